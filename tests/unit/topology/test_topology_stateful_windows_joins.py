"""Windowed aggregations, the windowed serde, and stream-table joins, on real stores."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from runtime.state.builders import StoreSpec
from runtime.topology import (
    KStream,
    StreamsBuilder,
    TimeWindows,
    Topology,
    TopologyError,
    Windowed,
    serdes,
)
from runtime.topology.testing import RecordingTaskContext, Sent


def windowed_output(sent: list[Sent], size: int) -> list[tuple[Any, int, int, Any]]:
    key_serde = serdes.windowed(serdes.STRING, size)
    rows = []
    for s in sent:
        w = key_serde.deserialize(s.key)
        assert w is not None
        rows.append((w.key, w.start, w.end, serdes.INT64.deserialize(s.value)))
    return rows


def windowed_count(windows: TimeWindows) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .windowed_by(windows)
        .count(store="counts")
        .to_stream()
        .to("out")  # key serde: serdes.windowed(STRING, size) by default
    )
    return builder.build()


def run(
    tmp_path: Path, windows: TimeWindows, records: list[tuple[str, int]], **options: Any
) -> RecordingTaskContext:
    ctx = RecordingTaskContext(state_dir=tmp_path, **options)
    graph = ctx.instantiate(windowed_count(windows).subtopologies[0])
    for key, ts in records:
        ctx.process(graph, "in", key, "v", ts)
    ctx.commit()
    return ctx


# -- TimeWindows ------------------------------------------------------------------


def test_time_windows_constructors_and_validation() -> None:
    assert TimeWindows.of_size_with_no_grace(10) == TimeWindows(10, 10, 0)
    assert TimeWindows.of_size_and_grace(timedelta(seconds=1), timedelta(milliseconds=200)) == (
        TimeWindows(1000, grace_ms=200)
    )
    hopping = TimeWindows.of_size_and_grace(10, 3).advance_by(5)
    assert (hopping.size_ms, hopping.advance_ms, hopping.grace_ms) == (10, 5, 3)
    assert hopping.retention_ms == 13 and not hopping.tumbling
    assert list(TimeWindows(10).window_starts(25)) == [20]
    assert list(hopping.window_starts(12)) == [5, 10]
    assert list(hopping.window_starts(3)) == [0]
    assert list(TimeWindows(10).window_starts(-1)) == []
    for bad in ((0,), (10, 11), (10, 0), (10, None, -1)):
        with pytest.raises(ValueError):
            TimeWindows(*bad)
    with pytest.raises(TypeError):
        TimeWindows(1.5)  # type: ignore[arg-type]


# -- windowed aggregations ----------------------------------------------------------


def test_tumbling_windows_count_per_window(tmp_path: Path) -> None:
    windows = TimeWindows.of_size_and_grace(10, 100)  # keeps every window in the store
    ctx = run(tmp_path, windows, [("a", 0), ("a", 5), ("b", 9), ("a", 10), ("a", 25)])
    assert windowed_output(ctx.output("out"), 10) == [
        ("a", 0, 10, 2),
        ("b", 0, 10, 1),
        ("a", 10, 20, 1),
        ("a", 20, 30, 1),
    ]
    assert ctx.dropped == {}
    store = ctx.stores["counts"]
    assert [(start, serdes.INT64.deserialize(v)) for start, v in store.fetch(b"a", 0, 100)] == [
        (0, 2),
        (10, 1),
        (20, 1),
    ]
    # changelog keys are the store's composite keys: key + 8-byte window start
    assert ctx.changelog("counts")[0].key == b"a" + (0).to_bytes(8, "big")


def test_hopping_windows_count_every_overlapping_window(tmp_path: Path) -> None:
    windows = TimeWindows(10, advance_ms=5, grace_ms=100)
    ctx = run(tmp_path, windows, [("a", 7), ("a", 12), ("a", 3)])
    assert sorted(windowed_output(ctx.output("out"), 10)) == [
        ("a", 0, 10, 2),  # 7, 3
        ("a", 5, 15, 2),  # 7, 12
        ("a", 10, 20, 1),  # 12
    ]


def test_late_records_are_dropped_and_counted(tmp_path: Path) -> None:
    ctx = run(
        tmp_path,
        TimeWindows.of_size_and_grace(10, 5),
        [("a", 20), ("a", 14), ("a", 3), ("a", 9)],
        cache_max_bytes=0,
    )
    # stream time 20, grace 5: window [10, 20) still open (20 > 15), [0, 10) closed
    assert windowed_output(ctx.output("out"), 10) == [("a", 20, 30, 1), ("a", 10, 20, 1)]
    assert ctx.dropped == {"late": 2}

    ctx = run(tmp_path / "no-grace", TimeWindows(10), [("a", 20), ("a", 19), ("a", 20)])
    assert windowed_output(ctx.output("out"), 10) == [("a", 20, 30, 2)]
    assert ctx.dropped == {"late": 1}


def test_dropped_records_do_not_close_windows(tmp_path: Path) -> None:
    # Kafka Streams' window aggregation keeps its own stream time: a record
    # it drops (here a null key at 100) does not advance it, so [0, 10)
    # is still open for the record at 3 (the task's stream time, 100, would
    # have closed it). A windowed count counts null values, as Kafka Streams'.
    ctx = RecordingTaskContext(state_dir=tmp_path, cache_max_bytes=0)
    graph = ctx.instantiate(windowed_count(TimeWindows.of_size_and_grace(10, 5)).subtopologies[0])
    for key, value, ts in [("a", "v", 5), (None, "v", 100), ("a", None, 3)]:
        ctx.process(graph, "in", key, value, ts)
    assert windowed_output(ctx.output("out"), 10) == [("a", 0, 10, 1), ("a", 0, 10, 2)]
    assert ctx.dropped == {"null_key": 1}


def test_hopping_late_records_count_once_per_closed_window(tmp_path: Path) -> None:
    windows = TimeWindows(10, advance_ms=5)
    ctx = run(tmp_path, windows, [("a", 20), ("a", 12)])
    # 12 is in [5, 15) (closed: 15 <= 20) and [10, 20) (closed: 20 <= 20)
    assert ctx.dropped == {"late": 2}
    assert sorted(windowed_output(ctx.output("out"), 10)) == [("a", 15, 25, 1), ("a", 20, 30, 1)]


def test_expired_windows_leave_the_store(tmp_path: Path) -> None:
    ctx = run(tmp_path, TimeWindows.of_size_and_grace(10, 5), [("a", 1), ("b", 100)])
    store = ctx.stores["counts"]
    assert list(store.fetch(b"a", 0, 1000)) == []  # retention 15 < 100 - 0
    assert [start for start, _ in store.fetch(b"b", 0, 1000)] == [100]


def test_windowed_reduce_and_aggregate_and_null_values(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    windowed = (
        builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.INT64)
        .group_by_key()
        .windowed_by(TimeWindows(100))
    )
    windowed.reduce(lambda a, b: max(a, b), store="max").to_stream().to("max")
    windowed.aggregate(
        lambda: 0, lambda k, v, agg: agg + v, store="sum", value_serde=serdes.INT64
    ).to_stream().to("sum")
    topology = builder.build()
    assert topology.subtopologies[0].store_specs == [
        StoreSpec("max", kind="window", window_size_ms=100, retention_ms=100),
        StoreSpec("sum", kind="window", window_size_ms=100, retention_ms=100),
    ]
    ctx = RecordingTaskContext(state_dir=tmp_path)
    graph = ctx.instantiate(topology.subtopologies[0])
    for value, ts in [(3, 1), (7, 2), (None, 3), (5, 150)]:
        ctx.process(graph, "in", "k", value, ts)
    ctx.commit()
    assert windowed_output(ctx.output("max"), 100) == [("k", 0, 100, 7), ("k", 100, 200, 5)]
    assert windowed_output(ctx.output("sum"), 100) == [("k", 0, 100, 10), ("k", 100, 200, 5)]
    assert ctx.dropped == {"null_value": 2}


def test_windowed_count_after_group_by_repartitions(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("in", value_serde=serdes.STRING)
        .group_by(lambda k, v: v, key_serde=serdes.STRING)
        .windowed_by(TimeWindows(timedelta(minutes=1)))
        .count(store="per-minute")
    )
    topology = builder.build()
    first, second = topology.subtopologies
    assert [t.name for t in first.sinks] == ["per-minute-repartition"]
    assert second.store_specs == [
        StoreSpec("per-minute", kind="window", window_size_ms=60_000, retention_ms=60_000)
    ]


# -- the windowed serde ---------------------------------------------------------------


def test_windowed_serde_uses_kafkas_time_windowed_layout() -> None:
    serde = serdes.windowed(serdes.STRING, 60_000)
    data = serde.serialize(Windowed("user-1", 120_000, 180_000))
    assert data == b"user-1" + (120_000).to_bytes(8, "big")
    assert serde.deserialize(data) == Windowed("user-1", 120_000, 180_000)
    assert serde.serialize(None) is None and serde.deserialize(None) is None
    with pytest.raises(TypeError, match="Windowed"):
        serde.serialize("user-1")
    with pytest.raises(ValueError, match="at least 8 bytes"):
        serde.deserialize(b"abc")
    with pytest.raises(ValueError, match="not resolved"):
        serdes.windowed(None, 10).serialize(Windowed("k", 0, 10))


def test_windowed_to_stream_key_serde_resolves_the_default(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    table = builder.stream("in").group_by_key().windowed_by(TimeWindows(10)).count()
    stream = table.to_stream()
    assert isinstance(stream.key_serde, serdes.TimeWindowedSerde)
    assert stream.key_serde.inner is None  # the configured default, resolved at init
    stream.to("out")
    ctx = RecordingTaskContext(state_dir=tmp_path, default_key_serde=serdes.STRING)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "in", "k", b"v", 12)
    ctx.commit()
    assert [s.key for s in ctx.output("out")] == [b"k" + (10).to_bytes(8, "big")]


# -- stream-table joins ------------------------------------------------------------


def _join_topology(left: bool) -> tuple[Topology, KStream]:
    builder = StreamsBuilder()
    users = builder.table("users", key_serde=serdes.STRING, value_serde=serdes.JSON)
    clicks = builder.stream("clicks", key_serde=serdes.STRING, value_serde=serdes.STRING)
    join = clicks.left_join if left else clicks.join
    joined = join(users, lambda click, user: {"click": click, "user": user})
    joined.to("enriched", value_serde=serdes.JSON)
    return builder.build(), joined


def _feed_join(tmp_path: Path, left: bool) -> RecordingTaskContext:
    topology, _ = _join_topology(left)
    (sub,) = topology.subtopologies  # stream and table share the store's subtopology
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory")
    graph = ctx.instantiate(sub)
    ctx.process(graph, "users", "u1", {"name": "Ann"}, 1)
    ctx.process(graph, "clicks", "u1", "home", 2)  # the table is read through its cache
    ctx.process(graph, "clicks", "u2", "cart", 3)
    ctx.process(graph, "clicks", None, "nokey", 4)
    ctx.process(graph, "clicks", "u1", None, 5)
    return ctx


def _enriched(ctx: RecordingTaskContext) -> list[tuple[Any, Any, int]]:
    return [
        (serdes.STRING.deserialize(s.key), serdes.JSON.deserialize(s.value), s.timestamp)
        for s in ctx.output("enriched")
    ]


def test_stream_table_join(tmp_path: Path) -> None:
    ctx = _feed_join(tmp_path, left=False)
    assert _enriched(ctx) == [("u1", {"click": "home", "user": {"name": "Ann"}}, 2)]
    assert ctx.dropped == {"null_key": 1, "null_value": 1}


def test_stream_table_left_join(tmp_path: Path) -> None:
    ctx = _feed_join(tmp_path, left=True)
    assert _enriched(ctx) == [
        ("u1", {"click": "home", "user": {"name": "Ann"}}, 2),
        ("u2", {"click": "cart", "user": None}, 3),
        (None, {"click": "nokey", "user": None}, 4),
    ]
    assert ctx.dropped == {"null_value": 1}


def test_join_registers_a_copartition_group() -> None:
    topology, joined = _join_topology(left=False)
    (sub,) = topology.subtopologies
    assert sub.copartition_groups == [frozenset({"clicks", "users"})]
    assert joined.value_serde is None and joined.key_serde is serdes.STRING


def test_join_reads_filtered_and_mapped_tables_through_the_store(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    prices = builder.table("prices", key_serde=serdes.STRING, value_serde=serdes.INT64)
    cheap = prices.filter(lambda k, v: v < 10).map_values(lambda v: v * 2)
    orders = builder.stream("orders", key_serde=serdes.STRING, value_serde=serdes.INT64)
    orders.left_join(cheap, lambda qty, doubled: [qty, doubled]).to("out", value_serde=serdes.JSON)
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory")
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "prices", "a", 4)
    ctx.process(graph, "prices", "b", 40)
    ctx.process(graph, "orders", "a", 1)
    ctx.process(graph, "orders", "b", 2)
    assert [serdes.JSON.deserialize(s.value) for s in ctx.output("out")] == [[1, 8], [2, None]]


def test_join_after_a_key_change_repartitions_the_stream_first() -> None:
    builder = StreamsBuilder()
    users = builder.table("users", key_serde=serdes.STRING, value_serde=serdes.STRING)
    clicks = builder.stream("clicks", key_serde=serdes.STRING, value_serde=serdes.STRING)
    rekeyed = clicks.map(lambda k, v: (v, k))
    rekeyed.join(
        users, lambda a, b: a + b, name="by-user", key_serde=serdes.STRING, value_serde="string"
    ).to("out")
    topology = builder.build()
    first, second = topology.subtopologies
    assert [t.name for t in first.sinks] == ["by-user-repartition"]
    assert {t.name for t in second.sources} == {"users", "by-user-repartition"}
    assert second.copartition_groups == [frozenset({"users", "by-user-repartition"})]
    assert second.store_specs == [StoreSpec("users-STATE-STORE-0000000000")]


def test_join_errors() -> None:
    builder = StreamsBuilder()
    stream = builder.stream("in")
    windowed = stream.group_by_key().windowed_by(TimeWindows(10)).count()
    with pytest.raises(TopologyError, match="windowed table cannot be joined"):
        stream.join(windowed, lambda a, b: a)
    with pytest.raises(TopologyError, match="expects a KTable"):
        stream.join(42, lambda a, b: a)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="needs windows=JoinWindows"):
        stream.join(stream, lambda a, b: a)
    other = StreamsBuilder().table("t")
    with pytest.raises(TopologyError, match="one StreamsBuilder"):
        stream.join(other, lambda a, b: a)


def test_windowed_keys_are_partitioned_by_their_inner_key(tmp_path: Path) -> None:
    # As Kafka Streams' WindowedStreamPartitioner: every window of a key goes
    # to the partition of the plain key's bytes.
    from runtime.murmur2 import partition_python

    ctx = RecordingTaskContext(state_dir=tmp_path, cache_max_bytes=0, partitions={"out": 7})
    graph = ctx.instantiate(windowed_count(TimeWindows(10)).subtopologies[0])
    for ts in (5, 15, 25):
        for key in ("a", "b", "c", "d"):
            ctx.process(graph, "in", key, "v", ts)
    sent = ctx.output("out")
    assert len(sent) == 12
    for s in sent:
        assert s.key is not None
        assert s.partition == partition_python(s.key[:-8], 7)
    assert len({s.partition for s in sent}) > 1
