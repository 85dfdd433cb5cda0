"""The stateless DSL: each operation's output on sample records, run without Kafka."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import pytest

from runtime.topology import (
    KStream,
    Processor,
    Record,
    StreamsBuilder,
    Topology,
    TopologyError,
    serdes,
)
from runtime.topology.testing import RecordingTaskContext


class _Collect(Processor):
    def __init__(self, seen: list[Record]) -> None:
        self.seen = seen

    def process(self, record: Record) -> None:
        self.seen.append(record)


def run(
    topology: Topology,
    inputs: Iterable[tuple[str, Any, Any]],
    subtopology: int = 0,
    ctx: RecordingTaskContext | None = None,
) -> RecordingTaskContext:
    """Feed (topic, key, value) records into one subtopology; return the context."""
    ctx = ctx or RecordingTaskContext(
        default_key_serde=serdes.STRING, default_value_serde=serdes.STRING
    )
    graph = topology.subtopologies[subtopology].instantiate()
    graph.init(ctx)
    for ts, (topic, key, value) in enumerate(inputs):
        graph.sources[topic].process(Record(key, value, ts, None, topic, 0, ts))
    graph.close()
    return ctx


def out(
    ctx: RecordingTaskContext,
    topic: str,
    key_serde: serdes.Serde = serdes.STRING,
    value_serde: serdes.Serde = serdes.STRING,
) -> list[tuple[Any, Any]]:
    return [
        (key_serde.deserialize(s.key), value_serde.deserialize(s.value))
        for s in ctx.sent
        if s.topic == topic
    ]


def _any(key: Any, value: Any) -> bool:
    return True


SAMPLE = [("in", "a", "apple"), ("in", "b", "banana"), ("in", None, "cherry"), ("in", "d", "")]


def single(op: Any) -> Topology:
    """in -> op(stream) -> out."""
    builder = StreamsBuilder()
    op(builder.stream("in")).to("out")
    return builder.build()


def test_filter_and_filter_not() -> None:
    keep = run(single(lambda s: s.filter(lambda k, v: "an" in v)), SAMPLE)
    drop = run(single(lambda s: s.filter_not(lambda k, v: "an" in v)), SAMPLE)
    assert out(keep, "out") == [("b", "banana")]
    assert out(drop, "out") == [("a", "apple"), (None, "cherry"), ("d", "")]


def test_map_changes_key_and_value() -> None:
    ctx = run(single(lambda s: s.map(lambda k, v: (v, k or "-"))), SAMPLE[:3])
    assert out(ctx, "out") == [("apple", "a"), ("banana", "b"), ("cherry", "-")]


def test_map_values_keeps_key_and_metadata() -> None:
    seen: list[Record] = []
    builder = StreamsBuilder()
    s = builder.stream("in").map_values(str.upper)
    s.process(lambda: _Collect(seen))
    s.to("out")
    ctx = run(builder.build(), SAMPLE[:2])
    assert out(ctx, "out") == [("a", "APPLE"), ("b", "BANANA")]
    assert [(r.topic, r.partition, r.offset, r.timestamp) for r in seen] == [
        ("in", 0, 0, 0),
        ("in", 0, 1, 1),
    ]


def test_flat_map_and_flat_map_values() -> None:
    fm = run(single(lambda s: s.flat_map(lambda k, v: [(c, k) for c in v[:2]])), SAMPLE[:2])
    assert out(fm, "out") == [("a", "a"), ("p", "a"), ("b", "b"), ("a", "b")]
    fmv = run(single(lambda s: s.flat_map_values(lambda v: v.split("a"))), SAMPLE[:2])
    assert out(fmv, "out") == [
        ("a", ""),
        ("a", "pple"),
        ("b", "b"),
        ("b", "n"),
        ("b", "n"),
        ("b", ""),
    ]
    empty = run(single(lambda s: s.flat_map_values(lambda v: [])), SAMPLE)
    assert out(empty, "out") == []


def test_flat_map_values_keeps_timestamp() -> None:
    ctx = run(single(lambda s: s.flat_map_values(lambda v: [v, v])), SAMPLE[:2])
    assert [s.timestamp for s in ctx.sent] == [0, 0, 1, 1]


def test_peek_and_foreach() -> None:
    peeked: list[tuple[Any, Any]] = []
    each: list[tuple[Any, Any]] = []
    builder = StreamsBuilder()
    stream = builder.stream("in").peek(lambda k, v: peeked.append((k, v)))
    stream.to("out")
    stream.foreach(lambda k, v: each.append((k, v)))
    ctx = run(builder.build(), SAMPLE[:2])
    assert peeked == each == [("a", "apple"), ("b", "banana")]
    assert out(ctx, "out") == [("a", "apple"), ("b", "banana")]


def test_a_stream_used_twice_forwards_to_both_in_order() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in")
    s.map_values(str.upper).to("up")
    s.to("same")
    ctx = run(builder.build(), SAMPLE[:2])
    assert [x.topic for x in ctx.sent] == ["up", "same", "up", "same"]


def test_headers_and_timestamp_reach_the_sink() -> None:
    topology = single(lambda s: s.map_values(str.upper))
    ctx = RecordingTaskContext(default_key_serde=serdes.STRING, default_value_serde=serdes.STRING)
    graph = topology.subtopologies[0].instantiate()
    graph.init(ctx)
    graph.sources["in"].process(Record("k", "v", 1234, [("h", b"1")]))
    (sent,) = ctx.sent
    assert (sent.timestamp, sent.headers, sent.partition) == (1234, [("h", b"1")], None)


# -- split / branch -------------------------------------------------------------


def _split_topology(with_default: bool) -> tuple[Topology, dict[str, KStream]]:
    builder = StreamsBuilder()
    branched = (
        builder.stream("in")
        .split(name="fruit-")
        .branch(lambda k, v: v.startswith("a"), name="a")
        .branch(lambda k, v: "an" in v)
        .branch(lambda k, v: v.startswith("b"), name="b")  # shadowed by the one above
    )
    branches = (
        branched.default_branch(name="other") if with_default else branched.no_default_branch()
    )
    for name, stream in branches.items():
        stream.to(name)
    return builder.build(), branches


def test_split_routes_to_first_match_and_default() -> None:
    topology, branches = _split_topology(with_default=True)
    assert list(branches) == ["fruit-a", "fruit-2", "fruit-b", "fruit-other"]
    ctx = run(topology, SAMPLE)
    assert out(ctx, "fruit-a") == [("a", "apple")]
    assert out(ctx, "fruit-2") == [("b", "banana")]
    assert out(ctx, "fruit-b") == []
    assert out(ctx, "fruit-other") == [(None, "cherry"), ("d", "")]


def test_split_without_default_drops_unmatched() -> None:
    topology, branches = _split_topology(with_default=False)
    assert list(branches) == ["fruit-a", "fruit-2", "fruit-b"]
    ctx = run(topology, SAMPLE)
    assert [s.topic for s in ctx.sent] == ["fruit-a", "fruit-2"]


def test_split_generated_names_follow_kafka_streams() -> None:
    builder = StreamsBuilder()
    branches = (
        builder.stream("in")
        .split()
        .branch(lambda k, v: True)
        .branch(lambda k, v: True, name="x")
        .default_branch()
    )
    assert list(branches) == [
        "KSTREAM-BRANCH-00000000011",
        "KSTREAM-BRANCH-0000000001x",
        "KSTREAM-BRANCH-00000000010",
    ]
    # each branch advanced the shared counter
    assert branches["KSTREAM-BRANCH-00000000010"].filter(_any).name == "KSTREAM-FILTER-0000000005"


def test_split_is_finished_after_default_branch() -> None:
    builder = StreamsBuilder()
    branched = builder.stream("in").split().branch(lambda k, v: True)
    branched.no_default_branch()
    with pytest.raises(TopologyError, match="already finished"):
        branched.branch(lambda k, v: True)


def test_old_branch_api() -> None:
    builder = StreamsBuilder()
    a, an = builder.stream("in").branch(lambda k, v: v.startswith("a"), lambda k, v: "an" in v)
    a.to("a")
    an.to("an")
    assert [a.name, an.name] == ["KSTREAM-BRANCHCHILD-0000000002", "KSTREAM-BRANCHCHILD-0000000003"]
    ctx = run(builder.build(), SAMPLE)
    assert [(s.topic, s.key) for s in ctx.sent] == [("a", b"a"), ("an", b"b")]
    with pytest.raises(TopologyError):
        builder.stream("other").branch()


def test_merge() -> None:
    builder = StreamsBuilder()
    left = builder.stream("left")
    right = builder.stream("right").map_values(str.upper)
    left.merge(right).to("out")
    topology = builder.build()
    assert len(topology.subtopologies) == 1
    assert {t.name for t in topology.subtopologies[0].sources} == {"left", "right"}
    ctx = run(topology, [("left", "1", "x"), ("right", "2", "y"), ("left", "3", "z")])
    assert out(ctx, "out") == [("1", "x"), ("2", "Y"), ("3", "z")]


def test_merge_rejects_foreign_streams() -> None:
    other = StreamsBuilder().stream("x")
    with pytest.raises(TopologyError, match="same StreamsBuilder"):
        StreamsBuilder().stream("y").merge(other)
    with pytest.raises(TopologyError):
        StreamsBuilder().stream("y").merge("x")  # type: ignore[arg-type]


def test_stream_of_several_topics() -> None:
    builder = StreamsBuilder()
    builder.stream(["t1", "t2"]).to("out")
    topology = builder.build()
    graph = topology.subtopologies[0].instantiate()
    assert graph.sources["t1"] is graph.sources["t2"]
    assert "Source: KSTREAM-SOURCE-0000000000 (topics: [t1, t2])" in topology.describe()


# -- serdes -----------------------------------------------------------------------


def test_default_serdes_are_used_when_none_given() -> None:
    topology = single(lambda s: s)
    ctx = RecordingTaskContext(default_key_serde=serdes.JSON, default_value_serde=serdes.INT64)
    graph = topology.subtopologies[0].instantiate()
    graph.init(ctx)
    source = graph.sources["in"]
    source.process(source.deserialize(b'{"id":1}', b"\x00" * 7 + b"\x05", 9, None, "in", 0, 0))
    (sent,) = ctx.sent
    assert (sent.key, sent.value) == (b'{"id":1}', b"\x00" * 7 + b"\x05")


def test_default_serde_may_be_a_config_name() -> None:
    ctx = RecordingTaskContext(default_key_serde="string", default_value_serde="int64")
    graph = single(lambda s: s).subtopologies[0].instantiate()
    graph.init(ctx)
    graph.sources["in"].process(Record("k", 7))
    assert (ctx.sent[0].key, ctx.sent[0].value) == (b"k", b"\x00" * 7 + b"\x07")


def test_missing_default_serde_fails_at_init() -> None:
    graph = single(lambda s: s).subtopologies[0].instantiate()
    with pytest.raises(ValueError, match="default.key.serde"):
        graph.init(RecordingTaskContext(default_key_serde=None))


def test_stream_serdes_flow_to_sinks() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.INT64)
    s.filter(lambda k, v: True).to("kept")  # both serdes known
    s.map_values(str).to("mapped")  # value serde unknown -> default (JSON here)
    s.to("explicit", value_serde=serdes.STRING)  # an explicit serde wins over the stream's
    ctx = RecordingTaskContext(default_key_serde=serdes.BYTES, default_value_serde=serdes.JSON)
    graph = builder.build().subtopologies[0].instantiate()
    graph.init(ctx)
    source = graph.sources["in"]
    record = source.deserialize(b"k", serdes.INT64.serialize(42), 0, None, "in", 0, 0)
    assert (record.key, record.value) == ("k", 42)
    with pytest.raises(TypeError, match="STRING serde expects str"):
        source.process(record)  # the "explicit" sink's STRING serde gets the int 42
    kept, mapped = ctx.sent
    assert (kept.topic, kept.key, kept.value) == ("kept", b"k", serdes.INT64.serialize(42))
    assert (mapped.topic, mapped.key, mapped.value) == ("mapped", b"k", b'"42"')


def test_deserialize_raises_on_bad_data() -> None:
    builder = StreamsBuilder()
    builder.stream("in", value_serde=serdes.INT64).to("out")
    graph = builder.build().subtopologies[0].instantiate()
    graph.init(RecordingTaskContext())
    with pytest.raises(ValueError):
        graph.sources["in"].deserialize(None, b"\x01", 0, None, "in", 0, 0)
    record = graph.sources["in"].deserialize(None, None, 5, [("h", None)], "in", 3, 17)
    assert (record.key, record.value, record.timestamp, record.headers) == (
        None,
        None,
        5,
        [("h", None)],
    )
    assert (record.topic, record.partition, record.offset) == ("in", 3, 17)


def test_serde_arguments_are_checked_at_build_time() -> None:
    builder = StreamsBuilder()
    with pytest.raises(TopologyError, match="instance"):
        builder.stream("a", key_serde=serdes.StringSerde)
    with pytest.raises(TopologyError, match="serialize"):
        builder.stream("b", value_serde=object())
    with pytest.raises(TopologyError, match="unknown serde"):
        builder.stream("c", value_serde="nope")
    stream = builder.stream("d", key_serde="string")
    assert stream.key_serde is serdes.STRING


# -- names and build-time errors -------------------------------------------------


def test_generated_names() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in")
    assert s.name == "KSTREAM-SOURCE-0000000000"
    assert s.filter(_any).name == "KSTREAM-FILTER-0000000001"
    assert s.filter_not(_any).name == "KSTREAM-FILTER-0000000002"
    assert s.map(lambda k, v: (k, v)).name == "KSTREAM-MAP-0000000003"
    assert s.map_values(str).name == "KSTREAM-MAPVALUES-0000000004"
    assert s.flat_map(lambda k, v: []).name == "KSTREAM-FLATMAP-0000000005"
    assert s.flat_map_values(lambda v: []).name == "KSTREAM-FLATMAPVALUES-0000000006"
    assert s.peek(print).name == "KSTREAM-PEEK-0000000007"
    assert s.filter(_any, name="mine").name == "mine"
    assert s.merge(s.filter(_any)).name == "KSTREAM-MERGE-0000000009"


def test_reading_a_topic_twice_is_an_error() -> None:
    builder = StreamsBuilder()
    builder.stream("in")
    with pytest.raises(TopologyError, match="'in' is already read"):
        builder.stream("in")
    with pytest.raises(TopologyError, match="already read"):
        builder.stream(["other", "in"])
    with pytest.raises(TopologyError, match="already read"):
        builder.stream("x").through("in")
    with pytest.raises(TopologyError, match="duplicate"):
        builder.stream(["y", "y"])


def test_duplicate_node_names_and_bad_arguments() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", name="src")
    with pytest.raises(TopologyError, match="already has a node named 'src'"):
        s.filter(_any, name="src")
    with pytest.raises(TopologyError, match="callable"):
        s.filter(42)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="illegal topic"):
        s.to("bad topic!")
    with pytest.raises(TopologyError, match="illegal topic"):
        builder.stream("..")
    with pytest.raises(TopologyError, match="empty"):
        StreamsBuilder().build()
