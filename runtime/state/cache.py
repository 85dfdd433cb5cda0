"""The caching layer and the one process-wide cache budget (`cache.max.bytes`).

Between commits, a store's cache holds the last write per key (dirty entries)
and values read from the inner store (clean entries). Repeated writes to a key
are folded: at `flush` (commit) each dirty key is emitted once, in the order of
its last write: written to the inner store (through the change-logging layer,
so one changelog record per key) and handed to `on_flush` (one downstream
update per key). After a flush the cache is empty.

Budget: ONE `CacheBudget` for every store of every task in the process; it is
not divided per processing thread, so adding or removing a thread changes
nothing. A store can only evict its own entries (another store belongs to
another task, possibly on another thread), so when the budget is exceeded the
writing store evicts its own least-recently-used entries, emitting the dirty
ones early, until the budget holds or its cache is empty (then its writes pass
through). Emptying every cache at commit gives each store a fresh share each
commit interval: an idle task cannot pin budget for longer than that.
`cache.max.bytes=0` turns caching off: each write is emitted at once.

Threads: a store's layer as the store (see the package docstring); only
`CacheBudget` is shared, and it locks.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator

from runtime.state.changelog import ChangeLoggingKeyValueStore, wall_clock_ms
from runtime.state.store import KeyValue, KeyValueStore, SortedKeys, merge_overlay

# Accounted per cache entry on top of key and value bytes: the Python objects
# of an entry (dict slot, entry object, bytes headers) cost about this much.
ENTRY_OVERHEAD_BYTES = 64

# on_flush(key, new value or None for a delete, old value or None, timestamp)
FlushListener = Callable[[bytes, bytes | None, bytes | None, int], None]


def entry_size(key: bytes, value: bytes | None) -> int:
    """The bytes a cache entry is charged against the budget."""
    return len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD_BYTES


class CacheBudget:
    """Bytes held by all caches of the process, against `cache.max.bytes`.

    Thread-safe: charged by every processing thread (and the polling thread
    at commit). `used` and `over()` are racy reads, fine for decisions that
    are re-checked under `charge`.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("cache.max.bytes must be >= 0")
        self._max = max_bytes
        self._used = 0
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self._max

    @property
    def enabled(self) -> bool:
        return self._max > 0

    @property
    def used(self) -> int:
        return self._used

    def charge(self, delta: int) -> bool:
        """Add `delta` bytes (negative: release); True when now over the budget."""
        with self._lock:
            self._used += delta
            return self._used > self._max

    def over(self) -> bool:
        return self._used > self._max


class _Entry:
    __slots__ = ("value", "dirty", "timestamp", "size")

    def __init__(self, value: bytes | None, dirty: bool, timestamp: int, size: int) -> None:
        self.value = value  # None: a delete not yet emitted
        self.dirty = dirty
        self.timestamp = timestamp
        self.size = size


class CachingKeyValueStore:
    """Folds writes per key between commits; see the module docstring.

    `inner` is usually a `ChangeLoggingKeyValueStore`; each emitted entry then
    carries the timestamp of its last write to the changelog. `clock` gives
    that timestamp (in the runtime: the record being processed). With
    `send_old_values`, `on_flush` also gets the inner store's previous value
    (one extra inner read per emitted entry).
    """

    def __init__(
        self,
        inner: KeyValueStore,
        budget: CacheBudget,
        on_flush: FlushListener | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        send_old_values: bool = False,
    ) -> None:
        self.inner = inner
        self._logged = inner if isinstance(inner, ChangeLoggingKeyValueStore) else None
        self._budget = budget
        self._on_flush = on_flush
        self._clock = clock
        self._send_old_values = send_old_values and on_flush is not None
        self._pass_through = not budget.enabled
        # LRU order: oldest first. Dirty keys in the order of their last write.
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._dirty: dict[bytes, None] = {}
        self._keys = SortedKeys()
        self._bytes = 0
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.emitted = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    def get(self, key: bytes) -> bytes | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return entry.value
        self.misses += 1
        value = self.inner.get(key)
        if value is not None and not self._pass_through:
            size = entry_size(key, value)
            self._entries[key] = _Entry(value, False, 0, size)
            self._keys.add(key)
            self._bytes += size
            if self._budget.charge(size):
                self._evict()
        return value

    def put(self, key: bytes, value: bytes) -> None:
        if value is None:
            raise ValueError("put(key, None): use delete(key)")
        self._write(key, value)

    def delete(self, key: bytes) -> None:
        self._write(key, None)

    def _write(self, key: bytes, value: bytes | None) -> None:
        timestamp = self._clock()
        if self._pass_through:
            self._emit(key, value, timestamp)
            return
        size = entry_size(key, value)
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            entries[key] = _Entry(value, True, timestamp, size)
            self._keys.add(key)
            delta = size
        else:
            entries.move_to_end(key)
            delta = size - entry.size
            entry.value = value
            entry.dirty = True
            entry.timestamp = timestamp
            entry.size = size
        dirty = self._dirty
        if key in dirty:
            del dirty[key]  # re-insert: dirty order is order of last write
        dirty[key] = None
        self._bytes += delta
        # An update of the same size (a count, most aggregates) leaves the
        # budget as it was: no trip through its lock.
        if delta and self._budget.charge(delta):
            self._evict()

    def _evict(self) -> None:
        """Evict own LRU entries while the shared budget is exceeded."""
        entries = self._entries
        budget = self._budget
        while entries and budget.over():
            key, entry = entries.popitem(last=False)
            self._keys.discard(key)
            self._bytes -= entry.size
            budget.charge(-entry.size)
            self.evictions += 1
            if entry.dirty:
                entry.dirty = False
                self._dirty.pop(key, None)
                self._emit(key, entry.value, entry.timestamp)

    def _emit(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        """Write one folded update down and hand it to `on_flush`."""
        old = self.inner.get(key) if self._send_old_values else None
        logged = self._logged
        if logged is not None:
            if value is None:
                logged.delete_at(key, timestamp)
            else:
                logged.put_at(key, value, timestamp)
        elif value is None:
            self.inner.delete(key)
        else:
            self.inner.put(key, value)
        self.emitted += 1
        if self._on_flush is not None:
            self._on_flush(key, value, old, timestamp)

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        if not self._entries:
            return self.inner.range(lo, hi)
        entries = self._entries
        overlay = [(k, entries[k].value) for k in self._keys.between(lo, hi)]
        return merge_overlay(overlay, self.inner.range(lo, hi))

    def all(self) -> Iterator[KeyValue]:
        return self.range(None, None)

    def approximate_num_entries(self) -> int:
        return self.inner.approximate_num_entries()

    def flush_cache(self) -> None:
        """Emit every dirty entry (order of last write), then empty the cache."""
        entries = self._entries
        while self._dirty:
            # Swap, not pop-first: on_flush may write to this store again.
            batch, self._dirty = self._dirty, {}
            for key in batch:
                entry = entries.get(key)
                if entry is None or not entry.dirty:
                    continue  # evicted (and emitted) meanwhile
                entry.dirty = False
                self._emit(key, entry.value, entry.timestamp)
        self._drop_entries()

    def flush(self) -> None:
        self.flush_cache()
        self.inner.flush()

    def _drop_entries(self) -> None:
        released = self._bytes
        self._entries.clear()
        self._dirty.clear()
        self._keys.clear()
        self._bytes = 0
        if released:
            self._budget.charge(-released)

    def close(self) -> None:
        """Drop the cache (dirty entries are lost, like a crash) and close inner."""
        self._drop_entries()
        self.inner.close()
