"""Topology structure: subtopology splitting, topics, describe(), TaskGraph lifecycle."""

from __future__ import annotations

import pytest

from runtime.topology import (
    Processor,
    ProcessorContext,
    Record,
    StreamsBuilder,
    TaskGraph,
    TopicSpec,
    Topology,
    TopologyError,
    serdes,
)
from runtime.topology.nodes import BranchNode, Node
from runtime.topology.testing import RecordingTaskContext


def _repartitioned(name: str | None = "by-word", partitions: int | None = 4) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream("lines", key_serde=serdes.STRING, value_serde=serdes.STRING)
        .flat_map(lambda k, v: [(w, w) for w in v.split()])
        .repartition(name, partitions, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .map_values(len)
        .to("lengths", value_serde=serdes.INT64)
    )
    return builder.build()


def test_repartition_splits_into_two_subtopologies() -> None:
    topology = _repartitioned()
    first, second = topology.subtopologies
    assert (first.id, second.id) == (0, 1)
    topic = TopicSpec("by-word-repartition", internal=True, partitions=4)
    assert first.sources == [TopicSpec("lines", internal=False)]
    assert first.sinks == [topic]
    assert second.sources == [topic]
    assert second.sinks == [TopicSpec("lengths")]
    assert first.copartition_groups == [] and second.copartition_groups == []
    assert topology.internal_topics() == [topic]
    assert first.node_names == [
        "KSTREAM-SOURCE-0000000000",
        "KSTREAM-FLATMAP-0000000001",
        "by-word-repartition-sink",
    ]
    assert second.node_names[0] == "by-word-repartition-source"


def test_repartition_generated_name_and_no_partitions() -> None:
    topology = _repartitioned(name=None, partitions=None)
    (topic,) = topology.internal_topics()
    assert topic == TopicSpec("KSTREAM-REPARTITION-0000000002-repartition", True, None)
    assert topology.subtopologies[1].sources == [topic]


def test_repartition_runs_end_to_end_through_both_subtopologies() -> None:
    topology = _repartitioned()
    ctx = RecordingTaskContext(application_id="wc", partitions={"wc-by-word-repartition": 4})
    first = topology.subtopologies[0].instantiate()
    first.init(ctx)
    first.sources["lines"].process(Record("line-1", "to be or not", 7))
    assert {s.topic for s in ctx.sent} == {"wc-by-word-repartition"}
    assert [s.partition for s in ctx.sent] == [None] * 4  # default partitioning by key

    second = topology.subtopologies[1].instantiate()
    out_ctx = RecordingTaskContext(application_id="wc")
    second.init(out_ctx)
    source = second.sources["by-word-repartition"]
    for i, sent in enumerate(ctx.sent):
        record = source.deserialize(
            sent.key, sent.value, sent.timestamp, sent.headers, sent.topic, 2, i
        )
        source.process(record)
    assert [(s.topic, s.key, serdes.INT64.deserialize(s.value)) for s in out_ctx.sent] == [
        ("lengths", b"to", 2),
        ("lengths", b"be", 2),
        ("lengths", b"or", 2),
        ("lengths", b"not", 3),
    ]
    assert all(s.timestamp == 7 for s in out_ctx.sent)


def test_repartition_names_must_be_unique_and_partitions_positive() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in")
    s.repartition(name="x")
    with pytest.raises(TopologyError, match="already used"):
        s.repartition(name="x")
    with pytest.raises(TopologyError, match="positive"):
        s.repartition(partitions=0)


def test_through_uses_a_user_topic_and_splits() -> None:
    builder = StreamsBuilder()
    builder.stream("in", value_serde=serdes.JSON).through("mid").to("out")
    topology = builder.build()
    first, second = topology.subtopologies
    assert first.sinks == [TopicSpec("mid", internal=False)]
    assert second.sources == [TopicSpec("mid", internal=False)]
    assert topology.internal_topics() == []
    # the new stream carries the serdes of the through topic
    graph = second.instantiate()
    ctx = RecordingTaskContext()
    graph.init(ctx)
    source = graph.sources["mid"]
    source.process(source.deserialize(b"k", b'{"a":1}', 0, None, "mid", 0, 0))
    assert ctx.sent[0].value == b'{"a":1}'


def test_independent_streams_are_separate_subtopologies_ordered_by_creation() -> None:
    builder = StreamsBuilder()
    b = builder.stream("b")
    a = builder.stream("a")
    a.to("a-out")
    b.to("b-out")
    topology = builder.build()
    assert [s.sources[0].name for s in topology.subtopologies] == ["b", "a"]
    assert [s.sinks for s in topology.subtopologies] == [[TopicSpec("b-out")], [TopicSpec("a-out")]]
    assert [t.name for t in topology.source_topics()] == ["b", "a"]
    assert [t.name for t in topology.sink_topics()] == ["b-out", "a-out"]


def test_nodes_sharing_a_store_share_a_subtopology() -> None:
    builder = StreamsBuilder()
    builder.stream("x").process(Processor, "shared")
    builder.stream("y").process(Processor, "shared")
    builder.stream("z").process(Processor, "own")
    topology = builder.build()
    assert [[t.name for t in s.sources] for s in topology.subtopologies] == [["x", "y"], ["z"]]
    assert topology.subtopologies[0].state_stores == ["shared"]


