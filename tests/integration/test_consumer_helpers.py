"""How the polling thread drives its consumer: consume_available, consume_until,
fetch_resumed_now.

librdkafka's ``consume(n, timeout)`` waits for n records or the whole timeout;
at low input rates that wait was added to every record's latency. After
``resume()`` librdkafka may wait up to a second before it fetches again;
``fetch_resumed_now`` seeks to the current position to start the fetch, which
must neither skip nor repeat a record.
"""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import Consumer, TopicPartition

from runtime.kafka.clients import consume_available, consume_until, fetch_resumed_now
from tests.kafka_helpers import create_topic, produce, unique_name

pytestmark = pytest.mark.integration

# Far above what the test needs, so that returning early is not a timing race.
_LONG_TIMEOUT_S = 20.0


def _assigned_consumer(bootstrap: str, topic: str, partitions: int) -> Consumer:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("consume-available"),
            "fetch.wait.max.ms": 10,
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    return consumer


def test_returns_with_the_first_record_not_after_the_timeout(bootstrap: str) -> None:
    topic = unique_name("consume-available")
    create_topic(bootstrap, topic, 1)
    consumer = _assigned_consumer(bootstrap, topic, 1)
    try:
        produce(bootstrap, topic, [("warm", "up")])
        assert len(consume_available(consumer, 500, _LONG_TIMEOUT_S)) == 1

        sender = threading.Thread(
            target=lambda: (time.sleep(0.3), produce(bootstrap, topic, [("k", "late")]))
        )
        sender.start()
        started = time.monotonic()
        records = consume_available(consumer, 500, _LONG_TIMEOUT_S)
        waited = time.monotonic() - started
        sender.join()

        assert [m.value() for m in records] == [b"late"]
        assert waited < _LONG_TIMEOUT_S / 2
    finally:
        consumer.close()


def test_a_wait_in_slices_ends_once_other_work_appears(bootstrap: str) -> None:
    # The polling thread waits so while a processing thread makes output: the
    # consumer's own wait cannot be woken, the end of a slice can.
    topic = unique_name("consume-until")
    create_topic(bootstrap, topic, 1)
    consumer = _assigned_consumer(bootstrap, topic, 1)
    try:
        output_handed_over = threading.Event()
        timer = threading.Timer(0.3, output_handed_over.set)
        timer.start()
        started = time.monotonic()
        records = consume_until(consumer, 500, _LONG_TIMEOUT_S, output_handed_over.is_set, 0.001)
        waited = time.monotonic() - started
        timer.join()

        assert records == []
        assert output_handed_over.is_set()
        assert waited < _LONG_TIMEOUT_S / 2
    finally:
        consumer.close()


def test_takes_everything_queued_in_offset_order_up_to_the_limit(bootstrap: str) -> None:
    topic = unique_name("consume-available")
    create_topic(bootstrap, topic, 1)
    produce(bootstrap, topic, [("k", str(i)) for i in range(300)], partition=0)
    consumer = _assigned_consumer(bootstrap, topic, 1)
    try:
        seen: list[bytes] = []
        deadline = time.monotonic() + 30
        while len(seen) < 300 and time.monotonic() < deadline:
            batch = consume_available(consumer, 100, 1.0)
            assert len(batch) <= 100
            seen.extend(m.value() for m in batch if m.error() is None)
        assert seen == [str(i).encode() for i in range(300)]
        # Nothing left: an empty list after the timeout, not an error.
        assert consume_available(consumer, 100, 0.2) == []
    finally:
        consumer.close()


def test_pause_resume_with_fetch_resumed_now_neither_skips_nor_repeats(bootstrap: str) -> None:
    topic = unique_name("fetch-resumed")
    create_topic(bootstrap, topic, 2)
    per_partition = 3000
    produce(
        bootstrap,
        topic,
        [("k", f"{p}-{i}", p) for p in range(2) for i in range(per_partition)],
    )
    consumer = _assigned_consumer(bootstrap, topic, 2)
    try:
        seen: dict[int, list[int]] = {0: [], 1: []}
        paused: list[TopicPartition] = []
        deadline = time.monotonic() + 60
        rounds = 0
        while sum(map(len, seen.values())) < 2 * per_partition and time.monotonic() < deadline:
            rounds += 1
            # Pause and resume every partition every round, as a full input
            # buffer does: the prefetched records are dropped each time.
            if paused:
                consumer.resume(paused)
                fetch_resumed_now(consumer, paused)
            for m in consume_available(consumer, 250, 0.5):
                if m.error() is None:
                    seen[m.partition()].append(m.offset())
            paused = [TopicPartition(topic, p) for p in range(2)]
            consumer.pause(paused)
        assert rounds > 10
        for p in range(2):
            got = seen[p]
            assert got == list(range(per_partition)), f"partition {p}"
    finally:
        consumer.close()


def test_fetch_resumed_now_leaves_partitions_without_a_position_alone(bootstrap: str) -> None:
    topic = unique_name("fetch-resumed")
    create_topic(bootstrap, topic, 1)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("fetch-resumed"),
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    try:
        # Assigned at the logical "stored/earliest" offset: nothing consumed yet.
        consumer.assign([TopicPartition(topic, 0)])
        partitions = [TopicPartition(topic, 0)]
        consumer.pause(partitions)
        consumer.resume(partitions)
        fetch_resumed_now(consumer, partitions)  # must not raise or seek to -1001
        produce(bootstrap, topic, [("k", "first")])
        got: list[bytes] = []
        deadline = time.monotonic() + 30
        while not got and time.monotonic() < deadline:
            got = [m.value() for m in consume_available(consumer, 10, 0.5) if m.error() is None]
        assert got == [b"first"]
    finally:
        consumer.close()
