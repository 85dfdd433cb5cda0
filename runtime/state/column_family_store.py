"""A task's store in the process's consolidated database
(`state.store.layout=consolidated`, runtime.state.consolidated): its keys,
under the task's prefix, in the column family of its store name.

The pending overlay is `RocksDBKeyValueStore`'s (keys without the prefix);
what differs is where reads look and where writes go. Reads add the prefix
(`get`) or scan the task's range and strip it (`range`). `commit` does not
write: it stages the store in the process's commit
(`ConsolidatedStores.stage`), and the pending writes stay readable until the
one batch of the commit is written (`batch_written`). `restore_batch`
writes the records with the store's changelog position in one batch. `wipe`
deletes the task's range. RocksDB's figures are per column family, so per
store name for all tasks (`FamilyFigures`), not per store object: this
store registers nothing with the metrics thread. Remote-state snapshots
export the task's range into a standalone database and install one back in
one batch (runtime.state.snapshot_export), so they are portable between
layouts.

Threads: as `RocksDBKeyValueStore` (runtime.state.rocksdb_store).
"""

from __future__ import annotations

import os
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import cast

from rocksdict import ColumnFamily, ReadOptions, WriteBatch

from runtime.state.checkpoint import ChangelogPartition
from runtime.state.consolidated import ConsolidatedStores
from runtime.state.consolidated_families import prefix_end, store_family_name, task_prefix
from runtime.state.rocksdb_store import RocksDBKeyValueStore
from runtime.state.snapshot_export import export_range, read_database
from runtime.state.store import KeyValue, SortedKeys

_CHUNK = 1024  # entries per rocksdict iterator (none outlives a chunk)
# Where a capture checkpoints the process database, beside the task's store
# directories (a name no store has: the uploader deletes entries starting
# with "." once the exports ran, and never uploads them).
CHECKPOINT_SCRATCH = ".consolidated-checkpoint"


