"""Persistent key-value store on RocksDB (rocksdict, raw bytes mode).

Writes between commits stay in a pending overlay (key -> value, or None for a
delete) that reads of the same task consult first (read-your-writes, merged
into `range`/`all`). `commit()` turns the overlay into one `WriteBatch` and
applies it with a single `db.write`: RocksDB applies a batch atomically (its
WAL stays on), so a crash leaves either the whole commit on disk or none of it.
The write is not synced: a process killed after it keeps it (the WAL is in the
page cache), a power loss may take back the last commits, so `sync()` runs
before a checkpoint names them (`StreamTask.post_commit`).
The overlay holds the last write per key, so the batch carries each key once.

Threads: the processing thread holding the task (reads, writes); the polling
thread at commit (`flush`/`commit`, and for remote state `start_flush` /
`checkpoint_to`) while the task is locked; the restoration thread
(`restore_batch`, `replace_with`) before the task is processed.

Remote state (runtime.state.remote) needs RocksDB checkpoints: a directory of
hard links to the live (immutable) SST files plus copies of the small
metadata files, taken at a commit, when the database holds exactly what the
task's checkpoint names. rocksdict's `Checkpoint` holds the GIL while RocksDB
flushes the memtable into an SST, which stalls every Python thread (about
0.3 s for a 50 MB memtable here); `start_flush` asks RocksDB's own background
thread to flush first, so the checkpoint taken at a later commit finds
little left to flush.

Opening: a store's files can be gone or damaged while its task's checkpoint
stays (an operator cleaning up, a disk). `open_database` tells the cases
apart before RocksDB sees the directory: no database files at all (the
directory missing or emptied) opens a new, empty database and marks the store
`created`, so its owner drops the checkpoint's position for it instead of
trusting it (`LayeredStore.apply_checkpoint`); database files RocksDB cannot
open (CURRENT or MANIFEST missing or cut short, SST files gone, a file where
the directory should be, no permission) raise `StoreUnopenableError`, whose
message names the directory and the fix. An existing database is never
opened with `create_if_missing`: RocksDB would otherwise start an empty one
over what is left of the old (CURRENT gone, the rest there) without a word.

Memory: every store opens with the options of its app's `RocksDBMemory`
(runtime.state.rocksdb_memory): the shared block cache and write-buffer
budget, small memtables, `state.rocksdb.config.setter`'s changes. An open
store is registered there, so the metrics thread
(runtime.state.rocksdb_metrics) can read its RocksDB properties; it does so
through `rocksdb_properties` under the store's `_lock`, which `close`, `wipe`
and `replace_with` also take while they swap the database, so a read never
meets a database being closed. Reads and writes do not take it (their thread
owns the store).
"""

from __future__ import annotations

import os
import re
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import cast

from rocksdict import Checkpoint, Options, Rdict, ReadOptions, WriteBatch

from runtime.logging import get_logger
from runtime.state.rocksdb_memory import RocksDBMemory, default_memory
from runtime.state.store import KeyValue, SortedKeys, StoreClosedError, merge_overlay

log = get_logger("runtime.state.rocksdb")

# Entries read from RocksDB per iterator. Iterators are re-created per chunk, so
# none outlives a `next()` call: an open rocksdict iterator keeps the database
# (and its LOCK file) alive after `close()`.
_CHUNK = 1024


# The files that make a database (as opposed to RocksDB's LOG, LOCK, IDENTITY,
# OPTIONS-* and rocksdict's config, which say nothing about its contents):
# CURRENT names the MANIFEST, the MANIFEST names the SST files, and numbered
# .log files are the write-ahead log. Any of them present means a database was
# here, and opening it must not quietly start a new one.
_DATABASE_FILE = re.compile(r"^(CURRENT|MANIFEST-\d+|\d+\.(sst|ldb|log|blob))$")


