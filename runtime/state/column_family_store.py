"""A task's store as a column family of the process's consolidated database
(`state.store.layout=consolidated`, runtime.state.consolidated).

Reads, writes and the pending overlay are `RocksDBKeyValueStore`'s (the
column family is an `Rdict` like a database of its own); what differs is
where writes go. `commit` does not write: it stages the store in the
process's commit (`ConsolidatedStores.stage`), and the pending writes stay
readable until the one batch of the commit is written (`batch_written`).
`restore_batch` writes the records with the store's changelog position in
one batch. `wipe` drops and recreates the column family. Remote-state
checkpoints are per database, so they are not offered here (the layout
refuses `state.remote.url` at start-up).

Threads: as `RocksDBKeyValueStore` (runtime.state.rocksdb_store).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from rocksdict import ColumnFamily, WriteBatch

from runtime.state.checkpoint import ChangelogPartition
from runtime.state.consolidated import ConsolidatedStores
from runtime.state.rocksdb_store import RocksDBKeyValueStore
from runtime.state.store import SortedKeys

_NO_SNAPSHOTS = "remote state snapshots are not built for state.store.layout=consolidated"


class ColumnFamilyStore(RocksDBKeyValueStore):
    """One store of one task in the consolidated database; `created` when its
    column family did not exist (it holds nothing, whatever a position says)."""

    def __init__(self, name: str, stores: ConsolidatedStores, task_id: str) -> None:  # noqa: D107
        # Not RocksDBKeyValueStore.__init__: nothing to open but the family.
        self._name = name
        self._stores = stores
        self.path = stores.path
        self._memory = stores.memory
        self._task_id = task_id
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
        self._memory.register(self)

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
        for key, value in self._pending.items():
            if value is None:
                batch.delete(key, handle)
            else:
                batch.put(key, value, handle)
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
        count = self._stores.write_restored(handle, records, position)
        if count:
            self._memory.relieve_write_buffers()
        return count

    def sync(self) -> None:
        self._open_db()
        self._stores.sync()

    def wipe(self) -> None:
        """Drop the column family and start an empty one (`created`); the owner
        dropped the store's position first (`LayeredStore.wipe`)."""
        self._pending = {}
        self._pending_keys.clear()
        with self._lock:
            self._db = None
            family, self._handle = self._stores.recreate_family(self._task_id, self._name)
            self._db = family
            self.created = True

    def close(self) -> None:
        """Forget the column family (it stays in the database); pending writes
        are dropped."""
        self._memory.unregister(self)
        self._pending = {}
        self._pending_keys.clear()
        with self._lock:
            was_open, self._db = self._db is not None, None
            self._handle = None  # a live handle would keep the database's LOCK
        if was_open:
            self._stores.release(self._task_id)

    # --- not in this layout ------------------------------------------------------

    def start_flush(self) -> None:
        raise NotImplementedError(_NO_SNAPSHOTS)

    def checkpoint_to(self, directory: str | os.PathLike[str]) -> None:
        raise NotImplementedError(_NO_SNAPSHOTS)

    def replace_with(self, directory: str | os.PathLike[str]) -> None:
        raise NotImplementedError(_NO_SNAPSHOTS)

    def rocksdb_statistics(self) -> str | None:
        """None: RocksDB's statistics belong to the database, not a column family."""
        return None
