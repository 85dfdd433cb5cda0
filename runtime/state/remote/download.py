"""Restoring from a snapshot: choose, download, verify, install.

Runs on the restoration thread only, for an active or standby task that has
no usable local state (a store without a checkpointed position), before its
changelog is replayed:

1. choose: the task's manifests, newest first; the first one that decodes
   (its checksum holds), was made by this application for this task, covers
   exactly the task's change-logged RocksDB stores, is younger than
   `state.remote.snapshot.max.age.ms`, and whose every offset is still in its
   changelog (low watermark <= offset <= high watermark: older records may be
   deleted, and an offset past the end means another changelog, e.g. after an
   application reset);
2. download: each file into a staging directory, its size and SHA-256 checked
   against the manifest (bounded work per `step()`). A missing or corrupt file
   makes that snapshot unusable (a corrupt object is deleted, so a later
   upload sends it again) and the next older candidate is tried;
3. install: each store's database is replaced by the downloaded checkpoint and
   its position set to the snapshot's offset; the changelog is then replayed
   from there.

When no candidate is usable, `step()` raises `SnapshotUnusable` and the caller
restores from the changelog's beginning, as without remote state. A snapshot is
only ever installed whole and verified, so it never produces wrong state.
"""

from __future__ import annotations

import contextlib
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runtime.logging import get_logger
from runtime.state.builders import LayeredStore
from runtime.state.remote.manifest import FileEntry, Manifest, decode
from runtime.state.remote.objects import ObjectStore, RemoteStoreError
from runtime.state.remote.settings import RemoteSettings
from runtime.state.remote.stats import RemoteStats

log = get_logger("runtime.state.remote")

Watermarks = Callable[[str, int], tuple[int, int]]


class SnapshotUnusable(Exception):
    """No snapshot of the task can be restored from; the reason says why."""


@dataclass
class _Chosen:
    manifest: Manifest
    files: list[tuple[str, FileEntry]]
    directory: Path
    index: int = 0
    downloaded: int = 0


