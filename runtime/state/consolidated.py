"""The consolidated store layout (`state.store.layout=consolidated`): ONE
RocksDB database per process, a column family per task-store, and the
changelog positions in the same database.

Why: with one database per store (`per-task`, the default), a commit is one
synced write per store plus a checkpoint file per task, hundreds of fsyncs
with hundreds of tasks. Here `<state.dir>/<application.id>/consolidated/`
(`consolidated-p<slot>/` in a processing process of a daemon with
`processes` > 1: the database belongs to one process) holds a column family
`<task id>/<store>` per store and one `offsets` column family (key: task id,
changelog topic and partition; value: the position, what a `.checkpoint`
file holds in the per-task layout, 8 bytes big-endian). A commit is ONE
synced `WriteBatch` over every task of the process: each store's pending
writes (`stage`) and each task's positions (`ConsolidatedPositions.commit`),
written by `write_commit` after every task's post-commit (Kafka Streams
4.3's KIP-1035 keeps offsets in the store the same way). Data and positions
can therefore never disagree, and no `.checkpoint` file is written.
Restoration and standby batches carry their store's position in the same
(unsynced) batch (`write_restored`), so a crash mid-restore replays at most
the batch that was being written.

Threads: the database is opened by the thread starting the app and closed
after every task is closed. The polling thread stages and writes commits
(tasks locked) and opens column families for new tasks; the restoration
thread writes restore batches, opens standbys' column families and drops a
wiped store's; the cleanup thread drops the column families of tasks not
owned here (`drop_task`, refused while a store of the task is open). RocksDB
is thread-safe; `_lock` guards the handle maps, the open-task counts and the
last written positions.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rocksdict import ColumnFamily, Options, Rdict, ReadOptions, WriteBatch, WriteOptions

from runtime.logging import get_logger
from runtime.state.checkpoint import ChangelogPartition, Offsets
from runtime.state.rocksdb_memory import RocksDBMemory, default_memory
from runtime.state.rocksdb_store import _unopenable

if TYPE_CHECKING:
    from runtime.state.column_family_store import ColumnFamilyStore

log = get_logger("runtime.state.consolidated")

OFFSETS_CF = "offsets"
_DEFAULT_CF = "default"
_SEP = "\x00"  # between task id, topic and partition in an offsets key
_POSITION = struct.Struct(">q")

_SYNC = WriteOptions()
_SYNC.sync = True


def consolidated_directory(state_dir: str, application_id: str, process_slot: int = -1) -> Path:
    """`<state.dir>/<application.id>/consolidated` (`consolidated-p<slot>` for
    a processing process of a daemon with processes > 1)."""
    name = "consolidated" if process_slot < 0 else f"consolidated-p{process_slot}"
    return Path(state_dir) / application_id / name


def column_family_name(task_id: str, store: str) -> str:
    return f"{task_id}/{store}"


def task_of_column_family(name: str) -> str | None:
    """The task id of a store's column family (None for `offsets`, `default`).
    Store names hold no `/`, so the task id is what precedes the last one."""
    task_id, slash, _store = name.rpartition("/")
    return task_id if slash else None


def _offsets_prefix(task_id: str) -> bytes:
    return (task_id + _SEP).encode("utf-8")


def offsets_key(task_id: str, partition: ChangelogPartition) -> bytes:
    topic, number = partition
    return f"{task_id}{_SEP}{topic}{_SEP}{number}".encode()


def _parse_offsets_key(key: bytes) -> ChangelogPartition:
    _task, topic, number = key.decode("utf-8").split(_SEP)
    return topic, int(number)


class ConsolidatedStores:
    """The process's one database (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str], memory: RocksDBMemory | None = None) -> None:
        self.path = Path(path)
        self.memory = memory or default_memory()
        self._lock = threading.Lock()
        self.path.mkdir(parents=True, exist_ok=True)
        existing = Rdict.list_cf(str(self.path)) if (self.path / "CURRENT").exists() else []
        families = {name: self._family_options(name) for name in existing}
        options = self.memory.options("consolidated", create=True, setter=False)
        options.create_missing_column_families(True)
        try:
            self._db: Rdict | None = Rdict(
                str(self.path), options, column_families=families or None
            )
        except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status
            raise _unopenable("consolidated", self.path, exc) from None
        # name -> (the column family as an Rdict, its handle for write batches)
        self._families: dict[str, tuple[Rdict, ColumnFamily]] = {}
        for name in existing:
            self._families[name] = (
                self._db.get_column_family(name),
                self._db.get_column_family_handle(name),
            )
        if OFFSETS_CF not in self._families:
            self._families[OFFSETS_CF] = self._create(OFFSETS_CF)
        self._open_tasks: dict[str, int] = {}  # task id -> stores open
        self._last_positions: dict[bytes, int] = {}  # offsets key -> last written
        # The commit being assembled (polling thread, tasks locked).
        self._staged_stores: dict[int, ColumnFamilyStore] = {}
        self._staged_positions: dict[bytes, int] = {}
        self.commits = 0  # batches written by `write_commit`
        log.info("consolidated_store_opened", path=str(self.path), column_families=len(existing))

    def _family_options(self, name: str) -> Options:
        if task_of_column_family(name) is None:  # offsets, default: in the budget too
            return self.memory.options(name, create=True, setter=False)
        store = name.rpartition("/")[2]
        return self.memory.options(store, create=True)

    def _create(self, name: str) -> tuple[Rdict, ColumnFamily]:
        db = self._database()
        family = db.create_column_family(name, self._family_options(name))
        return family, db.get_column_family_handle(name)

    def _database(self) -> Rdict:
        db = self._db
        if db is None:
            raise RuntimeError(f"the consolidated store at {self.path} is closed")
        return db

    # --- column families of stores (the thread opening or dropping a store) --

    def open_family(self, task_id: str, store: str) -> tuple[Rdict, ColumnFamily, bool]:
        """The column family of `task_id`'s `store`, created if missing (True
        then: it holds nothing). Counts the store open until `release`."""
        name = column_family_name(task_id, store)
        with self._lock:
            created = name not in self._families
            if created:
                self._families[name] = self._create(name)
            self._open_tasks[task_id] = self._open_tasks.get(task_id, 0) + 1
            family, handle = self._families[name]
        return family, handle, created

    def release(self, task_id: str) -> None:
        """A store of `task_id` closed: its overlay is gone, so positions staged
        for the task (a commit that failed before its batch was written) would
        name writes that will never come; they are dropped."""
        prefix = _offsets_prefix(task_id)
        with self._lock:
            left = self._open_tasks.get(task_id, 0) - 1
            if left > 0:
                self._open_tasks[task_id] = left
            else:
                self._open_tasks.pop(task_id, None)
            staged = self._staged_positions
            if any(key.startswith(prefix) for key in staged):
                self._staged_positions = {
                    k: v for k, v in staged.items() if not k.startswith(prefix)
                }

    def recreate_family(self, task_id: str, store: str) -> tuple[Rdict, ColumnFamily]:
        """Drop a store's column family and create it empty (a wiped store:
        its owner dropped its position first)."""
        name = column_family_name(task_id, store)
        with self._lock:
            if name in self._families:
                del self._families[name]
                self._database().drop_column_family(name)
            self._families[name] = self._create(name)
            family, handle = self._families[name]
        return family, handle

    def task_ids(self) -> set[str]:
        """Tasks with a column family here (the cleanup thread's candidates)."""
        with self._lock:
            return {t for n in self._families if (t := task_of_column_family(n)) is not None}

    def drop_task(self, task_id: str) -> bool:
        """Drop a task's state: its positions first (synced: from then on
        nothing claims its data), then its column families. False, and
        nothing done, while a store of the task is open."""
        with self._lock:
            if self._open_tasks.get(task_id):
                return False
            self._delete_positions_locked(task_id, None)
            names = [n for n in self._families if task_of_column_family(n) == task_id]
            for name in names:
                del self._families[name]
                self._database().drop_column_family(name)
        log.info("consolidated_task_dropped", task_id=task_id, column_families=len(names))
        return True

    # --- positions (the `offsets` column family) -------------------------------

    def read_positions(self, task_id: str) -> Offsets | None:
        """The task's changelog positions, None when it has none."""
        prefix = _offsets_prefix(task_id)
        offsets: Offsets = {}
        with self._lock:
            family = self._families[OFFSETS_CF][0]
            for key, value in _items_from(family, prefix):
                if not key.startswith(prefix):
                    break
                offsets[_parse_offsets_key(key)] = _POSITION.unpack(value)[0]
                self._last_positions[key] = offsets[_parse_offsets_key(key)]
        return offsets or None

    def write_positions(self, task_id: str, offsets: Offsets) -> None:
        """Write positions now, synced (a restore or standby checkpoint)."""
        batch = WriteBatch(raw_mode=True)
        with self._lock:
            handle = self._families[OFFSETS_CF][1]
            for partition, position in offsets.items():
                batch.put(offsets_key(task_id, partition), _POSITION.pack(position), handle)
            self._database().write(batch, _SYNC)
            for partition, position in offsets.items():
                self._last_positions[offsets_key(task_id, partition)] = position

    def delete_positions(self, task_id: str, partitions: Iterable[ChangelogPartition]) -> None:
        """Forget these positions of the task, synced (its stores no longer hold
        what they name)."""
        with self._lock:
            self._delete_positions_locked(task_id, list(partitions))

    def _delete_positions_locked(
        self, task_id: str, partitions: list[ChangelogPartition] | None
    ) -> None:
        family, handle = self._families[OFFSETS_CF]
        if partitions is None:
            prefix = _offsets_prefix(task_id)
            keys = [k for k, _ in _items_from(family, prefix) if k.startswith(prefix)]
        else:
            keys = [offsets_key(task_id, p) for p in partitions]
        if not keys:
            return
        batch = WriteBatch(raw_mode=True)
        for key in keys:
            batch.delete(key, handle)
            self._last_positions.pop(key, None)
        self._database().write(batch, _SYNC)

    # --- writes ------------------------------------------------------------------

    def write_adopted(self, task_id: str, batch: WriteBatch, offsets: Offsets) -> None:
        """A task's old per-task state (`batch`, runtime.state.layout_upgrade)
        with its positions, as one synced batch."""
        with self._lock:
            handle = self._families[OFFSETS_CF][1]
            for partition, position in offsets.items():
                batch.put(offsets_key(task_id, partition), _POSITION.pack(position), handle)
            self._database().write(batch, _SYNC)
            for partition, position in offsets.items():
                self._last_positions[offsets_key(task_id, partition)] = position

    def write_restored(
        self,
        handle: ColumnFamily,
        records: Iterable[tuple[bytes, bytes | None]],
        position: tuple[str, ChangelogPartition, int] | None,
    ) -> int:
        """Changelog records of one store and, when given, its position after
        them, in one batch (not synced: `sync` before the restore counts as
        done). Restoration thread."""
        batch = WriteBatch(raw_mode=True)
        count = 0
        for key, value in records:
            if value is None:
                batch.delete(key, handle)
            else:
                batch.put(key, value, handle)
            count += 1
        if not count:
            return 0
        if position is not None:
            task_id, partition, offset = position
            key = offsets_key(task_id, partition)
            with self._lock:
                handle = self._families[OFFSETS_CF][1]
            batch.put(key, _POSITION.pack(offset), handle)
        self._database().write(batch)
        if position is not None:
            with self._lock:
                self._last_positions[key] = offset
        return count

    def stage(self, store: ColumnFamilyStore) -> None:
        """Put a store's pending writes in the commit being assembled; they stay
        readable in the store until `write_commit` wrote them. Polling thread."""
        self._staged_stores[id(store)] = store

    def stage_positions(self, task_id: str, offsets: Offsets) -> None:
        """Put a task's positions in the commit being assembled (those that
        moved since they were last written). Polling thread."""
        with self._lock:
            last = self._last_positions
            for partition, position in offsets.items():
                key = offsets_key(task_id, partition)
                if last.get(key) != position:
                    self._staged_positions[key] = position

    def write_commit(self) -> int:
        """Write the commit assembled since the last one as ONE synced batch:
        every staged store's writes into its column family, every moved
        position into `offsets`. Returns the store writes it held. Polling
        thread, after every task's post-commit (runtime.polling.committer,
        step 6), tasks still locked."""
        # A store closed since it was staged (its task closed after a commit
        # that failed before this step) dropped its writes with its overlay.
        stores = [s for s in self._staged_stores.values() if s.is_open]
        self._staged_stores = {}
        with self._lock:
            positions = self._staged_positions
            self._staged_positions = {}
        if not positions and not any(s.pending_writes for s in stores):
            return 0
        batch = WriteBatch(raw_mode=True)
        count = 0
        for store in stores:
            count += store.add_to_batch(batch)
        with self._lock:
            handle = self._families[OFFSETS_CF][1]
        for key, position in positions.items():
            batch.put(key, _POSITION.pack(position), handle)
        # Outside the lock: the restoration thread's batches go on meanwhile
        # (other tasks' families; RocksDB orders the writes).
        self._database().write(batch, _SYNC)
        with self._lock:
            self._last_positions.update(positions)
        for store in stores:
            store.batch_written()
        self.commits += 1
        self.memory.relieve_write_buffers()
        return count

    def sync(self) -> None:
        """Sync the write-ahead log (after unsynced restore batches)."""
        self._database().flush_wal(True)

    def close(self) -> None:
        """Close the database (every store closed before: an open column family
        keeps RocksDB's LOCK held). The thread that stops the app."""
        with self._lock:
            db, self._db = self._db, None
            self._families = {}
            self._staged_stores = {}
        if db is not None:
            db.close()
            log.info("consolidated_store_closed", path=str(self.path))


def _items_from(family: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The entries of `family` whose key starts with `prefix` (which ends with
    the separator, 0x00), read in one pass (a task has a few positions)."""
    read_options = ReadOptions()
    read_options.set_iterate_upper_bound(prefix[:-1] + b"\x01")
    items = list(
        cast("Iterable[tuple[bytes, bytes]]", family.items(from_key=prefix, read_opt=read_options))
    )
    yield from items


class ConsolidatedPositions:
    """A task's positions in the `offsets` column family: the consolidated
    layout's counterpart of `FileCheckpoint` (runtime.state.checkpoint)."""

    def __init__(self, stores: ConsolidatedStores, task_id: str) -> None:
        self._stores = stores
        self._task_id = task_id

    def read(self) -> Offsets | None:
        return self._stores.read_positions(self._task_id)

    def write(self, offsets: Offsets) -> None:
        self._stores.write_positions(self._task_id, offsets)

    def commit(self, offsets: Offsets) -> None:
        """At a commit: staged, written with the stores' batches (`write_commit`)."""
        self._stores.stage_positions(self._task_id, offsets)

    def drop(self, partitions: Iterable[ChangelogPartition]) -> None:
        self._stores.delete_positions(self._task_id, partitions)