class ColumnFamilyStore(RocksDBKeyValueStore):
    """One store of one task in the consolidated database; `created` when its
    column family did not exist or the store was wiped (it holds nothing,
    whatever a position says)."""

    def __init__(self, name: str, stores: ConsolidatedStores, task_id: str) -> None:  # noqa: D107
        # Not RocksDBKeyValueStore.__init__: nothing to open but the family.
        self._name = name
        self._stores = stores
        self.path = stores.path
        self._memory = stores.memory
        self._task_id = task_id
        self._prefix = task_prefix(task_id)
        self._end = prefix_end(self._prefix)
        self._lock = threading.Lock()
        family, handle, self.created = stores.open_family(task_id, name)
        self._handle: ColumnFamily | None = handle
        self._db = family
        self._options = None  # type: ignore[assignment]  # statistics are per database
        self._pending: dict[bytes, bytes | None] = {}
        self._pending_keys = SortedKeys()
        # (topic, partition) of its changelog, set by its builder: restore
        # batches carry the position after them.
        self.changelog_partition: ChangelogPartition | None = None

    # --- reads (processing thread) ----------------------------------------------

    def get(self, key: bytes) -> bytes | None:
        pending = self._pending
        if key in pending:
            return pending[key]
        value: bytes | None = self._open_db().get(self._prefix + key)
        return value

    def _db_range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        prefix = self._prefix
        cut = len(prefix)
        start = prefix + (lo or b"")
        end = prefix + hi + b"\x00" if hi is not None else self._end  # exclusive
        while True:
            db = self._open_db()
            read_options = ReadOptions()
            read_options.set_iterate_upper_bound(end)
            items = cast("Iterable[KeyValue]", db.items(from_key=start, read_opt=read_options))
            chunk = list(islice(items, _CHUNK))
            del items, db  # drop the rocksdict iterator before yielding
            for key, value in chunk:
                yield key[cut:], value
            if len(chunk) < _CHUNK:
                return
            start = chunk[-1][0] + b"\x00"

    def approximate_num_entries(self) -> int:
        """The task's keys on disk, counted (RocksDB estimates per column
        family only, and the family holds every task's copy), plus the pending
        puts: O(keys of the task)."""
        on_disk = sum(1 for _ in self._db_range(None, None))
        return on_disk + sum(1 for v in self._pending.values() if v is not None)

    # --- commit (polling thread, task locked) ---------------------------------

    def commit(self) -> int:
        """Stage the pending writes in the process's commit; returns their count.
        They are written (and leave the overlay) with the commit's one batch."""
        self._open_db()
        if self._pending:
            self._stores.stage(self)
        return len(self._pending)

    def add_to_batch(self, batch: WriteBatch) -> int:
        """Put the pending writes into the commit's batch (`write_commit`)."""
        handle = self._handle
        assert handle is not None, "a closed store is never staged"
        prefix = self._prefix
        for key, value in self._pending.items():
            if value is None:
                batch.delete(prefix + key, handle)
            else:
                batch.put(prefix + key, value, handle)
        return len(self._pending)

    def batch_written(self) -> None:
        """The commit's batch is on disk: the overlay is no longer needed."""
        self._pending = {}
        self._pending_keys.clear()

    # --- restoration (restoration thread) ---------------------------------------

    def restore_batch(
        self, records: Iterable[tuple[bytes, bytes | None]], next_offset: int | None = None
    ) -> int:
        """Changelog records (None: delete) and, with `next_offset`, the store's
        position after them, in one atomic batch (not synced: `sync`)."""
        self._open_db()
        partition = self.changelog_partition
        position = (
            (self._task_id, partition, next_offset)
            if partition is not None and next_offset is not None
            else None
        )
        handle = self._handle
        assert handle is not None  # _open_db raised for a closed store
        count = self._stores.write_restored(handle, self._prefix, records, position)
        if count:
            self._memory.relieve_write_buffers()
        return count

    def sync(self) -> None:
        self._open_db()
        self._stores.sync()

    def wipe(self) -> None:
        """Delete the task's keys of this store (`created` from then on); the
        owner dropped the store's position first (`LayeredStore.wipe`)."""
        self._open_db()
        self._pending = {}
        self._pending_keys.clear()
        self._stores.clear_store(self._task_id, self._name)
        self.created = True

    def close(self) -> None:
        """Forget the column family (the task's keys stay in it); pending
        writes are dropped."""
        self._pending = {}
        self._pending_keys.clear()
        with self._lock:
            was_open, self._db = self._db is not None, None
            self._handle = None  # a live handle would keep the database's LOCK
        if was_open:
            self._stores.release(self._task_id)

    # --- remote state: per-task snapshots (runtime.state.snapshot_export) -----

    def memtable_bytes(self) -> int:
        """Bytes in the active memtables of the whole database: what the
        checkpoint under a snapshot would flush now."""
        return self._stores.memtable_bytes()

    def start_flush(self) -> None:
        """Ask RocksDB to flush every column family in the background."""
        self._stores.start_flush()

    def flush_pending(self) -> bool:
        return self._stores.flush_pending()

    def capture_snapshot(self, directory: str | os.PathLike[str]) -> Callable[[], None]:
        """Checkpoint the process database next to `directory` (once per
        capture: the task's other stores reuse it; the commit's batch is
        written, so it holds exactly the committed state) and return the
        export of the task's range from it into a standalone database at
        `directory`, to run later on the upload's thread
        (runtime.state.snapshot_export). Polling thread, task locked."""
        target = Path(directory)
        checkpoint = target.parent / CHECKPOINT_SCRATCH
        if not checkpoint.exists():
            self._stores.checkpoint_to(checkpoint)
        family = store_family_name(self._name)
        prefix, end = self._prefix, self._end

        def export() -> None:
            export_range(checkpoint, family, prefix, end, target)

        return export

    def checkpoint_to(self, directory: str | os.PathLike[str]) -> None:
        """Export the task's range now (what `capture_snapshot` defers), its
        scratch checkpoint deleted after."""
        try:
            self.capture_snapshot(directory)()
        finally:
            shutil.rmtree(Path(directory).parent / CHECKPOINT_SCRATCH, ignore_errors=True)

    def install_snapshot_db(self, directory: str | os.PathLike[str], position: int) -> None:
        """Replace the task's keys by those of the snapshot database at
        `directory` (either layout's) and set the store's position to
        `position`, in one synced batch. Pending writes are dropped. Raises if
        the snapshot does not open or read; nothing is written then (the
        store stays as restoration found it, without a position). Restoration thread, before processing."""
        self._open_db()
        self._pending = {}
        self._pending_keys.clear()
        partition = self.changelog_partition
        self._stores.write_installed(
            self._name,
            self._task_id,
            read_database(directory),
            (partition, position) if partition is not None else None,
        )
        self.created = False

    def replace_with(self, directory: str | os.PathLike[str]) -> None:
        raise NotImplementedError("consolidated stores install snapshots with install_snapshot_db")

    def rocksdb_properties(self, names: tuple[str, ...]) -> dict[str, int] | None:
        """None: RocksDB's properties are per column family, shared by every
        task's copy of the store (`FamilyFigures` reads them)."""
        return None

    def flushable_memtable_bytes(self) -> int:
        return 0

    def request_flush(self) -> None:
        return None

    def rocksdb_statistics(self) -> str | None:
        """None: RocksDB's statistics belong to the database, not a column family."""
        return None
