"""Uploading snapshots: files first, the manifest last, then retention.

Runs on the restoration thread only (never a processing thread): the polling
thread hands over `UploadJob`s (`submit`, through the restoration thread's
action queue), and the restoration loop calls `step()` once per turn. A step
does bounded work (at most `step_bytes` sent, or `step_seconds` spent), so a
large snapshot does not hold up restoring tasks, standbys or the status topic.

Content addressing: a file's key is `objects/<sha256 of its content>`. SST
files never change, so a checkpoint shares most of them with the previous
one; only files whose hash is not in the bucket yet are sent. The hash of a
file is cached by (device, inode, size, mtime): a checkpoint's SST files are
hard links to the live ones, so each SST is read and hashed once per process.

The manifest goes last. A process killed mid-upload leaves files that no
manifest names: such a partial snapshot is invisible to restoration, and its
files are deleted by a later retention pass.

Retention, after each manifest: all but the newest `retained` manifests of the
task are deleted, then every object of the task that no remaining manifest
names. Known race (documented): another instance uploading the same task at
that moment (a task just moved) may lose a file it counted as present; its
snapshot then fails verification at restore time and is skipped, never used.
"""

from __future__ import annotations

import shutil
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path

from runtime.logging import get_logger
from runtime.state.checkpoint import Offsets
from runtime.state.remote.capture import UploadJob
from runtime.state.remote.manifest import FileEntry, Manifest, StoreEntry, decode
from runtime.state.remote.objects import ObjectStore, RemoteStoreError, sha256_of
from runtime.state.remote.settings import RemoteSettings
from runtime.state.remote.stats import RemoteStats

log = get_logger("runtime.state.remote")

_HASH_CACHE_MAX = 100_000


@dataclass
class _Upload:
    job: UploadJob
    files: list[tuple[str, Path]]
    entries: dict[str, list[FileEntry]]
    started: float = field(default_factory=time.monotonic)
    index: int = 0
    sent_bytes: int = 0
    sent_files: int = 0


