"""`KTable.suppress`: the suppression node, its change-logged buffer, and the DSL step.

Kafka Streams' `KTableSuppressProcessor`: each update of the table goes into a
buffer keyed by the table's key; the buffer holds the key's latest value
at the place (buffer time) of its first buffered update ("non-resetting").
Once the suppression's stream time (the largest timestamp it has seen) minus
the suppression's duration reaches an entry's buffer time, the entry is
forwarded with the timestamp of its latest update, oldest buffer time first.

- `until_window_closes`: buffer time = the window's end, duration = the
  windows' grace (sessions: gap + grace), found by walking up the graph to
  the windowed aggregation. Tombstones are dropped when emitted (a merged
  session's retraction), as Kafka Streams' "final results" do.
- `until_time_limit(d)`: buffer time = the update's timestamp, duration = d;
  tombstones are forwarded.

Bounds (`BufferConfig`): after the time-based evictions, a buffer over its
record or byte limit either emits its oldest entries early (`"emit"`) or
fails the task (`"shut_down"`, a `SuppressionBufferFull` error naming the node).
Bytes count keys and values as serialized, plus 17 bytes per entry (Kafka
Streams counts its own object overhead, so its byte limit is not comparable to
the byte).

The buffer is a key-value store named `KTABLE-SUPPRESS-STATE-STORE-<n>`
(change-logged, restored, kept by standbys, not cached) whose keys are
`buffer time (8 bytes) + key bytes`, so a range read yields the oldest first,
and whose values are `timestamp (8 bytes) + flag (1) + value bytes`; flag 0
is a tombstone, 1 a value, and 2/3 the same with the update's headers
(`runtime.topology.header_codec`) between the flag and the value, so the
emitted record carries the buffered update's headers, as Kafka Streams' keeps
its record context. The node keeps an index of key -> buffer time, the entry
count and byte size in memory, rebuilt from the store at the task's first
record (after restoration: `init` may run while the store is still being
restored).

Threads: the node runs on the processing thread holding its task. Its
buffer and stream time are shared by all keys, so it opts out of key-parallel
processing. The DSL step runs on the thread that defines the application.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology import serdes as _serdes
from runtime.topology.context import TaskContext
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.header_codec import decode_headers, encode_headers
from runtime.topology.nodes import Node, StoreNode
from runtime.topology.record import Record
from runtime.topology.suppressed import Suppressed
from runtime.topology.windows import TimeWindows

if TYPE_CHECKING:
    # Types only: the DSL imports this module.
    from runtime.state.builders import StoreSpec
    from runtime.topology.ktable import KTable

_LONG = struct.Struct(">q")


class SuppressionBufferFull(RuntimeError):
    """A suppression with `shut_down_when_full()` exceeded its buffer config."""


class SuppressNode(StoreNode):
    """Holds a table's updates back; see the module docstring."""

    __slots__ = (
        "final",
        "duration_ms",
        "max_records",
        "max_bytes",
        "shut_down",
        "_index",
        "_bytes",
        "_min",
        "_observed",
        "_loaded",
    )

    def __init__(
        self,
        name: str,
        store: str,
        key_serde: Any,
        value_serde: Any,
        final: bool,
        duration_ms: int,
        max_records: int,
        max_bytes: int,
        shut_down: bool,
    ) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.final = final
        self.duration_ms = duration_ms
        self.max_records = max_records
        self.max_bytes = max_bytes
        self.shut_down = shut_down
        self._index: dict[bytes, tuple[int, int]] = {}  # key -> (buffer time, entry size)
        self._bytes = 0
        self._min: int | None = None
        self._observed = -1
        self._loaded = False

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._observed = -1  # not restored, as in Kafka Streams
        self._index = {}
        self._bytes = 0
        self._min = None
        self._loaded = False  # the store may still be restoring: read it at the first record

    def _load(self) -> None:
        """The in-memory index of the (restored) buffer."""
        self._loaded = True
        for data, value_bytes in self._store.all():
            time = _LONG.unpack_from(data)[0]
            size = len(data) + len(value_bytes)
            self._index[data[8:]] = (time, size)
            self._bytes += size
            if self._min is None or time < self._min:
                self._min = time

    def process(self, record: Record) -> None:
        if not self._loaded:
            self._load()
        timestamp = record.timestamp
        if timestamp > self._observed:
            self._observed = timestamp
        key = record.key
        if self.final:
            end = getattr(key, "end", None)
            if end is None:
                raise TopologyError(
                    f"{self.name}: until_window_closes() got a key without a window ({key!r}); "
                    "suppress a windowed aggregation's table"
                )
            buffer_time = end
        else:
            buffer_time = timestamp
        key_bytes = self._key_ser(key) or b""
        value = record.value
        headers = record.headers
        if headers:
            flag = b"\x02" if value is None else b"\x03"
            stored = _LONG.pack(timestamp) + flag + encode_headers(headers)
        else:
            stored = _LONG.pack(timestamp) + (b"\x00" if value is None else b"\x01")
        if value is not None:
            stored += self._value_ser(value) or b""
        previous = self._index.get(key_bytes)
        if previous is not None:
            buffer_time = previous[0]  # non-resetting: the key keeps its place
            self._bytes -= previous[1]
        size = 8 + len(key_bytes) + len(stored)
        self._store.put(_LONG.pack(buffer_time) + key_bytes, stored)
        self._index[key_bytes] = (buffer_time, size)
        self._bytes += size
        if self._min is None or buffer_time < self._min:
            self._min = buffer_time
        self._enforce()

    def _over(self) -> bool:
        return len(self._index) > self.max_records or self._bytes > self.max_bytes

    def _enforce(self) -> None:
        expiry = self._observed - self.duration_ms
        if self._min is not None and self._min <= expiry:
            self._evict(lambda time: time <= expiry)
        if self._over():
            if self.shut_down:
                raise SuppressionBufferFull(
                    f"{self.name}: the suppression buffer exceeded its max capacity: "
                    f"{len(self._index)}/{self.max_records} records, "
                    f"{self._bytes}/{self.max_bytes} bytes; raise the BufferConfig limits "
                    "or use emit_early_when_full()"
                )
            self._evict(lambda time: self._over())

    def _evict(self, should: Callable[[int], bool]) -> None:
        """Forward and remove entries, oldest buffer time first, while `should(time)`."""
        store = self._store
        evicted = []
        self._min = None
        for data, stored in store.range(None, None):
            time = _LONG.unpack_from(data)[0]
            if not should(time):
                self._min = time
                break
            key_bytes = data[8:]
            evicted.append(data)
            _time, size = self._index.pop(key_bytes)
            self._bytes -= size
            self._forward(key_bytes, stored)
        for data in evicted:
            store.delete(data)

    def _forward(self, key_bytes: bytes, stored: bytes) -> None:
        timestamp = _LONG.unpack_from(stored)[0]
        flag = stored[8]
        headers = None
        start = 9
        if flag >= 2:
            headers, start = decode_headers(stored, 9)
        if flag in (0, 2):
            if self.final:
                return  # a retraction of a window that never was final
            value = None
        else:
            value = self._value_de(stored[start:])
        self._emit(Record(self._key_de(key_bytes), value, timestamp, headers))


