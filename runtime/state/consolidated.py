"""The consolidated store layout (`state.store.layout=consolidated`): ONE
RocksDB database per process, a column family per store NAME holding every
task's copy of that store under a key prefix, and the changelog positions in
the same database.

Why: with one database per store (`per-task`, the default), a commit is one
synced write per store plus a checkpoint file per task, hundreds of fsyncs
with hundreds of tasks. Here `<state.dir>/<application.id>/consolidated/`
(`consolidated-p<slot>/` in a processing process of a daemon with
`processes` > 1: the database belongs to one process) holds a column family
`store.<store>` per store name, where the keys of task `t` are stored as
`t 0x00 key`, and one `offsets` column family (key: task id, changelog topic
and partition; value: the position, what a `.checkpoint` file holds in the
per-task layout, 8 bytes big-endian). A commit is ONE synced `WriteBatch`
over every task of the process: each store's pending writes (`stage`) and
each task's positions (`ConsolidatedPositions.commit`), written by
`write_commit` after every task's post-commit (Kafka Streams 4.3's KIP-1035
keeps offsets in the store the same way). Data and positions can therefore
never disagree, and no `.checkpoint` file is written. Restoration and
standby batches carry their store's position in the same (unsynced) batch
(`write_restored`), so a crash mid-restore replays at most the batch that
was being written.

Why a key prefix and not a column family per task-store (the first version
of this layout): RocksDB rewrites and re-parses its OPTIONS file, which
lists every column family with its options, at each column family created
or dropped, so N creations cost O(N^2): 512 task-stores took 35-90 s to
create one at a time on this project's 2-core machine (the per-task layout
opens them in 6 s), and dropping them cost as much. rocksdict offers no
batch creation. A task's store here costs nothing to create, and dropping a
task is one `delete_range` per store name in the same synced batch as the
deletion of its positions (atomic, where the column families were dropped
one by one after the positions). A database left by the first version
(`<task>/<store>` column families) is converted once when it opens
(`upgrade_family_per_task_store`).

Threads: the database is opened by the thread starting the app and closed
after every task is closed. The polling thread stages and writes commits
(tasks locked), opens the stores of new tasks and, for a remote-state
snapshot, flushes the memtables and checkpoints the whole database
(`checkpoint_to`); the restoration thread writes restore batches and
installed snapshots (`write_installed`), opens standbys' stores and clears
a wiped store;
the cleanup thread drops the state of tasks not owned here (`drop_task`,
refused while a store of the task is open); the metrics thread reads each
column family's properties (`FamilyFigures`). RocksDB is thread-safe;
`_lock` guards the handle maps, the open-task counts and the last written
positions.
"""

from __future__ import annotations

import os
import struct
import threading
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rocksdict import (
    Checkpoint,
    ColumnFamily,
    Options,
    Rdict,
    ReadOptions,
    WriteBatch,
    WriteOptions,
)

from runtime.logging import get_logger
from runtime.state.checkpoint import ChangelogPartition, Offsets
from runtime.state.consolidated_families import (
    OFFSETS_CF,
    FamilyFigures,
    is_legacy_family,
    prefix_end,
    store_family_name,
    store_of_family,
    task_prefix,
    upgrade_family_per_task_store,
)
from runtime.state.rocksdb_memory import RocksDBMemory, default_memory
from runtime.state.rocksdb_store import _unopenable

if TYPE_CHECKING:
    from runtime.state.column_family_store import ColumnFamilyStore

log = get_logger("runtime.state.consolidated")

_DEFAULT_CF = "default"
_SEP = b"\x00"  # after the task id in every key; between the parts of an offsets key
_POSITION = struct.Struct(">q")
_SCAN_CHUNK = 1024

_SYNC = WriteOptions()
_SYNC.sync = True


def consolidated_directory(state_dir: str, application_id: str, process_slot: int = -1) -> Path:
    """`<state.dir>/<application.id>/consolidated` (`consolidated-p<slot>` for
    a processing process of a daemon with processes > 1)."""
    name = "consolidated" if process_slot < 0 else f"consolidated-p{process_slot}"
    return Path(state_dir) / application_id / name


def offsets_key(task_id: str, partition: ChangelogPartition) -> bytes:
    topic, number = partition
    return task_prefix(task_id) + f"{topic}\x00{number}".encode()


