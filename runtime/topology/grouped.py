"""Grouped streams and their aggregations: `KGroupedStream`, `TimeWindowedKStream`.

`KStream.group_by_key()` / `group_by(...)` return a `KGroupedStream`;
`count`, `reduce` and `aggregate` turn it into a `KTable` materialized in a
state store (RocksDB, cached, change-logged). `windowed_by(TimeWindows...)`
gives the windowed forms, materialized in a window store.

Repartitioning (Kafka Streams' rules): when the key may have changed upstream
(`group_by` always; `group_by_key` after `map`, `flat_map`, `process`), the
aggregation reads its input back from the internal topic
`<name>-repartition`, where `name` is the grouping's name if given, else the
store's name (the runtime prefixes `<application.id>-` and creates the topic).
Records with a null key are dropped before that topic (counted `null_key`).
The topic's values use the group's value serde (from `group_by(...,
value_serde=)` or the stream's); when none is known, `count`, which only needs
to know that a value is not null, writes empty values instead of failing on the
configured default serde. That keeps the word count of ARCHITECTURE.md working
with default serdes.

Store names: `store=` if given, else generated as Kafka Streams does,
`KSTREAM-AGGREGATE-STATE-STORE-<n>` (`KSTREAM-REDUCE-STATE-STORE-<n>` for reduce).

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.topology import serdes as _serdes
from runtime.topology.builder import (
    GraphBuilder,
    check_callable,
    check_serde,
    check_store_name,
    store_spec,
)
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.ktable import KTable
from runtime.topology.nodes import Node
from runtime.topology.stateful_nodes import (
    AggregateNode,
    Fold,
    NullKeyFilterNode,
    WindowAggregateNode,
    aggregate_fold,
    count_fold,
    reduce_fold,
)
from runtime.topology.windows import TimeWindows


class PresenceSerde:
    """Values of a `count` repartition topic when no value serde is known.

    Writes b"" for any value and None for None, reads back True / None: count
    only needs to know whether a value was null.
    """

    name = "presence"

    def serialize(self, obj: Any) -> bytes | None:
        return None if obj is None else b""

    def deserialize(self, data: bytes | None) -> bool | None:
        return None if data is None else True

    def __repr__(self) -> str:
        return "PresenceSerde()"


PRESENCE = PresenceSerde()


def _make_null_key_filter(d: NodeDef) -> Node:
    return NullKeyFilterNode(d.name)


def _make_aggregate(d: NodeDef) -> Node:
    p = d.params
    return AggregateNode(d.name, p["store"], p["key_serde"], p["value_serde"], p["fold"])


def _make_window_aggregate(d: NodeDef) -> Node:
    p = d.params
    return WindowAggregateNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["fold"], p["windows"]
    )


class KGroupedStream:
    """A stream grouped by key, ready to aggregate (from `group_by_key`/`group_by`).

    `key_serde`/`value_serde` serialize the group's keys and values (for the
    repartition topic and the store keys; None: the configured defaults).
    """

    __slots__ = (
        "_graph",
        "_node",
        "key_serde",
        "value_serde",
        "repartition_required",
        "_repartition_name",
        "_repartitioned",
    )

    def __init__(
        self,
        graph: GraphBuilder,
        node: str,
        key_serde: Any,
        value_serde: Any,
        repartition_required: bool,
        repartition_name: str | None = None,
    ) -> None:
        self._graph = graph
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.repartition_required = repartition_required
        self._repartition_name = repartition_name
        self._repartitioned: dict[bool, str] = {}

    def __repr__(self) -> str:
        return f"KGroupedStream({self._node!r})"

    # -- aggregations ----------------------------------------------------------

    def count(self, store: str | None = None, name: str | None = None) -> KTable:
        """The number of records per key (values INT64); null values are not counted."""
        return self._aggregate(
            "KSTREAM-AGGREGATE-", name, store, _serdes.INT64, count_fold, None, False
        )

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | None = None,
        name: str | None = None,
    ) -> KTable:
        """Per key: the first value, then `reducer(aggregate, value)` for each next one.

        The aggregate has the type (and serde) of the values. Returning None
        deletes the key.
        """
        fn = check_callable(reducer, "reduce()")
        return self._aggregate(
            "KSTREAM-REDUCE-", name, store, self.value_serde, reduce_fold(fn), None, True
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per key: `aggregator(key, value, aggregate)`, starting from `initializer()`.

        `value_serde` serializes the aggregate in the store (None: the
        configured `default.value.serde`). Returning None deletes the key.
        """
        init = check_callable(initializer, "aggregate() initializer")
        agg = check_callable(aggregator, "aggregate() aggregator")
        return self._aggregate(
            "KSTREAM-AGGREGATE-",
            name,
            store,
            check_serde(value_serde, "value_serde"),
            aggregate_fold(init, agg),
            None,
            True,
        )

    def windowed_by(self, windows: Any) -> Any:
        """Aggregate per key and window, on event time: `TimeWindows` (tumbling,
        hopping), `SessionWindows` or `SlidingWindows`."""
        if isinstance(windows, TimeWindows):
            return TimeWindowedKStream(self, windows)
        windowed_stream = getattr(windows, "windowed_stream", None)  # sessions, sliding
        if windowed_stream is None:
            raise TopologyError(
                "windowed_by() expects TimeWindows, SessionWindows or SlidingWindows, "
                f"got {windows!r}"
            )
        return windowed_stream(self)

    def cogroup(self, aggregator: Callable[[Any, Any, Any], Any]) -> Any:
        """Start a cogroup (KIP-150) with this stream, aggregated with
        `aggregator(key, value, agg)`; see `runtime.topology.cogroup`."""
        from runtime.topology.cogroup import CogroupedKStream

        return CogroupedKStream.start(self, aggregator)

    # -- internals -------------------------------------------------------------

    def _input(self, store: str, values_needed: bool) -> str:
        """The node the aggregation reads from: this stream, or a repartition source."""
        if not self.repartition_required:
            return self._node
        presence = not values_needed and self.value_serde is None
        cached = self._repartitioned.get(presence)
        if cached is not None and self._repartition_name is not None:
            return cached  # a named grouping has one repartition topic for all its aggregations
        graph = self._graph
        topic = graph.reserve_internal_topic(f"{self._repartition_name or store}-repartition")
        value_serde = PRESENCE if presence else self.value_serde
        graph.add_processor(f"{topic}-filter", _make_null_key_filter, (self._node,))
        graph.add_sink(
            f"{topic}-sink",
            f"{topic}-filter",
            topic,
            True,
            self.key_serde,
            value_serde,
            None,
            origin="group_by",
        )
        source = f"{topic}-source"
        graph.add_source(source, [topic], True, self.key_serde, value_serde)
        self._repartitioned[presence] = source
        return source

    def _aggregate(
        self,
        prefix: str,
        name: str | None,
        store: str | None,
        value_serde: Any,
        fold: Fold,
        windows: TimeWindows | None,
        values_needed: bool,
    ) -> KTable:
        graph = self._graph
        if store is None:
            store_name = graph.new_name(f"{prefix}STATE-STORE-")
        else:
            store_name = check_store_name(store)
            if graph.store(store_name) is not None:
                raise TopologyError(f"the topology already has a state store named {store_name!r}")
        if windows is None:
            spec = store_spec(store_name)
            factory = _make_aggregate
        else:
            spec = store_spec(
                store_name,
                kind="window",
                window_size_ms=windows.size_ms,
                retention_ms=windows.retention_ms,
            )
            factory = _make_window_aggregate
        parent = self._input(store_name, values_needed)
        node = graph.node_name(name, prefix)
        graph.add_store(StateStoreDef(spec, self.key_serde, value_serde))
        graph.add_processor(
            node,
            factory,
            (parent,),
            {
                "store": store_name,
                "key_serde": self.key_serde,
                "value_serde": value_serde,
                "fold": fold,
                "windows": windows,
            },
            (store_name,),
        )
        return KTable.materialized(
            graph,
            node,
            store_name,
            self.key_serde,
            value_serde,
            windows.size_ms if windows is not None else None,
        )


