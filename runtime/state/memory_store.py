"""In-memory key-value store: a dict plus lazily sorted keys for `range`.

Not persistent: it starts empty, so restoration replays its whole changelog
and no checkpoint is written for it. Threads as for every store (see the
package docstring).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from runtime.state.store import KeyValue, SortedKeys, StoreClosedError


class InMemoryKeyValueStore:
    def __init__(self, name: str) -> None:
        self._name = name
        self._data: dict[bytes, bytes] = {}
        self._keys = SortedKeys()
        self._open = True

    @property
    def name(self) -> str:
        return self._name

    @property
    def persistent(self) -> bool:
        return False

    @property
    def is_open(self) -> bool:
        return self._open

    def _check_open(self) -> None:
        if not self._open:
            raise StoreClosedError(f"store {self._name!r} is closed")

    def get(self, key: bytes) -> bytes | None:
        self._check_open()
        return self._data.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self._check_open()
        if value is None:
            raise ValueError("put(key, None): use delete(key)")
        data = self._data
        if key not in data:
            self._keys.add(key)
        data[key] = value

    def delete(self, key: bytes) -> None:
        self._check_open()
        if self._data.pop(key, None) is not None:
            self._keys.discard(key)

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        self._check_open()
        data = self._data
        # Snapshot the values now: the iterator must not see later writes.
        return iter([(k, data[k]) for k in self._keys.between(lo, hi)])

    def all(self) -> Iterator[KeyValue]:
        return self.range(None, None)

    def approximate_num_entries(self) -> int:
        return len(self._data)

    def flush(self) -> None:
        self._check_open()

    def restore_batch(self, records: Iterable[tuple[bytes, bytes | None]]) -> int:
        count = 0
        for key, value in records:
            if value is None:
                self.delete(key)
            else:
                self.put(key, value)
            count += 1
        return count

    def wipe(self) -> None:
        """Drop every entry (restoration thread: the store restores from scratch)."""
        self._check_open()
        self._data = {}
        self._keys.clear()

    def close(self) -> None:
        self._open = False
        self._data = {}
        self._keys.clear()