def _make_suppress(d: NodeDef) -> Node:
    p = d.params
    return SuppressNode(
        d.name,
        p["store"],
        p["key_serde"],
        p["value_serde"],
        p["final"],
        p["duration_ms"],
        p["max_records"],
        p["max_bytes"],
        p["shut_down"],
    )


def _window_close_delay(table: KTable) -> int:
    """The grace (sessions: gap + grace) of the windowed aggregation above `table`."""
    specs = table.graph_builder().specs
    todo = [table.name]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        spec = specs[name]
        windows = spec.params.get("windows")
        if isinstance(windows, TimeWindows):
            return windows.grace_ms
        delay = getattr(windows, "close_delay_ms", None)  # session and sliding windows
        if isinstance(delay, int):
            return delay
        todo.extend(spec.parents)
    raise TopologyError(
        "suppress(Suppressed.until_window_closes(...)) needs a windowed table "
        "(from windowed_by(...).count/reduce/aggregate); use until_time_limit() otherwise"
    )


def stream_key_serde(table: KTable) -> Any:
    """The serde of `table`'s keys as its stream writes them (windowed layouts included)."""
    session_serde = getattr(table, "session_key_serde", None)
    if session_serde is not None:
        return session_serde()
    if table.window_size_ms is not None:
        return _serdes.windowed(table.key_serde, table.window_size_ms)
    return table.key_serde


def suppress(table: KTable, suppressed: Suppressed, store_spec: Callable[..., StoreSpec]) -> KTable:
    """Add the suppression below `table`; returns the suppressed table.
    `store_spec` makes a `StoreSpec` (the builder's)."""
    if not isinstance(suppressed, Suppressed):
        raise TopologyError(f"suppress() expects a Suppressed, got {suppressed!r}")
    graph = table.graph_builder()
    final = suppressed.kind == "window_close"
    duration = _window_close_delay(table) if final else suppressed.time_limit_ms
    if suppressed.name is not None:
        node = graph.node_name(suppressed.name, "KTABLE-SUPPRESS-")
        store = f"{suppressed.name}-store"
    else:
        node = graph.new_name("KTABLE-SUPPRESS-")
        store = graph.new_name("KTABLE-SUPPRESS-STATE-STORE-")
    if graph.store(store) is not None:
        raise TopologyError(f"the topology already has a state store named {store!r}")
    key_serde = stream_key_serde(table)
    graph.add_store(StateStoreDef(store_spec(store, caching=False), None, None))
    buffer = suppressed.buffer
    graph.add_processor(
        node,
        _make_suppress,
        (table.name,),
        {
            "store": store,
            "key_serde": key_serde,
            "value_serde": table.value_serde,
            "final": final,
            "duration_ms": duration,
            "max_records": buffer.records_limit,
            "max_bytes": buffer.bytes_limit,
            "shut_down": buffer.strict,
            "key_parallel": False,
        },
        (store,),
    )
    return type(table)(
        graph, node, table.key_serde, table.value_serde, None, None, table.window_size_ms
    )