class StoreUnopenableError(RuntimeError):
    """A store's directory holds something RocksDB cannot open as its database.

    Raised where the store is opened (the polling thread creating a task or a
    standby, the restoration thread wiping a store), so the app stops with
    this message rather than run on a silently emptied store. The message
    names the directory and what the operator can do.
    """

    def __init__(self, store: str, directory: Path, reason: str) -> None:
        self.store = store
        self.directory = directory
        self.reason = reason
        if "LOCK" in reason:
            fix = (
                "another process (or a store of this one not yet closed) holds its lock: "
                "check that no other instance uses the same state.dir"
            )
        else:
            fix = (
                f"its contents are in its changelog: stop the app, delete {directory} "
                f"(the store is then restored from its changelog) and start the app again"
            )
        super().__init__(f"state store {store!r} cannot be opened at {directory}: {reason}; {fix}")


def _unopenable(store: str, directory: Path, exc: BaseException) -> StoreUnopenableError:
    if isinstance(exc, FileExistsError | NotADirectoryError):
        reason = f"a file is in the way of its directory ({exc.filename})"
    elif isinstance(exc, OSError):
        where = f" ({exc.filename})" if exc.filename else ""
        reason = f"{type(exc).__name__}: {exc.strerror or exc}{where}"
    else:
        reason = str(exc).strip() or type(exc).__name__
    error = StoreUnopenableError(store, directory, reason)
    log.error(
        "state_store_unopenable",
        store=store,
        directory=str(directory),
        reason=reason,
        message=str(error),
    )
    return error


def open_database(
    name: str, path: Path, memory: RocksDBMemory | None = None
) -> tuple[Rdict, bool, Options]:
    """Open the database of store `name` at `path` with `memory`'s options
    (default: `default_memory()`); True when it was created now, and the
    options it opened with (their statistics, when on, are read from them).

    Created means there were no database files: the directory was missing or
    empty (see the module docstring). Raises `StoreUnopenableError` for
    anything else RocksDB cannot open. Called by whichever thread opens the
    store (the store's owner at that moment)."""
    try:
        path.mkdir(parents=True, exist_ok=True)  # a file in the way raises here
        entries = os.listdir(path)
    except OSError as exc:
        raise _unopenable(name, path, exc) from None
    created = not any(_DATABASE_FILE.match(entry) for entry in entries)
    options = (memory or default_memory()).options(name, create=created)
    try:
        db = Rdict(str(path), options)
    except Exception as exc:  # rocksdict raises plain Exception with RocksDB's status text
        raise _unopenable(name, path, exc) from None
    return db, created, options


