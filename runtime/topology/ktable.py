"""`KTable`: a changelog stream read as a table (latest value per key).

A KTable comes from `StreamsBuilder.table` or from an aggregation
(`KGroupedStream.count/reduce/aggregate`, and their windowed forms). Its
updates are the records its node forwards: one per key per commit with
caching on, one per write with caching off; a value of None is a tombstone
(the key was deleted or filtered out).

`filter`, `filter_not` and `map_values` are not materialized: they transform
updates on the way down, and for joins the table is read through its nearest
materialized ancestor with the same steps applied on read
(`TableValueGetter`). Windowed tables (from `windowed_by`) have `Windowed`
keys and cannot be joined.

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology import serdes as _serdes
from runtime.topology.builder import GraphBuilder, check_callable, store_spec
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef
from runtime.topology.nodes import Node, PassThroughNode
from runtime.topology.stateful_nodes import (
    TableFilterNode,
    TableMapValuesNode,
    TableSourceNode,
    TableValueGetter,
    filter_step,
    map_values_step,
)

if TYPE_CHECKING:
    from runtime.topology.kstream import KStream


def make_table_source(d: NodeDef) -> Node:
    p = d.params
    return TableSourceNode(d.name, p["store"], p["key_serde"], p["value_serde"])


def _make_filter(d: NodeDef) -> Node:
    return TableFilterNode(d.name, d.params["fn"], d.params["keep"])


def _make_map_values(d: NodeDef) -> Node:
    return TableMapValuesNode(d.name, d.params["fn"])


def _make_to_stream(d: NodeDef) -> Node:
    return PassThroughNode(d.name)


class KTable:
    """A table of the latest value per key; see the module docstring.

    `key_serde`/`value_serde` are the serdes of its keys and values when
    known (None: the configured defaults). `store_name` is the store that
    materializes it (None for a filtered or mapped table). `window_size_ms` is
    set for windowed tables, whose keys are `Windowed`.
    """

    __slots__ = (
        "_graph",
        "_node",
        "key_serde",
        "value_serde",
        "store_name",
        "window_size_ms",
        "_getter",
    )

    def __init__(
        self,
        graph: GraphBuilder,
        node: str,
        key_serde: Any,
        value_serde: Any,
        store_name: str | None,
        getter: TableValueGetter | None,
        window_size_ms: int | None = None,
    ) -> None:
        self._graph = graph
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.store_name = store_name
        self.window_size_ms = window_size_ms
        self._getter = getter

    @classmethod
    def materialized(
        cls,
        graph: GraphBuilder,
        node: str,
        store: str,
        key_serde: Any,
        value_serde: Any,
        window_size_ms: int | None = None,
    ) -> KTable:
        """The table whose node writes `store` (a source table or an aggregation)."""
        getter = TableValueGetter(store, key_serde, value_serde) if window_size_ms is None else None
        return cls(graph, node, key_serde, value_serde, store, getter, window_size_ms)

    @property
    def name(self) -> str:
        """The name of the node that produces this table's updates."""
        return self._node

    @property
    def windowed(self) -> bool:
        return self.window_size_ms is not None

    def __repr__(self) -> str:
        return f"KTable({self._node!r}, store={self.store_name!r})"

    def _derive(
        self,
        prefix: str,
        name: str | None,
        factory: Callable[[NodeDef], Node],
        params: dict[str, Any],
        value_serde: Any,
        getter: TableValueGetter | None,
    ) -> KTable:
        node = self._graph.node_name(name, prefix)
        self._graph.add_processor(node, factory, (self._node,), params)
        return KTable(
            self._graph, node, self.key_serde, value_serde, None, getter, self.window_size_ms
        )

    def filter(self, predicate: Callable[[Any, Any], Any], name: str | None = None) -> KTable:
        """The rows for which `predicate(key, value)` is true.

        An update the predicate rejects is forwarded as a tombstone `(key,
        None)`, so a row that stops matching disappears downstream.
        """
        fn = check_callable(predicate, "KTable.filter()")
        getter = self._getter.then(filter_step(fn, True)) if self._getter else None
        return self._derive(
            "KTABLE-FILTER-",
            name,
            _make_filter,
            {"fn": fn, "keep": True},
            self.value_serde,
            getter,
        )

    def filter_not(self, predicate: Callable[[Any, Any], Any], name: str | None = None) -> KTable:
        """The rows for which `predicate(key, value)` is false (see `filter`)."""
        fn = check_callable(predicate, "KTable.filter_not()")
        getter = self._getter.then(filter_step(fn, False)) if self._getter else None
        return self._derive(
            "KTABLE-FILTER-",
            name,
            _make_filter,
            {"fn": fn, "keep": False},
            self.value_serde,
            getter,
        )

    def map_values(self, mapper: Callable[[Any], Any], name: str | None = None) -> KTable:
        """Each value replaced by `mapper(value)`; tombstones stay tombstones."""
        fn = check_callable(mapper, "KTable.map_values()")
        getter = self._getter.then(map_values_step(fn)) if self._getter else None
        return self._derive("KTABLE-MAPVALUES-", name, _make_map_values, {"fn": fn}, None, getter)

    def to_stream(self, name: str | None = None) -> KStream:
        """The stream of this table's updates (tombstones included, as value None).

        A windowed table's stream has `Windowed` keys and the key serde
        `serdes.windowed(<table key serde>, size)` (Kafka's TimeWindowedSerde
        layout), so `.to(topic)` writes them without further ado.
        """
        from runtime.topology.kstream import KStream

        key_serde = self.key_serde
        if self.window_size_ms is not None:
            key_serde = _serdes.windowed(key_serde, self.window_size_ms)
        node = self._graph.node_name(name, "KTABLE-TOSTREAM-")
        self._graph.add_processor(node, _make_to_stream, (self._node,))
        return KStream(self._graph, node, key_serde, self.value_serde, False)

    def suppress(self, suppressed: Any) -> KTable:
        """Hold updates back: `Suppressed.until_window_closes(...)` (final results
        of a windowed table) or `until_time_limit(...)`; see `runtime.topology.suppress`."""
        from runtime.topology.suppress import suppress

        return suppress(self, suppressed, store_spec)

    # -- for stream-table joins (package-internal) -----------------------------

    def value_getter(self, what: str) -> TableValueGetter:
        """How a join reads this table; TopologyError when it cannot be read."""
        if self.window_size_ms is not None:
            raise TopologyError(f"{what}: a windowed table cannot be joined with a stream")
        if self._getter is None:
            raise TopologyError(f"{what}: the table is not readable (no store)")
        return self._getter

    def graph_builder(self) -> GraphBuilder:
        return self._graph
