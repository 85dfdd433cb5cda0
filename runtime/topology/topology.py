"""A built topology: subtopologies, their topics, and per-task graphs.

`StreamsBuilder.build()` returns a `Topology`, which never changes afterwards.
It splits the node graph into subtopologies (connected components; a sink
writing a repartition/through topic and the source reading it back are not
connected). A task is one subtopology times one partition number; the task
runtime calls `Subtopology.instantiate()` once per task to get that task's own
`TaskGraph`.

Threads: a `Topology` and its `Subtopology`s are immutable and may be read from
any thread. A `TaskGraph` belongs to one task (see `runtime.topology.nodes`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from runtime.topology.context import TaskContext
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, NodeKind
from runtime.topology.nodes import Node, SourceNode


@dataclass(frozen=True)
class TopicSpec:
    """A topic a subtopology reads or writes.

    `name` is as written in the topology: internal topics (repartition) are
    relative and get the `<application.id>-` prefix from the runtime
    (`TaskContext.resolve_topic`). `partitions` is the partition count asked
    for with `repartition(partitions=N)`, else None (the runtime decides).
    """

    name: str
    internal: bool = False
    partitions: int | None = None


class TaskGraph:
    """The runtime nodes of one task: fresh instances from `Subtopology.instantiate`.

    `sources` maps each topic name as written (relative for internal topics) to
    the `SourceNode` reading it; `nodes` lists every node parents-first.
    Called only by the processing thread holding the task's lock.
    """

    __slots__ = ("sources", "nodes", "_initialized")

    def __init__(self, sources: dict[str, SourceNode], nodes: list[Node]) -> None:
        self.sources = sources
        self.nodes = nodes
        self._initialized = 0

    def init(self, ctx: TaskContext) -> None:
        """Initialize every node, parents before children.

        If a node's `init` raises, the error propagates; call `close()` as usual
        then: it closes exactly the nodes whose `init` ran.
        """
        for node in self.nodes[self._initialized :]:
            node.init(ctx)
            self._initialized += 1

    def close(self) -> None:
        """Close every initialized node, parents first.

        Keeps going when a node's `close` raises and re-raises the first such
        error at the end. A second call (or a call without `init`) does nothing.
        """
        nodes = self.nodes[: self._initialized]
        self._initialized = 0
        first_error: BaseException | None = None
        for node in nodes:
            try:
                node.close()
            except Exception as exc:
                if first_error is None:
                    first_error = exc
        if first_error is not None:
            raise first_error

    def node(self, name: str) -> Node:
        """The node called `name` (for tests and diagnostics; not a hot path)."""
        for node in self.nodes:
            if node.name == name:
                return node
        raise KeyError(name)


class Subtopology:
    """One connected part of a topology; a task runs it for one partition number.

    `id` numbers subtopologies 0, 1, ...: a subtopology writing a topic that
    the topology reads back (repartition, through) comes before the one reading
    it (unless they form a cycle), otherwise creation order decides. `sources`/`sinks` are the topics it reads and writes (each once, in
    creation order). `copartition_groups` are sets of source topic names that
    must have the same partition count (joins add them; empty for now).
    `state_stores` names the stores its nodes use.
    """

    __slots__ = ("id", "_defs", "_sources", "_sinks", "_copartition_groups", "_stores")

    def __init__(
        self,
        id: int,
        defs: Sequence[NodeDef],
        copartition_groups: Iterable[frozenset[str]] = (),
    ) -> None:
        self.id = id
        self._defs = tuple(defs)
        self._sources = _unique_topics(d for d in self._defs if d.kind is NodeKind.SOURCE)
        self._sinks = _unique_topics(d for d in self._defs if d.kind is NodeKind.SINK)
        self._copartition_groups = tuple(copartition_groups)
        stores: dict[str, None] = {}
        for d in self._defs:
            stores.update(dict.fromkeys(d.stores))
        self._stores = tuple(stores)

    @property
    def sources(self) -> list[TopicSpec]:
        return list(self._sources)

    @property
    def sinks(self) -> list[TopicSpec]:
        return list(self._sinks)

    @property
    def copartition_groups(self) -> list[frozenset[str]]:
        return list(self._copartition_groups)

    @property
    def state_stores(self) -> list[str]:
        return list(self._stores)

    @property
    def node_names(self) -> list[str]:
        return [d.name for d in self._defs]

    def instantiate(self) -> TaskGraph:
        """Fresh runtime nodes for one task, wired, not yet initialized.

        User processors are created from their suppliers here; DSL functions
        (predicates, mappers) are the user's own objects and shared.
        """
        by_name: dict[str, Node] = {}
        nodes: list[Node] = []
        for d in self._defs:
            node = d.make()
            by_name[d.name] = node
            nodes.append(node)
        for d in self._defs:
            parent = by_name[d.name]
            for child in d.children:
                parent.add_child(by_name[child])
        sources: dict[str, SourceNode] = {}
        for d in self._defs:
            if d.kind is NodeKind.SOURCE:
                source = by_name[d.name]
                assert isinstance(source, SourceNode)
                for topic in d.topics:
                    sources[topic] = source
        return TaskGraph(sources, nodes)

    def describe(self) -> str:
        lines = [f"   Sub-topology: {self.id}"]
        for d in self._defs:
            if d.kind is NodeKind.SOURCE:
                lines.append(f"    Source: {d.name} (topics: [{', '.join(d.topics)}])")
                lines.append(f"      --> {_names(d.children)}")
            elif d.kind is NodeKind.SINK:
                lines.append(f"    Sink: {d.name} (topic: {d.topics[0]})")
                lines.append(f"      <-- {_names(d.parents)}")
            else:
                lines.append(f"    Processor: {d.name} (stores: [{', '.join(d.stores)}])")
                lines.append(f"      --> {_names(d.children)}")
                lines.append(f"      <-- {_names(d.parents)}")
        return "\n".join(lines) + "\n"

    def __repr__(self) -> str:
        return (
            f"Subtopology(id={self.id}, sources={[t.name for t in self._sources]}, "
            f"sinks={[t.name for t in self._sinks]})"
        )


def _names(names: Sequence[str]) -> str:
    return ", ".join(names) if names else "none"


def _unique_topics(defs: Iterable[NodeDef]) -> tuple[TopicSpec, ...]:
    seen: dict[TopicSpec, None] = {}
    for d in defs:
        for topic in d.topics:
            seen.setdefault(TopicSpec(topic, d.internal, d.partitions))
    return tuple(seen)


class Topology:
    """An immutable, built topology (what `StreamsBuilder.build()` returns)."""

    __slots__ = ("_subtopologies",)

    def __init__(
        self, defs: Sequence[NodeDef], copartition_groups: Sequence[frozenset[str]] = ()
    ) -> None:
        self._subtopologies = _split(defs, copartition_groups)

    @property
    def subtopologies(self) -> list[Subtopology]:
        return list(self._subtopologies)

    def subtopology(self, id: int) -> Subtopology:
        return self._subtopologies[id]

    def source_topics(self) -> list[TopicSpec]:
        """Every topic any subtopology reads (user and internal), each once."""
        return list(dict.fromkeys(t for s in self._subtopologies for t in s.sources))

    def sink_topics(self) -> list[TopicSpec]:
        """Every topic any subtopology writes (user and internal), each once."""
        return list(dict.fromkeys(t for s in self._subtopologies for t in s.sinks))

    def internal_topics(self) -> list[TopicSpec]:
        """The internal (repartition) topics, relative names, each once."""
        topics = (t for s in self._subtopologies for t in (*s.sources, *s.sinks) if t.internal)
        return list(dict.fromkeys(topics))

    def describe(self) -> str:
        """A text view like Kafka Streams' `TopologyDescription`."""
        return "Topologies:\n" + "\n".join(s.describe() for s in self._subtopologies)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"Topology(subtopologies={len(self._subtopologies)})"


