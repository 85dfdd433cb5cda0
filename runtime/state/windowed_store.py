"""Windowed store: a key-value store over composite keys `key + window start`.

The composite key is the serialized key followed by the window start as 8
bytes big-endian (unsigned), so one key's windows are contiguous and ordered
by start time, and `fetch(key, from, to)` is one range scan. A different key
can fall inside that scan only if it has our key as a prefix; it then has a
different length, which `fetch` filters out.

The windowed store wraps a layered key-value stack (metered -> cached ->
change-logged -> RocksDB) that sees composite keys: changelog records and
`on_flush` updates carry composite keys too (`split_window_key` decodes them).

Retention: `expire(before)` drops every window that starts before `before`,
deleting straight in the innermost store: no changelog tombstones (the window
changelog topic needs `cleanup.policy=compact,delete` with a retention of at
least the store's) and no downstream updates. A dirty cache entry of an
expired window is still emitted at the next flush (it is that window's last
update); the next expiry removes it again, and reads never show windows
before the expiry bound. Expiry scans the store, but only when `before` has
passed the earliest window start it knows of by `gc_slack_ms`: reads hide
expired windows at once, the scan only frees space. With no slack, a store
whose earliest start moves with every record (a stream-stream join's, whose
"windows" are the records' timestamps) scanned all of itself every few
records: 2 ms a record at 100,000 entries. The stores the DSL builds use
Kafka Streams' segment interval as the slack (half the retention, at least
a minute), so a scan deletes about half the store and costs O(1) a record
amortized, as dropping a segment does in Kafka Streams.

Threads: as every store (see the package docstring).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from runtime.state.store import KeyValueStore

_NONE = 1 << 64  # above every window start: "no window known"
_MAX_START = _NONE - 1


def window_key(key: bytes, window_start: int) -> bytes:
    """The composite store key of `key`'s window starting at `window_start` (ms >= 0)."""
    if window_start < 0:
        raise ValueError(f"window start must be >= 0, got {window_start}")
    return key + window_start.to_bytes(8, "big")


def split_window_key(composite: bytes) -> tuple[bytes, int]:
    """(key, window start) of a composite key."""
    return composite[:-8], int.from_bytes(composite[-8:], "big")