def _parse_offsets_key(key: bytes) -> ChangelogPartition:
    _task, topic, number = key.decode("utf-8").split("\x00")
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
        # column family name -> (the family as an Rdict, its handle for batches)
        self._families: dict[str, tuple[Rdict, ColumnFamily]] = {}
        self._figures: dict[str, FamilyFigures] = {}
        for name in existing:
            # RocksDB's `default` family is always there and never used.
            if name != _DEFAULT_CF and not is_legacy_family(name):
                self._adopt(name)
        if OFFSETS_CF not in self._families:
            self._create(OFFSETS_CF)
        self._open_tasks: dict[str, int] = {}  # task id -> stores open
        self._last_positions: dict[bytes, int] = {}  # offsets key -> last written
        # The commit being assembled (polling thread, tasks locked).
        self._staged_stores: dict[int, ColumnFamilyStore] = {}
        self._staged_positions: dict[bytes, int] = {}
        self.commits = 0  # batches written by `write_commit`
        legacy = [name for name in existing if is_legacy_family(name)]
        if legacy:
            upgrade_family_per_task_store(self, self._database(), legacy)
        log.info(
            "consolidated_store_opened",
            path=str(self.path),
            stores=sorted(s for n in self._families if (s := store_of_family(n)) is not None),
        )

    def _family_options(self, name: str) -> Options:
        store = store_of_family(name)
        if store is None:  # offsets, default, a legacy family: in the budget too
            return self.memory.options(name, create=True, setter=False)
        return self.memory.options(store, create=True)

    def _adopt(self, name: str) -> None:
        db = self._database()
        self._families[name] = (db.get_column_family(name), db.get_column_family_handle(name))
        figures = FamilyFigures(self, name)
        self._figures[name] = figures
        self.memory.register(figures)

    def _create(self, name: str) -> None:
        self._database().create_column_family(name, self._family_options(name))
        self._adopt(name)

    def _database(self) -> Rdict:
        db = self._db
        if db is None:
            raise RuntimeError(f"the consolidated store at {self.path} is closed")
        return db

    # --- per column family figures (the metrics thread; a writer relieving
    # the write-buffer budget): under `_lock`, so the database cannot close
    # meanwhile --------------------------------------------------------------

    def family_properties(self, name: str, properties: tuple[str, ...]) -> dict[str, int] | None:
        """RocksDB's integer `properties` of column family `name` (missing
        ones as 0), None when it or the database is closed."""
        with self._lock:
            entry = self._families.get(name)
            if entry is None or self._db is None:
                return None
            family = entry[0]
            return {p: int(family.property_int_value(p) or 0) for p in properties}

    def family_flushable_bytes(self, name: str) -> int:
        """Bytes of the family's active memtable; 0 when a flush is pending."""
        values = self.family_properties(
            name, ("rocksdb.num-immutable-mem-table", "rocksdb.cur-size-active-mem-table")
        )
        if not values or values["rocksdb.num-immutable-mem-table"]:
            return 0
        return values["rocksdb.cur-size-active-mem-table"]

    def flush_family(self, name: str) -> None:
        """Ask RocksDB to flush the family's memtable in the background."""
        with self._lock:
            entry = self._families.get(name)
            if entry is not None and self._db is not None:
                entry[0].flush(False)

    # --- remote-state snapshots (polling thread, at a commit) ------------------

    def memtable_bytes(self) -> int:
        """Bytes in every column family's active memtable."""
        with self._lock:
            families = [family for family, _handle in self._families.values()]
        prop = "rocksdb.cur-size-active-mem-table"
        return sum(int(family.property_int_value(prop) or 0) for family in families)

    def start_flush(self) -> None:
        """Ask RocksDB to flush every column family in the background."""
        with self._lock:
            families = [family for family, _handle in self._families.values()]
        for family in families:
            family.flush(False)

    def flush_pending(self) -> bool:
        """Whether a flush `start_flush` asked for is still under way."""
        with self._lock:
            families = [family for family, _handle in self._families.values()]
        for family in families:
            for prop in ("rocksdb.num-immutable-mem-table", "rocksdb.num-running-flushes"):
                if family.property_int_value(prop):
                    return True
        return False

    def checkpoint_to(self, directory: str | os.PathLike[str]) -> None:
        """A RocksDB checkpoint of the whole database at `directory` (which
        must not exist; SST files hard-linked, memtables flushed first)."""
        Checkpoint(self._database()).create_checkpoint(str(directory))

    # --- stores (the thread opening, wiping or dropping a store) ---------------

    def store_family(self, store: str) -> tuple[Rdict, ColumnFamily, bool]:
        """The column family of store name `store`, created if missing (True
        then)."""
        name = store_family_name(store)
        with self._lock:
            created = name not in self._families
            if created:
                self._create(name)
            family, handle = self._families[name]
        return family, handle, created

    def open_family(self, task_id: str, store: str) -> tuple[Rdict, ColumnFamily, bool]:
        """The column family holding `task_id`'s `store` (its keys under
        `task_prefix(task_id)`) and whether the family was created now (the
        store then holds nothing, whatever a position says). Counts the store
        open until `release`."""
        family, handle, created = self.store_family(store)
        with self._lock:
            self._open_tasks[task_id] = self._open_tasks.get(task_id, 0) + 1
        return family, handle, created

    def release(self, task_id: str) -> None:
        """A store of `task_id` closed: its overlay is gone, so positions staged
        for the task (a commit that failed before its batch was written) would
        name writes that will never come; they are dropped."""
        prefix = task_prefix(task_id)
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

    def clear_store(self, task_id: str, store: str) -> None:
        """Delete every key of a task's store, synced (a wiped store: its
        owner dropped its position first; synced, so no restart finds the old
        keys under a restore from the changelog's start)."""
        prefix = task_prefix(task_id)
        with self._lock:
            handle = self._families[store_family_name(store)][1]
            batch = WriteBatch(raw_mode=True)
            batch.delete_range(prefix, prefix_end(prefix), handle)
            self._database().write(batch, _SYNC)

    def task_ids(self) -> set[str]:
        """Tasks with data or positions here (the cleanup thread's candidates):
        one seek per task and column family."""
        with self._lock:
            found: set[str] = set()
            for family, _handle in self._families.values():
                found |= _prefixes(family)
        return found

    def drop_task(self, task_id: str) -> bool:
        """Drop a task's state: its positions and the keys of all its stores,
        in ONE synced batch (nothing can claim data that is gone, nor data
        stay without its positions). False, and nothing done, while a store of
        the task is open."""
        prefix = task_prefix(task_id)
        with self._lock:
            if self._open_tasks.get(task_id):
                return False
            batch = WriteBatch(raw_mode=True)
            for _family, handle in self._families.values():  # offsets among them
                batch.delete_range(prefix, prefix_end(prefix), handle)
            self._database().write(batch, _SYNC)
            for key in [k for k in self._last_positions if k.startswith(prefix)]:
                del self._last_positions[key]
        log.info("consolidated_task_dropped", task_id=task_id)
        return True

    # --- positions (the `offsets` column family) -------------------------------

    def read_positions(self, task_id: str) -> Offsets | None:
        """The task's changelog positions, None when it has none."""
        prefix = task_prefix(task_id)
        offsets: Offsets = {}
        with self._lock:
            family = self._families[OFFSETS_CF][0]
            for key, value in _items_under(family, prefix):
                offsets[_parse_offsets_key(key)] = position = _POSITION.unpack(value)[0]
                self._last_positions[key] = position
        return offsets or None

    def write_positions(self, task_id: str, offsets: Offsets) -> None:
        """Write positions now, synced (a restore or standby checkpoint)."""
        batch = WriteBatch(raw_mode=True)
        with self._lock:
            self._put_positions(batch, task_id, offsets)
            self._database().write(batch, _SYNC)
            self._remember(task_id, offsets)

    def delete_positions(self, task_id: str, partitions: Iterable[ChangelogPartition]) -> None:
        """Forget these positions of the task, synced (its stores no longer hold
        what they name)."""
        keys = [offsets_key(task_id, p) for p in partitions]
        if not keys:
            return
        batch = WriteBatch(raw_mode=True)
        with self._lock:
            handle = self._families[OFFSETS_CF][1]
            for key in keys:
                batch.delete(key, handle)
                self._last_positions.pop(key, None)
            self._database().write(batch, _SYNC)

    def _put_positions(self, batch: WriteBatch, task_id: str, offsets: Offsets) -> None:
        handle = self._families[OFFSETS_CF][1]
        for partition, position in offsets.items():
            batch.put(offsets_key(task_id, partition), _POSITION.pack(position), handle)

    def _remember(self, task_id: str, offsets: Offsets) -> None:
        for partition, position in offsets.items():
            self._last_positions[offsets_key(task_id, partition)] = position

    # --- writes ------------------------------------------------------------------

    def offsets_handle(self) -> ColumnFamily:
        """The `offsets` family's handle, for a batch of `write_adopted`."""
        with self._lock:
            return self._families[OFFSETS_CF][1]

    def write_adopted(self, task_id: str, batch: WriteBatch, offsets: Offsets) -> None:
        """A task's old state (`batch`: runtime.state.layout_upgrade, which may
        clear the task's positions first, or a legacy column family) with its
        positions, as one synced batch."""
        prefix = task_prefix(task_id)
        with self._lock:
            self._put_positions(batch, task_id, offsets)
            self._database().write(batch, _SYNC)
            for key in [k for k in self._last_positions if k.startswith(prefix)]:
                del self._last_positions[key]
            self._remember(task_id, offsets)

    def write_restored(
        self,
        handle: ColumnFamily,
        prefix: bytes,
        records: Iterable[tuple[bytes, bytes | None]],
        position: tuple[str, ChangelogPartition, int] | None,
    ) -> int:
        """Changelog records of one task's store (keys under `prefix` in the
        family of `handle`) and, when given, its position after them, in one
        batch (not synced: `sync` before the restore counts as done).
        Restoration thread."""
        batch = WriteBatch(raw_mode=True)
        count = 0
        for key, value in records:
            if value is None:
                batch.delete(prefix + key, handle)
            else:
                batch.put(prefix + key, value, handle)
            count += 1
        if not count:
            return 0
        if position is not None:
            task_id, partition, offset = position
            with self._lock:
                self._put_positions(batch, task_id, {partition: offset})
        self._database().write(batch)
        if position is not None:
            with self._lock:
                self._remember(task_id, {partition: offset})
        return count

    def write_installed(
        self,
        store: str,
        task_id: str,
        chunks: Iterable[list[tuple[bytes, bytes]]],
        position: tuple[ChangelogPartition, int] | None,
    ) -> int:
        """Replace a task's keys of `store` by a snapshot's (`chunks`: keys
        without the prefix) and set its position, in ONE synced batch: the
        old range cleared, the snapshot's keys, the snapshot's position. A
        crash leaves the old state with its old position or the new one with
        the new, never a mix. The whole snapshot is held in the batch (memory:
        its size). Restoration thread, the store not yet processed."""
        prefix = task_prefix(task_id)
        with self._lock:
            handle = self._families[store_family_name(store)][1]
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(prefix, prefix_end(prefix), handle)
        count = 0
        for chunk in chunks:
            for key, value in chunk:
                batch.put(prefix + key, value, handle)
            count += len(chunk)
        with self._lock:
            if position is not None:
                self._put_positions(batch, task_id, {position[0]: position[1]})
            self._database().write(batch, _SYNC)
            if position is not None:
                self._remember(task_id, {position[0]: position[1]})
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
        # (other tasks' keys; RocksDB orders the writes).
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
        """Close the database (every store closed before). The thread that
        stops the app."""
        for figures in self._figures.values():
            self.memory.unregister(figures)
        with self._lock:
            db, self._db = self._db, None
            self._families = {}
            self._figures = {}
            self._staged_stores = {}
        if db is not None:
            db.close()
            log.info("consolidated_store_closed", path=str(self.path))


