"""The DSL of sliding-window aggregations: `SlidingWindowedKStream`.

`grouped.windowed_by(SlidingWindows...)` returns one; `count`,
`reduce(reducer)` and `aggregate(initializer, aggregator)` give a windowed
`KTable` with `Windowed(key, start, start + difference)` keys, written by its
stream in Kafka's time-windowed layout (window size = the time difference).
The node is `runtime.topology.sliding_aggregate.SlidingWindowAggregateNode`.

Names as Kafka Streams': node `KSTREAM-AGGREGATE-<n>` (`KSTREAM-REDUCE-` for
reduce), store `KSTREAM-AGGREGATE-STATE-STORE-<n>` unless `store=` names it.
The node opts out of key-parallel processing.

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology import serdes as _serdes
from runtime.topology.builder import check_callable, check_serde, check_store_name, store_spec
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.ktable import KTable
from runtime.topology.nodes import Node
from runtime.topology.sliding_aggregate import SlidingFunctions, SlidingWindowAggregateNode

if TYPE_CHECKING:
    from runtime.topology.grouped import KGroupedStream
    from runtime.topology.sliding_windows import SlidingWindows


def _make_sliding_aggregate(d: NodeDef) -> Node:
    p = d.params
    return SlidingWindowAggregateNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["windows"], p["functions"]
    )


def _reduce_add(reducer: Callable[[Any, Any], Any]) -> Callable[[Any, Any, Any], Any]:
    def add(key: Any, value: Any, agg: Any) -> Any:
        return value if agg is None else reducer(agg, value)

    return add


class SlidingWindowedKStream:
    """A grouped stream aggregated per sliding window (from `windowed_by(SlidingWindows...)`)."""

    __slots__ = ("_grouped", "windows")

    def __init__(self, grouped: KGroupedStream, windows: SlidingWindows) -> None:
        self._grouped = grouped
        self.windows = windows

    def __repr__(self) -> str:
        return f"SlidingWindowedKStream({self._grouped!r}, {self.windows!r})"

    def emit_strategy(self, strategy: Any) -> SlidingWindowedKStream:
        """Only `on_window_update` (the default) for now; for final results use
        `.suppress(Suppressed.until_window_closes(...))` on the table."""
        if getattr(strategy, "on_close", False):
            raise TopologyError(
                "emit_strategy(on_window_close()) is not offered for sliding windows yet: "
                "use .count()/.aggregate(...).suppress(Suppressed.until_window_closes(...))"
            )
        return self

    def count(self, store: str | None = None, name: str | None = None) -> KTable:
        """Records per key and window (values INT64; null values are dropped, as Kafka's)."""
        functions: SlidingFunctions = (lambda: 0, lambda key, value, agg: agg + 1)
        return self._aggregate("KSTREAM-AGGREGATE-", name, store, _serdes.INT64, functions)

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | None = None,
        name: str | None = None,
    ) -> KTable:
        """Per window: the first value, then `reducer(aggregate, value)`."""
        fn = check_callable(reducer, "reduce()")
        functions: SlidingFunctions = (lambda: None, _reduce_add(fn))
        return self._aggregate("KSTREAM-REDUCE-", name, store, self._grouped.value_serde, functions)

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per window: `aggregator(key, value, agg)` from `initializer()`."""
        functions: SlidingFunctions = (
            check_callable(initializer, "aggregate() initializer"),
            check_callable(aggregator, "aggregate() aggregator"),
        )
        return self._aggregate(
            "KSTREAM-AGGREGATE-", name, store, check_serde(value_serde, "value_serde"), functions
        )

    def _aggregate(
        self,
        prefix: str,
        name: str | None,
        store: str | None,
        value_serde: Any,
        functions: SlidingFunctions,
    ) -> KTable:
        grouped = self._grouped
        graph = grouped._graph
        if store is None:
            store_name = graph.new_name(f"{prefix}STATE-STORE-")
        else:
            store_name = check_store_name(store)
            if graph.store(store_name) is not None:
                raise TopologyError(f"the topology already has a state store named {store_name!r}")
        parent = grouped._input(store_name, True)
        node = graph.node_name(name, prefix)
        graph.add_store(
            StateStoreDef(store_spec(store_name, caching=False), grouped.key_serde, value_serde)
        )
        graph.add_processor(
            node,
            _make_sliding_aggregate,
            (parent,),
            {
                "store": store_name,
                "key_serde": grouped.key_serde,
                "value_serde": value_serde,
                "windows": self.windows,
                "functions": functions,
                "key_parallel": False,
            },
            (store_name,),
        )
        return KTable(
            graph,
            node,
            grouped.key_serde,
            value_serde,
            store_name,
            None,
            self.windows.difference_ms,
        )
