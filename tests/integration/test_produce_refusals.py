"""Hostile produce refusals on real Kafka: only the refused record reaches the handler.

The matrix: what the broker refuses (a record too large for the sink, a
timestamp past the sink's `message.timestamp.after.max.ms`, the sink's
`max.message.bytes` lowered while the app runs) x the handler (log_and_fail,
log_and_continue, dead_letter_queue) x the guarantee. Each case checks which
input records reached the output (all valid ones, in order per partition, once
under exactly_once_v2), which reached the dead-letter topic (exactly the
refused ones, with their origin), and that the committed offset never skips a
valid record (and never passes a refused one under log_and_fail).

What librdkafka reports here is in runtime/collector/refusals.py: a refused
batch fails every record of it (MSG_SIZE_TOO_LARGE, INVALID_TIMESTAMP), or
names the culprits (INVALID_RECORD) and fails the rest with
`_INVALID_DIFFERENT_RECORD`. The sink has two partitions: partition 0 holds one
culprit among valid records (a whole-batch error), partition 1 two adjacent ones
(record errors), so both kinds of report are met.

Also: a changelog record the broker refuses stops the app whatever the handler
says, naming the store and the size (issue item 3).

Bounded: one topic setup and one app run per case, small record counts, waits
on conditions with deadlines.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ResourceType,
)

from runtime import App, AppState, StreamsBuilder, serdes
from runtime.collector.production_errors import HEADER_SINK_TOPIC
from tests.configs import app_config
from tests.kafka_helpers import (
    Msg,
    consume_all,
    create_topic,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

DAY_MS = 86_400_000
BIG = "BIG"
# Input accepts any timestamp (Kafka 4 refuses timestamps over an hour ahead by default).
ANY_TIMESTAMP = {"message.timestamp.after.max.ms": str(2**63 - 1)}

KINDS = ["too_large", "future_timestamp", "limit_lowered"]
HANDLERS = ["log_and_fail", "log_and_continue", "dead_letter_queue"]
GUARANTEES = ["at_least_once", "exactly_once_v2"]


class Case:
    """One refusal kind: topics, input records, what the broker refuses."""

    def __init__(self, kind: str, bootstrap: str) -> None:
        self.kind = kind
        self.bootstrap = bootstrap
        self.source = unique_name(f"ref-in-{kind}")
        self.sink = unique_name(f"ref-out-{kind}")
        self.dlq = unique_name(f"ref-dlq-{kind}")
        now = int(time.time() * 1000)
        self.big_bytes = 30_000
        sink_config: dict[str, str] = {}
        # (key, value, timestamp) per input offset; keys 'p0-*' go to sink
        # partition 0 (one culprit among valid records), 'p1-*' to partition 1.
        self.inputs: list[tuple[str, str, int]] = []
        self.refused: set[int] = set()
        self.phase_one = 0  # records produced before the sink's limit is lowered
        if kind == "too_large":
            sink_config = {"max.message.bytes": "20000"}
            self._fill(40, {13: "p0", 26: "p1", 27: "p1"}, now)
            for offset in self.refused:
                key, _, ts = self.inputs[offset]
                self.inputs[offset] = (key, BIG, ts)
        elif kind == "future_timestamp":
            sink_config = {"message.timestamp.after.max.ms": "60000"}
            self._fill(40, {13: "p0", 26: "p1", 27: "p1"}, now)
            for offset in self.refused:
                key, value, _ = self.inputs[offset]
                self.inputs[offset] = (key, value, now + DAY_MS)
        else:
            # 20 records flow; then the limit drops to 4000 bytes, under what
            # librdkafka batches of the next 40 (200 bytes each): every batch
            # is refused as a whole, though only the 6000-byte one is too large.
            self.big_bytes = 6_000
            self.phase_one = 20
            self._fill(60, {35: "p0"}, now, pad=200)
            key, _, ts = self.inputs[35]
            self.inputs[35] = (key, BIG, ts)
        create_topic(bootstrap, self.source, 1, ANY_TIMESTAMP)
        create_topic(bootstrap, self.sink, 2, sink_config)
        create_topic(bootstrap, self.dlq, 1)

    def _fill(self, count: int, refused: dict[int, str], now: int, pad: int = 60) -> None:
        for offset in range(count):
            side = refused.get(offset, "p0" if offset % 2 == 0 else "p1")
            value = f"v{offset:03d}-" + "." * pad
            self.inputs.append((f"{side}-{offset:03d}", value, now))
        self.refused = set(refused)

    @property
    def valid(self) -> set[int]:
        return set(range(len(self.inputs))) - self.refused

    def topology(self) -> Any:
        big = self.big_bytes
        builder = StreamsBuilder()
        builder.stream(self.source, key_serde=serdes.STRING, value_serde=serdes.STRING).map_values(
            lambda v: "x" * big if v == BIG else v
        ).to(
            self.sink,
            key_serde=serdes.STRING,
            value_serde=serdes.STRING,
            partitioner=lambda key, _value, _count: 0 if key.startswith("p0") else 1,
        )
        return builder.build()

    def produce(self, offsets: range) -> None:
        producer = Producer({"bootstrap.servers": self.bootstrap, "linger.ms": 20})
        failures: list[object] = []
        for offset in offsets:
            key, value, timestamp = self.inputs[offset]
            producer.produce(
                self.source,
                value.encode(),
                key.encode(),
                partition=0,
                timestamp=timestamp,
                on_delivery=lambda err, _msg: failures.append(err) if err else None,
            )
        assert producer.flush(30) == 0 and not failures, failures

    def lower_sink_limit(self, limit: int) -> None:
        admin = AdminClient({"bootstrap.servers": self.bootstrap})
        entry = ConfigEntry(
            "max.message.bytes", str(limit), incremental_operation=AlterConfigOpType.SET
        )
        resource = ConfigResource(ResourceType.TOPIC, self.sink, incremental_configs=[entry])
        for future in admin.incremental_alter_configs([resource]).values():
            future.result(30)

        def applied() -> bool:
            described = admin.describe_configs([ConfigResource(ResourceType.TOPIC, self.sink)])
            config = next(iter(described.values())).result(10)
            return config["max.message.bytes"].value == str(limit)

        wait_until(applied, 30, interval=0.1, message="the sink's new limit in force")


def config(bootstrap: str, case: Case, tmp_path: Path, guarantee: str, handler: str) -> dict:
    return app_config(
        bootstrap,
        unique_name(f"ref-{case.kind}"),
        tmp_path / "state",
        threads=1,
        guarantee=guarantee,
        **{
            "production.exception.handler": handler,
            "errors.dead.letter.queue.topic.name": case.dlq,
        },
    )


def committed(bootstrap: str, app_id: str, topic: str) -> int | None:
    """The group's committed offset of partition 0 (None: none yet).

    Asked through a consumer of the group that never joins it, not the
    AdminClient (`kafka_helpers.committed_offsets`): librdkafka 2.16's
    AdminClient crashed the test process (SIGSEGV in rd_kafka_cgrp_op from
    rd_kafka_handle_OffsetFetch) when asked right after the group appeared,
    while its coordinator was still loading (seen under gdb).
    """
    consumer = Consumer(
        {"bootstrap.servers": bootstrap, "group.id": app_id, "enable.auto.commit": False}
    )
    try:
        [position] = consumer.committed([TopicPartition(topic, 0)], timeout=10)
    except KafkaException as exc:
        if exc.args[0].retriable() or exc.args[0].code() == KafkaError.COORDINATOR_LOAD_IN_PROGRESS:
            return None
        raise
    finally:
        consumer.close()
    return position.offset if position.offset >= 0 else None


def offset_of(message: Msg) -> int:
    assert message.key is not None
    return int(message.key.decode().split("-")[1])


def wait_for(predicate: Callable[[], bool], app: App, timeout: float, what: str) -> None:
    """Wait for `predicate`, failing at once (with the app's failure) if the app stops."""

    def done() -> bool:
        if app.state is AppState.ERROR:
            raise AssertionError(f"app failed while waiting for {what}: {app.failure!r}")
        return predicate()

    wait_until(done, timeout, interval=0.25, message=what)


@pytest.mark.parametrize("guarantee", GUARANTEES)
@pytest.mark.parametrize("handler", HANDLERS)
@pytest.mark.parametrize("kind", KINDS)
def test_refusal_matrix(
    bootstrap: str, tmp_path: Path, kind: str, handler: str, guarantee: str
) -> None:
    case = Case(kind, bootstrap)
    settings = config(bootstrap, case, tmp_path, guarantee, handler)
    app_id = str(settings["application.id"])
    app = App(case.topology(), settings)
    first_refused = min(case.refused)
    if case.phase_one:
        case.produce(range(case.phase_one))
    else:
        case.produce(range(len(case.inputs)))
    app.start()
    try:
        if case.phase_one:
            wait_for(
                lambda: committed(bootstrap, app_id, case.source) == case.phase_one,
                app,
                60,
                "the first records committed",
            )
            case.lower_sink_limit(4000)
            case.produce(range(case.phase_one, len(case.inputs)))
        if handler == "log_and_fail":
            wait_until(lambda: app.state is AppState.ERROR, 60, message="the app stopped")
            failure = repr(app.failure)
            named = [o for o in case.refused if f"{case.source}[0]@{o}" in failure]
            assert named, f"the failure names no refused input record: {failure}"
            assert "production.exception.handler" in failure, failure
        else:
            wait_for(
                lambda: committed(bootstrap, app_id, case.source) == len(case.inputs),
                app,
                60,
                "every input record committed",
            )
            # Alive: a rebalance on a loaded machine (a missed heartbeat) is no failure.
            assert app.state in (AppState.RUNNING, AppState.REBALANCING), app.state
            # Counted once each, under exactly_once_v2 too (a replay's
            # handling of a record is not counted again).
            status = app.status()
            if handler == "log_and_continue":
                assert status.skipped == len(case.refused), status.skipped
            else:
                assert status.dead_lettered == len(case.refused), status.dead_lettered
    finally:
        app.close(30)

    # Every valid record unless the app stopped at the first refusal: read
    # until they are all there (or 30 s), not only until a short idle.
    expected = None if handler == "log_and_fail" else len(case.valid)
    output = consume_all(bootstrap, case.sink, expected=expected, timeout=30, idle=0.3)
    seen = [offset_of(m) for m in output]
    assert not set(seen) & case.refused, f"refused records in the output: {sorted(seen)}"
    for partition in (0, 1):
        in_order = [offset_of(m) for m in output if m.partition == partition]
        first_seen = list(dict.fromkeys(in_order))
        assert first_seen == sorted(first_seen), f"partition {partition} out of order: {in_order}"
    if guarantee == "exactly_once_v2":
        assert len(seen) == len(set(seen)), f"duplicates under exactly_once_v2: {sorted(seen)}"
    for message in output:
        key, value, timestamp = case.inputs[offset_of(message)]
        assert message.value is not None and message.value.decode() == value
        assert message.timestamp == timestamp

    committed_at = committed(bootstrap, app_id, case.source) or 0
    missing = sorted(o for o in case.valid if o < committed_at and o not in seen)
    assert not missing, f"committed {committed_at} past valid records with no output: {missing}"
    if handler == "log_and_fail":
        assert committed_at <= first_refused, (
            f"committed {committed_at} past refused {first_refused}"
        )
    else:
        assert set(seen) == case.valid, f"missing: {sorted(case.valid - set(seen))}"

    dead = consume_all(bootstrap, case.dlq, timeout=30, idle=0.3)
    if handler != "dead_letter_queue":
        assert dead == [], "nothing is dead-lettered by this handler"
        return
    origins = []
    for message in dead:
        headers = dict(message.headers)
        assert headers["__streams.errors.stage"] == b"production"
        assert headers[HEADER_SINK_TOPIC] == case.sink.encode()
        assert headers["__streams.errors.topic"] == case.source.encode()
        assert headers["__streams.errors.partition"] == b"0"
        origins.append(int(headers["__streams.errors.offset"] or b"-1"))
    assert sorted(origins) == sorted(case.refused), f"dead-lettered origins {origins}"


def test_a_refused_changelog_record_stops_the_app_whatever_the_handler(
    bootstrap: str, tmp_path: Path
) -> None:
    """Issue item 3: an aggregate grows past its changelog's limit. Skipping
    the changelog record would leave the store ahead of its changelog (a
    restore gives a wrong value), so the app stops, naming the store and the
    size, and commits nothing past the record that grew it."""
    source, sink = unique_name("agg-in"), unique_name("agg-out")
    app_id = unique_name("agg")
    store = "totals"
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    create_topic(
        bootstrap,
        f"{app_id}-{store}-changelog",
        1,
        {"cleanup.policy": "compact", "max.message.bytes": "20000"},
    )
    chunk = "y" * 3000
    producer = Producer({"bootstrap.servers": bootstrap})
    for _ in range(12):
        producer.produce(source, chunk.encode(), b"k", partition=0)
    assert producer.flush(30) == 0
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .aggregate(lambda: "", lambda _k, v, agg: agg + v, store=store, value_serde=serdes.STRING)
        .to_stream()
        .map_values(len)
        .to(sink, key_serde=serdes.STRING, value_serde=serdes.INT64)
    )
    app = App(
        builder.build(),
        app_config(
            bootstrap,
            app_id,
            tmp_path / "state",
            threads=1,
            heartbeat_ms=None,
            **{"production.exception.handler": "log_and_continue"},
        ),
    )
    app.start()
    try:
        wait_until(lambda: app.state is AppState.ERROR, 60, message="the app stopped")
        failure = repr(app.failure)
        assert f"changelog of store {store!r}" in failure, failure
        assert f"{app_id}-{store}-changelog" in failure and "bytes" in failure, failure
    finally:
        app.close(30)
    # The aggregate passes the limit with the 7th record (offset 6): 21000 bytes.
    committed_at = committed(bootstrap, app_id, source) or 0
    assert committed_at <= 6, f"committed {committed_at} past the refused changelog record"
