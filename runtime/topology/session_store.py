"""The session aggregation node and the session store's layout (Kafka Streams' semantics).

`KStreamSessionWindowAggregate`'s behaviour, for `runtime.topology.session_windows.SessionWindows`:
a record merges every session of its key within the gap into one.

The session store is an ordinary key-value store (change-logged, restored
and kept by standbys like any other, cached) whose keys are Kafka's
session key layout, `key bytes + end (8 bytes) + start (8 bytes)`, so one
range read finds a key's sessions in end order. Values are the serialized
aggregates. Sessions that ended more than gap + grace before the newest
session's end are invisible, as in Kafka Streams' segmented store, and are
deleted from the store in sweeps (one full scan per gap + grace of stream time).

Output goes through the store, as Kafka Streams' CachingSessionStore: the
node writes, and the store's flush listener (`on_flush`) forwards each
emitted store key as `(Windowed(key, start, end), aggregate)`, a delete as a
tombstone, each stamped with its session's end. With caching on a key goes
out once per commit (or at eviction), and a session created and merged away
within one commit not at all (the cache skips deletes of keys the store never
held); expiry sweeps delete silently (`drop`), as Kafka Streams' segment
drops. With caching off every write goes out at once: per update, the merged
sessions' tombstones, then the new session, exactly as Kafka Streams without
caching; without headers, as
Kafka Streams makes these records afresh (its on-close results carry the
headers of the record that closed the session; so do these). With the emit strategy
`on_window_close` (KIP-825), nothing is forwarded per update; each session is
forwarded once, when stream time passes its end + gap + grace. The last close
time emitted is kept in the store itself (a reserved key shorter than any
session key), so a restart neither loses nor repeats a final result.

Threads: nodes run on the processing thread holding their task; the node keeps
a stream time shared by all keys, so it opts out of key-parallel processing.
`on_flush` runs there too (caching off, or an eviction), or on the polling
thread at a commit while the task is locked.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from runtime.state.cache import CachingKeyValueStore
from runtime.topology import serdes as _serdes
from runtime.topology.context import TaskContext
from runtime.topology.nodes import StoreNode
from runtime.topology.record import Record
from runtime.topology.windows import Windowed

if TYPE_CHECKING:
    from runtime.topology.session_windows import SessionWindows

_LONG = struct.Struct(">q")
_TIMES = struct.Struct(">qq")
_MAX_TIMES = b"\xff" * 16
_EMIT_META = b"~emitted"  # shorter than any session key (key bytes + 16)


class SessionWindowedSerde(_serdes.TimeWindowedSerde):
    """`Windowed` session keys in Kafka's SessionWindowedSerde layout.

    `inner key bytes + end (8 bytes big-endian) + start (8 bytes)`. A
    `TimeWindowedSerde` by type, so sinks partition by the inner key (Kafka's
    `WindowedStreamPartitioner`) and nodes resolve a None inner serde to the
    configured default.
    """

    name = "session-windowed"

    __slots__ = ()

    def __init__(self, inner: _serdes.Serde | None) -> None:
        super().__init__(inner, 1)

    def with_inner(self, inner: _serdes.Serde) -> SessionWindowedSerde:
        return SessionWindowedSerde(inner)

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        if not isinstance(obj, Windowed):
            raise TypeError(f"session serde expects a Windowed key, got {type(obj).__name__}")
        key = self._inner().serialize(obj.key)
        return (key or b"") + _TIMES.pack(obj.end, obj.start)

    def deserialize(self, data: bytes | None) -> Windowed | None:
        if data is None:
            return None
        if len(data) < 16:
            raise ValueError(f"session serde expects at least 16 bytes, got {len(data)}")
        end, start = _TIMES.unpack_from(data, len(data) - 16)
        return Windowed(self._inner().deserialize(data[:-16]), start, end)

    def __repr__(self) -> str:
        return f"session_windowed({self.inner!r})"


def session_windowed(inner: _serdes.Serde | None) -> SessionWindowedSerde:
    """A serde for session-windowed keys (Kafka's SessionWindowedSerde layout)."""
    return SessionWindowedSerde(inner)


def session_key(key: bytes, start: int, end: int) -> bytes:
    return key + _TIMES.pack(end, start)


def split_session_key(data: bytes) -> tuple[bytes, int, int]:
    """(key bytes, start, end) of a session store key."""
    end, start = _TIMES.unpack_from(data, len(data) - 16)
    return data[:-16], start, end


def find_sessions(
    store: Any, key: bytes, earliest_end: int, latest_start: int
) -> Iterator[tuple[int, int, bytes]]:
    """(start, end, value) of `key`'s sessions ending at or after `earliest_end`
    and starting at or before `latest_start`, in end order (Kafka's
    `findSessions`). Keys that merely begin with `key` are skipped: a session
    key of `key` is exactly 16 bytes longer."""
    size = len(key) + 16
    for data, value in store.range(key + _LONG.pack(max(earliest_end, 0)), key + _MAX_TIMES):
        if len(data) != size:
            continue
        end, start = _TIMES.unpack_from(data, size - 16)
        if start <= latest_start:
            yield start, end, value


# The aggregation of one session node: (initializer, aggregator(key, value, agg),
# merger(key, agg1, agg2)), Kafka Streams' three functions.
SessionFunctions = tuple[
    Callable[[], Any], Callable[[Any, Any, Any], Any], Callable[[Any, Any, Any], Any]
]


class SessionWindowAggregateNode(StoreNode):
    """`windowed_by(SessionWindows).count/reduce/aggregate` (see the module docstring).

    Records with a null key are dropped (`null_key`), records with a negative
    timestamp too (`negative_timestamp`). Null values: counted by `count`,
    dropped by `reduce`/`aggregate` (`null_value`, after advancing stream
    time), where Kafka Streams would call the user's function with null.
    """

    __slots__ = (
        "windows",
        "functions",
        "values_needed",
        "emit_final",
        "_observed",
        "_store_time",
        "_swept",
        "_last_emit",
        "_drop",
    )

    def __init__(
        self,
        name: str,
        store: str,
        key_serde: Any,
        value_serde: Any,
        windows: SessionWindows,
        functions: SessionFunctions,
        values_needed: bool,
        emit_final: bool = False,
    ) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.windows = windows
        self.functions = functions
        self.values_needed = values_needed
        self.emit_final = emit_final
        self._observed = -1
        self._store_time: int | None = None
        self._swept = -1
        self._last_emit: int | None = None
        self._drop: Callable[[bytes], None] = self._not_bound

    @staticmethod
    def _not_bound(key: bytes) -> None:
        raise RuntimeError("session aggregation used before init")

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._register_flush(ctx)
        # The caching layer under the metered one (there is one whenever a
        # flush listener is registered): sessions merged away within a commit
        # go nowhere, and sweeps delete without emitting.
        cache = self._store
        while cache is not None and not isinstance(cache, CachingKeyValueStore):
            cache = getattr(cache, "inner", None)
        if cache is None:
            self._drop = self._store.delete
        else:
            cache.skip_unseen_deletes = True
            self._drop = cache.drop
        # Stream time starts over in a new instance (as Kafka Streams'); the
        # store's time and the last emitted close time are read back lazily,
        # once the store has been restored.
        self._observed = -1
        self._store_time = None
        self._swept = -1
        self._last_emit = None

    def _register_flush(self, ctx: TaskContext) -> None:
        """Forward the store's emitted updates (a cogroup's inputs register one)."""
        ctx.register_flush_listener(self.store_name, self.on_flush)

    def _scan_store_time(self) -> int:
        latest = -1
        for data, _value in self._store.all():
            if len(data) >= 16:
                latest = max(latest, _TIMES.unpack_from(data, len(data) - 16)[0])
        return latest

    def process(self, record: Record) -> None:
        key = record.key
        if key is None:
            self._dropped("null_key")
            return
        timestamp = record.timestamp
        if timestamp < 0:
            self._dropped("negative_timestamp")
            return
        if timestamp > self._observed:
            self._observed = timestamp
        value = record.value
        windows = self.windows
        close_time = self._observed - windows.grace_ms - windows.gap_ms
        if value is None and self.values_needed:
            self._dropped("null_value")
            self._maybe_emit_final(record, close_time)
            return
        store = self._store
        if self._store_time is None:
            self._store_time = self._scan_store_time()
        store_time = self._store_time
        gap = windows.gap_ms
        key_bytes = self._key_ser(key) or b""
        initializer, aggregator, merger = self.functions
        agg = initializer()
        start = end = timestamp
        # Sessions older than the retention are invisible (Kafka's segmented store).
        visible_from = max(timestamp - gap, store_time - windows.retention_ms + 1)
        merged = []
        for s_start, s_end, data in find_sessions(store, key_bytes, visible_from, timestamp + gap):
            merged.append((s_start, s_end, data))
            agg = merger(key, agg, self._value_de(data))
            start, end = min(start, s_start), max(end, s_end)
        if end < close_time:
            self._dropped("late")
            self._maybe_emit_final(record, close_time)
            return
        if start != timestamp or end != timestamp:
            for s_start, s_end, _data in merged:
                store.delete(session_key(key_bytes, s_start, s_end))
        agg = aggregator(key, value, agg)
        new_key = session_key(key_bytes, start, end)
        if agg is None:
            store.delete(new_key)
        else:
            store.put(new_key, self._value_ser(agg))
        if end > store_time:
            self._store_time = end
        self._maybe_emit_final(record, close_time)
        self._maybe_sweep()

    def on_flush(self, key: bytes, new: bytes | None, old: bytes | None, timestamp: int) -> None:
        """The store emitted a session key's update: forward it (see the module
        docstring). Nothing with `on_window_close`, and nothing for the
        reserved `~emitted` key (shorter than any session key)."""
        if self.emit_final or len(key) < 16:
            return
        key_bytes, start, end = split_session_key(key)
        windowed = Windowed(self._key_de(key_bytes), start, end)
        value = None if new is None else self._value_de(new)
        self._emit(Record(windowed, value, end))

    def _maybe_emit_final(self, record: Record, close_time: int) -> None:
        """`on_window_close`: forward every session that closed since the last time."""
        if not self.emit_final:
            return
        store = self._store
        if self._last_emit is None:
            data = store.get(_EMIT_META)
            self._last_emit = -1 if data is None else _LONG.unpack(data)[0]
        last = self._last_emit
        if last != -1 and last >= close_time:
            return
        upper = close_time - 1  # session ends are inclusive
        lower = max(0, last)
        if upper < lower:
            return
        closed = []
        for data, value in store.all():
            if len(data) < 16:
                continue
            key_bytes, start, end = split_session_key(data)
            if lower <= end <= upper:
                closed.append((end, key_bytes, start, value))
        closed.sort()
        for end, key_bytes, start, value in closed:
            windowed = Windowed(self._key_de(key_bytes), start, end)
            self._emit(Record(windowed, self._value_de(value), end, record.headers))
        self._last_emit = close_time
        store.put(_EMIT_META, _LONG.pack(close_time))

    def _maybe_sweep(self) -> None:
        """Delete sessions past the retention, once per retention of stream time."""
        store_time = self._store_time
        retention = self.windows.retention_ms
        if store_time is None or store_time - self._swept < retention:
            return
        self._swept = store_time
        limit = store_time - retention  # a session ending at or before this is invisible
        store = self._store
        expired = [
            data
            for data, _value in store.all()
            if len(data) >= 16 and _TIMES.unpack_from(data, len(data) - 16)[0] <= limit
        ]
        if self.emit_final and expired:
            # Keep what on_window_close has not emitted yet (a no-grace session
            # closes only after the next record).
            last = self._last_emit if self._last_emit is not None else -1
            expired = [d for d in expired if _TIMES.unpack_from(d, len(d) - 16)[0] < last]
        # Silently: through the cache a delete would go downstream as a tombstone.
        drop = self._drop
        for data in expired:
            drop(data)
