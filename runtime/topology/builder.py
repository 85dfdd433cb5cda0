"""`StreamsBuilder`, the DSL entry point, and the graph it records.

`StreamsBuilder.stream(...)` returns a `KStream`, `StreamsBuilder.table(...)` a
`KTable`; each DSL call on them adds a node to the builder's `GraphBuilder`, and
stateful calls also register their state stores (`StateStoreDef`). `build()`
freezes the graph into a `Topology`. The builder is used by one thread while the
application is being defined.

Node names follow Kafka Streams: a prefix and a 10-digit counter shared by all
generated names (`KSTREAM-SOURCE-0000000000`, `KSTREAM-FILTER-0000000001`, ...);
a name the user gives is used as is and does not advance the counter.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

# The argument checks live in a leaf module; re-exported here, where the DSL's
# modules have always imported them from.
from runtime.topology.arguments import check_callable as check_callable
from runtime.topology.arguments import check_partitions as check_partitions
from runtime.topology.arguments import check_serde as check_serde
from runtime.topology.arguments import check_store_name as check_store_name
from runtime.topology.arguments import check_topic as check_topic
from runtime.topology.arguments import store_spec as store_spec
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, NodeKind, NodeSpec, StateStoreDef
from runtime.topology.nodes import Node, Partitioner, SourceNode
from runtime.topology.sink_node import SinkNode
from runtime.topology.topology import Topology

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.topology.global_table import GlobalKTable, GlobalStoreDef
    from runtime.topology.kstream import KStream
    from runtime.topology.ktable import KTable


def _make_source(d: NodeDef) -> Node:
    p = d.params
    return SourceNode(d.name, d.topics, d.internal, p["key_serde"], p["value_serde"])


def _make_sink(d: NodeDef) -> Node:
    p = d.params
    return SinkNode(
        d.name,
        d.topics[0],
        d.internal,
        p["key_serde"],
        p["value_serde"],
        p["partitioner"],
        p.get("origin"),
    )


class GraphBuilder:
    """The node graph under construction (package-internal; the DSL's backend).

    Every `KStream`/`KTable` of one `StreamsBuilder` shares one `GraphBuilder`.
    Stateful DSL operations (aggregations, tables, joins) add their nodes with
    `add_processor`, register their stores with `add_store`, attach stores to
    nodes with `connect_stores` and declare co-partitioning with
    `add_copartition_group`.
    """

    def __init__(self) -> None:
        self.specs: dict[str, NodeSpec] = {}
        self._index = 0
        self._read_topics: dict[tuple[str, bool], str] = {}
        self._internal_topics: set[str] = set()
        self._copartition_groups: list[frozenset[str]] = []
        self._stores: dict[str, StateStoreDef] = {}
        self._global_stores: list[GlobalStoreDef] = []

    # -- names ---------------------------------------------------------------

    def new_name(self, prefix: str) -> str:
        """The next generated name, e.g. `KSTREAM-FILTER-0000000003`."""
        name = f"{prefix}{self._index:010d}"
        self._index += 1
        return name

    def node_name(self, given: str | None, prefix: str) -> str:
        """`given` if the user named the node, else a generated name."""
        if given is None:
            return self.new_name(prefix)
        if not isinstance(given, str) or not given:
            raise TopologyError(f"a node name must be a non-empty str, got {given!r}")
        return given

    # -- nodes ---------------------------------------------------------------

    def _add(self, spec: NodeSpec, parents: Sequence[str]) -> NodeSpec:
        if spec.name in self.specs:
            raise TopologyError(f"the topology already has a node named {spec.name!r}")
        for parent in parents:
            parent_spec = self.specs[parent]
            if parent_spec.kind is NodeKind.SINK:
                raise TopologyError(f"sink {parent!r} cannot have downstream nodes")
            parent_spec.children.append(spec.name)
            spec.parents.append(parent)
        self.specs[spec.name] = spec
        return spec

    def add_processor(
        self,
        name: str,
        factory: Callable[[NodeDef], Node],
        parents: Sequence[str],
        params: dict[str, Any] | None = None,
        stores: Iterable[str] = (),
    ) -> NodeSpec:
        spec = NodeSpec(name, NodeKind.PROCESSOR, len(self.specs), factory, params=params or {})
        self._add(spec, parents)
        self.connect_stores(name, stores)
        return spec

    def add_source(
        self,
        name: str,
        topics: Sequence[str],
        internal: bool,
        key_serde: Any,
        value_serde: Any,
        partitions: int | None = None,
    ) -> NodeSpec:
        if not topics:
            raise TopologyError("a stream needs at least one topic")
        for topic in topics:
            check_topic(topic)
            reader = self._read_topics.get((topic, internal))
            if reader is not None:
                kind = "internal topic" if internal else "topic"
                raise TopologyError(
                    f"{kind} {topic!r} is already read by {reader!r}: a topology may read "
                    "each topic only once (reuse the KStream instead)"
                )
        if len(set(topics)) != len(topics):
            raise TopologyError(f"duplicate topics in {list(topics)}")
        spec = NodeSpec(
            name,
            NodeKind.SOURCE,
            len(self.specs),
            _make_source,
            topics=list(topics),
            internal=internal,
            partitions=partitions,
            params={"key_serde": key_serde, "value_serde": value_serde},
        )
        self._add(spec, ())
        for topic in topics:
            self._read_topics[(topic, internal)] = name
        return spec

    def add_sink(
        self,
        name: str,
        parent: str,
        topic: str,
        internal: bool,
        key_serde: Any,
        value_serde: Any,
        partitioner: Partitioner | None,
        partitions: int | None = None,
        origin: str | None = None,
    ) -> NodeSpec:
        """`origin`: the DSL call making the sink ("to", "through", "repartition",
        "group_by"), named by the fix a serialization error suggests."""
        check_topic(topic)
        if partitioner is not None:
            check_callable(partitioner, "partitioner")
        spec = NodeSpec(
            name,
            NodeKind.SINK,
            len(self.specs),
            _make_sink,
            topics=[topic],
            internal=internal,
            partitions=partitions,
            params={
                "key_serde": key_serde,
                "value_serde": value_serde,
                "partitioner": partitioner,
                "origin": origin,
            },
        )
        return self._add(spec, (parent,))

    def add_parent(self, node: str, parent: str) -> None:
        """Wire `parent` above `node` too (a sink fed by two nodes, as the
        foreign-key join's response sink)."""
        if self.specs[parent].kind is NodeKind.SINK:
            raise TopologyError(f"sink {parent!r} cannot have downstream nodes")
        self.specs[parent].children.append(node)
        self.specs[node].parents.append(parent)

    def reserve_internal_topic(self, topic: str) -> str:
        """Claim a relative internal topic name; each may be used once."""
        check_topic(topic, "internal topic name")
        if topic in self._internal_topics:
            raise TopologyError(
                f"internal topic {topic!r} is already used: give each repartition a distinct name"
            )
        self._internal_topics.add(topic)
        return topic

    def connect_stores(self, node: str, stores: Iterable[str]) -> None:
        """Let `node` use the named state stores (its subtopology then holds them)."""
        spec = self.specs[node]
        for store in stores:
            if not isinstance(store, str) or not store:
                raise TopologyError(f"a state store name must be a non-empty str, got {store!r}")
            if store not in spec.stores:
                spec.stores.append(store)

    def add_copartition_group(self, topics: Iterable[str]) -> None:
        """Declare source topics (names as written) that must be co-partitioned."""
        group = frozenset(topics)
        if group not in self._copartition_groups:
            self._copartition_groups.append(group)

    def add_store(self, store: StateStoreDef) -> StateStoreDef:
        """Register a state store the topology creates (each name once)."""
        check_store_name(store.name)
        if store.name in self._stores:
            raise TopologyError(
                f"the topology already has a state store named {store.name!r}: "
                "give each aggregation or table its own store name"
            )
        self._stores[store.name] = store
        return store

    def store(self, name: str) -> StateStoreDef | None:
        return self._stores.get(name)

    def add_global_store(self, definition: GlobalStoreDef) -> None:
        """Register a global table (`runtime.topology.global_table`): its
        store name is unique among all stores, its topic read by nothing else."""
        check_store_name(definition.store)
        if definition.store in self._stores or any(
            g.store == definition.store for g in self._global_stores
        ):
            raise TopologyError(
                f"the topology already has a state store named {definition.store!r}"
            )
        reader = self._read_topics.get((definition.topic, False))
        if reader is not None:
            raise TopologyError(
                f"topic {definition.topic!r} is already read by {reader!r}: a global table "
                "needs a topic of its own"
            )
        if definition.source in self.specs:
            raise TopologyError(f"the topology already has a node named {definition.source!r}")
        self._read_topics[(definition.topic, False)] = definition.source
        self._global_stores.append(definition)

    def replace_store(self, store: StateStoreDef) -> None:
        """Swap a registered store's definition (a table starting to send old values)."""
        if store.name not in self._stores:
            raise TopologyError(f"no state store named {store.name!r} to replace")
        self._stores[store.name] = store

    def source_topics_of(self, node: str) -> set[str]:
        """The topics (names as written) of every source upstream of `node`."""
        topics: set[str] = set()
        seen: set[str] = set()
        pending = [node]
        while pending:
            spec = self.specs[pending.pop()]
            if spec.name in seen:
                continue
            seen.add(spec.name)
            if spec.kind is NodeKind.SOURCE:
                topics.update(spec.topics)
            pending.extend(spec.parents)
        return topics

    def build(self) -> Topology:
        if not self.specs:
            raise TopologyError("the topology is empty: add a stream with builder.stream(...)")
        return Topology(
            [s.freeze() for s in self.specs.values()],
            self._copartition_groups,
            self._stores,
            global_stores=self._global_stores,
        )


class StreamsBuilder:
    """Entry point of the DSL: define streams, then `build()` a `Topology`."""

    def __init__(self) -> None:
        self._graph = GraphBuilder()

    def stream(
        self,
        topics: str | Sequence[str],
        key_serde: Any = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KStream:
        """A stream of the records of one topic or several topics.

        Serdes left None use the configured `default.key.serde` /
        `default.value.serde`. Each topic may be read only once per topology.
        """
        from runtime.topology.kstream import KStream

        topic_list = [topics] if isinstance(topics, str) else list(topics)
        key_serde = check_serde(key_serde, "key_serde")
        value_serde = check_serde(value_serde, "value_serde")
        node = self._graph.node_name(name, "KSTREAM-SOURCE-")
        self._graph.add_source(node, topic_list, False, key_serde, value_serde)
        return KStream(self._graph, node, key_serde, value_serde)

    def table(
        self,
        topic: str,
        key_serde: Any = None,
        value_serde: Any = None,
        store: str | None = None,
        name: str | None = None,
    ) -> KTable:
        """A table of the latest value per key of `topic`, materialized in a store.

        Each record upserts its key; a null value (tombstone) deletes it; null
        keys are dropped (counted as `null_key`). The store (named `store`, else
        `<topic>-STATE-STORE-<n>`) is key-value, RocksDB, cached and
        change-logged; downstream nodes see one update per key per commit
        (each write when caching is off). `name` names the source node; the
        table node is then `<name>-table`.
        """
        from runtime.topology.ktable import KTable, make_table_source

        check_topic(topic)
        key_serde = check_serde(key_serde, "key_serde")
        value_serde = check_serde(value_serde, "value_serde")
        graph = self._graph
        store_name = (
            check_store_name(store)
            if store is not None
            else graph.new_name(f"{topic}-STATE-STORE-")
        )
        source = graph.node_name(name, "KSTREAM-SOURCE-")
        table_node = f"{name}-table" if name is not None else graph.new_name("KTABLE-SOURCE-")
        graph.add_source(source, [topic], False, key_serde, value_serde)
        graph.add_store(StateStoreDef(store_spec(store_name), key_serde, value_serde))
        graph.add_processor(
            table_node,
            make_table_source,
            (source,),
            {
                "store": store_name,
                "key_serde": key_serde,
                "value_serde": value_serde,
                "queryable": store is not None,  # (table_changes.sends_old_values_unforced)
            },
            (store_name,),
        )
        return KTable.materialized(graph, table_node, store_name, key_serde, value_serde)

    def add_state_store(
        self, spec: StoreSpec, key_serde: Any = None, value_serde: Any = None
    ) -> None:
        """Register a store for Processor API nodes (`KStream.process(..., spec.name)`).

        The runtime then creates it for every task of the subtopology whose
        nodes connect to it; `key_serde`/`value_serde` are what interactive
        queries use to decode it (None: the configured defaults).
        """
        self._graph.add_store(
            StateStoreDef(
                spec,
                check_serde(key_serde, "key_serde"),
                check_serde(value_serde, "value_serde"),
            )
        )

    def build(self) -> Topology:
        """Freeze what was defined so far into an immutable `Topology`."""
        return self._graph.build()

    def global_table(
        self,
        topic: str,
        key_serde: Any = None,
        value_serde: Any = None,
        store: str | None = None,
        name: str | None = None,
    ) -> GlobalKTable:
        """A table of the latest value per key of every partition of `topic`,
        on every process: read to its end before processing starts, then kept
        up to date by the global thread (docs/dsl.md, "Global tables").

        Join streams with it (`KStream.join(table, key_mapper, joiner)`,
        `left_join`); `App.store(store)` reads it. The store (named `store`,
        else `<topic>-STATE-STORE-<n>`) is RocksDB without a changelog: the
        topic is its changelog, so give it `cleanup.policy=compact`.
        """
        from runtime.topology.global_table import add_global_table

        check_topic(topic)
        return add_global_table(
            self._graph,
            topic,
            check_serde(key_serde, "key_serde"),
            check_serde(value_serde, "value_serde"),
            None if store is None else check_store_name(store),
            name,
        )