def test_topology_is_immutable_after_build() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in")
    branched = s.split().branch(lambda k, v: k == "a", name="a")
    topology = builder.build()
    before = topology.describe()
    branched.branch(lambda k, v: True, name="rest").no_default_branch()
    s.to("later")
    builder.stream("other")
    assert topology.describe() == before
    assert len(builder.build().subtopologies) == 2
    # the built split node only knows the branch that existed at build time
    splitter = topology.subtopologies[0].instantiate().node("KSTREAM-BRANCH-0000000001")
    assert isinstance(splitter, BranchNode)
    assert [child for _, child in splitter.routes] == ["KSTREAM-BRANCH-0000000001a"]


def test_describe_matches_kafka_streams_layout() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in").filter(lambda k, v: True)
    s.to("out")
    s.process(Processor, "store-1", name="proc")
    assert builder.build().describe() == (
        "Topologies:\n"
        "   Sub-topology: 0\n"
        "    Source: KSTREAM-SOURCE-0000000000 (topics: [in])\n"
        "      --> KSTREAM-FILTER-0000000001\n"
        "    Processor: KSTREAM-FILTER-0000000001 (stores: [])\n"
        "      --> KSTREAM-SINK-0000000002, proc\n"
        "      <-- KSTREAM-SOURCE-0000000000\n"
        "    Sink: KSTREAM-SINK-0000000002 (topic: out)\n"
        "      <-- KSTREAM-FILTER-0000000001\n"
        "    Processor: proc (stores: [store-1])\n"
        "      --> none\n"
        "      <-- KSTREAM-FILTER-0000000001\n"
    )


def test_describe_lists_every_subtopology() -> None:
    text = _repartitioned().describe()
    assert "   Sub-topology: 0\n" in text and "   Sub-topology: 1\n" in text
    assert "Sink: by-word-repartition-sink (topic: by-word-repartition)" in text
    assert "Source: by-word-repartition-source (topics: [by-word-repartition])" in text


def test_instantiate_gives_fresh_nodes_in_topological_order() -> None:
    builder = StreamsBuilder()
    left = builder.stream("l")
    right = builder.stream("r").map_values(str)
    left.merge(right).to("out")
    sub = builder.build().subtopologies[0]
    g1, g2 = sub.instantiate(), sub.instantiate()
    assert not set(map(id, g1.nodes)) & set(map(id, g2.nodes))
    position = {node.name: i for i, node in enumerate(g1.nodes)}
    for node in g1.nodes:
        for child in node.children:
            assert position[node.name] < position[child.name]
    assert set(g1.sources) == {"l", "r"}


class _Lifecycle(Node):
    def __init__(
        self, name: str, log: list[str], fail_init: bool = False, fail_close: bool = False
    ):
        super().__init__(name)
        self.log = log
        self.fail_init = fail_init
        self.fail_close = fail_close

    def init(self, ctx: object) -> None:
        self.log.append(f"init {self.name}")
        if self.fail_init:
            raise RuntimeError(f"init {self.name}")

    def close(self) -> None:
        self.log.append(f"close {self.name}")
        if self.fail_close:
            raise RuntimeError(f"close {self.name}")


def test_task_graph_close_keeps_going_and_reraises_the_first_error() -> None:
    log: list[str] = []
    nodes: list[Node] = [
        _Lifecycle("a", log, fail_close=True),
        _Lifecycle("b", log, fail_close=True),
        _Lifecycle("c", log),
    ]
    graph = TaskGraph({}, nodes)
    graph.init(RecordingTaskContext())
    with pytest.raises(RuntimeError, match="close a"):
        graph.close()
    assert log == ["init a", "init b", "init c", "close a", "close b", "close c"]
    graph.close()  # a second close does nothing
    assert len(log) == 6


def test_task_graph_close_after_failed_init_closes_initialized_nodes_only() -> None:
    log: list[str] = []
    graph = TaskGraph(
        {}, [_Lifecycle("a", log), _Lifecycle("b", log, fail_init=True), _Lifecycle("c", log)]
    )
    with pytest.raises(RuntimeError, match="init b"):
        graph.init(RecordingTaskContext())
    graph.close()
    assert log == ["init a", "init b", "close a"]


def test_processor_close_runs_on_task_graph_close() -> None:
    closed: list[str] = []

    class Closing(Processor):
        def init(self, context: ProcessorContext) -> None:
            self.task = context.task_id

        def process(self, record: Record) -> None:
            pass

        def close(self) -> None:
            closed.append(self.task)

    builder = StreamsBuilder()
    builder.stream("in").process(Closing)
    graph = builder.build().subtopologies[0].instantiate()
    graph.init(RecordingTaskContext(task_id="0_3"))
    graph.close()
    assert closed == ["0_3"]


def test_a_writer_subtopology_comes_before_its_reader() -> None:
    builder = StreamsBuilder()
    early = builder.stream("early")  # created first, but merged with the reader side
    builder.stream("x").repartition("r").merge(early).to("out")
    writer, reader = builder.build().subtopologies
    assert [t.name for t in writer.sources] == ["x"]
    assert writer.sinks == [TopicSpec("r-repartition", internal=True)]
    assert [t.name for t in reader.sources] == ["early", "r-repartition"]


def test_a_cycle_between_subtopologies_still_builds() -> None:
    builder = StreamsBuilder()
    x = builder.stream("x")
    back = x.repartition("a").repartition("b")
    back.merge(x).to("out")
    topology = builder.build()
    assert [s.id for s in topology.subtopologies] == [0, 1]
    assert [t.name for t in topology.subtopologies[0].sources] == ["x", "b-repartition"]
