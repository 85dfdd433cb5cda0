"""cogroup (KIP-150): one store and one table for several grouped streams, on real stores."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.topology import StreamsBuilder, TopologyError, serdes
from runtime.topology.session_store import session_windowed
from runtime.topology.session_windows import SessionWindows
from runtime.topology.sliding_windows import SlidingWindows
from runtime.topology.suppressed import BufferConfig, Suppressed
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.windows import TimeWindows

STR = serdes.STRING


def _streams(builder: StreamsBuilder) -> tuple[Any, Any]:
    one = builder.stream("one", key_serde=STR, value_serde=STR)
    two = builder.stream("two", key_serde=STR, value_serde=STR)
    return one, two


def _cogrouped(builder: StreamsBuilder) -> Any:
    one, two = _streams(builder)
    return (
        one.group_by_key()
        .cogroup(lambda key, value, agg: f"{agg}+{value}")
        .cogroup(two.group_by_key(), lambda key, value, agg: f"{agg}-{value}")
    )


def _ctx(tmp_path: Path, cache: int = 0) -> RecordingTaskContext:
    return RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=cache)


def _rows(ctx: RecordingTaskContext, key_serde: Any = STR) -> list[tuple[Any, Any, int]]:
    return [
        (key_serde.deserialize(s.key), STR.deserialize(s.value), s.timestamp)
        for s in ctx.output("out")
    ]


def test_two_streams_aggregate_into_one_table(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    table = _cogrouped(builder).aggregate(lambda: "", store="agg", value_serde=STR)
    table.to_stream().to("out", value_serde=STR)
    topology = builder.build()
    assert len(topology.subtopologies) == 1  # no repartition: both keyed already
    ctx = _ctx(tmp_path)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "one", "a", "1", 5)
    ctx.process(graph, "two", "a", "2", 6)
    ctx.process(graph, "two", "b", "3", 7)
    ctx.process(graph, "one", "a", None, 8)  # null value: dropped, as Kafka Streams'
    ctx.process(graph, "one", None, "x", 9)  # null key: dropped
    ctx.process(graph, "one", "a", "4", 10)
    assert _rows(ctx) == [("a", "+1", 5), ("a", "+1-2", 6), ("b", "-3", 7), ("a", "+1-2+4", 10)]
    assert ctx.dropped["null_value"] == 1 and ctx.dropped["null_key"] == 1
    # One change-logged store holds both inputs' aggregates.
    assert [STR.deserialize(s.value) for s in ctx.changelog("agg")][-1] == "+1-2+4"


def test_caching_on_forwards_once_per_key_per_commit(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    _cogrouped(builder).aggregate(lambda: "", value_serde=STR).to_stream().to(
        "out", value_serde=STR
    )
    ctx = _ctx(tmp_path, cache=1 << 20)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "one", "a", "1", 5)
    ctx.process(graph, "two", "a", "2", 6)
    assert ctx.output("out") == []
    ctx.commit()
    assert _rows(ctx) == [("a", "+1-2", 6)]


def test_topology_names_as_kafka_streams(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    _cogrouped(builder).aggregate(lambda: "", value_serde=STR).to_stream().to("out")
    text = str(builder.build().describe())
    assert "COGROUPKSTREAM-AGGREGATE-STATE-STORE-0000000002" in text
    assert "Processor: COGROUPKSTREAM-AGGREGATE-0000000003 (stores: [COGROUPKSTREAM" in text
    assert "Processor: COGROUPKSTREAM-MERGE-0000000005 (stores: [])" in text

    builder = StreamsBuilder()
    _cogrouped(builder).aggregate(lambda: "", store="s", name="test").to_stream().to("out")
    text = str(builder.build().describe())
    for node in ("test-cogroup-agg-0", "test-cogroup-agg-1", "test-cogroup-merge"):
        assert f"Processor: {node} " in text


def test_each_repartitioned_input_gets_its_own_topic(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    one, two = _streams(builder)
    three = builder.stream("three", key_serde=STR, value_serde=STR)
    table = (
        one.select_key(lambda k, v: v[0])
        .group_by_key(key_serde=STR)
        .cogroup(lambda key, value, agg: agg + 1)
        .cogroup(two.group_by(lambda k, v: v[0], key_serde=STR), lambda key, value, agg: agg + 10)
        .cogroup(three.group_by_key(), lambda key, value, agg: agg + 100)
        .aggregate(lambda: 0, store="c", value_serde=serdes.INT64)
    )
    table.to_stream().to("out", value_serde=serdes.INT64)
    topology = builder.build()
    text = str(topology.describe())
    assert "(topic: c-repartition)" in text and "(topic: c-1-repartition)" in text
    aggregation = topology.subtopologies[-1]
    assert {"c-repartition", "c-1-repartition", "three"} in [
        set(g) for g in aggregation.copartition_groups
    ]

    # Records flow through both repartition topics into the one store.
    upstream = topology.subtopologies[:-1]
    ctx = _ctx(tmp_path / "up")
    for sub in upstream:
        graph = ctx.instantiate(sub)
        for topic, value in (("one", "x1"), ("two", "x2"), ("one", "y3")):
            if topic in graph.sources:
                ctx.process(graph, topic, "k", value, 1)
    down = _ctx(tmp_path / "down")
    graph = down.instantiate(aggregation)
    down.pipe(graph, ctx.sent)
    down.process(graph, "three", "x", "z", 2)
    got = [(STR.deserialize(s.key), serdes.INT64.deserialize(s.value)) for s in down.output("out")]
    assert sorted(got) == sorted([("x", 1), ("y", 1), ("x", 11), ("x", 111)])


def test_named_grouping_names_the_repartition_topic() -> None:
    builder = StreamsBuilder()
    one, two = _streams(builder)
    (
        one.map(lambda k, v: (v, k))
        .group_by_key(name="repartition-test")
        .cogroup(lambda key, value, agg: agg)
        .cogroup(two.group_by_key(), lambda key, value, agg: agg)
        .aggregate(lambda: "", value_serde=STR)
        .to_stream()
        .to("out")
    )
    assert "(topic: repartition-test-repartition)" in str(builder.build().describe())


def test_mistakes_say_what_to_do() -> None:
    builder = StreamsBuilder()
    one, two = _streams(builder)
    grouped = one.group_by_key()
    cogrouped = grouped.cogroup(lambda k, v, a: a)
    with pytest.raises(TopologyError, match="already part"):
        cogrouped.cogroup(grouped, lambda k, v, a: a)
    with pytest.raises(TopologyError, match="KGroupedStream"):
        cogrouped.cogroup(two, lambda k, v, a: a)
    with pytest.raises(TopologyError, match="callable"):
        cogrouped.cogroup(two.group_by_key(), "nope")
    with pytest.raises(TopologyError, match="merger"):
        cogrouped.windowed_by(SessionWindows(10)).aggregate(lambda: 0)
    with pytest.raises(TopologyError, match="only used with SessionWindows"):
        cogrouped.windowed_by(TimeWindows.of_size_with_no_grace(10)).aggregate(
            lambda: 0, lambda k, a, b: a
        )
    with pytest.raises(TopologyError, match="windowed_by"):
        cogrouped.windowed_by(10)


def test_tumbling_windows_share_one_window_store(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    windows = TimeWindows.of_size_and_grace(10, 5)
    table = _cogrouped(builder).windowed_by(windows).aggregate(lambda: "", value_serde=STR)
    table.to_stream().to("out", key_serde=serdes.windowed(STR, 10), value_serde=STR)
    ctx = _ctx(tmp_path)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "one", "a", "1", 1)
    ctx.process(graph, "two", "a", "2", 12)
    ctx.process(graph, "two", "a", "3", 5)
    ctx.process(graph, "one", "a", "4", 30)
    # Not late for the "two" input (its own stream time is 12, as Kafka
    # Streams' per-input processors keep it), but the shared store's time is
    # 30: window 0 is past its retention (size + grace), so it starts over,
    # as in Kafka Streams' segmented store.
    ctx.process(graph, "two", "a", "5", 8)
    ctx.process(graph, "one", "a", "6", 8)  # late for "one" (its stream time is 30)
    rows = [(w.key, w.start, v) for w, v, _ in _rows(ctx, serdes.windowed(STR, 10))]
    assert rows == [
        ("a", 0, "+1"),
        ("a", 10, "-2"),
        ("a", 0, "+1-3"),
        ("a", 30, "+4"),
        ("a", 0, "-5"),
    ]
    assert ctx.dropped["late"] == 1


def test_session_windows_merge_across_inputs(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    table = (
        _cogrouped(builder)
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(10, 20))
        .aggregate(lambda: "", lambda key, a, b: f"{a}{b}", value_serde=STR)
    )
    serde = session_windowed(STR)
    table.to_stream().to("out", value_serde=STR)
    ctx = _ctx(tmp_path)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "one", "a", "1", 0)
    ctx.process(graph, "two", "a", "2", 30)
    ctx.process(graph, "two", "a", "3", 15)  # joins nothing (0 and 30 are > 10 away)
    # "one" merges the session "two" wrote last: one store, shared store time.
    ctx.process(graph, "one", "a", "4", 22)  # merges 15 and 30
    rows = [((w.start, w.end), v) for w, v, _ in _rows(ctx, serde)]
    assert rows == [
        ((0, 0), "+1"),
        ((30, 30), "-2"),
        ((15, 15), "-3"),
        ((15, 15), None),
        ((30, 30), None),
        ((15, 30), "-3-2+4"),
    ]


def test_sliding_windows_and_suppress(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    table = (
        _cogrouped(builder)
        .windowed_by(SlidingWindows.of_time_difference_and_grace(10, 0))
        .aggregate(lambda: "", value_serde=STR)
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
    )
    table.to_stream().to("out", value_serde=STR)
    ctx = _ctx(tmp_path)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "one", "a", "1", 20)
    ctx.process(graph, "two", "a", "2", 25)
    ctx.process(graph, "one", "a", "3", 60)  # closes the windows ending by 60
    rows = [((w.start, w.end), v) for w, v, _ in _rows(ctx, serdes.windowed(STR, 10))]
    # Windows end inclusive; suppressed until stream time reaches their end.
    assert rows == [((10, 20), "+1"), ((15, 25), "+1-2"), ((21, 31), "-2"), ((50, 60), "+3")]


def test_cogrouped_table_can_be_regrouped(tmp_path: Path) -> None:
    """The merge node sends old values when a table re-grouping needs them."""
    builder = StreamsBuilder()
    (
        _cogrouped(builder)
        .aggregate(lambda: "", value_serde=STR)
        .group_by(lambda k, v: ("all", v), key_serde=STR, value_serde=STR)
        .count()
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )
    topology = builder.build()
    assert len(topology.subtopologies) == 2
    ctx = _ctx(tmp_path)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "one", "a", "1", 5)
    ctx.process(graph, "two", "a", "2", 6)
    repartition = [s for s in ctx.sent if s.topic.endswith("-repartition")]
    # The second update carries the first as its old value (to subtract).
    assert len(repartition) == 2 and b"+1" in (repartition[1].value or b"")


def test_windowed_cogroups_opt_out_of_key_parallel() -> None:
    for windows, expected in (
        (None, True),
        (TimeWindows.of_size_and_grace(10, 0), False),
        (SessionWindows(10), False),
        (SlidingWindows.of_time_difference_and_grace(10, 0), False),
    ):
        builder = StreamsBuilder()
        cogrouped = _cogrouped(builder)
        if windows is None:
            table = cogrouped.aggregate(lambda: "", value_serde=STR)
        elif isinstance(windows, SessionWindows):
            table = cogrouped.windowed_by(windows).aggregate(lambda: "", lambda k, a, b: a + b)
        else:
            table = cogrouped.windowed_by(windows).aggregate(lambda: "")
        table.to_stream().to("out")
        assert builder.build().subtopologies[0].key_parallel is expected, windows


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from(["one", "two"]), st.sampled_from(["a", "b", "c"])),
        max_size=30,
    )
)
def test_cogroup_equals_the_sum_of_its_inputs(records: list[tuple[str, str]]) -> None:
    """Invariant: each input's aggregator sees exactly its records, in one
    aggregate per key: +1 per "one" record, +1000 per "two" record."""
    builder = StreamsBuilder()
    one, two = _streams(builder)
    (
        one.group_by_key()
        .cogroup(lambda k, v, agg: agg + 1)
        .cogroup(two.group_by_key(), lambda k, v, agg: agg + 1000)
        .aggregate(lambda: 0, value_serde=serdes.INT64)
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )
    with tempfile.TemporaryDirectory() as tmp:
        ctx = _ctx(Path(tmp))
        graph = ctx.instantiate(builder.build().subtopologies[0])
        for i, (topic, key) in enumerate(records):
            ctx.process(graph, topic, key, "v", i)
        final = {
            STR.deserialize(s.key): serdes.INT64.deserialize(s.value) for s in ctx.output("out")
        }
        ctx.close()
    want: dict[str, int] = {}
    for topic, key in records:
        want[key] = want.get(key, 0) + (1 if topic == "one" else 1000)
    assert final == want
