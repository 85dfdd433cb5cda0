"""Old values of KTable updates: the `Change` record and how a table starts sending them.

A KTable's updates carry the new value only, unless an operator downstream
needs the value it replaces: a left or outer table-table join (to send a
tombstone when a matched row goes away) and `KTable.group_by` (to subtract
the old value from its old group). Kafka Streams then calls
`enableSendingOldValues` up the table's chain; here `enable_old_values` does
the same at build time:

- a store-writing table node (`builder.table`, `to_table`, an aggregation, a
  materialized join) gets `send_old_values` on its store (the store hands the
  previous value to the flush listener) and forwards `Change` records;
- `filter`/`map_values` nodes apply themselves to the old value too, and a
  filter forwards nothing when both values are None (Kafka Streams' rule: no
  tombstone for a row downstream never saw);
- `KTable.filter` asks for old values itself when its table can send them
  without being materialized for it (`sends_old_values_unforced`, Kafka
  Streams' `enableSendingOldValues(false)` in `KTableFilter`'s constructor):
  a filtered materialized table then forwards no tombstone for a rejected
  update of a row that did not pass before either;
- an unmaterialized table-table join computes the old result from its sides'
  old values (both sides then send them).

`Change` is a `Record` with one more slot, `old_value`, so every node that
does not care reads it as a plain record. Operators that do not need old
values strip nothing: a `Change` passing through `to_stream` is written as
its new value.

Threads: `enable_old_values` runs on the thread that defines the topology;
the node classes on the processing thread holding the task, like every node.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import Node
from runtime.topology.record import Headers, Record
from runtime.topology.stateful_nodes import TableFilterNode, TableMapValuesNode, _StoreWriterNode

if TYPE_CHECKING:
    from runtime.topology.builder import GraphBuilder

# What a table node is, for `enable_old_values` (keyed by its NodeSpec factory).
STORE, FILTER, MAP_VALUES, JOIN = "store", "filter", "map_values", "join"


class Change(Record):
    """A table update with the value it replaces (`old_value`, None: none)."""

    __slots__ = ("old_value",)

    def __init__(
        self,
        key: Any,
        value: Any,
        timestamp: int,
        old_value: Any,
        headers: Headers | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        super().__init__(key, value, timestamp, headers, topic, partition, offset)
        self.old_value = old_value

    def __repr__(self) -> str:
        return f"Change(key={self.key!r}, new={self.value!r}, old={self.old_value!r})"


def old_value_of(record: Record) -> Any:
    """The value `record` replaces (None for a plain record: nothing known)."""
    return record.old_value if type(record) is Change else None


def change(record: Record, new: Any, old: Any) -> Change:
    """`record` with new and old values, origin and headers kept."""
    return Change(
        record.key,
        new,
        record.timestamp,
        old,
        record.headers,
        record.topic,
        record.partition,
        record.offset,
    )


# -- node variants that send old values ----------------------------------------


def _on_flush_with_old(
    self: _StoreWriterNode, key: bytes, new: bytes | None, old: bytes | None, timestamp: int
) -> None:
    old_value = None if old is None else self._value_de(old)
    headers = self._last_write.headers_of(key)
    self._emit(Change(self._key_de(key), self._emitted_value(new), timestamp, old_value, headers))


_WITH_OLD: dict[type, type] = {}


def _store_writer_with_old(node: Node) -> Node:
    """`node` (a store-writing table node) turned into its old-value-sending variant.

    The variant is a subclass with no slots of its own, so the instance just
    changes class; its store has `send_old_values` (set by `enable_old_values`).
    """
    cls = type(node)
    if not isinstance(node, _StoreWriterNode):
        raise TopologyError(f"node {node.name!r} does not write a table store")
    variant = _WITH_OLD.get(cls)
    if variant is None:
        variant = _WITH_OLD[cls] = type(
            f"{cls.__name__}WithOldValues",
            (cls,),
            {"__slots__": (), "on_flush": _on_flush_with_old},
        )
    node.__class__ = variant
    return node


class TableFilterChangeNode(TableFilterNode):
    """`KTable.filter` sending old values: both values filtered; nothing when both are None."""

    __slots__ = ()

    def _keep(self, key: Any, value: Any) -> Any:
        if value is None or bool(self.predicate(key, value)) != self.keep:
            return None
        return value

    def process(self, record: Record) -> None:
        new = self._keep(record.key, record.value)
        old = self._keep(record.key, old_value_of(record))
        if new is None and old is None:
            return
        self._emit(change(record, new, old))


class TableMapValuesChangeNode(TableMapValuesNode):
    """`KTable.map_values` sending old values: both mapped, None stays None."""

    __slots__ = ()

    def process(self, record: Record) -> None:
        new, old = record.value, old_value_of(record)
        fn = self.fn
        self._emit(
            change(record, None if new is None else fn(new), None if old is None else fn(old))
        )


def _filter_with_old(node: Node) -> Node:
    assert isinstance(node, TableFilterNode)
    return TableFilterChangeNode(node.name, node.predicate, node.keep)


def _map_values_with_old(node: Node) -> Node:
    assert isinstance(node, TableMapValuesNode)
    return TableMapValuesChangeNode(node.name, node.fn)


def _wrap(factory: Callable[[NodeDef], Node], convert: Callable[[Node], Node]) -> Any:
    def make(d: NodeDef) -> Node:
        return convert(factory(d))

    make.sends_old_values = True  # type: ignore[attr-defined]
    return make


def sends_old_values_unforced(graph: GraphBuilder, node: str, kinds: Mapping[Any, str]) -> bool:
    """Whether the table produced by `node` can send old values without a
    store added for it: Kafka Streams' `enableSendingOldValues(false)`.

    True for a table already sending them, a table source whose store the
    user named (`builder.table`/`to_table` with `store`: Kafka Streams'
    `Materialized.as`; an internal store does not count, as its
    `KTableSource.materialized()`), an aggregation or materialized join (they
    always have their store), an unmaterialized table-table join (Kafka
    Streams' join merger enables its sides with force, and answers yes), and
    a filter or `map_values` whose parent can. False otherwise: an unnamed
    source, a windowed table, a Processor API table.
    """
    spec = graph.specs[node]
    if getattr(spec.factory, "sends_old_values", False) or spec.params.get("send_old"):
        return True
    kind = kinds.get(spec.factory)
    if kind == STORE:
        return bool(spec.params.get("queryable", True))
    if kind in (FILTER, MAP_VALUES):
        return sends_old_values_unforced(graph, spec.parents[0], kinds)
    return kind == JOIN


def enable_old_values(graph: GraphBuilder, node: str, kinds: Mapping[Any, str], what: str) -> None:
    """Make the table produced by `node` send old values (see the module docstring).

    `kinds` says what each table factory is (STORE, FILTER, MAP_VALUES, JOIN);
    `what` names the operator asking, for the error when a table cannot.
    Idempotent: a node already sending old values is left alone.
    """
    spec = graph.specs[node]
    if getattr(spec.factory, "sends_old_values", False) or spec.params.get("send_old"):
        return
    kind = kinds.get(spec.factory)
    if kind == STORE:
        store = spec.params["store"]
        current = graph.store(store)
        assert current is not None, store
        graph.replace_store(
            StateStoreDef(
                replace(current.spec, send_old_values=True),
                current.key_serde,
                current.value_serde,
            )
        )
        spec.factory = _wrap(spec.factory, _store_writer_with_old)
    elif kind in (FILTER, MAP_VALUES):
        spec.factory = _wrap(
            spec.factory, _filter_with_old if kind == FILTER else _map_values_with_old
        )
        enable_old_values(graph, spec.parents[0], kinds, what)
    elif kind == JOIN:
        # An unmaterialized join's merge node: its two join nodes compute the
        # old result from the old value of their side (Kafka Streams enables
        # old values on both joined tables).
        spec.params["send_old"] = True
        for join_node in spec.parents:
            join_spec = graph.specs[join_node]
            join_spec.params["send_old"] = True
            enable_old_values(graph, join_spec.parents[0], kinds, what)
    else:
        raise TopologyError(
            f"{what}: the table of node {node!r} cannot send the old values it needs "
            "(a windowed table, or one made by the Processor API)"
        )
