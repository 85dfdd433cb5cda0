"""The DSL of session-windowed aggregations: `SessionWindowedKStream` and its table.

`grouped.windowed_by(SessionWindows...)` returns a `SessionWindowedKStream`;
`count`, `reduce(reducer)` and `aggregate(initializer, aggregator, merger)`
give a `SessionWindowedKTable`, whose keys are `Windowed(key, start, end)` and
whose stream writes them with Kafka's session key layout
(`session_windows.session_windowed`). The nodes are in
`runtime.topology.session_windows`.

Names as Kafka Streams': node `KSTREAM-AGGREGATE-<n>` (`KSTREAM-REDUCE-` for
reduce), store `KSTREAM-AGGREGATE-STATE-STORE-<n>` unless `store=` names it,
repartitioned through `<store or grouping name>-repartition` when the key
changed upstream. The node opts out of key-parallel processing.

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
from runtime.topology.session_store import (
    SessionFunctions,
    SessionWindowAggregateNode,
    session_windowed,
)
from runtime.topology.suppressed import EmitStrategy

if TYPE_CHECKING:
    from runtime.topology.grouped import KGroupedStream
    from runtime.topology.kstream import KStream
    from runtime.topology.session_windows import SessionWindows


def _make_session_aggregate(d: NodeDef) -> Node:
    p = d.params
    return SessionWindowAggregateNode(
        d.name,
        p["store"],
        p["key_serde"],
        p["value_serde"],
        p["windows"],
        p["functions"],
        p["values_needed"],
        p["emit_final"],
    )


class SessionWindowedKTable(KTable):
    """A table keyed by session (`Windowed(key, start, end)`), from a session aggregation.

    As a windowed `KTable`, but its stream's key serde is Kafka's session
    layout (key bytes + end + start), so `.to(topic)` writes what Kafka
    Streams' `SessionWindowedSerde` reads.
    """

    __slots__ = ()

    def _derive(self, *args: Any, **kwargs: Any) -> KTable:
        table = super()._derive(*args, **kwargs)
        return SessionWindowedKTable(
            table._graph,
            table._node,
            table.key_serde,
            table.value_serde,
            table.store_name,
            None,
            table.window_size_ms,
        )

    def session_key_serde(self) -> Any:
        """The serde of this table's keys as its stream writes them."""
        return session_windowed(self.key_serde)

    def to_stream(self, name: str | None = None) -> KStream:
        stream = super().to_stream(name)
        stream.key_serde = self.session_key_serde()
        return stream


def _count_functions() -> SessionFunctions:
    return (lambda: 0, lambda key, value, agg: agg + 1, lambda key, a, b: a + b)


def _reduce_functions(reducer: Callable[[Any, Any], Any]) -> SessionFunctions:
    # Kafka Streams' reduce over sessions: no initial value, merge = reduce.
    def add(key: Any, value: Any, agg: Any) -> Any:
        return value if agg is None else reducer(agg, value)

    def merge(key: Any, agg: Any, other: Any) -> Any:
        return other if agg is None else reducer(agg, other)

    return (lambda: None, add, merge)


class SessionWindowedKStream:
    """A grouped stream aggregated per session (from `windowed_by(SessionWindows...)`)."""

    __slots__ = ("_grouped", "windows", "_emit_final")

    def __init__(
        self, grouped: KGroupedStream, windows: SessionWindows, emit_final: bool = False
    ) -> None:
        self._grouped = grouped
        self.windows = windows
        self._emit_final = emit_final

    def __repr__(self) -> str:
        return f"SessionWindowedKStream({self._grouped!r}, {self.windows!r})"

    def emit_strategy(self, strategy: EmitStrategy) -> SessionWindowedKStream:
        """`EmitStrategy.on_window_close()`: forward each session once, when it closes."""
        if not isinstance(strategy, EmitStrategy):
            raise TopologyError(f"emit_strategy() expects an EmitStrategy, got {strategy!r}")
        return SessionWindowedKStream(self._grouped, self.windows, strategy.on_close)

    def count(self, store: str | None = None, name: str | None = None) -> KTable:
        """Records per key and session (values INT64; null values count)."""
        return self._aggregate(
            "KSTREAM-AGGREGATE-", name, store, _serdes.INT64, _count_functions(), False
        )

    def reduce(
        self,
        reducer: Callable[[Any, Any], Any],
        store: str | None = None,
        name: str | None = None,
    ) -> KTable:
        """Per session: the first value, then `reducer(aggregate, value)`; merged
        sessions combine with `reducer(earlier, later)`."""
        fn = check_callable(reducer, "reduce()")
        return self._aggregate(
            "KSTREAM-REDUCE-",
            name,
            store,
            self._grouped.value_serde,
            _reduce_functions(fn),
            True,
        )

    def aggregate(
        self,
        initializer: Callable[[], Any],
        aggregator: Callable[[Any, Any, Any], Any],
        merger: Callable[[Any, Any, Any], Any],
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per session: `aggregator(key, value, agg)` from `initializer()`;
        `merger(key, agg1, agg2)` combines sessions that a record joins."""
        functions = (
            check_callable(initializer, "aggregate() initializer"),
            check_callable(aggregator, "aggregate() aggregator"),
            check_callable(merger, "aggregate() merger"),
        )
        return self._aggregate(
            "KSTREAM-AGGREGATE-",
            name,
            store,
            check_serde(value_serde, "value_serde"),
            functions,
            True,
        )

    def _aggregate(
        self,
        prefix: str,
        name: str | None,
        store: str | None,
        value_serde: Any,
        functions: SessionFunctions,
        values_needed: bool,
    ) -> KTable:
        grouped = self._grouped
        graph = grouped._graph
        if store is None:
            store_name = graph.new_name(f"{prefix}STATE-STORE-")
        else:
            store_name = check_store_name(store)
            if graph.store(store_name) is not None:
                raise TopologyError(f"the topology already has a state store named {store_name!r}")
        parent = grouped._input(store_name, values_needed)
        node = graph.node_name(name, prefix)
        graph.add_store(StateStoreDef(store_spec(store_name), grouped.key_serde, value_serde))
        graph.add_processor(
            node,
            _make_session_aggregate,
            (parent,),
            {
                "store": store_name,
                "key_serde": grouped.key_serde,
                "value_serde": value_serde,
                "windows": self.windows,
                "functions": functions,
                "values_needed": values_needed,
                "emit_final": self._emit_final,
                "key_parallel": False,
            },
            (store_name,),
        )
        return SessionWindowedKTable(
            graph,
            node,
            grouped.key_serde,
            value_serde,
            store_name,
            None,
            self.windows.gap_ms,
        )
