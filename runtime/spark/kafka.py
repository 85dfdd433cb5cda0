"""Kafka access for the Spark pipeline, with confluent-kafka: offsets, ranges, reading, producing.

Nothing here imports Spark, so the same code runs on the driver (planning:
partitions, offsets) and in Spark's Python workers (reading a range,
producing rows). Every function creates and closes its own clients; none is
shared between threads.

Offsets use Spark's Kafka source conventions: a JSON object
`{"topic": {"0": 23, "1": -2}}`, where -2 means earliest and -1 latest, and
the strings `earliest` / `latest` for all partitions. A range is
`[start, end)`: the end is exclusive, a consumer position.

Ends of partitions are learnt from the fetch path, not from ListOffsets alone:
the development broker (Tansu) answers ListOffsets(latest) with the base offset
of the last record batch plus one, which is short of the true end when that
batch holds several records. So `end_offsets` asks ListOffsets first (right on
real Kafka, where with read_committed it gives the last stable offset), then
reads from one below that answer with `enable.partition.eof`: the EOF event
names the true end (the high watermark, or the last stable offset for
read_committed). On real Kafka this costs one small fetch per partition.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from confluent_kafka import (
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    TopicPartition,
)

EARLIEST = -2
LATEST = -1

TopicPartitionKey = tuple[str, int]
Offsets = dict[TopicPartitionKey, int]

# Options given to the data source with this prefix go to the Kafka clients
# unchanged (as Spark's own Kafka source does): kafka.security.protocol=SSL.
CLIENT_PREFIX = "kafka."


class KafkaSourceError(RuntimeError):
    """Bad options, unknown topics, lost data or a broker that does not answer."""


@dataclass(frozen=True)
class OffsetRange:
    """Offsets `[start, end)` of one partition: one Spark input partition reads it."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return max(0, self.end - self.start)


def parse_topics(spec: str | None) -> list[str]:
    """`a,b , c` -> ["a", "b", "c"]; KafkaSourceError when empty."""
    topics = [t.strip() for t in (spec or "").split(",") if t.strip()]
    if not topics:
        raise KafkaSourceError("option 'topic' is required: a topic or a comma-separated list")
    if len(set(topics)) != len(topics):
        raise KafkaSourceError(f"option 'topic' names a topic twice: {spec!r}")
    return topics


def client_overrides(options: Mapping[str, str]) -> dict[str, str]:
    """librdkafka properties passed through as `kafka.<property>` options."""
    return {
        k[len(CLIENT_PREFIX) :]: v
        for k, v in options.items()
        if k.lower().startswith(CLIENT_PREFIX) and k.lower() != "kafka.bootstrap.servers"
    }


def consumer_settings(
    bootstrap: str, isolation: str, overrides: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """An assign()-only reader: never joins or commits its (random) group."""
    if isolation not in ("read_committed", "read_uncommitted"):
        raise KafkaSourceError(
            f"isolation.level must be read_committed or read_uncommitted, got {isolation!r}"
        )
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "group.id": f"spark-reader-{uuid.uuid4().hex[:12]}",
        "enable.auto.commit": False,
        "enable.auto.offset.store": False,
        "enable.partition.eof": True,
        "isolation.level": isolation,
        "auto.offset.reset": "error",
        "fetch.wait.max.ms": 100,
        "log.connection.close": False,
    }
    settings.update(overrides or {})
    return settings