class WindowStore:
    """Windows of values per key, on a key-value stack over composite keys.

    `base` is the innermost store of that stack (where expiry deletes); it
    defaults to `store` itself for an unlayered store.
    """

    def __init__(
        self,
        store: KeyValueStore,
        window_size_ms: int,
        retention_ms: int,
        base: KeyValueStore | None = None,
        gc_slack_ms: int = 0,
    ) -> None:
        if window_size_ms <= 0:
            raise ValueError("window size must be > 0")
        if retention_ms < window_size_ms:
            raise ValueError("retention must be at least the window size")
        self.store = store
        self.base = base if base is not None else store
        self.window_size_ms = window_size_ms
        self.retention_ms = retention_ms
        self.expired_before = 0  # windows starting before this are gone
        self._earliest: int | None = None  # earliest start possibly stored; None: unknown
        # Window starts written since the last flush: those writes are in the
        # layers above `base` (the cache) until the flush, so an expiry scan of
        # `base` does not see them. Few distinct values (windows share starts).
        self._unflushed_starts: set[int] = set()
        self.expired_count = 0
        # How far the expiry bound may pass the earliest stored start before
        # `expire` scans `base` to delete (reads hide expired windows at
        # once; the scan only frees space). 0: at every call that can delete.
        self.gc_slack_ms = gc_slack_ms

    @property
    def name(self) -> str:
        return self.store.name

    @property
    def persistent(self) -> bool:
        return self.store.persistent

    def put(self, key: bytes, window_start: int, value: bytes | None) -> None:
        """Set (or, with None, delete) `key`'s window starting at `window_start`."""
        composite = window_key(key, window_start)
        if value is None:
            self.store.delete(composite)
            return
        self.store.put(composite, value)
        self._unflushed_starts.add(window_start)
        if self._earliest is not None and window_start < self._earliest:
            self._earliest = window_start

    def get(self, key: bytes, window_start: int) -> bytes | None:
        if window_start < self.expired_before:
            return None
        return self.store.get(window_key(key, window_start))

    # --- values as objects (over a store with a caching layer) ---------------

    def use_values(self, serde: Any) -> bool:
        """Bind the value serde for `get_value`/`put_value`; False when the
        stack below cannot hold objects (no caching layer), then use bytes."""
        use = getattr(self.store, "use_values", None)
        return bool(use(serde)) if use is not None else False

    @property
    def emitting(self) -> Any:
        """The object of the update the cache below is emitting (UNSET: none)."""
        return self.store.emitting  # type: ignore[attr-defined]

    def get_value(self, key: bytes, window_start: int) -> Any:
        """`get`, as an object (see `runtime.state.cache`); None when absent."""
        if window_start < self.expired_before:
            return None
        return self.store.get_value(window_key(key, window_start))  # type: ignore[attr-defined]

    def put_value(self, key: bytes, window_start: int, obj: Any) -> None:
        """`put`, as an object; None deletes."""
        composite = window_key(key, window_start)
        self.store.put_value(composite, obj)  # type: ignore[attr-defined]
        if obj is None:
            return
        self._unflushed_starts.add(window_start)
        if self._earliest is not None and window_start < self._earliest:
            self._earliest = window_start

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        """`(window start, value)` of `key`'s windows starting in [time_from, time_to]."""
        time_from = max(time_from, self.expired_before, 0)
        time_to = min(time_to, _MAX_START)
        if time_to < time_from:
            return
        size = len(key) + 8
        for composite, value in self.store.range(
            window_key(key, time_from), window_key(key, time_to)
        ):
            if len(composite) == size:
                yield int.from_bytes(composite[-8:], "big"), value

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[tuple[bytes, int, bytes]]:
        """`(key, window start, value)` of all windows starting in [time_from, time_to].

        Ordered by key, then start. Scans the whole store.
        """
        time_from = max(time_from, self.expired_before)
        for composite, value in self.store.all():
            start = int.from_bytes(composite[-8:], "big")
            if time_from <= start <= time_to:
                yield composite[:-8], start, value

    def all(self) -> Iterator[tuple[bytes, int, bytes]]:
        return self.fetch_all(0, _NONE)

    def expire(self, before: int) -> int:
        """Drop windows starting before `before`; returns how many were deleted.

        The DSL calls it as stream time advances, with `before = stream time -
        retention`.
        """
        if before <= self.expired_before:
            return 0
        self.expired_before = before
        if self._earliest is not None and before <= self._earliest + self.gc_slack_ms:
            return 0
        remaining = _NONE
        deleted = 0
        base = self.base
        # Deleting while iterating is safe: store iterators snapshot pending writes.
        for composite, _ in base.all():
            start = int.from_bytes(composite[-8:], "big")
            if start < before:
                base.delete(composite)
                deleted += 1
            elif start < remaining:
                remaining = start
        # Unflushed windows starting before `before` reach `base` at the next
        # flush, which then lowers `_earliest` (see `flush`). Counting them here
        # would make every later call scan the whole store again until that
        # flush (a backlog whose commit interval spans more event time than
        # the retention scanned once per record).
        alive = [start for start in self._unflushed_starts if start >= before]
        self._earliest = min(remaining, min(alive, default=_NONE))
        self.expired_count += deleted
        return deleted

    def restored(self) -> None:
        """Restoration wrote to `base` behind our back: forget the earliest start."""
        self._earliest = None

    def approximate_num_entries(self) -> int:
        return self.store.approximate_num_entries()

    def flush(self) -> None:
        self.store.flush()
        starts = self._unflushed_starts
        if starts:
            written = min(starts)
            if written < self.expired_before and self._earliest is not None:
                # Expired windows just reached `base`: the next expiry removes them.
                self._earliest = min(self._earliest, written)
            starts.clear()

    def close(self) -> None:
        self.store.close()


class ReadOnlyWindowStore:
    """The read side of a window store, for interactive queries (no locking)."""

    __slots__ = ("_store",)

    def __init__(self, store: WindowStore) -> None:
        self._store = store

    @property
    def name(self) -> str:
        return self._store.name

    def get(self, key: bytes, window_start: int) -> bytes | None:
        return self._store.get(key, window_start)

    def fetch(self, key: bytes, time_from: int, time_to: int) -> Iterator[tuple[int, bytes]]:
        return self._store.fetch(key, time_from, time_to)

    def fetch_all(self, time_from: int, time_to: int) -> Iterator[tuple[bytes, int, bytes]]:
        return self._store.fetch_all(time_from, time_to)

    def all(self) -> Iterator[tuple[bytes, int, bytes]]:
        return self._store.all()
