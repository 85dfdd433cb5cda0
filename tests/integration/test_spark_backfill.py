"""Backfill of DSL topologies on Spark local[2], checked against the daemon on the same topic.

The backfill's output must equal what the daemon computes over the same history, and a
daemon started afterwards with the backfill's application.id must restore the state from
the changelogs and continue with exact results (nothing counted twice, nothing missed).
The history is read with Spark's connector (the default) and, in one test, with the
project's source (the option); the output keeps the input records' timestamps.
"""

from __future__ import annotations

import os
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from runtime import App, Processor, Record, StreamsBuilder, TimeWindows, Topology, serdes
from runtime.cli import main
from runtime.config import StreamsConfig
from runtime.partitioning.default import default_partition
from runtime.spark import BackfillError, run_backfill, spark_session
from runtime.spark.names import STREAMS_KAFKA
from runtime.spark.session import JavaMissingError, check_java
from tests.configs import app_config
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

WORDS = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "honeydew"]


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    """The process's one local[2] session (see test_spark_source)."""
    return spark_session("local[2]", "streams-runtime-tests")


def lines(start: int, count: int) -> list[tuple[str, str]]:
    return [
        (f"line-{i}", " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(i % 5 + 1)))
        for i in range(start, start + count)
    ]


def word_count(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .flat_map_values(lambda line: line.lower().split())
        .group_by(lambda key, word: word, key_serde=serdes.STRING)
        .count(store="word-counts")
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    return builder.build()


def word_count_from_env() -> Topology:
    """For `streams-runtime backfill tests.integration.test_spark_backfill:word_count_from_env`."""
    return word_count(os.environ["SPARK_TEST_SOURCE"], os.environ["SPARK_TEST_SINK"])


def strict_longs_from_env() -> Topology:
    """Values must be INT64: a 3-byte value fails deserialization (log_and_fail)."""
    builder = StreamsBuilder()
    builder.stream(
        os.environ["SPARK_TEST_SOURCE"], key_serde=serdes.STRING, value_serde=serdes.INT64
    ).map_values(lambda v: v + 1).to(os.environ["SPARK_TEST_SINK"])
    return builder.build()


def latest(
    bootstrap: str, topic: str, value_de: Any = serdes.INT64.deserialize
) -> dict[bytes, Any]:
    out: dict[bytes, Any] = {}
    for m in sorted(consume_all(bootstrap, topic, idle=0.5), key=lambda m: (m.partition, m.offset)):
        assert m.key is not None
        out[m.key] = value_de(m.value)
    return out


def expected_counts(records: list[tuple[str, str]]) -> dict[bytes, int]:
    return {
        w.encode(): n for w, n in Counter(w for _, line in records for w in line.split()).items()
    }


def app(topology: Topology, app_id: str, bootstrap: str, state_dir: Path) -> App:
    return App(
        topology,
        app_config(bootstrap, app_id, state_dir, commit_ms=300, heartbeat_ms=None),
    )


def test_word_count_backfill_equals_the_daemon_and_a_daemon_continues_exactly(
    spark: Any, bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    source, daemon_sink, backfill_sink = (
        unique_name("bf-lines"),
        unique_name("bf-daemon-counts"),
        unique_name("bf-counts"),
    )
    for topic in (source, daemon_sink, backfill_sink):
        create_topic(bootstrap, topic, 4)
    first = lines(0, 3000)
    produce(bootstrap, source, first)
    app_id = unique_name("bf-wc")

    daemon = app(
        word_count(source, daemon_sink), unique_name("bf-wc-daemon"), bootstrap, tmp_path / "d"
    )
    daemon.start()  # the daemon's own run over the same topic, meanwhile
    try:
        monkeypatch.setenv("SPARK_TEST_SOURCE", source)
        monkeypatch.setenv("SPARK_TEST_SINK", backfill_sink)
        argv = [
            "backfill",
            "tests.integration.test_spark_backfill:word_count_from_env",
            "--engine",
            "spark",
            "--set",
            f"application.id={app_id}",
            "--set",
            f"bootstrap.servers={bootstrap}",
        ]
        assert main(argv) == 0
        err = capsys.readouterr().err
        assert "stage 0" in err and "stage 1" in err and "committed offsets" in err

        expected = expected_counts(first)
        assert latest(bootstrap, backfill_sink) == expected
        wait_until(
            lambda: latest(bootstrap, daemon_sink) == expected,
            90,
            interval=1.0,
            message="the daemon's counts never matched",
        )
    finally:
        assert daemon.close(30)

    # The end offsets were committed; the changelog holds one record per word, on the
    # partition of the daemon task that owns the word.
    assert committed_offsets(bootstrap, app_id, source) == end_offsets(bootstrap, source)
    changelog = consume_all(bootstrap, f"{app_id}-word-counts-changelog", idle=0.5)
    assert sorted(m.key for m in changelog) == sorted(expected)
    for m in changelog:
        assert m.key is not None
        assert m.partition == default_partition(m.key, 4)
        assert serdes.INT64.deserialize(m.value) == expected[m.key]

    # A second backfill for the same application is refused: it has state now.
    assert main(argv) == 2
    assert "already has committed offsets" in capsys.readouterr().err

    # The daemon with the backfill's application.id restores and continues live.
    second = lines(3000, 1500)
    produce(bootstrap, source, second)
    continued = app(word_count(source, backfill_sink), app_id, bootstrap, tmp_path / "fresh")
    continued.start()
    try:
        wait_until(
            lambda: latest(bootstrap, backfill_sink) == expected_counts(first + second),
            90,
            interval=1.0,
            message="the continued counts never became exact",
        )
        assert continued.status()["restored"] >= len(WORDS)
    finally:
        assert continued.close(30)


# -- windows, reduce, aggregate -------------------------------------------------------

MINUTE = 60_000


def events_topology(source: str, per_minute: str, longest: str, by_letter: str) -> Topology:
    builder = StreamsBuilder()
    events = builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
    (
        events.group_by_key()
        .windowed_by(TimeWindows.of_size_with_no_grace(MINUTE))
        .count(store="per-minute")
        .to_stream()
        .to(per_minute, value_serde=serdes.INT64)
    )
    (
        events.map_values(len)
        .group_by_key(value_serde=serdes.INT64)
        .reduce(max, store="longest")
        .to_stream()
        .to(longest, value_serde=serdes.INT64)
    )
    (
        events.group_by(lambda key, value: value[0], key_serde=serdes.STRING)
        .aggregate(
            lambda: [0, 0],
            lambda key, value, agg: [agg[0] + 1, agg[1] + len(value)],
            store="by-letter",
            value_serde=serdes.JSON,
        )
        .to_stream()
        .to(by_letter, value_serde=serdes.JSON)
    )
    return builder.build()


def events(start: int, count: int, base_ms: int) -> list[tuple[str, str, int]]:
    """Keyed events in timestamp order, 100 ms apart (no record is late)."""
    return [
        (f"user-{i % 17}", WORDS[(i * 5) % len(WORDS)] + "!" * (i % 7), base_ms + i * 100)
        for i in range(start, start + count)
    ]


def produce_events(bootstrap: str, topic: str, records: list[tuple[str, str, int]]) -> None:
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
        }
    )
    for key, value, ts in records:
        producer.produce(topic, key=key.encode(), value=value.encode(), timestamp=ts)
    assert producer.flush(30) == 0


def expected_events(records: list[tuple[str, str, int]]) -> tuple[dict, dict, dict]:  # type: ignore[type-arg]
    windowed: Counter[bytes] = Counter()
    longest: dict[bytes, int] = {}
    letters: dict[bytes, list[int]] = defaultdict(lambda: [0, 0])
    for key, value, ts in records:
        start = ts - ts % MINUTE
        windowed[key.encode() + start.to_bytes(8, "big")] += 1
        longest[key.encode()] = max(longest.get(key.encode(), 0), len(value))
        letters[value[0].encode()][0] += 1
        letters[value[0].encode()][1] += len(value)
    return dict(windowed), longest, dict(letters)


def test_windows_reduce_and_aggregate_backfill_equal_the_daemon_and_continue(
    spark: Any, bootstrap: str, tmp_path: Path
) -> None:
    names = [unique_name(f"bf-ev-{n}") for n in ("in", "pm", "long", "letter")]
    daemon_outs = [unique_name(f"bf-ev-d-{n}") for n in ("pm", "long", "letter")]
    for topic in (*names, *daemon_outs):
        create_topic(bootstrap, topic, 3)
    source, outs = names[0], names[1:]
    base = (int(time.time() * 1000) - 3_600_000) // MINUTE * MINUTE
    first = events(0, 2000, base)
    produce_events(bootstrap, source, first)

    daemon = app(
        events_topology(source, *daemon_outs), unique_name("bf-ev-d"), bootstrap, tmp_path / "d"
    )
    daemon.start()
    try:
        app_id = unique_name("bf-ev")
        config = StreamsConfig.from_dict({"application.id": app_id, "bootstrap.servers": bootstrap})
        result = run_backfill(spark, events_topology(source, *outs), config)
        assert result.records_read == 2000
        windowed, longest, letters = expected_events(first)
        got = [
            latest(bootstrap, outs[0]),
            latest(bootstrap, outs[1]),
            latest(bootstrap, outs[2], serdes.JSON.deserialize),
        ]
        assert got == [windowed, longest, letters]
        # Output records carry the timestamps of the records that made them (an hour
        # old), not the time of writing: the daemon's semantics.
        last_event = first[-1][2]
        for topic in outs:
            assert max(m.timestamp for m in consume_all(bootstrap, topic)) == last_event
        wait_until(
            lambda: (
                [
                    latest(bootstrap, daemon_outs[0]),
                    latest(bootstrap, daemon_outs[1]),
                    latest(bootstrap, daemon_outs[2], serdes.JSON.deserialize),
                ]
                == got
            ),
            90,
            interval=1.0,
            message="the daemon's results never matched the backfill's",
        )
    finally:
        assert daemon.close(30)

    # The windowed changelog keys are the window store's (key bytes + 8-byte start);
    # it holds the windows a daemon would still keep (retention: size + grace), among
    # them every key's latest window.
    changelog = consume_all(bootstrap, f"{app_id}-per-minute-changelog", idle=0.5)
    stored = {m.key: serdes.INT64.deserialize(m.value) for m in changelog}
    assert stored and stored.items() <= windowed.items()
    last_window: dict[bytes, bytes] = {}
    for key in sorted(windowed):
        last_window[key[:-8]] = key
    assert set(last_window.values()) <= set(stored)
    assert len(stored) < len(windowed)  # expired windows are not restored

    second = events(2000, 1000, base)
    produce_events(bootstrap, source, second)
    continued = app(events_topology(source, *outs), app_id, bootstrap, tmp_path / "fresh")
    continued.start()
    try:
        want = list(expected_events(first + second))
        wait_until(
            lambda: (
                [
                    latest(bootstrap, outs[0]),
                    latest(bootstrap, outs[1]),
                    latest(bootstrap, outs[2], serdes.JSON.deserialize),
                ]
                == want
            ),
            90,
            interval=1.0,
            message="the continued windows/reduce/aggregate never became exact",
        )
    finally:
        assert continued.close(30)


def test_the_backfill_reads_with_the_project_source_too(spark: Any, bootstrap: str) -> None:
    """`source="streams-kafka"`: the same results, changelogs and committed offsets."""
    names = [unique_name(f"bf-sk-{n}") for n in ("in", "pm", "long", "letter")]
    for topic in names:
        create_topic(bootstrap, topic, 3)
    source, outs = names[0], names[1:]
    base = (int(time.time() * 1000) - 3_600_000) // MINUTE * MINUTE
    history = events(0, 1500, base)
    produce_events(bootstrap, source, history)
    app_id = unique_name("bf-sk")
    config = StreamsConfig.from_dict({"application.id": app_id, "bootstrap.servers": bootstrap})
    result = run_backfill(spark, events_topology(source, *outs), config, source=STREAMS_KAFKA)
    assert result.records_read == 1500
    got = [
        latest(bootstrap, outs[0]),
        latest(bootstrap, outs[1]),
        latest(bootstrap, outs[2], serdes.JSON.deserialize),
    ]
    assert got == list(expected_events(history))
    assert committed_offsets(bootstrap, app_id, source) == end_offsets(bootstrap, source)
    changelog = consume_all(bootstrap, f"{app_id}-longest-changelog", idle=0.5)
    assert {m.key: serdes.INT64.deserialize(m.value) for m in changelog} == got[1]
    for m in changelog:
        assert m.key is not None and m.partition == default_partition(m.key, 3)


def test_a_bad_source_is_refused_by_name(spark: Any) -> None:
    config = StreamsConfig.from_dict({"application.id": "x", "bootstrap.servers": "unused:1"})
    with pytest.raises(BackfillError, match="source must be one of kafka, streams-kafka"):
        run_backfill(spark, word_count("a", "b"), config, source="jdbc")


# -- refusals and failures --------------------------------------------------------------


class Shout(Processor):
    def init(self, context: Any) -> None:
        self.context = context

    def process(self, record: Record) -> None:
        self.context.forward(record.with_value(record.value.upper()))


def test_a_processor_api_step_is_refused_by_name(spark: Any, bootstrap: str) -> None:
    builder = StreamsBuilder()
    builder.stream("any-topic").process(Shout, name="shout").to("any-output")
    config = StreamsConfig.from_dict(
        {"application.id": unique_name("bf-pap"), "bootstrap.servers": bootstrap}
    )
    with pytest.raises(BackfillError, match="'shout' is a Processor API step"):
        run_backfill(spark, builder.build(), config)


def test_a_bad_record_under_log_and_fail_fails_the_backfill_with_its_offset(
    spark: Any, bootstrap: str, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    source, sink = unique_name("bf-bad"), unique_name("bf-bad-out")
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    produce(bootstrap, source, [("a", serdes.INT64.serialize(1)), ("b", b"abc")])
    monkeypatch.setenv("SPARK_TEST_SOURCE", source)
    monkeypatch.setenv("SPARK_TEST_SINK", sink)
    app_id = unique_name("bf-bad")
    base = [
        "backfill",
        "tests.integration.test_spark_backfill:strict_longs_from_env",
        "--quiet",
        "--set",
        f"bootstrap.servers={bootstrap}",
        "--set",
        "default.value.serde=int64",
    ]
    assert main([*base, "--set", f"application.id={app_id}"]) == 1
    err = capsys.readouterr().err
    assert f"deserialization error at {source}-0@1" in err
    assert committed_offsets(bootstrap, app_id, source) == {}  # nothing committed

    skip = [*base, "--set", f"application.id={app_id}-skip"]
    assert main([*skip, "--set", "deserialization.exception.handler=log_and_continue"]) == 0
    assert [serdes.INT64.deserialize(m.value) for m in consume_all(bootstrap, sink)] == [2]


def test_missing_java_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("JAVA_HOME", str(tmp_path))
    with pytest.raises(JavaMissingError, match="Java runtime, version 17 or newer.*no bin/java"):
        check_java()
    monkeypatch.delenv("JAVA_HOME")
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(JavaMissingError, match="no `java` on PATH"):
        check_java()


def test_tables_joins_and_chained_aggregations_are_refused_by_name() -> None:
    from runtime.spark.plan import check_nodes, plan_backfill

    builder = StreamsBuilder()
    table = builder.table("customers", store="customer-table")
    builder.stream("orders").join(table, lambda order, customer: order).to("out")
    with pytest.raises(BackfillError, match="builder.table"):
        check_nodes(builder.build())

    builder = StreamsBuilder()
    (
        builder.stream("words", key_serde=serdes.STRING)
        .group_by_key()
        .count(store="first")
        .to_stream()
        .group_by_key()
        .count(store="second")
    )
    topology = builder.build()
    config = StreamsConfig.from_dict({"application.id": "x", "bootstrap.servers": "unused:1"})
    from runtime.kafka.topics import TopicLayout

    layout = TopicLayout(
        sources={0: ["words"]}, partitions={"words": 2}, subtopology_of={"words": 0}, changelogs={}
    )
    with pytest.raises(BackfillError, match="chained aggregations"):
        plan_backfill(topology, config, layout)


def test_the_plan_of_a_word_count() -> None:
    from runtime.kafka.topics import TopicLayout
    from runtime.spark.plan import plan_backfill

    topology = word_count("lines", "counts")
    config = StreamsConfig.from_dict({"application.id": "wc", "bootstrap.servers": "unused:1"})
    layout = TopicLayout(
        sources={0: ["lines"], 1: ["wc-word-counts-repartition"]},
        partitions={"lines": 4, "counts": 2, "wc-word-counts-repartition": 4},
        subtopology_of={"lines": 0, "wc-word-counts-repartition": 1},
        changelogs={"wc-word-counts-changelog": 1},
    )
    plan = plan_backfill(topology, config, layout)
    assert [s.history_topics for s in plan.stages] == [("lines",), ()]
    assert [s.handed_topics for s in plan.stages] == [(), ("wc-word-counts-repartition",)]
    (agg,) = plan.stages[1].aggregates
    assert (agg.store, agg.changelog, agg.is_count, agg.windowed) == (
        "word-counts",
        "wc-word-counts-changelog",
        True,
        False,
    )
    assert plan.output_topics == ("counts",)
    assert plan.kafka_topics == ("counts", "wc-word-counts-changelog")
    assert not plan.needs_order
    from pyspark import cloudpickle

    shipped = cloudpickle.loads(cloudpickle.dumps(plan))  # plans ship to Spark workers
    assert [d.name for d in shipped.stages[0].defs] == [d.name for d in plan.stages[0].defs]
