"""Re-aggregating a table: `KTable.group_by(selector)` and `KGroupedTable`.

Kafka Streams' `KTable.groupBy(...).aggregate/count/reduce` with an adder and a
subtractor. A table row belongs to one group at a time; when it changes, the
old row leaves its group (subtractor) and the new row joins its group
(adder). The graph (Kafka Streams' names):

    table (sending old values) -> KTABLE-SELECT-<n> -> KSTREAM-SINK-<n>
        -> <application.id>-<name or store>-repartition
        -> KSTREAM-SOURCE-<n> -> KTABLE-AGGREGATE-<n> / KTABLE-REDUCE-<n> (store)

`TableSelectNode` maps the new and the old row with `selector(key, value) ->
(group key, value)`. When both land in the same group it sends one record
carrying both (KIP-904); otherwise the old one first (subtract, to the old
group's partition), then the new one (add, to the new group's). Rows mapped
to a None key or value are skipped. The repartition topic's values are
`(new, old)` pairs (`ChangeSerde`: a flag byte, the new value's length and
bytes, the old value's bytes).

`TableAggregateNode` applies a pair to its group's aggregate: subtract the
old value if the aggregate exists, then add the new one (starting from the
initializer, or for `reduce` from the value itself). An aggregate of None
deletes the group; a `count` that drops to 0 stays at 0, as in Kafka Streams.
The store is key-value, change-logged and cached like every aggregation's;
the store's flush listener forwards the updates (`_StoreWriterNode`).

Result timestamps are the updating record's (Kafka Streams': the largest
timestamp the aggregate has seen; this runtime's stores keep no timestamps).

Key-parallel: both nodes work per key, so they run key-parallel.

Threads: `KGroupedTable` on the thread defining the topology; nodes on the
processing thread holding the task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology import serdes as _serdes
from runtime.topology.context import TaskContext
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import Node, _not_initialized
from runtime.topology.record import Record
from runtime.topology.stateful_nodes import _StoreWriterNode
from runtime.topology.table_changes import old_value_of

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.topology.builder import GraphBuilder
    from runtime.topology.ktable import KTable

_NEW, _OLD = 1, 2


class ChangeSerde:
    """`(new, old)` value pairs of a table re-grouping's repartition topic.

    Layout: one flag byte (1: new present, 2: old present), the new value's
    length (4 bytes big-endian), its bytes, then the old value's bytes.
    `inner` serializes each value; None means the configured default value
    serde (nodes resolve it, as `serdes.windowed(None, ...)`).
    """

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    @property
    def name(self) -> str:
        return f"change({getattr(self.inner, 'name', self.inner)!r})"

    def with_inner(self, inner: Any) -> ChangeSerde:
        return ChangeSerde(inner)

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        new, old = obj
        ser = self.inner.serialize
        new_bytes = b"" if new is None else ser(new) or b""
        old_bytes = b"" if old is None else ser(old) or b""
        flags = (_NEW if new is not None else 0) | (_OLD if old is not None else 0)
        return bytes((flags,)) + len(new_bytes).to_bytes(4, "big") + new_bytes + old_bytes

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        flags = data[0]
        n = int.from_bytes(data[1:5], "big")
        de = self.inner.deserialize
        new = de(data[5 : 5 + n]) if flags & _NEW else None
        old = de(data[5 + n :]) if flags & _OLD else None
        return (new, old)

    def __repr__(self) -> str:
        return f"ChangeSerde({self.inner!r})"


def _pair(selector: Callable[[Any, Any], Any], key: Any, value: Any) -> tuple[Any, Any] | None:
    """`selector(key, value)` as a (group key, value) pair; None when either is None."""
    if value is None:
        return None
    pair = selector(key, value)
    if pair is None:
        return None
    try:
        group, selected = pair
    except (TypeError, ValueError):
        raise TypeError(
            f"KTable.group_by() selector must return a (key, value) pair, got {pair!r}"
        ) from None
    if group is None or selected is None:
        return None
    return group, selected


class TableSelectNode(Node):
    """`KTable.group_by`'s selector over new and old rows (see the module docstring)."""

    __slots__ = ("selector",)

    def __init__(self, name: str, selector: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.selector = selector

    def process(self, record: Record) -> None:
        key = record.key
        new = _pair(self.selector, key, record.value)
        old = _pair(self.selector, key, old_value_of(record))
        if new is not None and old is not None and new[0] == old[0]:
            self._emit(Record(new[0], (new[1], old[1]), record.timestamp, record.headers))
            return
        if old is not None:
            self._emit(Record(old[0], (None, old[1]), record.timestamp, record.headers))
        if new is not None:
            self._emit(Record(new[0], (new[1], None), record.timestamp, record.headers))


class TableAggregateNode(_StoreWriterNode):
    """`KGroupedTable.aggregate`/`reduce`/`count`: subtract the old, add the new.

    `adder(key, value, agg)`/`subtractor(key, value, agg)`; `initializer()`
    starts an aggregate, or with `initializer` None (reduce) the first value
    is the aggregate.
    """

    __slots__ = ("initializer", "adder", "subtractor", "_group_dropped")

    def __init__(
        self,
        name: str,
        store: str,
        key_serde: Any,
        value_serde: Any,
        initializer: Callable[[], Any] | None,
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
    ) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.initializer = initializer
        self.adder = adder
        self.subtractor = subtractor
        self._group_dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._group_dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        key = record.key
        pair = record.value
        if key is None or pair is None:
            self._group_dropped("null_key" if key is None else "null_value")
            return
        new, old = pair
        key_bytes = self._key_ser(key)
        self._writing(key_bytes, record.headers)
        store = self._store
        data = store.get(key_bytes)
        agg = None if data is None else self._value_de(data)
        if old is not None and agg is not None:
            agg = self.subtractor(key, old, agg)
        if new is not None:
            if agg is not None:
                agg = self.adder(key, new, agg)
            elif self.initializer is not None:
                agg = self.adder(key, new, self.initializer())
            else:
                agg = new
        if agg is None:
            store.delete(key_bytes)
        else:
            store.put(key_bytes, self._value_ser(agg))


def make_select(d: NodeDef) -> Node:
    return TableSelectNode(d.name, d.params["selector"])


def make_table_aggregate(d: NodeDef) -> Node:
    p = d.params
    return TableAggregateNode(
        d.name,
        p["store"],
        p["key_serde"],
        p["value_serde"],
        p["initializer"],
        p["adder"],
        p["subtractor"],
    )


def _count_add(key: Any, value: Any, agg: int) -> int:
    return agg + 1


def _count_subtract(key: Any, value: Any, agg: int) -> int:
    return agg - 1


def _count_init() -> int:
    return 0


class KGroupedTable:
    """A table's rows grouped by a new key, ready to re-aggregate (from `KTable.group_by`).

    `key_serde`/`value_serde` serialize the group keys and the selected
    values (repartition topic, store keys; None: the configured defaults).
    """

    __slots__ = ("_graph", "_node", "key_serde", "value_serde", "_name", "_make_table")

    def __init__(
        self,
        graph: GraphBuilder,
        node: str,
        key_serde: Any,
        value_serde: Any,
        name: str | None,
        make_table: Callable[..., KTable],
    ) -> None:
        self._graph = graph
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._name = name
        self._make_table = make_table

    def __repr__(self) -> str:
        return f"KGroupedTable({self._node!r})"

    def count(self, store: str | None = None, name: str | None = None) -> KTable:
        """Rows per group (values INT64); a group whose rows all left counts 0."""
        return self._aggregate(
            "KTABLE-AGGREGATE-",
            name,
            store,
            _serdes.INT64,
            _count_init,
            _count_add,
            _count_subtract,
        )

    def reduce(
        self,
        adder: Callable[[Any, Any], Any],
        subtractor: Callable[[Any, Any], Any],
        store: str | None = None,
        name: str | None = None,
    ) -> KTable:
        """Per group: the first value, then `adder(agg, value)` for rows joining
        and `subtractor(agg, value)` for rows leaving. None deletes the group."""
        add = _check(adder, "KGroupedTable.reduce() adder")
        sub = _check(subtractor, "KGroupedTable.reduce() subtractor")
        return self._aggregate(
            "KTABLE-REDUCE-",
            name,
            store,
            self.value_serde,
            None,
            lambda key, value, agg: add(agg, value),
            lambda key, value, agg: sub(agg, value),
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per group: `adder(key, value, agg)` for rows joining (from
        `initializer()`), `subtractor(key, value, agg)` for rows leaving.
        `value_serde` serializes the aggregate (None: the default). None
        deletes the group."""
        return self._aggregate(
            "KTABLE-AGGREGATE-",
            name,
            store,
            value_serde,
            _check(initializer, "KGroupedTable.aggregate() initializer"),
            _check(adder, "KGroupedTable.aggregate() adder"),
            _check(subtractor, "KGroupedTable.aggregate() subtractor"),
        )

    def _aggregate(
        self,
        prefix: str,
        name: str | None,
        store: str | None,
        value_serde: Any,
        initializer: Callable[[], Any] | None,
        adder: Callable[[Any, Any, Any], Any],
        subtractor: Callable[[Any, Any, Any], Any],
    ) -> KTable:
        graph = self._graph
        if store is None:
            store_name = graph.new_name("KTABLE-AGGREGATE-STATE-STORE-")
        elif not isinstance(store, str) or not store:
            raise TopologyError(f"a state store name must be a non-empty str, got {store!r}")
        else:
            store_name = store
        if graph.store(store_name) is not None:
            raise TopologyError(f"the topology already has a state store named {store_name!r}")
        topic = graph.reserve_internal_topic(f"{self._name or store_name}-repartition")
        sink = graph.new_name("KSTREAM-SINK-")
        source = graph.new_name("KSTREAM-SOURCE-")
        changes = ChangeSerde(self.value_serde)
        graph.add_sink(
            sink, self._node, topic, True, self.key_serde, changes, None, origin="group_by"
        )
        graph.add_source(source, [topic], True, self.key_serde, changes)
        node = graph.node_name(name, prefix)
        graph.add_store(StateStoreDef(_store_spec(store_name), self.key_serde, value_serde))
        graph.add_processor(
            node,
            make_table_aggregate,
            (source,),
            {
                "store": store_name,
                "key_serde": self.key_serde,
                "value_serde": value_serde,
                "initializer": initializer,
                "adder": adder,
                "subtractor": subtractor,
            },
            (store_name,),
        )
        return self._make_table(graph, node, store_name, self.key_serde, value_serde)


def _store_spec(name: str) -> StoreSpec:
    """The aggregate's store: key-value, RocksDB, cached, change-logged (the
    import waits until call time: runtime.state imports this package)."""
    from runtime.state.builders import StoreSpec

    try:
        return StoreSpec(name)
    except ValueError as exc:
        raise TopologyError(str(exc)) from None


def _check(fn: Any, what: str) -> Any:
    if not callable(fn):
        raise TopologyError(f"{what} must be callable, got {fn!r}")
    return fn


def add_select(
    graph: GraphBuilder, parent: str, selector: Callable[[Any, Any], Any], name: str | None
) -> str:
    """Add `KTABLE-SELECT-<n>` (or `name`) below the table node `parent`."""
    node = graph.node_name(name, "KTABLE-SELECT-")
    graph.add_processor(node, make_select, (parent,), {"selector": selector})
    return node


__all__ = ["ChangeSerde", "KGroupedTable", "TableAggregateNode", "TableSelectNode", "add_select"]