class SnapshotDownload:
    """One task's restore from a snapshot. Restoration thread."""

    def __init__(
        self,
        settings: RemoteSettings,
        objects: ObjectStore,
        stats: RemoteStats,
        task_id: str,
        stores: dict[str, LayeredStore],
        staging_root: Path,
        watermarks: Watermarks,
        candidates: list[str],
        step_bytes: int = 64 << 20,
        step_seconds: float = 0.5,
    ) -> None:
        self._settings = settings
        self._objects = objects
        self._stats = stats
        self.task_id = task_id
        self._stores = stores
        self._staging_root = staging_root
        self._watermarks = watermarks
        self._candidates = candidates  # manifest keys, newest first
        self._step_bytes = step_bytes
        self._step_seconds = step_seconds
        self._chosen: _Chosen | None = None
        self._reasons: list[str] = []
        self.started = time.monotonic()

    @classmethod
    def find(
        cls,
        settings: RemoteSettings,
        objects: ObjectStore,
        stats: RemoteStats,
        task_id: str,
        stores: dict[str, LayeredStore],
        staging_root: Path,
        watermarks: Watermarks,
    ) -> SnapshotDownload | None:
        """A download for the task, or None when the bucket has no snapshot of it.

        Raises `RemoteStoreError` when the bucket cannot be listed."""
        keys = sorted(
            (
                key
                for key, _ in objects.list_keys(settings.manifests_prefix(task_id))
                if key.endswith(".json")
            ),
            reverse=True,
        )
        if not keys:
            return None
        return cls(settings, objects, stats, task_id, stores, staging_root, watermarks, keys)

    @property
    def snapshot_id(self) -> str | None:
        return self._chosen.manifest.snapshot_id if self._chosen else None

    @property
    def downloaded_bytes(self) -> int:
        return self._chosen.downloaded if self._chosen else 0

    def step(self) -> bool:
        """Bounded work; True once a snapshot is downloaded and verified.

        Raises `SnapshotUnusable` when no candidate is left."""
        if self._chosen is None:
            self._chosen = self._choose()
        chosen = self._chosen
        deadline = time.monotonic() + self._step_seconds
        got = 0
        while chosen.index < len(chosen.files):
            if got >= self._step_bytes or time.monotonic() > deadline:
                return False
            store, entry = chosen.files[chosen.index]
            try:
                got += self._fetch(chosen, store, entry)
            except (RemoteStoreError, OSError, ValueError) as exc:
                self._reject(chosen.manifest.snapshot_id, str(exc))
                shutil.rmtree(chosen.directory, ignore_errors=True)
                self._chosen = None
                return False
            chosen.index += 1
        return True

    def install(self) -> dict[tuple[str, int], int]:
        """Put the downloaded snapshot in place of the stores' databases.

        Returns the changelog position of each store installed; a store that
        failed to install is empty and absent from the result (it restores
        from its changelog's beginning)."""
        chosen = self._chosen
        assert chosen is not None
        positions: dict[tuple[str, int], int] = {}
        try:
            for name, entry in chosen.manifest.stores.items():
                position = chosen.manifest.offsets[entry.changelog]
                try:
                    self._stores[name].install_snapshot(chosen.directory / name, position)
                except Exception as exc:
                    self._stats.snapshot_restore_failures += 1
                    log.warning(
                        "remote_snapshot_install_failed",
                        task_id=self.task_id,
                        store=name,
                        snapshot=chosen.manifest.snapshot_id,
                        error=f"{type(exc).__name__}: {exc}",
                    )
                    continue
                positions[entry.changelog] = position
        finally:
            shutil.rmtree(chosen.directory, ignore_errors=True)
        self._stats.snapshot_restores += 1
        return positions

    def abandon(self) -> None:
        if self._chosen is not None:
            shutil.rmtree(self._chosen.directory, ignore_errors=True)
            self._chosen = None

    # --- helpers ------------------------------------------------------------------

    def _choose(self) -> _Chosen:
        while self._candidates:
            key = self._candidates.pop(0)
            try:
                manifest = decode(self._objects.get_bytes(key))
            except (RemoteStoreError, ValueError) as exc:
                self._reject(key.rsplit("/", 1)[-1], f"manifest: {exc}")
                continue
            reason = self._unusable(manifest)
            if reason is not None:
                self._reject(manifest.snapshot_id, reason)
                continue
            directory = self._staging_root / f"download-{self.task_id}-{manifest.snapshot_id}"
            shutil.rmtree(directory, ignore_errors=True)
            for name in manifest.stores:
                (directory / name).mkdir(parents=True)
            files = [(name, f) for name, s in sorted(manifest.stores.items()) for f in s.files]
            log.info(
                "remote_snapshot_download_started",
                task_id=self.task_id,
                snapshot=manifest.snapshot_id,
                bytes=manifest.size,
            )
            return _Chosen(manifest, files, directory)
        reasons = "; ".join(self._reasons) or "none found"
        raise SnapshotUnusable(f"no usable snapshot of task {self.task_id}: {reasons}")

    def _unusable(self, manifest: Manifest) -> str | None:
        """Why this (verified) manifest cannot be restored from, or None."""
        if manifest.application_id != self._settings.application_id:
            return f"made by application {manifest.application_id!r}"
        if manifest.task_id != self.task_id:
            return f"made for task {manifest.task_id!r}"
        if set(manifest.stores) != set(self._stores):
            return f"covers stores {sorted(manifest.stores)}, the task has {sorted(self._stores)}"
        for name, entry in manifest.stores.items():
            changelog = self._stores[name].changelog
            assert changelog is not None
            if entry.changelog != (changelog.topic, changelog.partition):
                return f"store {name!r} was logged to {entry.changelog}"
        age_s = time.time() - manifest.created_ms / 1000.0
        if age_s > self._settings.max_age_s:
            return f"{age_s:.0f} s old, above state.remote.snapshot.max.age.ms"
        for (topic, partition), offset in manifest.offsets.items():
            try:
                low, high = self._watermarks(topic, partition)
            except Exception as exc:
                return f"watermarks of {topic}-{partition} unknown: {exc}"
            if not low <= offset <= high:
                return (
                    f"offset {offset} of {topic}-{partition} is outside the changelog "
                    f"[{low}, {high}]"
                )
        return None

    def _fetch(self, chosen: _Chosen, store: str, entry: FileEntry) -> int:
        key = self._settings.object_key(self.task_id, entry.sha256)
        size, sha = self._objects.download(key, chosen.directory / store / entry.name)
        if size != entry.size or sha != entry.sha256:
            # Corrupt in the bucket: deleted, so the next upload sends it again.
            with contextlib.suppress(RemoteStoreError):
                self._objects.delete_keys([key])
            raise ValueError(
                f"{store}/{entry.name}: {size} bytes with sha256 {sha[:12]}..., "
                f"the manifest says {entry.size} bytes, {entry.sha256[:12]}..."
            )
        chosen.downloaded += size
        self._stats.bytes_downloaded += size
        return max(size, 1)

    def _reject(self, snapshot: str, reason: str) -> None:
        self._reasons.append(f"{snapshot}: {reason}")
        log.warning(
            "remote_snapshot_skipped",
            task_id=self.task_id,
            snapshot=snapshot,
            reason=reason,
        )