class RocksDBKeyValueStore:
    """One RocksDB database per store, at `path` (created if there was none).

    `created` is True when this store object started from a new, empty
    database (no database files were there when it opened, or `wipe` emptied
    it): whatever a checkpoint says about the store, it holds nothing.
    """

    def __init__(
        self,
        name: str,
        path: str | os.PathLike[str],
        memory: RocksDBMemory | None = None,
        task_id: str | None = None,
    ) -> None:
        """`memory`: the app's shared RocksDB memory (default: the process's
        `default_memory()`); `task_id` labels its metrics (default: the task
        directory's name, `<task dir>/rocksdb/<store>`)."""
        self._name = name
        self.path = Path(path)
        self._memory = memory or default_memory()
        self._task_id = task_id if task_id is not None else self.path.parent.parent.name
        self._lock = threading.Lock()
        db, self.created, self._options = open_database(name, self.path, self._memory)
        self._db: Rdict | None = db
        self._pending: dict[bytes, bytes | None] = {}
        self._pending_keys = SortedKeys()
        self._memory.register(self)

    @property
    def name(self) -> str:
        return self._name

    @property
    def task_id(self) -> str:
        return self._task_id

    @property
    def persistent(self) -> bool:
        return True

    @property
    def is_open(self) -> bool:
        return self._db is not None

    @property
    def pending_writes(self) -> int:
        """Keys written since the last commit."""
        return len(self._pending)

    def _open_db(self) -> Rdict:
        db = self._db
        if db is None:
            raise StoreClosedError(f"store {self._name!r} is closed")
        return db

    # --- reads and writes (processing thread) ----------------------------------

    def get(self, key: bytes) -> bytes | None:
        pending = self._pending
        if key in pending:
            return pending[key]
        value: bytes | None = self._open_db().get(key)
        return value

    def put(self, key: bytes, value: bytes) -> None:
        if value is None:
            raise ValueError("put(key, None): use delete(key)")
        pending = self._pending
        if key not in pending:
            self._pending_keys.add(key)
        pending[key] = value

    def delete(self, key: bytes) -> None:
        pending = self._pending
        if key not in pending:
            self._pending_keys.add(key)
        pending[key] = None

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        self._open_db()
        pending = self._pending
        overlay = [(k, pending[k]) for k in self._pending_keys.between(lo, hi)]
        return merge_overlay(overlay, self._db_range(lo, hi))

    def all(self) -> Iterator[KeyValue]:
        return self.range(None, None)

    def _db_range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        start = lo
        while True:
            db = self._open_db()
            read_options = ReadOptions()
            if hi is not None:
                read_options.set_iterate_upper_bound(hi + b"\x00")  # exclusive bound
            items = cast("Iterable[KeyValue]", db.items(from_key=start, read_opt=read_options))
            chunk = list(islice(items, _CHUNK))
            del items, db  # drop the rocksdict iterator before yielding
            yield from chunk
            if len(chunk) < _CHUNK:
                return
            start = chunk[-1][0] + b"\x00"  # the smallest key after the last one

    def approximate_num_entries(self) -> int:
        estimate = self._open_db().property_int_value("rocksdb.estimate-num-keys") or 0
        return int(estimate) + sum(1 for v in self._pending.values() if v is not None)

    # --- commit, restoration, lifecycle (polling / restoration thread) --------

    def commit(self) -> int:
        """Apply the pending writes as one atomic write batch; returns their count."""
        db = self._open_db()
        pending = self._pending
        if not pending:
            return 0
        batch = WriteBatch(raw_mode=True)
        for key, value in pending.items():
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
        db.write(batch)
        count = len(pending)
        self._pending = {}
        self._pending_keys.clear()
        self._memory.relieve_write_buffers()
        return count

    def flush(self) -> None:
        self.commit()

    def restore_batch(self, records: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Apply changelog records (None value: delete) straight to disk, atomically.

        Pending writes, if any, stay on top (they are newer). Returns the count.
        Not synced (restoration writes many batches): call `sync()` before a
        checkpoint names the restored offsets.
        """
        db = self._open_db()
        batch = WriteBatch(raw_mode=True)
        count = 0
        for key, value in records:
            if value is None:
                batch.delete(key)
            else:
                batch.put(key, value)
            count += 1
        if count:
            db.write(batch)
            self._memory.relieve_write_buffers()
        return count

    def sync(self) -> None:
        """Sync RocksDB's write-ahead log to disk: before a checkpoint names
        what commits or restoration batches wrote."""
        self._open_db().flush_wal(True)

    # --- remote state: checkpoints and their installation -------------------

    def memtable_bytes(self) -> int:
        """Bytes in the active memtable: what a checkpoint would flush now."""
        value = self._open_db().property_int_value("rocksdb.cur-size-active-mem-table")
        return int(value or 0)

    def start_flush(self) -> None:
        """Ask RocksDB to flush the memtable in its background thread (returns at once)."""
        self._open_db().flush(False)

    def flush_pending(self) -> bool:
        """Whether a flush asked for by `start_flush` is still under way."""
        db = self._open_db()
        for prop in ("rocksdb.num-immutable-mem-table", "rocksdb.num-running-flushes"):
            if db.property_int_value(prop):
                return True
        return False

    def checkpoint_to(self, directory: str | os.PathLike[str]) -> None:
        """A consistent RocksDB checkpoint of what is on disk now (committed
        writes only: the pending overlay is not in the database) at `directory`,
        which must not exist. SST files are hard links (same file system)."""
        Checkpoint(self._open_db()).create_checkpoint(str(directory))

    def capture_snapshot(self, directory: str | os.PathLike[str]) -> Callable[[], None] | None:
        """Take the snapshot of this store into `directory` now (a checkpoint);
        None: nothing is left to do later (the consolidated layout's store
        returns its deferred export instead)."""
        self.checkpoint_to(directory)
        return None

    def install_snapshot_db(self, directory: str | os.PathLike[str], position: int) -> None:
        """Install a snapshot database (`replace_with`); the position is kept
        by the owner's checkpoint in this layout."""
        del position
        self.replace_with(directory)

    def replace_with(self, directory: str | os.PathLike[str]) -> None:
        """Replace the whole database by the one at `directory` (a downloaded
        checkpoint, on the same file system), then open it. Pending writes are
        dropped. If the new database does not open, an empty one is opened
        instead and the error is raised: the caller then restores from the
        changelog's beginning. Restoration thread, before processing."""
        self._pending = {}
        self._pending_keys.clear()
        with self._lock:
            db, self._db = self._db, None
            if db is not None:
                db.close()
            shutil.rmtree(self.path, ignore_errors=True)
            os.replace(directory, self.path)
            try:
                # Never create: a checkpoint without its CURRENT is no database,
                # and an empty one opened in its place would claim the position.
                options = self._memory.options(self._name, create=False)
                self._db = Rdict(str(self.path), options)
                self._options = options
                self.created = False
            except Exception:
                shutil.rmtree(self.path, ignore_errors=True)
                self._db, self.created, self._options = open_database(
                    self._name, self.path, self._memory
                )
                raise

    def wipe(self) -> None:
        """Drop the whole database and open a new, empty one (`created`).

        For a store whose checkpointed position the changelog does not have
        (restoration thread, before processing): what it holds cannot be
        placed in the changelog, so it restores from the changelog's start.
        Pending writes are dropped. Raises `StoreUnopenableError` if the
        directory cannot be deleted or the new database not opened."""
        self._pending = {}
        self._pending_keys.clear()
        with self._lock:
            db, self._db = self._db, None
            if db is not None:
                db.close()
            try:
                shutil.rmtree(self.path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                raise _unopenable(self._name, self.path, exc) from None
            self._db, self.created, self._options = open_database(
                self._name, self.path, self._memory
            )

    def close(self) -> None:
        """Close the database; writes not committed are dropped."""
        self._memory.unregister(self)
        self._pending = {}
        self._pending_keys.clear()
        with self._lock:
            db, self._db = self._db, None
            if db is not None:
                db.close()

    # --- metrics (the metrics thread; any thread) -------------------------------

    def rocksdb_properties(self, names: tuple[str, ...]) -> dict[str, int] | None:
        """RocksDB's integer properties `names` (missing ones as 0), or None
        when the store is closed. RocksDB's property reads are thread-safe;
        the lock keeps the database from closing meanwhile."""
        with self._lock:
            db = self._db
            if db is None:
                return None
            return {name: int(db.property_int_value(name) or 0) for name in names}

    def flushable_memtable_bytes(self) -> int:
        """Bytes of the active memtable, 0 when closed or when a flush is
        already pending (an immutable memtable waits): what `request_flush`
        would free. Any thread (`RocksDBMemory.relieve_write_buffers`)."""
        with self._lock:
            db = self._db
            if db is None or db.property_int_value("rocksdb.num-immutable-mem-table"):
                return 0
            return int(db.property_int_value("rocksdb.cur-size-active-mem-table") or 0)

    def request_flush(self) -> None:
        """Ask RocksDB to flush the memtable in the background (returns at once).
        Any thread: committed writes only are in the memtable, and a flush
        changes no content."""
        with self._lock:
            if self._db is not None:
                self._db.flush(False)

    def rocksdb_statistics(self) -> str | None:
        """RocksDB's statistics text (`state.rocksdb.statistics`), None when off or closed."""
        with self._lock:
            if self._db is None or not self._memory.settings.statistics:
                return None
            text: str | None = self._options.get_statistics()
            return text