def producer_settings(bootstrap: str, overrides: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Idempotent producer: no duplicates or reordering from retries."""
    settings: dict[str, Any] = {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 20,
        "batch.num.messages": 10000,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "delivery.report.only.error": True,
        "partitioner": "murmur2_random",  # the Java client's default partitioner
        "log.connection.close": False,
    }
    settings.update(overrides or {})
    return settings


# -- metadata and offsets (driver) ---------------------------------------------


def partitions_of(
    client: Consumer, topics: Sequence[str], timeout: float, unknown_timeout: float = 5.0
) -> dict[str, list[int]]:
    """Partition numbers per topic; KafkaSourceError naming missing topics.

    Waits up to `timeout` for metadata, but only `unknown_timeout` for a topic
    the cluster does not know (a topic created a moment ago shows up by then).
    """
    start = time.monotonic()
    deadline = start + timeout
    missing: dict[str, str] = {}
    while True:
        found: dict[str, list[int]] = {}
        missing = {}
        for topic in topics:
            try:
                md = client.list_topics(topic=topic, timeout=max(0.5, deadline - time.monotonic()))
            except KafkaException as exc:
                raise KafkaSourceError(f"cannot read metadata of topic {topic!r}: {exc}") from exc
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None or not tmd.partitions:
                missing[topic] = str(tmd.error) if tmd is not None and tmd.error else "not found"
            else:
                found[topic] = sorted(tmd.partitions)
        if not missing:
            return found
        now = time.monotonic()
        unknown = all("not found" in why or "UNKNOWN_TOPIC" in why for why in missing.values())
        if now >= deadline or (unknown and now - start >= unknown_timeout):
            listed = ", ".join(f"{t!r} ({why})" for t, why in missing.items())
            raise KafkaSourceError(f"topic(s) not available: {listed}")
        time.sleep(0.2)


def watermarks(
    bootstrap: str,
    topics: Sequence[str],
    isolation: str = "read_committed",
    overrides: Mapping[str, str] | None = None,
    timeout: float = 60.0,
) -> dict[TopicPartitionKey, tuple[int, int]]:
    """`(earliest, end)` of every partition of `topics`; the end from a fetch (see module doc)."""
    deadline = time.monotonic() + timeout
    consumer = Consumer(consumer_settings(bootstrap, isolation, overrides))
    try:
        parts = partitions_of(consumer, topics, timeout)
        low: dict[TopicPartitionKey, int] = {}
        ends: dict[TopicPartitionKey, int] = {}
        probe: list[TopicPartition] = []
        for topic, numbers in parts.items():
            for p in numbers:
                lo, reported = _watermark_offsets(consumer, TopicPartition(topic, p), deadline)
                low[(topic, p)] = max(lo, 0)
                if reported <= lo:
                    ends[(topic, p)] = max(reported, lo, 0)
                else:  # read the last batch: its EOF event names the true end
                    probe.append(TopicPartition(topic, p, reported - 1))
        if probe:
            consumer.assign(probe)
            waiting = {(tp.topic, tp.partition) for tp in probe}
            while waiting:
                if time.monotonic() >= deadline:
                    raise KafkaSourceError(
                        f"no end offset for {sorted(waiting)} within {timeout}s "
                        "(the broker did not answer fetches)"
                    )
                for m in consumer.consume(10000, 0.2):
                    err = m.error()
                    if err is None:
                        continue
                    if err.code() == KafkaError._PARTITION_EOF:
                        key = (m.topic() or "", m.partition() or 0)
                        offset = m.offset()
                        assert offset is not None
                        ends[key] = offset
                        waiting.discard(key)
                    elif err.fatal():
                        raise KafkaSourceError(f"reading end offsets: {err}")
        return {tp: (low[tp], max(ends[tp], low[tp])) for tp in sorted(low)}
    finally:
        consumer.close()


# What a partition answers while its leader is not known yet (the error object of
# get_watermark_offsets does not carry librdkafka's retriable flag).
_ELECTING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._UNKNOWN_PARTITION,
    }
)


def _watermark_offsets(consumer: Consumer, tp: TopicPartition, deadline: float) -> tuple[int, int]:
    """ListOffsets for `tp`, retried until `deadline` while the cluster is still electing its
    leader (a topic created a moment ago answers NOT_LEADER_FOR_PARTITION for a while)."""
    while True:
        try:
            lo, hi = consumer.get_watermark_offsets(
                tp, timeout=max(0.5, deadline - time.monotonic())
            )
            return int(lo), int(hi)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            code = err.code() if isinstance(err, KafkaError) else None
            if code not in _ELECTING or time.monotonic() >= deadline:
                raise KafkaSourceError(f"no offsets for {tp.topic}-{tp.partition}: {exc}") from exc
            time.sleep(0.2)


def parse_offsets(spec: str | None, default: str, what: str) -> str | dict[str, dict[str, int]]:
    """`earliest`, `latest`, or the JSON form `{"topic": {"0": 12, "1": -2}}`."""
    text = (spec or default).strip()
    if text.lower() in ("earliest", "latest"):
        return text.lower()
    try:
        parsed = json.loads(text)
    except ValueError:
        raise KafkaSourceError(
            f"{what}: expected 'earliest', 'latest' or JSON like "
            f'{{"topic": {{"0": 23, "1": -2}}}}, got {text!r}'
        ) from None
    if not isinstance(parsed, dict) or not all(
        isinstance(t, str) and isinstance(ps, dict) for t, ps in parsed.items()
    ):
        raise KafkaSourceError(f"{what}: JSON must map topic -> {{partition: offset}}")
    out: dict[str, dict[str, int]] = {}
    for topic, ps in parsed.items():
        out[topic] = {}
        for p, off in ps.items():
            if not str(p).lstrip("-").isdigit() or not isinstance(off, int) or off < -2:
                raise KafkaSourceError(f"{what}: bad entry {topic}/{p}: {off!r}")
            out[topic][str(int(p))] = off
    return out


def resolve_offsets(
    spec: str | dict[str, dict[str, int]],
    marks: Mapping[TopicPartitionKey, tuple[int, int]],
    what: str,
) -> Offsets:
    """Concrete offsets for every partition in `marks`.

    JSON entries may be -2 (earliest) or -1 (latest); partitions the JSON
    leaves out take earliest for a start and latest for an end, as Spark does.
    An offset beyond the partition's end is clamped to the end.
    """
    out: Offsets = {}
    fallback = EARLIEST if what == "startingOffsets" else LATEST
    if isinstance(spec, dict):
        known = {t for t, _ in marks}
        unknown = sorted(set(spec) - known)
        if unknown:
            raise KafkaSourceError(f"{what} names topics that are not read: {unknown}")
    for tp, (low, high) in marks.items():
        if isinstance(spec, str):
            wanted = EARLIEST if spec == "earliest" else LATEST
        else:
            wanted = spec.get(tp[0], {}).get(str(tp[1]), fallback)
        if wanted == EARLIEST:
            out[tp] = low
        elif wanted == LATEST:
            out[tp] = high
        else:
            out[tp] = min(wanted, high)
    return out


def offsets_to_json(offsets: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """`{(topic, p): offset}` -> Spark's offset JSON shape (string partition keys)."""
    out: dict[str, dict[str, int]] = {}
    for (topic, p), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(p)] = offset
    return out


