"""Global stores: the process's copy of each global table, where it lives on
disk, and how a task or an interactive query reads it.

A global store mirrors every partition of one topic (`StreamsBuilder.global_table`).
It has no changelog (the topic is its changelog) and belongs to no task:
one copy per process, under `<state.dir>/<application.id>/global/`
(`global-p<i>` for processing process i > 0 of a daemon with `processes` > 1,
which all share `state.dir`), with RocksDB databases in `rocksdb/<store>`
and the topic positions the databases hold in `.checkpoint` (Kafka Streams'
format, as a task's). The directory is locked (`TaskDirectoryLock`) while
the store is open, so two processes never write one copy.

Threads: `apply` only on the global thread (`runtime.state.global_thread`),
which owns the copy's writes; `get`/`range`/`all` from any thread (processing
threads joining, interactive queries). Writes go straight to RocksDB as
atomic write batches (`restore_batch`), never through a pending overlay, so a
read on another thread sees the database as of the last whole batch.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any, Protocol

from runtime.state.store import KeyValue

GLOBAL_DIR = "global"


def global_directory(state_dir: str | os.PathLike[str], application_id: str, slot: int) -> Path:
    """Where this process keeps its global stores: `global`, or `global-p<slot>`
    for a processing process other than the first of a daemon."""
    name = GLOBAL_DIR if slot <= 0 else f"{GLOBAL_DIR}-p{slot}"
    return Path(state_dir) / application_id / name


class _Backing(Protocol):
    """What a global store is built on (RocksDB, or memory in tests)."""

    @property
    def name(self) -> str: ...

    def get(self, key: bytes) -> bytes | None: ...

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]: ...

    def approximate_num_entries(self) -> int: ...

    def restore_batch(self, records: Iterable[tuple[bytes, bytes | None]]) -> int: ...

    def close(self) -> None: ...


class GlobalStore:
    """One global table's store: the topic's latest value per key, as bytes."""

    __slots__ = ("name", "topic", "_backing", "created", "records_applied")

    def __init__(self, name: str, topic: str, backing: _Backing, created: bool = True) -> None:
        """`created`: the backing store started empty (no checkpoint can
        vouch for it: the topic is read from its beginning)."""
        self.name = name
        self.topic = topic
        self._backing = backing
        self.created = created
        self.records_applied = 0  # since this process opened it (status)

    # --- reads (any thread) -----------------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        return self._backing.get(key)

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        return self._backing.range(lo, hi)

    def all(self) -> Iterator[KeyValue]:
        return self._backing.range(None, None)

    def approximate_num_entries(self) -> int:
        return self._backing.approximate_num_entries()

    # --- writes (the global thread) ---------------------------------------------

    def apply(self, records: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Upsert (None: delete) the topic's records, in order, as one atomic
        batch; returns their count."""
        count = self._backing.restore_batch(records)
        self.records_applied += count
        return count

    def sync(self) -> None:
        """Make what was applied durable before a checkpoint names it."""
        sync = getattr(self._backing, "sync", None)
        if sync is not None:
            sync()

    def close(self) -> None:
        self._backing.close()


def open_rocksdb_global_store(name: str, topic: str, directory: Path, memory: Any) -> GlobalStore:
    """The RocksDB-backed copy of global store `name` under `directory`."""
    from runtime.state.rocksdb_store import RocksDBKeyValueStore

    backing = RocksDBKeyValueStore(name, directory / "rocksdb" / name, memory, task_id="global")
    return GlobalStore(name, topic, backing, backing.created)


def memory_global_store(name: str, topic: str) -> GlobalStore:
    """An in-memory global store (tests, the test driver)."""
    from runtime.state.memory_store import InMemoryKeyValueStore

    return GlobalStore(name, topic, InMemoryKeyValueStore(name))
