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

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.topology.context import TaskContext
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, NodeKind, StateStoreDef
from runtime.topology.nodes import Node, SourceNode

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.topology.global_table import GlobalStoreDef


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
    creation order). `copartition_groups` are sets of source topic names (as
    written) that must have the same partition count (stream-table joins add
    them). `state_stores` names the stores its nodes use; `store_specs` are
    those the topology defines, for the runtime to build per task.
    """

    __slots__ = (
        "id",
        "query",
        "local_id",
        "_defs",
        "_sources",
        "_sinks",
        "_copartition_groups",
        "_stores",
        "_store_defs",
    )

    def __init__(
        self,
        id: int,
        defs: Sequence[NodeDef],
        copartition_groups: Iterable[frozenset[str]] = (),
        store_defs: Mapping[str, StateStoreDef] | None = None,
        query: str | None = None,
        local_id: int | None = None,
    ) -> None:
        self.id = id
        # Several named queries in one app (runtime.topology.named_queries): the
        # query this subtopology belongs to and its number inside that query.
        self.query = query
        self.local_id = id if local_id is None else local_id
        self._defs = tuple(defs)
        self._sources = _unique_topics(d for d in self._defs if d.kind is NodeKind.SOURCE)
        self._sinks = _unique_topics(d for d in self._defs if d.kind is NodeKind.SINK)
        self._copartition_groups = tuple(copartition_groups)
        stores: dict[str, None] = {}
        for d in self._defs:
            stores.update(dict.fromkeys(d.stores))
        self._stores = tuple(stores)
        known = store_defs or {}
        self._store_defs = tuple(known[name] for name in self._stores if name in known)

    @property
    def task_name(self) -> str:
        """What task ids start with: `<id>`, or `<query>__<local id>` for a
        named query (Kafka Streams' named-topology form), so a query's task
        ids, state directories and status entries are its own whatever other
        queries run beside it."""
        return str(self.id) if self.query is None else f"{self.query}__{self.local_id}"

    def topic_prefix(self, application_id: str) -> str:
        """Prefix of the changelog topics of its stores: `<application.id>`,
        or `<application.id>-<query>` for a named query."""
        return application_id if self.query is None else f"{application_id}-{self.query}"

    @property
    def defs(self) -> tuple[NodeDef, ...]:
        return self._defs

    def renumbered(
        self, id: int, query: str, defs: Sequence[NodeDef], groups: Iterable[frozenset[str]]
    ) -> Subtopology:
        """This subtopology as part of query `query` under the app-wide `id`,
        with `defs` and `groups` (internal topics renamed by the caller)."""
        return Subtopology(
            id,
            defs,
            groups,
            {d.name: d for d in self._store_defs},
            query=query,
            local_id=self.local_id,
        )

    @property
    def key_parallel(self) -> bool:
        """Whether its tasks may run key-parallel (`num.threads.per.task`): no
        node opted out (`KStream.process(..., key_parallel=False)`)."""
        return all(d.params.get("key_parallel", True) for d in self._defs)

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
    def store_specs(self) -> list[StoreSpec]:
        """The stores to build for every task of this subtopology.

        In node order: a store written by an upstream node comes before one
        written downstream of it, which is the order to flush them in at
        commit (a store's flush can write the stores below it). Stores a
        Processor API node names without `StreamsBuilder.add_state_store` are
        not here: the runtime cannot build them.
        """
        return [d.spec for d in self._store_defs]

    @property
    def store_defs(self) -> list[StateStoreDef]:
        """`store_specs` with the serdes that decode each store."""
        return list(self._store_defs)

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
    """An immutable, built topology (what `StreamsBuilder.build()` returns).

    State stores: `store_specs()` lists every store to build (per task of the
    subtopology that holds it, `store_subtopology(name)`); `store_serdes(name)`
    gives the serdes that decode a store's bytes, for interactive queries.
    """

    __slots__ = ("_subtopologies", "_store_owner", "_global_stores")

    def __init__(
        self,
        defs: Sequence[NodeDef],
        copartition_groups: Sequence[frozenset[str]] = (),
        stores: Mapping[str, StateStoreDef] | None = None,
        global_stores: Sequence[GlobalStoreDef] = (),
    ) -> None:
        self._set(_split(defs, copartition_groups, stores or {}))
        self._global_stores = tuple(global_stores)

    def _set(self, subtopologies: tuple[Subtopology, ...]) -> None:
        self._subtopologies = subtopologies
        # A named query's stores are also known as `<query>.<store>` (two
        # queries may use the same store name; the plain name then means the
        # first query's).
        self._store_owner: dict[str, tuple[Subtopology, StateStoreDef]] = {}
        for sub in subtopologies:
            for d in sub.store_defs:
                self._store_owner.setdefault(d.name, (sub, d))
                if sub.query is not None:
                    self._store_owner[f"{sub.query}.{d.name}"] = (sub, d)

    @classmethod
    def of_subtopologies(cls, subtopologies: Iterable[Subtopology]) -> Topology:
        """A topology made of given subtopologies (their ids unique): how
        `runtime.topology.named_queries.compose` joins named queries into one."""
        topology = cls.__new__(cls)
        topology._set(tuple(sorted(subtopologies, key=lambda s: s.id)))
        topology._global_stores = ()  # named queries refuse global tables
        return topology

    @property
    def queries(self) -> list[str]:
        """Names of the named queries it holds, in id order (empty: one plain topology)."""
        return list(dict.fromkeys(s.query for s in self._subtopologies if s.query is not None))

    @property
    def subtopologies(self) -> list[Subtopology]:
        return list(self._subtopologies)

    def subtopology(self, id: int) -> Subtopology:
        for sub in self._subtopologies:
            if sub.id == id:
                return sub
        raise KeyError(f"no subtopology {id}")

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

    def partitioned_sinks(self) -> list[tuple[str, str]]:
        """`(sink node, topic as written)` of the sinks given their own
        partitioner (`to(partitioner=...)`, `repartition(partitioner=...)`),
        which a configured static partitioner overrides."""
        return [
            (d.name, d.topics[0])
            for sub in self._subtopologies
            for d in sub._defs
            if d.kind is NodeKind.SINK and d.params.get("partitioner") is not None
        ]

    def store_specs(self) -> list[StoreSpec]:
        """Every store the runtime builds, each once (see `Subtopology.store_specs`)."""
        return [d.spec for sub in self._subtopologies for d in sub.store_defs]

    def store_names(self) -> list[str]:
        return list(self._store_owner)

    def store_def(self, name: str) -> StateStoreDef:
        """The definition of store `name`; KeyError when the topology has none."""
        try:
            return self._store_owner[name][1]
        except KeyError:
            known = ", ".join(self._store_owner) or "none"
            raise KeyError(f"the topology has no state store {name!r} (stores: {known})") from None

    def store_serdes(self, name: str) -> tuple[Any, Any]:
        """`(key_serde, value_serde)` that decode store `name` (None: configured default).

        For interactive queries (`app.store(name)`): a key-value store maps
        `key_serde` bytes to `value_serde` bytes; a window store (`spec.kind ==
        "window"`) keys `key_serde` bytes plus the window start (8 bytes
        big-endian, `runtime.state.windowed_store.window_key`).
        """
        d = self.store_def(name)
        return d.key_serde, d.value_serde

    def store_subtopology(self, name: str) -> Subtopology:
        """The subtopology whose tasks hold store `name` (one store per task)."""
        self.store_def(name)
        return self._store_owner[name][0]

    @property
    def global_stores(self) -> list[GlobalStoreDef]:
        """The global tables (`StreamsBuilder.global_table`): read by the
        global thread, part of no subtopology (`runtime.topology.global_table`)."""
        return list(self._global_stores)

    def describe(self) -> str:
        """A text view like Kafka Streams' `TopologyDescription`; global
        stores come after the subtopologies, numbered on from them (Kafka
        Streams numbers all in creation order; task ids here stay as they were)."""
        parts = [s.describe() for s in self._subtopologies]
        first = max((s.id for s in self._subtopologies), default=-1) + 1
        parts += [g.describe(first + i) for i, g in enumerate(self._global_stores)]
        return "Topologies:\n" + "\n".join(parts)

    def __str__(self) -> str:
        return self.describe()

    def __repr__(self) -> str:
        return f"Topology(subtopologies={len(self._subtopologies)})"


def _split(
    defs: Sequence[NodeDef],
    copartition_groups: Sequence[frozenset[str]],
    stores: Mapping[str, StateStoreDef],
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
        subtopologies.append(Subtopology(id, members, groups, stores))
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