def _split(
    defs: Sequence[NodeDef], copartition_groups: Sequence[frozenset[str]]
) -> tuple[Subtopology, ...]:
    """Connected components over parent/child edges and shared state stores.

    Numbered so that a subtopology writing a topic the topology reads again
    (repartition, through) comes before the one reading it, then by creation
    order; only a cycle between subtopologies breaks the first rule.
    """
    parent_of: dict[str, str] = {d.name: d.name for d in defs}

    def find(name: str) -> str:
        root = name
        while parent_of[root] != root:
            root = parent_of[root]
        while parent_of[name] != root:
            parent_of[name], name = root, parent_of[name]
        return root

    def union(a: str, b: str) -> None:
        ra, rb = find(a), find(b)
        if ra != rb:
            parent_of[rb] = ra

    store_owner: dict[str, str] = {}
    for d in defs:
        for child in d.children:
            union(d.name, child)
        for store in d.stores:
            union(store_owner.setdefault(store, d.name), d.name)

    components: dict[str, list[NodeDef]] = {}
    for d in sorted(defs, key=lambda d: d.order):
        components.setdefault(find(d.name), []).append(d)
    ordered = _writers_first(list(components.values()))

    subtopologies = []
    for id, members in enumerate(ordered):
        read = {t for d in members if d.kind is NodeKind.SOURCE for t in d.topics}
        groups = [g for g in copartition_groups if g & read]
        for g in groups:
            if not g <= read:
                raise TopologyError(
                    f"co-partitioned topics {sorted(g)} are not all read by one subtopology"
                )
        subtopologies.append(Subtopology(id, members, groups))
    return tuple(subtopologies)


def _writers_first(components: list[list[NodeDef]]) -> list[list[NodeDef]]:
    """Order components (given in creation order) so writers precede readers."""
    reader_of: dict[tuple[str, bool], int] = {}
    for i, members in enumerate(components):
        for d in members:
            if d.kind is NodeKind.SOURCE:
                for topic in d.topics:
                    reader_of[(topic, d.internal)] = i
    readers: list[set[int]] = [set() for _ in components]
    pending = [0] * len(components)
    for i, members in enumerate(components):
        for d in members:
            if d.kind is NodeKind.SINK:
                reader = reader_of.get((d.topics[0], d.internal))
                if reader is not None and reader != i and reader not in readers[i]:
                    readers[i].add(reader)
                    pending[reader] += 1
    order: list[int] = []
    left = set(range(len(components)))
    while left:
        ready = [i for i in left if pending[i] == 0]
        nxt = min(ready) if ready else min(left)  # min(left): break a cycle
        left.remove(nxt)
        order.append(nxt)
        for reader in readers[nxt]:
            pending[reader] -= 1
    return [components[i] for i in order]
