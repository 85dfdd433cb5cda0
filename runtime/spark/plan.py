"""What a backfill runs: a built `Topology` checked and cut into Spark stages.

`plan_backfill` walks the topology's node definitions (`Subtopology` order:
writers of a repartition or `through` topic before its readers) and makes one
`StagePlan` per subtopology. A stage's input is the history of the user
topics it reads plus what earlier stages wrote to the topics it reads
(repartition topics never touch Kafka in a backfill; `through` topics are
written to Kafka and also handed on). Inside a stage the runtime's own node
objects run (`runtime.spark.graph`), except that each aggregation node is
replaced by a stand-in: Spark groups and folds what reaches it.

Supported: every stateless DSL step (filter, filter_not, map, map_values,
flat_map, flat_map_values, peek, foreach, split/branch, merge, to, through,
repartition, group_by/group_by_key) and grouped `count`, `reduce`,
`aggregate`, also over `TimeWindows`, with the KTable steps after them
(`filter`, `filter_not`, `map_values`, `to_stream`). Not supported, each with
a `BackfillError` naming the node: Processor API steps (`process`),
`builder.table`, stream-table joins, and an aggregation fed by another
aggregation of the same subtopology.

Everything in a plan is picklable: it is shipped to Spark's Python workers.
Runs on the driver.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.config import StreamsConfig
from runtime.kafka.topics import TopicLayout
from runtime.state.changelog import changelog_topic_name
from runtime.topology.graph import NodeDef, NodeKind
from runtime.topology.nodes import (
    BranchNode,
    FilterNode,
    FilterNotNode,
    FlatMapNode,
    FlatMapValuesNode,
    ForeachNode,
    MapNode,
    MapValuesNode,
    PassThroughNode,
    PeekNode,
    SourceNode,
)
from runtime.topology.sink_node import SinkNode
from runtime.topology.stateful_nodes import (
    AggregateNode,
    KeySelectNode,
    NullKeyFilterNode,
    StreamTableJoinNode,
    TableFilterNode,
    TableMapValuesNode,
    TableSourceNode,
    WindowAggregateNode,
    count_fold,
)
from runtime.topology.topology import Subtopology, Topology
from runtime.topology.windows import TimeWindows


class BackfillError(RuntimeError):
    """The topology or the cluster does not allow a backfill (names what and why)."""


STATELESS = (
    SourceNode,
    SinkNode,
    FilterNode,
    FilterNotNode,
    MapNode,
    MapValuesNode,
    FlatMapNode,
    FlatMapValuesNode,
    PeekNode,
    ForeachNode,
    PassThroughNode,
    BranchNode,
    KeySelectNode,
    NullKeyFilterNode,
    TableFilterNode,
    TableMapValuesNode,
)
AGGREGATES = (AggregateNode, WindowAggregateNode)


@dataclass(frozen=True)
class AggregateSpec:
    """One aggregation node of a stage: its store, changelog, windows, fold."""

    index: int
    node: str
    store: str
    changelog: str | None
    windows: TimeWindows | None
    is_count: bool

    @property
    def windowed(self) -> bool:
        return self.windows is not None


@dataclass(frozen=True)
class StagePlan:
    """One subtopology run as a Spark stage."""

    id: int
    defs: tuple[NodeDef, ...]
    history_topics: tuple[str, ...]
    handed_topics: tuple[str, ...]
    aggregates: tuple[AggregateSpec, ...]
    tasks: int

    @property
    def windowed(self) -> bool:
        return any(a.windowed for a in self.aggregates)

    @property
    def needs_order(self) -> bool:
        """Whether the order records reach an aggregation matters (not a plain count)."""
        return any(a.windowed or not a.is_count for a in self.aggregates)


@dataclass(frozen=True)
class BackfillPlan:
    """A whole backfill: stages in order, topics by role, and the settings workers need."""

    application_id: str
    stages: tuple[StagePlan, ...]
    partitions: Mapping[str, int]
    history_topics: tuple[str, ...]
    internal_topics: tuple[str, ...]
    through_topics: tuple[str, ...]
    output_topics: tuple[str, ...]
    changelog_topics: tuple[str, ...]
    default_key_serde: Any
    default_value_serde: Any
    deserialization_handler: str
    processing_handler: str
    dead_letter_topic: str | None

    @property
    def needs_order(self) -> bool:
        return any(s.needs_order for s in self.stages)

    @property
    def kafka_topics(self) -> tuple[str, ...]:
        """Topics the backfill writes to Kafka (repartition topics are not among them)."""
        topics = [*self.output_topics, *self.through_topics, *self.changelog_topics]
        if self.dead_letter_topic:
            topics.append(self.dead_letter_topic)
        return tuple(dict.fromkeys(topics))

    def readers_of(self, topic: str) -> list[int]:
        return [s.id for s in self.stages if topic in s.handed_topics]

    def stage(self, stage_id: int) -> StagePlan:
        for s in self.stages:
            if s.id == stage_id:
                return s
        raise KeyError(stage_id)


def _portable(d: NodeDef) -> NodeDef:
    """The definition with plain-dict params (a mappingproxy does not pickle)."""
    return dataclasses.replace(d, params=dict(d.params))


def _describe_unsupported(d: NodeDef, node: Any) -> str:
    name = d.name
    if isinstance(node, TableSourceNode):
        what = "a table read with builder.table()"
    elif isinstance(node, StreamTableJoinNode):
        what = "a stream-table join"
    else:
        what = f"a {type(node).__name__}"
    return f"node {name!r} is {what}, which backfill does not support"


def node_defs(sub: Subtopology) -> tuple[NodeDef, ...]:
    """A subtopology's node definitions, parents first.

    `Subtopology` keeps them private (`_defs`); this is the one place that
    reaches in. A public accessor there would be the cleaner hook.
    """
    defs: tuple[NodeDef, ...] = sub._defs
    return defs


def check_nodes(topology: Topology) -> dict[str, Any]:
    """Every node of the topology built once; BackfillError for what backfill cannot run."""
    made: dict[str, Any] = {}
    for sub in topology.subtopologies:
        for d in node_defs(sub):
            if "supplier" in d.params:
                raise BackfillError(
                    f"node {d.name!r} is a Processor API step (KStream.process): backfill "
                    "runs DSL steps only (filter, map, flat_map, ..., group_by + count/reduce/"
                    "aggregate); run this topology with `streams-runtime run` instead"
                )
            node = d.make()
            if not isinstance(node, STATELESS + AGGREGATES):
                raise BackfillError(_describe_unsupported(d, node))
            made[d.name] = node
    return made


def _check_no_chained_aggregates(defs: tuple[NodeDef, ...], aggregates: set[str]) -> None:
    by_name = {d.name: d for d in defs}
    for start in aggregates:
        pending = list(by_name[start].children)
        seen: set[str] = set()
        while pending:
            name = pending.pop()
            if name in seen:
                continue
            seen.add(name)
            if name in aggregates:
                raise BackfillError(
                    f"aggregation {name!r} reads the updates of aggregation {start!r} in the "
                    "same subtopology: backfill does not support chained aggregations "
                    "(add .repartition() between them)"
                )
            pending.extend(by_name[name].children)


def plan_backfill(topology: Topology, config: StreamsConfig, layout: TopicLayout) -> BackfillPlan:
    """Check the topology and lay out its stages; BackfillError on what cannot run."""
    app = config.application_id
    made = check_nodes(topology)

    def full(name: str, internal: bool) -> str:
        return f"{app}-{name}" if internal else name

    written: set[str] = set()
    internal: set[str] = set()
    for sub in topology.subtopologies:
        for spec in sub.sinks:
            written.add(full(spec.name, spec.internal))
        for spec in (*sub.sources, *sub.sinks):
            if spec.internal:
                internal.add(full(spec.name, True))

    stages = []
    history: list[str] = []
    outputs: list[str] = []
    changelogs: list[str] = []
    seen_writers: set[str] = set()
    for sub in topology.subtopologies:
        defs = tuple(_portable(d) for d in node_defs(sub))
        sources = [full(s.name, s.internal) for s in sub.sources]
        handed = [t for t in sources if t in written]
        not_yet = [t for t in handed if t not in seen_writers]
        if not_yet:
            raise BackfillError(
                f"subtopology {sub.id} reads {not_yet}, written by a later subtopology (a cycle): "
                "backfill cannot order it"
            )
        from_history = [t for t in sources if t not in written]
        history.extend(from_history)
        aggregates: list[AggregateSpec] = []
        for d in defs:
            node = made[d.name]
            if isinstance(node, AGGREGATES):
                store = d.params["store"]
                windows = d.params.get("windows")
                logged = topology.store_def(store).spec.changelog
                aggregates.append(
                    AggregateSpec(
                        index=len(aggregates),
                        node=d.name,
                        store=store,
                        changelog=changelog_topic_name(app, store) if logged else None,
                        windows=windows,
                        is_count=d.params["fold"] is count_fold,
                    )
                )
                if logged:
                    changelogs.append(changelog_topic_name(app, store))
        _check_no_chained_aggregates(defs, {a.node for a in aggregates})
        for d in defs:
            if d.kind is NodeKind.SINK:
                topic = full(d.topics[0], d.internal)
                seen_writers.add(topic)
                if not d.internal and topic not in outputs:
                    outputs.append(topic)
        tasks = max((layout.partitions[t] for t in sources), default=1)
        stages.append(
            StagePlan(
                id=sub.id,
                defs=defs,
                history_topics=tuple(from_history),
                handed_topics=tuple(handed),
                aggregates=tuple(aggregates),
                tasks=tasks,
            )
        )
    through = tuple(t for t in outputs if any(t in s.handed_topics for s in stages))
    return BackfillPlan(
        application_id=app,
        stages=tuple(stages),
        partitions=dict(layout.partitions),
        history_topics=tuple(dict.fromkeys(history)),
        internal_topics=tuple(sorted(internal)),
        through_topics=through,
        output_topics=tuple(t for t in outputs if t not in through),
        changelog_topics=tuple(changelogs),
        default_key_serde=config.default_key_serde,
        default_value_serde=config.default_value_serde,
        deserialization_handler=config.deserialization_exception_handler,
        processing_handler=config.processing_exception_handler,
        dead_letter_topic=config.dead_letter_queue_topic,
    )
