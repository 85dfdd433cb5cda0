"""Global tables: `StreamsBuilder.global_table`, `GlobalKTable`, and the
stream-global table join node.

A global table is a whole topic (every partition) kept in one store per
process, read by the app's global thread (`runtime.state.global_thread`),
not by tasks: its topic is its changelog, so the store has none, and it is
part of no subtopology. The topology only records it (`GlobalStoreDef`,
`Topology.global_stores`) and shows it in `describe()` as Kafka Streams does
("Sub-topology: N for global store (will not generate tasks)").

`KStream.join(global_table, key_mapper, joiner)` / `left_join` add a
`GlobalTableJoinNode` (`global_join`): each record looks up
`key_mapper(key, value)` in the global store. No co-partitioning and no
repartition topic: every process has the whole table. Rules, as Kafka
Streams 4.3's `KStreamKTableJoinProcessor` (read from its byte code): the
mapper is called for every record (a None key or value too); a record with
a None value is dropped; a None mapped key drops the record in the inner
join and joins it with None in the left join; otherwise the inner join
emits only when the table has the key.

Threads: the builder calls are made by the thread defining the topology;
the node runs on the processing thread holding its task (key-parallel:
several, for different keys; the node keeps no per-record state, and the
store's reads are safe beside the global thread's writes).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.topology.context import TaskContext
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef
from runtime.topology.nodes import Node, _not_initialized, resolve_serde
from runtime.topology.record import Record

if TYPE_CHECKING:
    from runtime.topology.builder import GraphBuilder


@dataclass(frozen=True)
class GlobalStoreDef:
    """One global table: its store, the topic it mirrors, the serdes that
    decode the store (None: the configured defaults), and the names of its
    source and table nodes (for `describe()`)."""

    store: str
    topic: str
    key_serde: Any
    value_serde: Any
    source: str
    processor: str

    def describe(self, id: int) -> str:
        return (
            f"   Sub-topology: {id} for global store (will not generate tasks)\n"
            f"    Source: {self.source} (topics: [{self.topic}])\n"
            f"      --> {self.processor}\n"
            f"    Processor: {self.processor} (stores: [{self.store}])\n"
            f"      --> none\n"
            f"      <-- {self.source}\n"
        )


class GlobalKTable:
    """A table of the latest value per key of a whole topic, on every
    process (create with `StreamsBuilder.global_table`). It has no DSL
    operators of its own: join a stream with it
    (`KStream.join(table, key_mapper, joiner)`, `left_join`)."""

    __slots__ = ("_graph", "definition")

    def __init__(self, graph: GraphBuilder, definition: GlobalStoreDef) -> None:
        self._graph = graph
        self.definition = definition

    @property
    def store_name(self) -> str:
        """The global store's name (`App.store(name)` reads it)."""
        return self.definition.store

    def graph_builder(self) -> GraphBuilder:
        return self._graph

    def __repr__(self) -> str:
        return f"GlobalKTable(topic={self.definition.topic!r}, store={self.definition.store!r})"


def add_global_table(
    graph: GraphBuilder,
    topic: str,
    key_serde: Any,
    value_serde: Any,
    store: str | None,
    name: str | None,
) -> GlobalKTable:
    """What `StreamsBuilder.global_table` does (arguments already checked):
    names as Kafka Streams generates them (store, then source, then table
    node), the topic claimed so no stream reads it too."""
    store_name = store if store is not None else graph.new_name(f"{topic}-STATE-STORE-")
    source = graph.node_name(name, "KSTREAM-SOURCE-")
    processor = f"{name}-table" if name is not None else graph.new_name("KTABLE-SOURCE-")
    definition = GlobalStoreDef(store_name, topic, key_serde, value_serde, source, processor)
    graph.add_global_store(definition)
    return GlobalKTable(graph, definition)


class GlobalTableJoinNode(Node):
    """`KStream.join`/`left_join` with a `GlobalKTable` (see the module doc)."""

    __slots__ = (
        "store",
        "key_serde",
        "value_serde",
        "key_mapper",
        "joiner",
        "left",
        "_get",
        "_dropped",
    )

    def __init__(
        self,
        name: str,
        definition: GlobalStoreDef,
        key_mapper: Callable[[Any, Any], Any],
        joiner: Callable[[Any, Any], Any],
        left: bool,
    ) -> None:
        super().__init__(name)
        self.store = definition.store
        self.key_serde = definition.key_serde
        self.value_serde = definition.value_serde
        self.key_mapper = key_mapper
        self.joiner = joiner
        self.left = left
        self._get: Callable[[Any], Any] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        lookup = getattr(ctx, "global_store", None)
        if lookup is None:
            raise TopologyError(
                f"node {self.name!r} joins global table {self.store!r}, but this task "
                "context has no global stores"
            )
        store = lookup(self.store)
        key_ser = resolve_serde(self.key_serde, ctx.default_key_serde, self.name, "key").serialize
        value_de = resolve_serde(
            self.value_serde, ctx.default_value_serde, self.name, "value"
        ).deserialize
        get_bytes = store.get

        def get(key: Any) -> Any:
            data = get_bytes(key_ser(key))
            return None if data is None else value_de(data)

        self._get = get
        self._dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        value = record.value
        mapped = self.key_mapper(record.key, value)
        if value is None:
            self._dropped("null_value")
            return
        if mapped is None:
            if not self.left:
                self._dropped("null_key")
                return
            table_value = None
        else:
            table_value = self._get(mapped)
            if table_value is None and not self.left:
                return
        self._emit(record.with_value(self.joiner(value, table_value)))


def _make_global_join(d: NodeDef) -> Node:
    p = d.params
    return GlobalTableJoinNode(d.name, p["definition"], p["key_mapper"], p["joiner"], p["left"])


def global_join(
    graph: GraphBuilder,
    stream_node: str,
    table: GlobalKTable,
    key_mapper: Any,
    joiner: Any,
    left: bool,
    name: Any,
    extra: Sequence[Any],
) -> str:
    """What `KStream.join/left_join(global_table, key_mapper, joiner[, name])`
    does below the stream's node; returns the join node's name. `extra`: the
    stream-table join's other arguments, which must be left unset here. No
    repartition even after a key change: the lookup key is the mapper's."""
    what = "left_join()" if left else "join()"
    if any(arg is not None for arg in extra):
        raise TopologyError(
            f"{what} with a GlobalKTable takes (global_table, key_mapper, joiner, name): "
            "serdes, windows and stores are not used"
        )
    if table.graph_builder() is not graph:
        raise TopologyError(
            f"{what}: the stream and the global table must come from one StreamsBuilder"
        )
    for fn, role in ((key_mapper, "key_mapper"), (joiner, "joiner")):
        if not callable(fn):
            raise TopologyError(f"{what} with a GlobalKTable expects a callable {role}, got {fn!r}")
    node = graph.node_name(name, "KSTREAM-LEFTJOIN-" if left else "KSTREAM-JOIN-")
    graph.add_processor(
        node,
        _make_global_join,
        (stream_node,),
        {"definition": table.definition, "key_mapper": key_mapper, "joiner": joiner, "left": left},
    )
    return node
