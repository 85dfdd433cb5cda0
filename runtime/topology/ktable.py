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
    from runtime.topology.table_grouping import KGroupedTable


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
        None)`, so a row that stops matching disappears downstream. When this
        table can tell what it replaces (its store was named, it is an
        aggregation or a table-table join, as Kafka Streams'
        `enableSendingOldValues(false)`), the old value is filtered too and a
        rejected update of a row that did not pass before forwards nothing.
        """
        fn = check_callable(predicate, "KTable.filter()")
        return self._filter(fn, True, name, "KTable.filter()")

    def filter_not(self, predicate: Callable[[Any, Any], Any], name: str | None = None) -> KTable:
        """The rows for which `predicate(key, value)` is false (see `filter`)."""
        fn = check_callable(predicate, "KTable.filter_not()")
        return self._filter(fn, False, name, "KTable.filter_not()")

    def _filter(
        self, fn: Callable[[Any, Any], Any], keep: bool, name: str | None, what: str
    ) -> KTable:
        from runtime.topology.table_changes import sends_old_values_unforced

        getter = self._getter.then(filter_step(fn, keep)) if self._getter else None
        table = self._derive(
            "KTABLE-FILTER-", name, _make_filter, {"fn": fn, "keep": keep}, self.value_serde, getter
        )
        # Kafka Streams' KTableFilter asks its parent for old values without
        # forcing a store on it; where the parent has them, the filter sends
        # them too and drops updates that neither pass now nor passed before.
        if sends_old_values_unforced(self._graph, self._node, self._table_kinds()):
            table._enable_old_values(what)
        return table

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

    # -- table-table joins and re-grouping (runtime.topology.table_joins,
    #    table_grouping; old values: table_changes) ---------------------------

    def join(
        self,
        other: KTable,
        joiner: Callable[..., Any],
        foreign_joiner: Callable[[Any, Any], Any] | None = None,
        *,
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """The inner join with the table `other`.

        `join(other, joiner)`: same keys, co-partitioned; `joiner(value,
        other_value)` per key both have (`runtime.topology.table_joins`).
        `join(other, foreign_key_extractor, joiner)`: each row joins the row of
        `other` whose key is `foreign_key_extractor(value)` (KIP-213,
        `runtime.topology.fk_join`). With `store` the result is materialized.
        """
        if foreign_joiner is not None:
            return self._fk_join(other, joiner, foreign_joiner, False, store, value_serde, name)
        return self._table_join(other, joiner, False, False, store, value_serde, name, "join")

    def left_join(
        self,
        other: KTable,
        joiner: Callable[..., Any],
        foreign_joiner: Callable[[Any, Any], Any] | None = None,
        *,
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Every row of this table, `joiner(value, other_value or None)`; with a
        foreign-key extractor first, the foreign-key left join (see `join`)."""
        if foreign_joiner is not None:
            return self._fk_join(other, joiner, foreign_joiner, True, store, value_serde, name)
        return self._table_join(other, joiner, True, False, store, value_serde, name, "left_join")

    def outer_join(
        self,
        other: KTable,
        joiner: Callable[[Any, Any], Any],
        *,
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Every row of either table; the missing side's value is None."""
        return self._table_join(other, joiner, True, True, store, value_serde, name, "outer_join")

    def group_by(
        self,
        selector: Callable[[Any, Any], Any],
        key_serde: Any = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KGroupedTable:
        """Rows regrouped by `selector(key, value) -> (new key, new value)`, to
        re-aggregate with an adder and a subtractor (`runtime.topology.table_grouping`).
        `name` names the repartition topic `<name>-repartition` (default: the store's)."""
        from runtime.topology.builder import check_serde
        from runtime.topology.table_grouping import KGroupedTable, add_select

        fn = check_callable(selector, "KTable.group_by()")
        if self.window_size_ms is not None:
            raise TopologyError("KTable.group_by(): a windowed table cannot be regrouped")
        self._enable_old_values("KTable.group_by()")
        node = add_select(self._graph, self._node, fn, name)
        return KGroupedTable(
            self._graph,
            node,
            check_serde(key_serde, "key_serde"),
            check_serde(value_serde, "value_serde"),
            name,
            KTable.materialized,
        )

    def _table_join(
        self,
        other: KTable,
        joiner: Callable[[Any, Any], Any],
        left_outer: bool,
        right_outer: bool,
        store: str | None,
        value_serde: Any,
        name: str | None,
        op: str,
    ) -> KTable:
        from runtime.topology.builder import check_serde, check_store_name, store_spec
        from runtime.topology.table_joins import table_join

        what = f"KTable.{op}()"
        if not isinstance(other, KTable):
            raise TopologyError(
                f"{what} joins two KTables; got {other!r} (a KStream joins a table)"
            )
        if other._graph is not self._graph:
            raise TopologyError(f"{what}: both tables must come from the same StreamsBuilder")
        fn = check_callable(joiner, what)
        value_serde = check_serde(value_serde, "value_serde")
        this_getter, other_getter = self.value_getter(what), other.value_getter(what)
        if left_outer:
            self._enable_old_values(what)
        if right_outer:
            other._enable_old_values(what)
        materialized = None
        if store is not None:
            materialized = (check_store_name(store), self.key_serde, value_serde)
        node, getter = table_join(
            self._graph,
            (self._node, this_getter),
            (other._node, other_getter),
            fn,
            left_outer,
            right_outer,
            name,
            materialized,
            store_spec,
        )
        return KTable(self._graph, node, self.key_serde, value_serde, store, getter)

    def _fk_join(
        self,
        other: KTable,
        extractor: Callable[[Any], Any],
        joiner: Callable[[Any, Any], Any],
        left: bool,
        store: str | None,
        value_serde: Any,
        name: str | None,
    ) -> KTable:
        from runtime.topology.builder import check_serde, check_store_name, store_spec
        from runtime.topology.fk_join_dsl import FkTables, fk_join

        what = "KTable.left_join()" if left else "KTable.join()"
        if not isinstance(other, KTable):
            raise TopologyError(f"{what} with a foreign key joins two KTables; got {other!r}")
        if other._graph is not self._graph:
            raise TopologyError(f"{what}: both tables must come from the same StreamsBuilder")
        extract = check_callable(extractor, f"{what} foreign_key_extractor")
        fn = check_callable(joiner, what)
        value_serde = check_serde(value_serde, "value_serde")
        if self.key_serde is None or other.key_serde is None:
            raise TopologyError(
                f"{what} with a foreign key needs both tables' key serdes (give key_serde= to "
                "builder.table / builder.stream): the subscription topics carry both keys"
            )
        this_side = FkTables(self._node, self.value_getter(what), self.key_serde, self.value_serde)
        other_side = FkTables(
            other._node, other.value_getter(what), other.key_serde, other.value_serde
        )
        self._enable_old_values(what)
        other._enable_old_values(what)
        node, store_name = fk_join(
            self._graph,
            this_side,
            other_side,
            extract,
            fn,
            left,
            name,
            None if store is None else check_store_name(store),
            value_serde,
            store_spec,
            make_table_source,
        )
        return KTable.materialized(self._graph, node, store_name, self.key_serde, value_serde)

    def _enable_old_values(self, what: str) -> None:
        from runtime.topology import table_changes

        table_changes.enable_old_values(self._graph, self._node, self._table_kinds(), what)

    @staticmethod
    def _table_kinds() -> dict[Any, str]:
        """What each table node factory is, for `runtime.topology.table_changes`."""
        from runtime.topology import cogroup, table_changes, table_grouping, table_joins
        from runtime.topology.grouped import _make_aggregate

        return {
            make_table_source: table_changes.STORE,
            _make_aggregate: table_changes.STORE,
            table_joins.make_join_store: table_changes.STORE,
            table_grouping.make_table_aggregate: table_changes.STORE,
            _make_filter: table_changes.FILTER,
            _make_map_values: table_changes.MAP_VALUES,
            table_joins.make_merge: table_changes.JOIN,
            cogroup.make_merge: table_changes.STORE,
        }
