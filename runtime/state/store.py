"""The key-value store contract, a read-only view, and helpers shared by stores.

Keys and values are bytes; serdes live above the stores. A value of `None`
never appears in a store: `put(key, None)` is not allowed, `delete` is the
tombstone. Called by the processing thread holding the store's task (see the
package docstring for the other threads).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Protocol

from sortedcontainers import SortedList

KeyValue = tuple[bytes, bytes]


class StoreClosedError(RuntimeError):
    """A store was used after `close()`."""


class KeyValueStore(Protocol):
    """A sorted key-value store over bytes, as every layer and store implements it.

    `range(lo, hi)` is inclusive at both ends, `None` meaning unbounded, and
    yields in key order (unsigned bytewise). Iterators see the writes made
    before they were created; do not keep one across a commit.
    """

    @property
    def name(self) -> str: ...

    @property
    def persistent(self) -> bool:
        """True when the store keeps its data on disk across restarts."""
        ...

    def get(self, key: bytes) -> bytes | None: ...

    def put(self, key: bytes, value: bytes) -> None: ...

    def delete(self, key: bytes) -> None:
        """Remove the key (a tombstone); deleting a missing key is not an error."""
        ...

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]: ...

    def all(self) -> Iterator[KeyValue]: ...

    def approximate_num_entries(self) -> int: ...

    def flush(self) -> None:
        """Make every write so far durable in the inner store (called at commit)."""
        ...

    def close(self) -> None:
        """Release the store. Writes not flushed are dropped (like a crash)."""
        ...


class ReadOnlyKeyValueStore:
    """The read side of a store, for interactive queries.

    The view itself adds no locking: the caller decides on which thread the
    reads run (the store's task must not be processed at the same time).
    """

    __slots__ = ("_store",)

    def __init__(self, store: KeyValueStore) -> None:
        self._store = store

    @property
    def name(self) -> str:
        return self._store.name

    def get(self, key: bytes) -> bytes | None:
        return self._store.get(key)

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        return self._store.range(lo, hi)

    def all(self) -> Iterator[KeyValue]:
        return self._store.all()

    def approximate_num_entries(self) -> int:
        return self._store.approximate_num_entries()


class SortedKeys:
    """The keys of a dict in sorted order, maintained lazily.

    Until the first `between`, adding a key costs an append and discarding
    one a set add: stores that never range (counts, aggregates) never sort.
    The first `between` sorts once and switches to a `SortedList`
    (sortedcontainers): O(log n) adds and discards and O(log n + k) ranges
    from then on, since a store that ranged once will range again. Sorting
    the whole list on every range after an add, as this did before, made a
    stream-stream join quadratic in its pending writes (2 ms a record at
    100,000 of them). The owner guarantees `add` only for keys not present
    and `discard` only for keys present (its dict knows).
    """

    __slots__ = ("_appended", "_removed", "_sorted")

    def __init__(self, keys: Iterable[bytes] = ()) -> None:
        self._appended: list[bytes] = list(keys)
        self._removed: set[bytes] = set()
        self._sorted: SortedList | None = None

    def add(self, key: bytes) -> None:
        ordered = self._sorted
        if ordered is not None:
            ordered.add(key)
        elif key in self._removed:
            self._removed.discard(key)  # still physically in the list
        else:
            self._appended.append(key)

    def discard(self, key: bytes) -> None:
        ordered = self._sorted
        if ordered is not None:
            ordered.discard(key)
        else:
            self._removed.add(key)

    def clear(self) -> None:
        if self._sorted is not None:
            self._sorted.clear()
        self._appended = []
        self._removed = set()

    def between(self, lo: bytes | None, hi: bytes | None) -> list[bytes]:
        """The present keys in [lo, hi] (None: unbounded), sorted."""
        ordered = self._sorted
        if ordered is None:
            removed = self._removed
            keys = self._appended
            ordered = (
                SortedList(k for k in keys if k not in removed) if removed else SortedList(keys)
            )
            self._sorted = ordered
            self._appended = []
            self._removed = set()
        return list(ordered.irange(lo, hi))


def merge_overlay(
    overlay: list[tuple[bytes, bytes | None]], base: Iterator[KeyValue]
) -> Iterator[KeyValue]:
    """Merge sorted newer entries over a sorted base iterator.

    `overlay` wins on equal keys; an overlay value of None hides the key.
    """
    if not overlay:
        yield from base
        return
    i = 0
    n = len(overlay)
    for key, value in base:
        while i < n and overlay[i][0] < key:
            okey, ovalue = overlay[i]
            i += 1
            if ovalue is not None:
                yield okey, ovalue
        if i < n and overlay[i][0] == key:
            ovalue = overlay[i][1]
            i += 1
            if ovalue is not None:
                yield key, ovalue
            continue
        yield key, value
    while i < n:
        okey, ovalue = overlay[i]
        i += 1
        if ovalue is not None:
            yield okey, ovalue
