"""Taking snapshots: RocksDB checkpoints of a task's stores at a commit.

Runs on the polling thread inside the commit protocol (rule 4), after every
task's `post_commit`, while every task is still locked: `Committer.commit`
calls `after_commit(tasks)`. That is the point where a task's RocksDB
databases hold exactly the writes whose changelog records the producer
acknowledged (or whose transaction committed), and the stores' changelog
positions name exactly those: the snapshot is tagged with them, and the
task's checkpoint file is rewritten with them (a regular commit may defer
it), so the local state and its newest snapshot name the same positions. Between commits
nothing writes the databases of an active task (processing threads write the
stores' pending overlays and caches, which reach RocksDB only in
`post_commit`), so the checkpoint and the offsets cannot drift apart.

Consolidated layout (`state.store.layout=consolidated`): a store is a key
range of column families shared by every task. The same two commits apply
to the whole database (its memtables: every family), then the capture
checkpoints the whole database once (hard links; `write_state` wrote the
commit's batch before `after_commit`) beside the job's store directories,
and the uploader exports the task's ranges from it into standalone databases
of the per-task format on the restoration thread and deletes it
(runtime.state.snapshot_export).

The cost to processing (per-task layout): while the commit holds the task locks, and because
rocksdict holds the GIL, a checkpoint stalls every thread for as long as
RocksDB needs to flush the memtable (about 6 ms per MB here). So a due task
goes through two commits: the first asks RocksDB to flush in its background
thread (`start_flush`, returns at once) unless the memtable is small; a later
commit, once the flush finished, takes the checkpoint (hard links and a copy of
the small metadata files: a few ms). The upload, the expensive part, happens
on the restoration thread (`upload.Uploader`). At most one task is captured
per commit, none while that task's previous upload is still going, and none
when the stores did not change since the last snapshot uploaded.

Polling thread only.
"""

from __future__ import annotations

import random
import secrets
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from runtime.logging import get_logger
from runtime.state.builders import LayeredStore, task_checkpoint_offsets
from runtime.state.checkpoint import Offsets

log = get_logger("runtime.state.remote")

# A memtable at most this big is flushed by the checkpoint itself (a few ms).
_FLUSH_FIRST_BYTES = 2 << 20
# Take the checkpoint anyway once a background flush has run this long.
_FLUSH_WAIT_S = 30.0


class SnapshotSource(Protocol):
    """What capture needs of a task (`StreamTask` is one)."""

    @property
    def id(self) -> str: ...

    @property
    def stores(self) -> dict[str, LayeredStore]: ...

    def write_checkpoint(self) -> None: ...


@dataclass(frozen=True)
class UploadJob:
    """One captured snapshot, handed to the restoration thread for upload.

    `directory` holds one RocksDB checkpoint per store (`<directory>/<store>`),
    or will once `exports` ran: the consolidated layout's deferred exports of
    the task's ranges (runtime.state.snapshot_export), which the uploader
    runs first on its own thread, each once; entries whose name starts with
    "." are scratch (the database checkpoint they read), deleted after. The uploader deletes the
    directory when done or failed."""

    task_id: str
    snapshot_id: str
    created_ms: int
    offsets: Offsets
    changelogs: dict[str, tuple[str, int]]  # store -> changelog partition
    directory: Path
    exports: tuple[Callable[[], None], ...] = ()


def snapshot_stores(task: SnapshotSource) -> dict[str, LayeredStore]:
    """The stores a snapshot covers: the change-logged RocksDB ones."""
    return {
        name: store
        for name, store in task.stores.items()
        if store.changelog is not None and store.rocksdb is not None
    }


def new_snapshot_id(now_ms: int) -> str:
    return f"{now_ms:013d}-{secrets.token_hex(4)}"


