"""The development broker and the Kafka test helpers work end to end."""

from __future__ import annotations

import threading
import time

import pytest
from confluent_kafka import KafkaError, Message, Producer

from runtime.brokers.devbroker import DevBroker
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration


def test_keyed_records_round_trip_exactly(bootstrap: str) -> None:
    topic = unique_name("devbroker")
    create_topic(bootstrap, topic, 4)
    records = [(f"key-{i % 50}", f"value-{i}") for i in range(1000)]

    assert produce(bootstrap, topic, records) == 1000

    got = consume_all(bootstrap, topic, expected=1000, idle=0.5)
    assert sorted((m.key, m.value) for m in got) == sorted(
        (k.encode(), v.encode()) for k, v in records
    )
    # The same key always lands in the same partition, in production order.
    partitions_by_key: dict[bytes | None, set[int]] = {}
    for m in got:
        partitions_by_key.setdefault(m.key, set()).add(m.partition)
    assert all(len(p) == 1 for p in partitions_by_key.values())
    assert len({m.partition for m in got}) == 4
    for key in (b"key-0", b"key-7"):
        values = [m.value for m in sorted(got, key=lambda m: m.offset) if m.key == key]
        assert values == [v.encode() for k, v in records if k.encode() == key]
    # End offsets are the true high watermarks, and reading to them finds everything.
    ends = end_offsets(bootstrap, topic)
    assert sum(ends.values()) == 1000
    assert len(consume_all(bootstrap, topic)) == 1000
    assert committed_offsets(bootstrap, unique_name("nobody"), topic) == {}


def test_produce_during_pause_completes_after_resume() -> None:
    with DevBroker() as broker:
        topic = unique_name("pause")
        create_topic(broker.bootstrap, topic, 1)
        produce(broker.bootstrap, topic, [(b"k", b"before")])

        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        delivered = threading.Event()
        results: list[KafkaError | None] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            results.append(err)
            delivered.set()

        broker.pause()
        try:
            producer.produce(topic, key=b"k", value=b"during", on_delivery=on_delivery)
            paused_until = time.monotonic() + 1.0
            while time.monotonic() < paused_until:  # the broker must not acknowledge now
                producer.poll(0.1)
            assert not delivered.is_set()
        finally:
            broker.resume()
        wait_until(lambda: producer.poll(0.1) >= 0 and delivered.is_set(), timeout=30)
        assert results == [None]

        got = consume_all(broker.bootstrap, topic, expected=2, idle=0.2)
        assert [m.value for m in got] == [b"before", b"during"]
    assert not broker.running