def _items_under(family: Rdict, prefix: bytes) -> Iterator[tuple[bytes, bytes]]:
    """The entries of `family` whose key starts with `prefix` (ending with
    0x00), read in chunks: no rocksdict iterator outlives a chunk (an open one
    keeps the database alive after `close`)."""
    start = prefix
    end = prefix_end(prefix)
    while True:
        read_options = ReadOptions()
        read_options.set_iterate_upper_bound(end)
        items = cast(
            "Iterable[tuple[bytes, bytes]]", family.items(from_key=start, read_opt=read_options)
        )
        chunk = list(islice(items, _SCAN_CHUNK))
        del items
        yield from chunk
        if len(chunk) < _SCAN_CHUNK:
            return
        start = chunk[-1][0] + b"\x00"


def _prefixes(family: Rdict) -> set[str]:
    """The task ids with a key in `family`: seek to a key, take its task, skip
    past the task's range, again."""
    found: set[str] = set()
    start = b""
    while True:
        keys = cast("Iterator[bytes]", iter(family.keys(from_key=start)))
        key = next(keys, None)
        del keys
        if key is None:
            return found
        task, sep, _rest = key.partition(_SEP)
        if not sep:  # not a task's key (nothing writes such keys): skip it
            start = key + b"\x00"
            continue
        found.add(task.decode("utf-8"))
        start = task + b"\x01"


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