class SnapshotCapture:
    """Decides which task to snapshot at a commit, and takes its checkpoint."""

    def __init__(
        self,
        interval_s: float,
        staging_root: Path,
        submit: Callable[[UploadJob], None],
        uploading: Callable[[], frozenset[str]],
        uploaded: Callable[[str], Offsets | None],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._interval_s = interval_s
        self._staging_root = staging_root
        self._submit = submit
        self._uploading = uploading
        self._uploaded = uploaded
        self._clock = clock
        self._due: dict[str, float] = {}  # task id -> monotonic time
        self._flushing: dict[str, float] = {}  # task id -> when the flush was asked
        self._seen: dict[str, float] = {}  # task id -> last commit that named it
        self.captured = 0
        self.capture_seconds = 0.0  # total time spent in checkpoints (tasks locked)

    def after_commit(self, tasks: Sequence[Any]) -> None:
        """Called by the committer after post_commit, every task locked.

        Never raises: a failed capture is logged and retried later; the commit
        it follows is already done."""
        now = self._clock()
        captured = False
        uploading = self._uploading()
        for task in tasks:
            task_id = task.id
            self._seen[task_id] = now
            due = self._due.get(task_id)
            if due is None:
                # First seen: spread the tasks' snapshots over one interval.
                self._due[task_id] = now + self._interval_s * random.uniform(0.5, 1.0)
                continue
            if captured or now < due or task_id in uploading:
                continue
            try:
                captured = self._advance(task, now)
            except Exception as exc:  # never fail the commit for a snapshot
                log.warning(
                    "remote_snapshot_capture_failed",
                    task_id=task_id,
                    error=f"{type(exc).__name__}: {exc}",
                )
                self._flushing.pop(task_id, None)
                self._due[task_id] = now + self._interval_s
        # A commit may cover only some tasks (a revocation): forget a task only
        # once no commit has named it for a while (it moved away).
        stale = [t for t, seen in self._seen.items() if now - seen > 2 * self._interval_s + 60]
        for gone in stale:
            self._seen.pop(gone, None)
            self._due.pop(gone, None)
            self._flushing.pop(gone, None)

    def _advance(self, task: SnapshotSource, now: float) -> bool:
        """One step for a due task; True if a checkpoint was taken."""
        stores = snapshot_stores(task)
        task_id = task.id
        if not stores:
            self._due[task_id] = float("inf")
            return False
        offsets = task_checkpoint_offsets(stores.values())
        if len(offsets) < len(stores):
            return False  # a position is not known yet: retry at the next commit
        if offsets == self._uploaded(task_id):
            self._due[task_id] = now + self._interval_s  # nothing changed
            return False
        asked = self._flushing.get(task_id)
        if asked is None:
            big = [s for s in stores.values() if _rocksdb(s).memtable_bytes() > _FLUSH_FIRST_BYTES]
            if big:
                for store in big:
                    _rocksdb(store).start_flush()
                self._flushing[task_id] = now
                return False
        elif now - asked < _FLUSH_WAIT_S and any(
            _rocksdb(s).flush_pending() for s in stores.values()
        ):
            return False
        self._flushing.pop(task_id, None)
        self._capture(task_id, stores, offsets)
        task.write_checkpoint()
        self._due[task_id] = now + self._interval_s
        return True

    def _capture(self, task_id: str, stores: dict[str, LayeredStore], offsets: Offsets) -> None:
        created_ms = int(time.time() * 1000)
        snapshot_id = new_snapshot_id(created_ms)
        directory = self._staging_root / f"{task_id}-{snapshot_id}"
        started = time.perf_counter()
        try:
            directory.mkdir(parents=True)
            exports = []
            for name, store in stores.items():
                export = _rocksdb(store).capture_snapshot(directory / name)
                if export is not None:
                    exports.append(export)
        except BaseException:
            shutil.rmtree(directory, ignore_errors=True)
            raise
        elapsed = time.perf_counter() - started
        self.captured += 1
        self.capture_seconds += elapsed
        changelogs = {}
        for name, store in stores.items():
            assert store.changelog is not None
            changelogs[name] = (store.changelog.topic, store.changelog.partition)
        log.info(
            "remote_snapshot_captured",
            task_id=task_id,
            snapshot=snapshot_id,
            ms=round(elapsed * 1000, 1),
        )
        self._submit(
            UploadJob(
                task_id,
                snapshot_id,
                created_ms,
                dict(offsets),
                changelogs,
                directory,
                tuple(exports),
            )
        )


def _rocksdb(store: LayeredStore) -> Any:
    base = store.rocksdb
    assert base is not None
    return base