class Uploader:
    """Uploads captured snapshots. Restoration thread, except the two
    attributes other threads read: `uploading` and `uploaded_offsets`."""

    def __init__(
        self,
        settings: RemoteSettings,
        objects: ObjectStore,
        stats: RemoteStats,
        instance: str = "",
        step_bytes: int = 64 << 20,
        step_seconds: float = 0.5,
    ) -> None:
        self._settings = settings
        self._objects = objects
        self._stats = stats
        self._instance = instance
        self._step_bytes = step_bytes
        self._step_seconds = step_seconds
        self._queue: deque[UploadJob] = deque()
        self._current: _Upload | None = None
        self._known: dict[str, set[str]] = {}  # task id -> object hashes in the bucket
        self._hashes: dict[tuple[int, int, int, int], str] = {}
        # Read racily by the polling thread (capture); replaced whole.
        self.uploading: frozenset[str] = frozenset()
        self.uploaded_offsets: dict[str, Offsets] = {}

    @property
    def busy(self) -> bool:
        return self._current is not None or bool(self._queue)

    def submit(self, job: UploadJob) -> None:
        self._queue.append(job)
        self._publish()

    def _publish(self) -> None:
        ids = {job.task_id for job in self._queue}
        if self._current is not None:
            ids.add(self._current.job.task_id)
        self.uploading = frozenset(ids)

    def step(self) -> None:
        """Bounded upload work; never raises for a failed upload (logged, counted)."""
        if self._current is None:
            if not self._queue:
                return
            job = self._queue.popleft()
            try:
                self._current = self._begin(job)
            except (RemoteStoreError, OSError) as exc:
                self._fail(job, exc)
                return
        upload = self._current
        deadline = time.monotonic() + self._step_seconds
        sent = 0
        try:
            while upload.index < len(upload.files):
                if sent >= self._step_bytes or time.monotonic() > deadline:
                    return
                store, path = upload.files[upload.index]
                sent += self._upload_file(upload, store, path)
                upload.index += 1
            self._finish(upload)
        except (RemoteStoreError, OSError) as exc:
            self._current = None
            self._fail(upload.job, exc)

    def close(self) -> None:
        """Drop what is queued or under way (shutdown): its staging goes, its
        uploaded files stay unnamed until a later retention pass."""
        jobs = list(self._queue)
        if self._current is not None:
            jobs.append(self._current.job)
            log.info(
                "remote_snapshot_upload_abandoned",
                task_id=self._current.job.task_id,
                snapshot=self._current.job.snapshot_id,
            )
        self._queue.clear()
        self._current = None
        for job in jobs:
            shutil.rmtree(job.directory, ignore_errors=True)
        self._publish()

    # --- one upload -------------------------------------------------------------

    def _begin(self, job: UploadJob) -> _Upload:
        # The consolidated layout's exports first, then its checkpoint goes:
        # the directory then looks like a per-task one. An export is not split
        # across steps (see docs/remote-state.md for its cost).
        for export in job.exports:
            try:
                export()
            except Exception as exc:  # rocksdict raises plain Exception
                raise OSError(f"export of the task's ranges failed: {exc}") from exc
        for entry in job.directory.iterdir():
            if entry.name.startswith("."):  # a capture's scratch (its checkpoint)
                shutil.rmtree(entry, ignore_errors=True)
        # Listed afresh for every snapshot (one request per 1000 files): what
        # the bucket holds is the truth, whatever other instances deleted.
        prefix = self._settings.objects_prefix(job.task_id)
        self._known[job.task_id] = {
            key[len(prefix) :] for key, _ in self._objects.list_keys(prefix)
        }
        files: list[tuple[str, Path]] = []
        for store in sorted(job.changelogs):
            directory = job.directory / store
            files.extend((store, path) for path in sorted(directory.iterdir()) if path.is_file())
        self._publish()
        log.info(
            "remote_snapshot_upload_started",
            task_id=job.task_id,
            snapshot=job.snapshot_id,
            files=len(files),
        )
        return _Upload(job, files, {store: [] for store in job.changelogs})

    def _upload_file(self, upload: _Upload, store: str, path: Path) -> int:
        stat = path.stat()
        cache_key = (stat.st_dev, stat.st_ino, stat.st_size, stat.st_mtime_ns)
        sha = self._hashes.get(cache_key)
        if sha is None:
            sha = sha256_of(path)
            if len(self._hashes) >= _HASH_CACHE_MAX:
                self._hashes.clear()
            self._hashes[cache_key] = sha
        upload.entries[store].append(FileEntry(path.name, stat.st_size, sha))
        known = self._known[upload.job.task_id]
        if sha in known:
            self._stats.files_reused += 1
            return 0
        size = self._objects.put_file(self._settings.object_key(upload.job.task_id, sha), path)
        known.add(sha)
        upload.sent_bytes += size
        upload.sent_files += 1
        self._stats.files_uploaded += 1
        self._stats.bytes_uploaded += size
        return max(size, 1)

    def _finish(self, upload: _Upload) -> None:
        job = upload.job
        manifest = Manifest(
            snapshot_id=job.snapshot_id,
            application_id=self._settings.application_id,
            task_id=job.task_id,
            created_ms=job.created_ms,
            offsets=job.offsets,
            stores={
                store: StoreEntry(job.changelogs[store], tuple(entries))
                for store, entries in upload.entries.items()
            },
            instance=self._instance,
        )
        self._objects.put_bytes(
            self._settings.manifest_key(job.task_id, job.snapshot_id), manifest.encode()
        )
        self._current = None
        shutil.rmtree(job.directory, ignore_errors=True)
        seconds = time.monotonic() - upload.started
        self.uploaded_offsets = {**self.uploaded_offsets, job.task_id: dict(job.offsets)}
        self._stats.snapshot_done(
            job.task_id,
            {
                "snapshot": job.snapshot_id,
                "created": job.created_ms / 1000.0,
                "offsets": {f"{t}-{p}": o for (t, p), o in sorted(job.offsets.items())},
                "bytes": manifest.size,
                "uploaded_bytes": upload.sent_bytes,
                "uploaded_files": upload.sent_files,
                "seconds": round(seconds, 3),
            },
        )
        log.info(
            "remote_snapshot_uploaded",
            task_id=job.task_id,
            snapshot=job.snapshot_id,
            bytes=manifest.size,
            uploaded_bytes=upload.sent_bytes,
            seconds=round(seconds, 3),
        )
        try:
            self._retain(job.task_id)
        except (RemoteStoreError, OSError) as exc:
            log.warning("remote_snapshot_retention_failed", task_id=job.task_id, error=str(exc))
        self._publish()

    def _fail(self, job: UploadJob, exc: BaseException) -> None:
        shutil.rmtree(job.directory, ignore_errors=True)
        self._stats.snapshot_failures += 1
        self._publish()
        log.warning(
            "remote_snapshot_upload_failed",
            task_id=job.task_id,
            snapshot=job.snapshot_id,
            error=f"{type(exc).__name__}: {exc}",
        )

    def _retain(self, task_id: str) -> None:
        """Delete manifests beyond the newest `retained`, then unnamed objects."""
        settings = self._settings
        manifests = sorted(
            k for k, _ in self._objects.list_keys(settings.manifests_prefix(task_id))
        )
        if len(manifests) <= settings.retained:
            return
        drop, keep = manifests[: -settings.retained], manifests[-settings.retained :]
        referenced: set[str] = set()
        for key in keep:
            try:
                kept = decode(self._objects.get_bytes(key))
            except ValueError as exc:
                # Unreadable to us (corrupt, or a newer format): what it names
                # is unknown, so no object is deleted this time.
                log.warning("remote_snapshot_manifest_unreadable", key=key, error=str(exc))
                self._objects.delete_keys(drop)
                return
            referenced.update(f.sha256 for s in kept.stores.values() for f in s.files)
        # Manifests first: no manifest may ever name a deleted object.
        self._objects.delete_keys(drop)
        prefix = settings.objects_prefix(task_id)
        unnamed = [
            key
            for key, _ in self._objects.list_keys(prefix)
            if key[len(prefix) :] not in referenced
        ]
        self._objects.delete_keys(unnamed)
        log.info(
            "remote_snapshots_retained",
            task_id=task_id,
            deleted_snapshots=len(drop),
            deleted_files=len(unnamed),
        )
