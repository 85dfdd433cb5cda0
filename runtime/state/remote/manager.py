"""`RemoteState`: the remote-state parts one process needs, made once by the app.

The app builds it when `state.remote.url` is set and hands it to the
restoration thread (uploads, downloads) and, through `capture`, to the
committer (snapshots at commits). Staging directories live under
`<state.dir>/<application.id>/.remote-staging/`, on the stores' file system (a
checkpoint's SST files are hard links); the cleanup thread leaves them alone
and `clean_staging` empties them when the restoration thread starts.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from runtime.state.builders import LayeredStore
from runtime.state.remote.capture import SnapshotCapture, UploadJob
from runtime.state.remote.download import SnapshotDownload, Watermarks
from runtime.state.remote.objects import ObjectStore
from runtime.state.remote.settings import RemoteSettings
from runtime.state.remote.stats import RemoteStats
from runtime.state.remote.upload import Uploader

STAGING_DIR = ".remote-staging"


class RemoteState:
    def __init__(
        self,
        settings: RemoteSettings,
        state_dir: str | Path,
        instance: str = "",
        objects: ObjectStore | None = None,
    ) -> None:
        self.settings = settings
        self.objects = objects if objects is not None else ObjectStore(settings)
        self.stats = RemoteStats()
        self.staging_root = Path(state_dir) / settings.application_id / STAGING_DIR
        self.uploader = Uploader(settings, self.objects, self.stats, instance)

    def capture(self, submit: Callable[[UploadJob], None]) -> SnapshotCapture:
        """The polling thread's side; `submit` hands a job to the restoration thread."""
        uploader = self.uploader
        return SnapshotCapture(
            self.settings.interval_s,
            self.staging_root,
            submit,
            uploading=lambda: uploader.uploading,
            uploaded=lambda task_id: uploader.uploaded_offsets.get(task_id),
        )

    def clean_staging(self) -> None:
        """Nothing is in flight when the restoration thread starts: empty staging."""
        shutil.rmtree(self.staging_root, ignore_errors=True)

    def find_snapshot(
        self, task_id: str, stores: dict[str, LayeredStore], watermarks: Watermarks
    ) -> SnapshotDownload | None:
        return SnapshotDownload.find(
            self.settings,
            self.objects,
            self.stats,
            task_id,
            stores,
            self.staging_root,
            watermarks,
        )
