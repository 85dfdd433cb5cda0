"""Plain Kafka helpers for tests and benchmarks: topics, loading, reading back, waiting.

Why: integration tests must check exact output (no loss, no duplicates) and offsets against
a real broker, without consumer-group joins (slow on Tansu) or bare sleeps.
Everything here uses standard Kafka APIs through confluent-kafka, so it works against the
development broker (Tansu) and a real Kafka cluster alike.

Tansu quirk handled here: ListOffsets(latest) returns the base offset of the last record
batch plus one, not the true high watermark. Ends of partitions are therefore learnt from
fetches (partition-EOF events), which carry the true high watermark.

Threads: every function creates and closes its own clients, so any thread may call any of
them, concurrently.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

__all__ = [
    "Msg",
    "committed_offsets",
    "consume_all",
    "create_topic",
    "end_offsets",
    "produce",
    "unique_name",
    "wait_until",
]

Serializer = Callable[[Any], bytes | None]
Headers = tuple[tuple[str, bytes | None], ...]


@dataclass(frozen=True, slots=True)
class Msg:
    """One consumed record, detached from the consumer that read it."""

    key: bytes | None
    value: bytes | None
    topic: str
    partition: int
    offset: int
    timestamp: int
    """Milliseconds since the epoch (create or log-append time, as the topic says)."""
    headers: Headers = ()


def unique_name(prefix: str) -> str:
    """``prefix`` plus a short random suffix: topics and groups never collide across tests."""
    return f"{prefix}-{uuid.uuid4().hex[:10]}"


def wait_until(
    predicate: Callable[[], object], timeout: float, interval: float = 0.05, message: str = ""
) -> None:
    """Poll ``predicate`` until it returns something truthy; AssertionError after ``timeout``.

    Use this instead of sleeps: it returns as soon as the condition holds, and a failure names
    what was awaited. Exceptions raised by the predicate propagate.
    """
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise AssertionError(message or f"condition not met within {timeout}s")
        time.sleep(min(interval, remaining))


def _admin(bootstrap: str) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


def _partitions(
    bootstrap: str, topic: str, deadline: float, client: Consumer | None = None
) -> list[int]:
    """The topic's partition numbers, waiting (until ``deadline``) for it to exist.

    Pass the consumer that will read the topic: its metadata cache then knows the leaders
    before ``assign()``, which saves librdkafka's 500 ms offset-query retry.
    """
    meta_client: Consumer | AdminClient = client if client is not None else _admin(bootstrap)
    last = "topic not found"
    while True:
        remaining = deadline - time.monotonic()
        try:
            md = meta_client.list_topics(topic=topic, timeout=max(0.1, min(remaining, 5.0)))
            tmd = md.topics.get(topic)
            if tmd is not None and tmd.error is None and tmd.partitions:
                return sorted(tmd.partitions)
            if tmd is not None and tmd.error is not None:
                last = str(tmd.error)
        except KafkaException as exc:
            last = str(exc)
        if time.monotonic() >= deadline:
            raise AssertionError(f"topic {topic!r} has no partitions in time: {last}")
        time.sleep(0.05)


def create_topic(
    bootstrap: str,
    name: str,
    partitions: int,
    config: dict[str, str] | None = None,
    *,
    exist_ok: bool = False,
    replication_factor: int = 1,
    timeout: float = 30.0,
) -> None:
    """Create a topic and wait until its metadata shows all partitions.

    TOPIC_ALREADY_EXISTS is an error unless ``exist_ok=True`` (then the existing topic is
    kept as it is, whatever its partition count).
    """
    deadline = time.monotonic() + timeout
    new = NewTopic(
        name,
        num_partitions=partitions,
        replication_factor=replication_factor,
        config=dict(config or {}),
    )
    admin = _admin(bootstrap)  # must outlive the future: a destroyed client fails it
    future = admin.create_topics([new], operation_timeout=timeout)[name]
    try:
        future.result(timeout=timeout)
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        already = isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS
        if not (already and exist_ok):
            raise
        return
    wait_until(
        lambda: len(_partitions(bootstrap, name, deadline)) == partitions,
        timeout=max(0.0, deadline - time.monotonic()),
        message=f"topic {name!r} did not show {partitions} partitions in time",
    )


def _to_bytes(obj: Any, serializer: Serializer | None) -> bytes | None:
    if obj is None:
        return None
    if serializer is not None:
        return serializer(obj)
    if isinstance(obj, bytes):
        return obj
    if isinstance(obj, str):
        return obj.encode("utf-8")
    raise TypeError(f"cannot produce {type(obj).__name__} without a serializer: {obj!r}")


def produce(
    bootstrap: str,
    topic: str,
    records: Iterable[tuple[Any, Any] | tuple[Any, Any, int | None]],
    *,
    partition: int | None = None,
    key_serializer: Serializer | None = None,
    value_serializer: Serializer | None = None,
    timeout: float = 60.0,
) -> int:
    """Write ``records`` ((key, value) or (key, value, partition)) and return how many.

    Uses an idempotent producer with murmur2_random, the Java client's default partitioner,
    so keys land where Kafka Streams and Java consumers expect. A record's own partition
    wins over ``partition``; with neither, the key decides. Without serializers, str is
    UTF-8 encoded, bytes and None pass through. Flushes, and raises RuntimeError if any
    delivery failed or did not finish within ``timeout`` seconds.
    """
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
        }
    )
    errors: list[KafkaError] = []

    def on_delivery(err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            errors.append(err)

    count = 0
    for record in records:
        key, value = record[0], record[1]
        part = record[2] if len(record) > 2 else None
        if part is None:
            part = partition
        kwargs: dict[str, Any] = {
            "key": _to_bytes(key, key_serializer),
            "value": _to_bytes(value, value_serializer),
            "on_delivery": on_delivery,
        }
        if part is not None:
            kwargs["partition"] = part
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:  # local queue full: let deliveries drain
                producer.poll(0.05)
        count += 1
        if count % 10_000 == 0:
            producer.poll(0)
    remaining = producer.flush(timeout)
    if remaining:
        raise RuntimeError(f"{remaining} of {count} records to {topic!r} not delivered in time")
    if errors:
        raise RuntimeError(
            f"{len(errors)} of {count} records to {topic!r} failed; first: {errors[0]}"
        )
    return count


def _headers(msg: Message) -> Headers:
    raw = msg.headers()
    if not raw:
        return ()
    pairs = raw.items() if isinstance(raw, dict) else raw
    return tuple((k, v.encode() if isinstance(v, str) else v) for k, v in pairs)


def _reader(bootstrap: str, isolation: str) -> Consumer:
    """A consumer for assign()-only reading: its group id is never joined or committed."""
    return Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("reader"),
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "enable.partition.eof": True,
            "isolation.level": isolation,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
        }
    )


def consume_all(
    bootstrap: str,
    topic: str,
    *,
    expected: int | None = None,
    timeout: float = 30.0,
    isolation: str = "read_committed",
    idle: float = 2.0,
) -> list[Msg]:
    """Read a topic from the beginning of every partition, without a consumer group.

    With ``expected``: read until that many records were seen, then keep reading for ``idle``
    seconds so that extra records (duplicates) show up in the result too. Without it: read
    until every partition's end (as of reading) is reached. Raises AssertionError naming how
    many were seen if ``timeout`` passes first. Records come in per-partition offset order.
    """
    deadline = time.monotonic() + timeout
    consumer = _reader(bootstrap, isolation)
    out: list[Msg] = []
    at_end: set[int] = set()
    last_error: KafkaError | None = None
    try:
        parts = _partitions(bootstrap, topic, deadline, consumer)
        consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
        stop_at: float | None = None
        while True:
            now = time.monotonic()
            if stop_at is not None and now >= stop_at:
                return out
            if expected is None and len(at_end) == len(parts):
                return out
            if now >= deadline:
                if stop_at is not None:
                    return out
                want = f"{expected}" if expected is not None else "the end offsets"
                missing = sorted(set(parts) - at_end)
                raise AssertionError(
                    f"consume_all({topic!r}): saw {len(out)} records, wanted {want}, within "
                    f"{timeout}s (partitions not at end: {missing}; last error: {last_error})"
                )
            wait = min(0.2, (stop_at or deadline) - now, deadline - now)
            for m in consumer.consume(1000, max(0.0, wait)):
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_end.add(m.partition() or 0)
                        continue
                    if err.fatal():
                        raise KafkaException(err)
                    last_error = err
                    continue
                partition = m.partition()
                offset = m.offset()
                assert partition is not None and offset is not None
                at_end.discard(partition)
                out.append(
                    Msg(
                        key=m.key(),
                        value=m.value(),
                        topic=m.topic() or topic,
                        partition=partition,
                        offset=offset,
                        timestamp=m.timestamp()[1],
                        headers=_headers(m),
                    )
                )
            if expected is not None and stop_at is None and len(out) >= expected:
                stop_at = time.monotonic() + idle
    finally:
        consumer.close()


def end_offsets(bootstrap: str, topic: str, timeout: float = 30.0) -> dict[int, int]:
    """Each partition's high watermark (the offset the next record will get).

    Learnt from a fetch, not from ListOffsets alone, because the dev broker under-reports
    ListOffsets(latest) when the last batch holds several records (see module docstring).
    """
    deadline = time.monotonic() + timeout
    consumer = _reader(bootstrap, "read_uncommitted")
    try:
        parts = _partitions(bootstrap, topic, deadline, consumer)
        ends: dict[int, int] = {}
        start: list[TopicPartition] = []
        for p in parts:
            low, reported = consumer.get_watermark_offsets(
                TopicPartition(topic, p), timeout=max(0.1, deadline - time.monotonic())
            )
            if reported <= low:
                ends[p] = reported
            else:  # Reading from reported - 1 lands in the last batch; EOF names the true end.
                start.append(TopicPartition(topic, p, reported - 1))
        if start:
            consumer.assign(start)
        while len(ends) < len(parts):
            if time.monotonic() >= deadline:
                missing = sorted(set(parts) - set(ends))
                raise AssertionError(f"end_offsets({topic!r}): no end for partitions {missing}")
            for m in consumer.consume(1000, 0.2):
                err = m.error()
                if err is not None and err.code() == KafkaError._PARTITION_EOF:
                    partition, offset = m.partition(), m.offset()
                    assert partition is not None and offset is not None
                    ends[partition] = offset
        return dict(sorted(ends.items()))
    finally:
        consumer.close()


def committed_offsets(
    bootstrap: str, group: str, topic: str, timeout: float = 30.0
) -> dict[int, int]:
    """The group's committed offsets for the topic's partitions; uncommitted ones are absent.

    Asked through a consumer of the group that never joins it (OffsetFetch
    only), not AdminClient.list_consumer_group_offsets: librdkafka 2.16's
    AdminClient crashed the test process (SIGSEGV in rd_kafka_cgrp_op from
    rd_kafka_handle_OffsetFetch) when polled while the group's coordinator
    was still loading. A coordinator still loading is retried to the deadline.
    """
    deadline = time.monotonic() + timeout
    parts = _partitions(bootstrap, topic, deadline)
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": group,
            "enable.auto.commit": False,
            "enable.auto.offset.store": False,
            "log_level": 0,
        }
    )
    try:
        while True:
            try:
                result = consumer.committed(
                    [TopicPartition(topic, p) for p in parts],
                    timeout=max(0.1, deadline - time.monotonic()),
                )
                break
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                retriable = isinstance(err, KafkaError) and err.retriable()
                if not retriable or time.monotonic() >= deadline:
                    raise
                time.sleep(0.1)
    finally:
        consumer.close()
    out: dict[int, int] = {}
    for tp in result:
        if tp.error is not None:
            raise KafkaException(tp.error)
        if tp.offset >= 0:
            out[tp.partition] = tp.offset
    return dict(sorted(out.items()))


def broker_filters_aborted_transactions(bootstrap: str) -> bool:
    """Whether read_committed consumers of this broker skip aborted records.

    A Kafka broker does (fetch responses list aborted transactions); the
    development broker (Tansu 0.6.0) does not, which makes exactly-once
    output unobservable on it after any abort. Exactly-once tests ask this
    and check what the broker allows. Costs a topic and a transaction.
    """
    topic = unique_name("abort-probe")
    create_topic(bootstrap, topic, 1)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": unique_name("abort-probe"),
            "log.connection.close": False,
        }
    )
    producer.init_transactions(30)
    producer.begin_transaction()
    producer.produce(topic, b"aborted")
    producer.flush(30)
    producer.abort_transaction(30)
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(30)
    values = [m.value for m in consume_all(bootstrap, topic, idle=0.5)]
    return values == [b"committed"]
