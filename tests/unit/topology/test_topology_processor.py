"""Processor API (forward, schedule, commit, stores) and sink partitioning."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest

from runtime.topology import (
    Processor,
    ProcessorContext,
    PunctuationType,
    Record,
    StreamsBuilder,
    TaskGraph,
    Topology,
    TopologyError,
    serdes,
)
from runtime.topology.testing import RecordingTaskContext


def _init(topology: Topology, **ctx_args: Any) -> tuple[TaskGraph, RecordingTaskContext]:
    ctx = RecordingTaskContext(
        default_key_serde=serdes.STRING, default_value_serde=serdes.STRING, **ctx_args
    )
    graph = topology.subtopologies[0].instantiate()
    graph.init(ctx)
    return graph, ctx


class Router(Processor):
    """Sends records whose value starts with '!' to the child 'alerts', others to all."""

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, record: Record) -> None:
        if record.value.startswith("!"):
            self.context.forward(record.with_value(record.value[1:]), to="alerts")
        else:
            self.context.forward(record)


def _router_topology() -> Topology:
    builder = StreamsBuilder()
    routed = builder.stream("in").process(Router, name="router")
    routed.to("alerts-topic", name="alerts")
    routed.to("all-topic", name="all")
    return builder.build()


def test_forward_to_all_children_and_to_a_named_child() -> None:
    graph, ctx = _init(_router_topology())
    source = graph.sources["in"]
    source.process(Record("k", "hello", 1))
    source.process(Record("k", "!fire", 2))
    assert [(s.topic, s.value) for s in ctx.sent] == [
        ("alerts-topic", b"hello"),
        ("all-topic", b"hello"),
        ("alerts-topic", b"fire"),
    ]


def test_forward_to_unknown_child_raises() -> None:
    class Bad(Processor):
        def init(self, context: ProcessorContext) -> None:
            self.context = context

        def process(self, record: Record) -> None:
            self.context.forward(record, to="nobody")

    builder = StreamsBuilder()
    builder.stream("in").process(Bad).to("out", name="sink")
    graph, _ = _init(builder.build())
    with pytest.raises(ValueError, match="no child named 'nobody'.*sink"):
        graph.sources["in"].process(Record("k", "v"))


def test_a_fresh_processor_per_instantiate() -> None:
    created: list[Processor] = []

    class Counting(Processor):
        def __init__(self) -> None:
            created.append(self)
            self.count = 0

        def process(self, record: Record) -> None:
            self.count += 1

    builder = StreamsBuilder()
    builder.stream("in").process(Counting)
    sub = builder.build().subtopologies[0]
    assert created == []  # nothing is instantiated at build time
    g1, g2 = sub.instantiate(), sub.instantiate()
    assert len(created) == 2 and created[0] is not created[1]
    g1.init(RecordingTaskContext())
    g1.sources["in"].process(Record(b"k", b"v"))
    assert [p.count for p in created] == [1, 0]  # type: ignore[attr-defined]
    del g2


def test_factory_supplier_and_instance_rejected() -> None:
    builder = StreamsBuilder()
    builder.stream("a").process(lambda: Router())
    with pytest.raises(TopologyError, match="not .*instance|supplier"):
        builder.stream("b").process(Router())  # type: ignore[arg-type]
    with pytest.raises(TopologyError):
        builder.stream("c").process(42)  # type: ignore[arg-type]


def test_schedule_delegates_to_the_task_context() -> None:
    punctuated: list[int] = []

    class Ticking(Processor):
        def init(self, context: ProcessorContext) -> None:
            self.wall = context.schedule(
                timedelta(seconds=2), PunctuationType.WALL_CLOCK_TIME, self.punctuate
            )
            self.stream = context.schedule(500, PunctuationType.STREAM_TIME, self.punctuate)
            self.context = context

        def punctuate(self, timestamp: int) -> None:
            punctuated.append(timestamp)
            self.context.forward(Record("tick", str(timestamp), timestamp))

        def process(self, record: Record) -> None:
            pass

    builder = StreamsBuilder()
    builder.stream("in").process(Ticking).to("out")
    graph, ctx = _init(builder.build())
    wall, stream = ctx.scheduled
    assert (wall.interval_ms, wall.punctuation_type) == (2000, PunctuationType.WALL_CLOCK_TIME)
    assert (stream.interval_ms, stream.punctuation_type) == (500, PunctuationType.STREAM_TIME)
    stream.callback(1500)  # the task fires a punctuation
    assert punctuated == [1500]
    assert [(s.topic, s.key, s.value, s.timestamp) for s in ctx.sent] == [
        ("out", b"tick", b"1500", 1500)
    ]
    processor = graph.nodes[1].processor  # type: ignore[attr-defined]
    processor.wall.cancel()
    assert wall.cancelled


@pytest.mark.parametrize(
    ("interval", "kind", "error"),
    [
        (0, PunctuationType.STREAM_TIME, ValueError),
        (timedelta(microseconds=10), PunctuationType.STREAM_TIME, ValueError),
        (1.5, PunctuationType.STREAM_TIME, TypeError),
        (10, "stream_time", TypeError),
    ],
)
def test_schedule_rejects_bad_arguments(interval: Any, kind: Any, error: type) -> None:
    class P(Processor):
        def init(self, context: ProcessorContext) -> None:
            context.schedule(interval, kind, lambda ts: None)

    builder = StreamsBuilder()
    builder.stream("in").process(P)
    with pytest.raises(error):
        _init(builder.build())


def test_commit_state_store_and_ids() -> None:
    seen: dict[str, Any] = {}

    class Stateful(Processor):
        def init(self, context: ProcessorContext) -> None:
            seen["ids"] = (context.task_id, context.application_id, context.processor_name)
            seen["store"] = context.state_store("counts")
            with pytest.raises(ValueError, match="no access to state store 'other'"):
                context.state_store("other")
            context.commit()

        def process(self, record: Record) -> None:
            pass

    store = object()
    builder = StreamsBuilder()
    builder.stream("in").process(Stateful, "counts", name="stateful")
    _, ctx = _init(builder.build(), task_id="1_2", application_id="app-x", stores={"counts": store})
    assert seen == {"ids": ("1_2", "app-x", "stateful"), "store": store}
    assert ctx.commits_requested == 1


def test_base_processor_process_is_abstract() -> None:
    with pytest.raises(NotImplementedError):
        Processor().process(Record(1, 2))


def test_process_result_stream_loses_serdes_and_needs_repartition() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    processed = s.process(Router)
    assert (processed.key_serde, processed.value_serde) == (None, None)
    assert processed.repartition_required and not s.repartition_required
    assert s.map_values(str).repartition_required is False
    assert s.map(lambda k, v: (k, v)).repartition_required is True


# -- sinks ---------------------------------------------------------------------------


def test_sink_partitioner_gets_deserialized_key_value_and_partition_count() -> None:
    calls: list[tuple[Any, Any, int]] = []

    def by_length(key: Any, value: Any, num_partitions: int) -> int | None:
        calls.append((key, value, num_partitions))
        return None if key is None else len(key) % num_partitions

    builder = StreamsBuilder()
    builder.stream("in").to("out", partitioner=by_length)
    graph, ctx = _init(builder.build(), partitions={"out": 3})
    graph.sources["in"].process(Record("abcd", "v"))
    graph.sources["in"].process(Record(None, "w"))
    assert calls == [("abcd", "v", 3), (None, "w", 3)]
    assert [s.partition for s in ctx.sent] == [1, None]


def test_partitioner_out_of_range_raises() -> None:
    builder = StreamsBuilder()
    builder.stream("in").to("out", partitioner=lambda k, v, n: n)
    graph, ctx = _init(builder.build(), partitions={"out": 2})
    with pytest.raises(ValueError, match="partitioner returned 2"):
        graph.sources["in"].process(Record("k", "v"))
    assert ctx.sent == []


def test_repartition_partitioner_sees_the_full_internal_topic() -> None:
    counts: list[int] = []

    def first(key: Any, value: Any, num_partitions: int) -> int:
        counts.append(num_partitions)
        return 0

    builder = StreamsBuilder()
    builder.stream("in").repartition("r", partitioner=first).to("out")
    graph, ctx = _init(builder.build(), application_id="app", partitions={"app-r-repartition": 6})
    graph.sources["in"].process(Record("k", "v"))
    assert counts == [6]
    assert [(s.topic, s.partition) for s in ctx.sent] == [("app-r-repartition", 0)]
