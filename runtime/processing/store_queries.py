"""Interactive queries: read a store across this instance's tasks.

`App.store(name)` returns a `StoreQuery`. Each read visits the local tasks
that hold the store; it locks one task at a time through the task manager
(as a processing thread would, with priority over scheduling), so a read
never overlaps the task's processing and sees its uncommitted writes the way
the task does. Tasks still restoring are not visible (as in Kafka Streams).
Callable from any thread but a processing thread.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from runtime.processing.task import StreamTask
from runtime.processing.task_manager import TaskManager

T = TypeVar("T")


class StoreUnavailableError(RuntimeError):
    """The app is not in a state where its stores can be read (failed,
    stopped, not started): Kafka Streams' InvalidStateStoreException."""


def _always_available() -> None:
    pass


class StoreQuery:
    """Read-only access to one named store across the local tasks.

    `available()` raises `StoreUnavailableError` when the app cannot answer
    (it failed, or is not running); every read asks it first, so a query on
    a failed app says so instead of failing on some later detail.
    """

    def __init__(
        self,
        name: str,
        task_manager: TaskManager,
        key_serde: Any,
        value_serde: Any,
        windowed: bool,
        timeout: float = 10.0,
        available: Callable[[], None] = _always_available,
        key_serde_source: str = "",
        query: str | None = None,
    ) -> None:
        """`query`: only the tasks of this named query (two queries may use
        one store name)."""
        self.name = name
        self._query = query
        self._task_manager = task_manager
        self._key_serde = key_serde
        self._value_serde = value_serde
        self.windowed = windowed
        self._timeout = timeout
        self._available = available
        self._key_serde_source = key_serde_source

    def _tasks(self) -> list[StreamTask]:
        self._available()
        return [
            t
            for t in self._task_manager.tasks()
            if self.name in t.stores and (self._query is None or t.query == self._query)
        ]

    def _key_bytes(self, key: Any) -> bytes:
        """`key` as the store holds it; a key the store's serde refuses is
        reported with the serde and where it came from."""
        try:
            data: bytes = self._key_serde.serialize(key)
        except Exception as exc:
            source = f" ({self._key_serde_source})" if self._key_serde_source else ""
            raise TypeError(
                f"store {self.name!r}: its key serde {self._key_serde!r}{source} cannot "
                f"serialize the {type(key).__name__} {key!r} ({exc}); query with keys of the "
                "type the store holds, or give the store the serde of its keys"
            ) from exc
        return data

    def _read(self, task: StreamTask, fn: Callable[[Any], T]) -> T:
        return self._task_manager.run_exclusive(
            task.id, lambda: fn(task.stores[self.name].store), self._timeout
        )

    # --- key-value stores -------------------------------------------------------

    def get(self, key: Any) -> Any:
        """The value for `key` in whichever local task holds it, or None."""
        self._require(windowed=False)
        self._available()
        key_bytes = self._key_bytes(key)
        for task in self._tasks():
            raw = self._read(task, lambda store: store.get(key_bytes))
            if raw is not None:
                return self._value_serde.deserialize(raw)
        return None

    def range(self, lo: Any, hi: Any) -> Iterator[tuple[Any, Any]]:
        """Entries with lo <= key <= hi (serialized order), merged across tasks."""
        self._require(windowed=False)
        self._available()
        lo_b = None if lo is None else self._key_bytes(lo)
        hi_b = None if hi is None else self._key_bytes(hi)
        return self._merged(lambda store: list(store.range(lo_b, hi_b)))

    def all(self) -> Iterator[tuple[Any, Any]]:
        """Every entry, merged across tasks in serialized key order."""
        self._require(windowed=False)
        return self._merged(lambda store: list(store.all()))

    def approximate_num_entries(self) -> int:
        return sum(
            self._read(task, lambda store: store.approximate_num_entries())
            for task in self._tasks()
        )

    # --- window stores ----------------------------------------------------------

    def fetch(self, key: Any, time_from: int, time_to: int) -> list[tuple[int, Any]]:
        """(window start, value) of `key`'s windows starting in [time_from, time_to]."""
        self._require(windowed=True)
        self._available()
        key_bytes = self._key_bytes(key)
        found: list[tuple[int, Any]] = []
        for task in self._tasks():
            rows = self._read(task, lambda store: list(store.fetch(key_bytes, time_from, time_to)))
            found.extend((start, self._value_serde.deserialize(v)) for start, v in rows)
        return sorted(found, key=lambda row: row[0])

    def _merged(
        self, read: Callable[[Any], list[tuple[bytes, bytes]]]
    ) -> Iterator[tuple[Any, Any]]:
        # Snapshot each task's rows under its lock, then merge outside it.
        rows = [self._read(task, read) for task in self._tasks()]
        for key, value in heapq.merge(*rows, key=lambda kv: kv[0]):
            yield self._key_serde.deserialize(key), self._value_serde.deserialize(value)

    def _require(self, windowed: bool) -> None:
        if windowed != self.windowed:
            kind = "window" if self.windowed else "key-value"
            raise TypeError(f"store {self.name!r} is a {kind} store")