def plan_ranges(
    starts: Mapping[TopicPartitionKey, int],
    ends: Mapping[TopicPartitionKey, int],
    max_records: int = 0,
    min_partitions: int = 0,
) -> list[OffsetRange]:
    """One range per partition with data, split into pieces of at most `max_records`
    (0: no limit) and into at least `min_partitions` pieces overall (0: no minimum)."""
    ranges = [
        OffsetRange(t, p, starts[(t, p)], ends[(t, p)])
        for (t, p) in sorted(starts)
        if (t, p) in ends and ends[(t, p)] > starts[(t, p)]
    ]
    total = sum(r.size for r in ranges)
    limit = max_records if max_records > 0 else 0
    if min_partitions > len(ranges) and total > 0:
        per = -(-total // min_partitions)
        limit = min(limit, per) if limit else per
    if not limit:
        return ranges
    out = []
    for r in ranges:
        start = r.start
        while start < r.end:
            end = min(r.end, start + limit)
            out.append(OffsetRange(r.topic, r.partition, start, end))
            start = end
    return out


# -- reading a range (Spark workers) ---------------------------------------------


def read_range(
    settings: Mapping[str, Any],
    offset_range: OffsetRange,
    fail_on_data_loss: bool = True,
    batch_size: int = 10000,
    idle_timeout: float = 120.0,
) -> Iterator[list[Message]]:
    """The records of `offset_range`, in offset order, in lists of up to `batch_size`.

    Ends when the position reaches `end` (a record at or past it, or an EOF at
    or past it: compacted and transactional partitions have gaps). Raises
    KafkaSourceError if `start` was deleted (unless `fail_on_data_loss` is
    off: then it starts at the earliest remaining record) or if no progress
    is made for `idle_timeout` seconds.
    """
    r = offset_range
    if r.end <= r.start:
        return
    conf = dict(settings)
    conf["auto.offset.reset"] = "error" if fail_on_data_loss else "earliest"
    consumer = Consumer(conf)
    try:
        # Metadata first: assign() before the leader is known costs librdkafka
        # a 500 ms retry of its first fetch.
        partitions_of(consumer, [r.topic], idle_timeout)
        consumer.assign([TopicPartition(r.topic, r.partition, r.start)])
        last_progress = time.monotonic()
        position = r.start
        while True:
            # consume() returns early only once it has all it asked for: never
            # ask for more than the range still holds.
            wanted = max(1, min(batch_size, r.end - position))
            messages = consumer.consume(wanted, 0.1)
            if not messages:
                if time.monotonic() - last_progress > idle_timeout:
                    raise KafkaSourceError(
                        f"no records from {r.topic}-{r.partition} for {idle_timeout:.0f}s while "
                        f"reading [{r.start}, {r.end})"
                    )
                continue
            last_progress = time.monotonic()
            batch: list[Message] = []
            done = False
            for m in messages:
                err = m.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        if (m.offset() or 0) >= r.end:
                            done = True
                        continue
                    if err.code() == KafkaError._AUTO_OFFSET_RESET:
                        raise KafkaSourceError(
                            f"{r.topic}-{r.partition}: offset {r.start} is no longer available "
                            f"(deleted by retention?): {err.str()}; set failOnDataLoss=false to "
                            "start at the earliest remaining record"
                        )
                    if err.fatal() or not err.retriable():
                        raise KafkaSourceError(f"reading {r.topic}-{r.partition}: {err.str()}")
                    continue
                offset = m.offset()
                assert offset is not None
                if offset >= r.end:
                    done = True
                    break
                batch.append(m)
                position = offset + 1
                if position >= r.end:
                    done = True
                    break
            if batch:
                yield batch
            if done:
                return
    finally:
        consumer.close()