class TimeWindowedKStream:
    """A grouped stream aggregated per time window (from `windowed_by`).

    The resulting `KTable` has `Windowed(key, start, end)` keys and lives in a
    window store kept for size + grace; see `WindowAggregateNode` for event
    time, grace and late records.
    """

    __slots__ = ("_grouped", "windows")

    def __init__(self, grouped: KGroupedStream, windows: TimeWindows) -> None:
        self._grouped = grouped
        self.windows = windows

    def __repr__(self) -> str:
        return f"TimeWindowedKStream({self._grouped!r}, {self.windows!r})"

    def emit_strategy(self, strategy: Any) -> Any:
        """`EmitStrategy.on_window_close()`: forward each window once, when it
        closes (KIP-825; `runtime.topology.window_emit_final`)."""
        from runtime.topology.window_emit_final import emit_strategy

        return emit_strategy(self, strategy, store_spec)

    def count(self, store: str | None = None, name: str | None = None) -> KTable:
        """Records per key and window (values INT64)."""
        return self._grouped._aggregate(
            "KSTREAM-AGGREGATE-", name, store, _serdes.INT64, count_fold, self.windows, False
        )

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | None = None,
        name: str | None = None,
    ) -> KTable:
        """Per key and window: first value, then `reducer(aggregate, value)`."""
        fn = check_callable(reducer, "reduce()")
        grouped = self._grouped
        return grouped._aggregate(
            "KSTREAM-REDUCE-",
            name,
            store,
            grouped.value_serde,
            reduce_fold(fn),
            self.windows,
            True,
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per key and window: `aggregator(key, value, aggregate)` from `initializer()`."""
        init = check_callable(initializer, "aggregate() initializer")
        agg = check_callable(aggregator, "aggregate() aggregator")
        return self._grouped._aggregate(
            "KSTREAM-AGGREGATE-",
            name,
            store,
            check_serde(value_serde, "value_serde"),
            aggregate_fold(init, agg),
            self.windows,
            True,
        )
