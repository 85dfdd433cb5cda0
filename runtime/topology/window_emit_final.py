"""`EmitStrategy.on_window_close()` for time-windowed aggregations (KIP-825).

`grouped.windowed_by(TimeWindows...).emit_strategy(EmitStrategy.on_window_close())`
aggregates as usual but forwards nothing per update: once stream time minus
grace passes a window's end, the window's final aggregate is forwarded, once
(Kafka Streams' `KStreamWindowAggregate` with `ON_WINDOW_CLOSE`, emitting at
every record, as with its emit interval at 0). Windows go out in start order,
then key order.

The node is a `WindowAggregateNode` that ignores its store's per-update flushes
and, before applying each record, emits the windows that record closes (a
record never updates a window it closes, so emitting first gives the same
values, and it comes before the store's expiry of the oldest windows). The
close time last emitted is kept in a small change-logged store of its own,
`<store>-emit-time` (Kafka Streams keeps it in the commit's metadata), so a
restart neither repeats nor loses a final result.

Result timestamps: the window's end - 1 (the latest a record in it can have);
Kafka Streams stamps the largest timestamp the window has seen (the store here
keeps no timestamps: the same known difference as for every windowed
aggregation, docs/differential.md).

Threads: the node runs on the processing thread holding its task; it keeps a
stream time shared by all keys, as its base class. The DSL part runs on the
thread that defines the application.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology.context import TaskContext
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import Node
from runtime.topology.record import Record
from runtime.topology.stateful_nodes import WindowAggregateNode
from runtime.topology.suppressed import EmitStrategy
from runtime.topology.windows import Windowed

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.topology.grouped import TimeWindowedKStream
    from runtime.topology.ktable import KTable

_LONG = struct.Struct(">q")
_META_KEY = b"emitted-close-time"


class EmitFinalWindowAggregateNode(WindowAggregateNode):
    """A time-windowed aggregation that forwards each window once, when it closes."""

    __slots__ = ("meta_store", "_meta", "_last_emit")

    def __init__(self, *args: Any, meta_store: str) -> None:
        super().__init__(*args)
        self.meta_store = meta_store
        self._meta: Any = None
        self._last_emit: int | None = None

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._meta = ctx.state_store(self.meta_store)
        self._last_emit = None  # read at the first record: the store may still be restoring

    def close(self) -> None:
        super().close()
        self._meta = None

    def on_flush(self, key: bytes, new: bytes | None, old: bytes | None, timestamp: int) -> None:
        return  # no per-update results

    def process(self, record: Record) -> None:
        ts = record.timestamp
        applies = record.key is not None and (record.value is not None or self._count) and ts >= 0
        if applies:
            self._emit_closed(max(self._observed, ts) - self._grace, record)
        super().process(record)

    def _emit_closed(self, close: int, record: Record) -> None:
        """Kafka's maybeForwardFinalResult for time windows."""
        if self._last_emit is None:
            data = self._meta.get(_META_KEY)
            self._last_emit = -1 if data is None else _LONG.unpack(data)[0]
        last = self._last_emit
        if last != -1 and last >= close:
            return
        size = self._size
        upper = close - size
        if upper < 0:
            return
        lower = 0 if last == -1 else max(0, last - size) + 1
        if last != -1:
            starts = self.windows.window_starts
            if list(starts(upper)) == list(starts(lower - 1)):
                return  # no window closed since the last emission
        closed = sorted(
            (start, key, value) for key, start, value in self._store.fetch_all(lower, upper)
        )
        for start, key, value in closed:
            windowed = Windowed(self._key_de(key), start, start + size)
            # The record that closed the window lends its headers, as in Kafka Streams.
            self._emit(
                Record(windowed, self._emitted_value(value), start + size - 1, record.headers)
            )
        self._last_emit = close
        self._meta.put(_META_KEY, _LONG.pack(close))


def _make_emit_final(d: NodeDef) -> Node:
    p = d.params
    return EmitFinalWindowAggregateNode(
        d.name,
        p["store"],
        p["key_serde"],
        p["value_serde"],
        p["fold"],
        p["windows"],
        meta_store=p["meta_store"],
    )


class EmitFinalTimeWindowedKStream:
    """`TimeWindowedKStream` with `on_window_close`: the same aggregations, final results only."""

    __slots__ = ("_windowed", "_store_spec")

    def __init__(self, windowed: TimeWindowedKStream, store_spec: Callable[..., StoreSpec]) -> None:
        self._windowed = windowed
        self._store_spec = store_spec

    def __repr__(self) -> str:
        return f"EmitFinal({self._windowed!r})"

    def count(self, store: str | None = None, name: str | None = None) -> KTable:
        return self._final(self._windowed.count(store, name))

    def reduce(self, reducer: Any, store: str | None = None, name: str | None = None) -> KTable:
        return self._final(self._windowed.reduce(reducer, store, name))

    def aggregate(
        self,
        initializer: Any,
        aggregator: Any,
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        return self._final(
            self._windowed.aggregate(initializer, aggregator, store, value_serde, name)
        )

    def _final(self, table: KTable) -> KTable:
        """Turn the aggregation node just added into the emit-final one."""
        graph = table.graph_builder()
        spec = graph.specs[table.name]
        store = spec.params["store"]
        meta = f"{store}-emit-time"
        graph.add_store(StateStoreDef(self._store_spec(meta, caching=False), None, None))
        graph.connect_stores(table.name, (meta,))
        spec.factory = _make_emit_final
        spec.params["meta_store"] = meta
        spec.params["key_parallel"] = False
        return table


def emit_strategy(
    windowed: TimeWindowedKStream, strategy: Any, store_spec: Callable[..., StoreSpec]
) -> Any:
    """`windowed` itself for `on_window_update`, its final-results form for `on_window_close`."""
    if not isinstance(strategy, EmitStrategy):
        raise TopologyError(f"emit_strategy() expects an EmitStrategy, got {strategy!r}")
    return EmitFinalTimeWindowedKStream(windowed, store_spec) if strategy.on_close else windowed
