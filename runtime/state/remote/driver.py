"""`SnapshotDriver`: the remote-state transfers, one bounded step at a time.

What it drives: downloads of a snapshot for a task or standby that has no
usable local state (`download.SnapshotDownload`, before its changelog tail
is replayed), and uploads of the snapshots the committer captured
(`upload.Uploader`). It owns which downloads are under way, installs a
finished one into its owner's stores and sets the positions the changelog
is replayed from, and keeps the download figures of `RemoteStats`.
Restoration itself (changelogs, standbys) is not here: a finished or failed
download comes back from `step` as a `Fetched`, and the restoration thread
then assigns the changelog from the positions it left.

Where it is driven from, and why there: the restoration thread's loop gives
it one turn per loop turn (`step`: one bounded piece of work, at most 64 MiB
or 0.5 s, a download first since a task waits for it, else an upload).

- A download's result is the start of a changelog replay on the restore
  consumer, which only the restoration thread touches; so are the
  watermarks a snapshot is chosen by. Driven from another thread, every
  download would cross threads twice and a task would have two owners
  while it is fetched.
- The threads stay the ones the design draws (no thread of its own for
  the object store; ARCHITECTURE.md: "this thread, and no other, talks to
  the object store").
- Restoration is not held up beyond one bounded step: restoring tasks,
  standbys and the status topic get their turn between any two steps,
  and while transfers are pending the loop fetches changelogs without
  waiting (`busy`), so neither side starves the other.

Threads: restoration thread only (`start`, `fetch`, `step`, `cancel`,
`close`); `submit` is called there too, from an upload action the polling
thread queued (`RestorationThread.add_upload`).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from runtime.logging import get_logger
from runtime.state.remote.capture import UploadJob, snapshot_stores
from runtime.state.remote.download import SnapshotDownload, SnapshotUnusable, Watermarks
from runtime.state.remote.manager import RemoteState
from runtime.state.remote.objects import RemoteStoreError

log = get_logger("runtime.restoration")


@dataclass(frozen=True)
class Fetched:
    """A download that ended: restore `owner`'s changelogs from the positions
    it now has. `download` is None when no snapshot was installed (the whole
    changelog, as without remote state); `started` is when the restore began."""

    owner: Any  # the task or standby (restoration's RestorableTask or StandbyTask)
    standby: bool
    started: float
    download: SnapshotDownload | None


@dataclass
class _Fetching:
    owner: Any
    standby: bool
    download: SnapshotDownload


class SnapshotDriver:
    """Downloads and uploads of snapshots, one bounded step at a time. See the
    module docstring. Restoration thread only."""

    def __init__(self, remote: RemoteState, watermarks: Watermarks) -> None:
        self.remote = remote
        # (low, high) of a changelog partition, asked of the restore consumer.
        self._watermarks = watermarks
        # Tasks and standbys downloading a snapshot, by task id, in arrival order.
        self._fetching: dict[str, _Fetching] = {}

    @property
    def busy(self) -> bool:
        """Transfers pending: the loop should not wait on its consumer."""
        return bool(self._fetching) or self.remote.uploader.busy

    def start(self) -> None:
        """The thread starts: nothing is in flight, so staging is emptied."""
        self.remote.clean_staging()

    def submit(self, job: UploadJob) -> None:
        """Upload a snapshot the committer captured."""
        self.remote.uploader.submit(job)

    def fetch(self, owner: Any, standby: bool) -> bool:
        """Start downloading a snapshot for a task (or standby) that has no
        usable local state; False when it restores from the changelog alone."""
        stores = snapshot_stores(owner)
        if not stores or all(
            owner.restore_from.get((store.changelog_topic, owner.partition)) is not None
            for store in stores.values()
        ):
            return False  # nothing a snapshot would restore, or local state to use
        try:
            download = self.remote.find_snapshot(owner.id, stores, self._watermarks)
        except RemoteStoreError as exc:
            log.warning("remote_snapshot_list_failed", task_id=owner.id, error=str(exc))
            return False
        if download is None:
            log.info("remote_snapshot_none", task_id=owner.id)
            return False
        self._fetching[owner.id] = _Fetching(owner, standby, download)
        return True

    def fetching_standbys(self) -> list[str]:
        """Ids of the standbys still downloading (closed at shutdown)."""
        return [task_id for task_id, f in self._fetching.items() if f.standby]

    def cancel(self, task_id: str, standby: bool) -> Any | None:
        """Abandon the download of a task (`standby` False) or a standby; its
        owner, or None when it was not downloading."""
        fetching = self._fetching.get(task_id)
        if fetching is None or fetching.standby != standby:
            return None
        del self._fetching[task_id]
        fetching.download.abandon()
        return fetching.owner

    def step(self) -> Fetched | None:
        """One bounded piece of transfer work: a download first (a task waits
        for it), else an upload. A download that ended comes back."""
        if self._fetching:
            task_id = next(iter(self._fetching))
            return self._step_fetch(task_id, self._fetching[task_id])
        self.remote.uploader.step()
        return None

    def close(self) -> None:
        """The thread stops: uploads dropped, downloads abandoned."""
        self.remote.uploader.close()
        for fetching in self._fetching.values():
            fetching.download.abandon()

    def _step_fetch(self, task_id: str, fetching: _Fetching) -> Fetched | None:
        download = fetching.download
        try:
            done = download.step()
        except SnapshotUnusable as exc:
            self.remote.stats.snapshot_restore_failures += 1
            log.warning("remote_snapshot_fallback_to_changelog", task_id=task_id, reason=str(exc))
            del self._fetching[task_id]
            return Fetched(fetching.owner, fetching.standby, download.started, None)
        if not done:
            return None
        del self._fetching[task_id]
        positions = download.install()
        owner = fetching.owner
        for tp, position in positions.items():
            owner.restore_from[tp] = position
        seconds = round(time.monotonic() - download.started, 3)
        log.info(
            "remote_snapshot_installed",
            task_id=task_id,
            standby=fetching.standby,
            snapshot=download.snapshot_id,
            bytes=download.downloaded_bytes,
            seconds=seconds,
            positions={f"{t}-{p}": o for (t, p), o in positions.items()},
        )
        if positions:
            self.remote.stats.snapshot_installed(
                task_id,
                {
                    "snapshot": download.snapshot_id,
                    "standby": fetching.standby,
                    "bytes": download.downloaded_bytes,
                    "seconds": seconds,
                },
            )
        return Fetched(owner, fetching.standby, download.started, download if positions else None)
