"""Remote state figures for `App.status()` and `/metrics`.

Written by the restoration thread only; other threads read them racily (the
dicts are replaced whole, never changed in place, so a reader never sees one
half-updated).
"""

from __future__ import annotations

from typing import Any


class RemoteStats:
    def __init__(self) -> None:
        self.snapshots_uploaded = 0
        self.snapshot_failures = 0
        self.bytes_uploaded = 0
        self.files_uploaded = 0
        self.files_reused = 0
        self.bytes_downloaded = 0
        self.snapshot_restores = 0
        self.snapshot_restore_failures = 0
        # task id -> {"snapshot", "created", "offsets", "bytes", "uploaded_bytes", "seconds"}
        self.last_snapshot: dict[str, dict[str, Any]] = {}
        # task id -> {"snapshot", "standby", "bytes", "seconds"}: the newest snapshot
        # installed for an active task or a standby (a standby starts from one too).
        self.installed: dict[str, dict[str, Any]] = {}

    def snapshot_done(self, task_id: str, figures: dict[str, Any]) -> None:
        self.snapshots_uploaded += 1
        self.last_snapshot = {**self.last_snapshot, task_id: figures}

    def snapshot_installed(self, task_id: str, figures: dict[str, Any]) -> None:
        self.installed = {**self.installed, task_id: figures}

    def as_dict(self) -> dict[str, Any]:
        return {
            "snapshots_uploaded": self.snapshots_uploaded,
            "snapshot_failures": self.snapshot_failures,
            "bytes_uploaded": self.bytes_uploaded,
            "files_uploaded": self.files_uploaded,
            "files_reused": self.files_reused,
            "bytes_downloaded": self.bytes_downloaded,
            "snapshot_restores": self.snapshot_restores,
            "snapshot_restore_failures": self.snapshot_restore_failures,
            "last_snapshot": dict(self.last_snapshot),
            "installed": dict(self.installed),
        }
