"""The sliding-window aggregation node (Kafka Streams' `KStreamSlidingWindowAggregate`).

Which windows a record creates and updates follows Kafka Streams step by step
(its reverse-iteration path, and its "early record" path for timestamps below
the time difference, which share the window `[0, difference]`), so results are
the same record for record: per record, the windows it falls in are updated,
its own left window `[t - d, t]` is created (seeded with the aggregate of the
window just before it when that one holds the previous record), and right
windows `[t + 1, t + 1 + d]` of it or of the previous record are created when
a later record falls in them. Each update is forwarded as
`(Windowed(key, start, start + d), aggregate)` stamped with the largest
record timestamp in the window, as Kafka Streams does.

The store is an ordinary key-value store (change-logged, restored, kept by
standbys, not cached) keyed `key bytes + window start (8 bytes)`, values
`max record timestamp (8 bytes) + aggregate bytes`: the window timestamps the
algorithm needs. Windows whose start is more than grace + 2 * difference
behind the newest start are invisible, as in Kafka Streams' segmented store,
and deleted in sweeps.

Records with a null key or value are dropped (`null_key`, `null_value`, as
Kafka Streams: its sliding aggregation drops both), and negative timestamps
(`negative_timestamp`); a record whose own left window has closed (stream
time - grace past `t + d`) is `late`, and so is each closed window it misses.

Threads: the processing thread holding the task; the node's stream time is
shared across keys, so it opts out of key-parallel processing.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology.context import TaskContext
from runtime.topology.nodes import StoreNode
from runtime.topology.record import Record
from runtime.topology.windows import Windowed

if TYPE_CHECKING:
    from runtime.topology.sliding_windows import SlidingWindows

_LONG = struct.Struct(">q")

# (initializer, aggregator(key, value, agg)): Kafka Streams' two functions
# (reduce: no initial value, the first value is the aggregate).
SlidingFunctions = tuple[Callable[[], Any], Callable[[Any, Any, Any], Any]]

# A window as read from the store: (start, max record timestamp, aggregate).
_Window = tuple[int, int, Any]


class SlidingWindowAggregateNode(StoreNode):
    """`windowed_by(SlidingWindows).count/reduce/aggregate`; see the module docstring."""

    __slots__ = (
        "windows",
        "functions",
        "_observed",
        "_store_time",
        "_swept",
        "_key",
        "_key_bytes",
        "_record",
    )

    def __init__(
        self,
        name: str,
        store: str,
        key_serde: Any,
        value_serde: Any,
        windows: SlidingWindows,
        functions: SlidingFunctions,
    ) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.windows = windows
        self.functions = functions
        self._observed = -1
        self._store_time: int | None = None
        self._swept = -1
        self._key: Any = None
        self._key_bytes = b""
        self._record: Record | None = None

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._observed = -1  # not restored (nor is Kafka Streams')
        self._store_time = None  # read back from the store on first use
        self._swept = -1

    def close(self) -> None:
        self._store = None
        self._record = None

    # -- the store ---------------------------------------------------------------

    def _fetch(self, lo: int, hi: int) -> list[_Window]:
        """This key's visible windows with start in [lo, hi], ascending."""
        key_bytes = self._key_bytes
        size = len(key_bytes) + 8
        assert self._store_time is not None
        lo = max(lo, self._store_time - self.windows.retention_ms + 1, 0)
        if hi < lo:
            return []
        out = []
        for data, value in self._store.range(
            key_bytes + _LONG.pack(lo), key_bytes + _LONG.pack(hi)
        ):
            if len(data) != size:
                continue  # a longer key that begins with this one
            start = _LONG.unpack_from(data, size - 8)[0]
            out.append((start, _LONG.unpack_from(value)[0], self._value_de(value[8:])))
        return out

    def _put(self, start: int, agg: Any, timestamp: int) -> None:
        key = self._key_bytes + _LONG.pack(start)
        if agg is None:
            self._store.delete(key)
        else:
            self._store.put(key, _LONG.pack(timestamp) + (self._value_ser(agg) or b""))
        assert self._store_time is not None
        if start > self._store_time:
            self._store_time = start

    def _forward(self, start: int, agg: Any, timestamp: int) -> None:
        record = self._record
        assert record is not None
        windowed = Windowed(self._key, start, start + self.windows.difference_ms)
        self._emit(Record(windowed, agg, timestamp, record.headers))

    def _update(self, start: int, old_agg: Any, old_ts: int, close: int) -> None:
        """Add the record to the window at `start` (Kafka's updateWindowAndForward)."""
        if start + self.windows.difference_ms < close:
            self._dropped("late")
            return
        record = self._record
        assert record is not None
        new_agg = self.functions[1](self._key, record.value, old_agg)
        ts = record.timestamp
        new_ts = ts if old_agg is None else max(ts, old_ts)
        self._put(start, new_agg, new_ts)
        self._forward(start, new_agg, new_ts)

    def _create_right(self, ts: int, right: tuple[Any, int]) -> None:
        """The record's right window, holding `right` (the later records)."""
        self._put(ts + 1, right[0], right[1])
        self._forward(ts + 1, right[0], right[1])

    # -- processing ---------------------------------------------------------------

    def process(self, record: Record) -> None:
        if record.key is None:
            self._dropped("null_key")
            return
        if record.value is None:
            self._dropped("null_value")
            return
        ts = record.timestamp
        if ts < 0:
            self._dropped("negative_timestamp")
            return
        if ts > self._observed:
            self._observed = ts
        diff = self.windows.difference_ms
        close = self._observed - self.windows.grace_ms
        if ts + diff < close:
            self._dropped("late")
            return
        if self._store_time is None:
            self._store_time = self._scan_store_time()
        self._key = record.key
        self._key_bytes = self._key_ser(record.key) or b""
        self._record = record
        try:
            if ts < diff:
                self._process_early(ts, close)
            else:
                self._process(ts, close)
        finally:
            self._record = None
        self._maybe_sweep()

    def _process(self, ts: int, close: int) -> None:
        """Kafka Streams' processReverse: the windows from the latest start back."""
        diff = self.windows.difference_ms
        starts: set[int] = set()
        left: tuple[Any, int] | None = None
        right: tuple[Any, int] | None = None
        left_created = right_created = False
        previous: int | None = None
        for start, max_ts, agg in reversed(self._fetch(max(0, ts - 2 * diff), ts + 1)):
            starts.add(start)
            end = start + diff
            if start == ts + 1:
                right_created = True
            elif end > ts:
                if right is None:
                    right = (agg, max_ts)
                self._update(start, agg, max_ts, close)
            elif end == ts:
                left_created = True
                self._update(start, agg, max_ts, close)
                if max_ts < ts:
                    previous = max_ts
                else:
                    return  # a record at this timestamp already made every window
            else:
                left = (agg, max_ts)
                previous = max_ts
                break
        initializer = self.functions[0]
        if previous is not None:
            previous_right = previous + 1
            if previous_right not in starts and previous_right + diff >= ts:
                self._update(previous_right, initializer(), ts, close)
        if not left_created:
            if previous is not None and ts - diff <= previous and left is not None:
                self._update(ts - diff, left[0], ts, close)
            else:
                self._update(ts - diff, initializer(), ts, close)
        if not right_created and right is not None and right[1] > ts:
            self._create_right(ts, right)

    def _process_early(self, ts: int, close: int) -> None:
        """Kafka Streams' processEarly: records before the first full window share
        `[0, difference]`."""
        combined: _Window | None = None
        right: tuple[Any, int] | None = None
        right_created = False
        starts: set[int] = set()
        previous: int | None = None
        for start, max_ts, agg in self._fetch(0, ts + 1):
            starts.add(start)
            if start == 0:
                combined = (start, max_ts, agg)
                if max_ts < ts:
                    previous = max_ts
            elif start <= ts:
                right = (agg, max_ts)
                self._update(start, agg, max_ts, close)
            else:  # start == ts + 1
                right_created = True
        if right is None and combined is not None and combined[1] > ts:
            right = (combined[2], combined[1])
        if not right_created and right is not None and right[1] > ts:
            self._create_right(ts, right)
        initializer = self.functions[0]
        if previous is not None and previous + 1 not in starts:
            self._update(previous + 1, initializer(), ts, close)
        if combined is None:
            self._update(0, initializer(), ts, close)
        else:
            self._update(0, combined[2], combined[1], close)

    # -- expiry ---------------------------------------------------------------------

    def _scan_store_time(self) -> int:
        latest = -1
        for data, _value in self._store.all():
            latest = max(latest, _LONG.unpack_from(data, len(data) - 8)[0])
        return latest

    def _maybe_sweep(self) -> None:
        """Delete invisible windows, once per retention of store time."""
        store_time = self._store_time
        retention = self.windows.retention_ms
        if store_time is None or store_time - self._swept < retention:
            return
        self._swept = store_time
        limit = store_time - retention  # a window starting at or before this is invisible
        store = self._store
        expired = [
            data
            for data, _value in store.all()
            if _LONG.unpack_from(data, len(data) - 8)[0] <= limit
        ]
        for data in expired:
            store.delete(data)
