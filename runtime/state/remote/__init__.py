"""Remote state: snapshots of each task's RocksDB stores in S3-compatible object
storage, and restoration from them (`state.remote.url`).

Why: restoring a large store by replaying its changelog takes minutes to
hours; downloading a recent snapshot and replaying only the changelog after it
takes seconds. A snapshot is a RocksDB checkpoint of every change-logged
RocksDB store of one task, taken where the stores hold exactly what the task's
checkpoint names (right after a commit's `post_commit`), tagged with those
changelog offsets. With `state.store.layout=consolidated` it is the same
per-task format, exported from a checkpoint of the process database
(runtime.state.snapshot_export), so snapshots move between the layouts.

The parts, and which thread runs them:

- `capture.SnapshotCapture`: polling thread, inside the commit while every
  task is locked. Asks RocksDB to flush the memtable in the background, and at
  a later commit takes the checkpoint (hard links, a few ms) into a staging
  directory; hands an `UploadJob` to the restoration thread.
- `upload.Uploader`: restoration thread. Uploads the new files of a job
  (content-addressed by SHA-256: a file already in the bucket is not sent
  again), then the manifest (written last: a snapshot without one does not
  exist), then deletes snapshots beyond `state.remote.snapshots.retained` and
  files no kept snapshot uses. Bounded work per call, so restoring tasks,
  standbys and the status topic keep their turn.
- `download.SnapshotDownload`: restoration thread. For a task without usable
  local state, picks the newest snapshot whose offsets are still in the
  changelog, downloads and verifies each file (size and SHA-256), installs
  it in place of the stores' databases; restoration then replays only the
  changelog after the snapshot's offsets. Anything wrong: a warning, and the
  changelog from the beginning.
- `driver.SnapshotDriver`: restoration thread, one bounded step per loop
  turn. Drives the downloads and uploads above, installs a finished
  download and hands its task back to changelog restoration (its docstring
  says why it runs on that thread's loop).
- `objects.ObjectStore`: the S3 client (boto3), used by the restoration
  thread, and once at start-up by the caller of `App.start` (bucket check).
- `stats.RemoteStats`: figures for status and metrics, written by the
  restoration thread, read racily by any thread.
"""

from runtime.state.remote.capture import SnapshotCapture, UploadJob
from runtime.state.remote.download import SnapshotDownload, SnapshotUnusable
from runtime.state.remote.manager import RemoteState
from runtime.state.remote.objects import ObjectStore, RemoteStoreError
from runtime.state.remote.settings import RemoteSettings
from runtime.state.remote.stats import RemoteStats
from runtime.state.remote.upload import Uploader

__all__ = [
    "ObjectStore",
    "RemoteSettings",
    "RemoteState",
    "RemoteStats",
    "RemoteStoreError",
    "SnapshotCapture",
    "SnapshotDownload",
    "SnapshotUnusable",
    "UploadJob",
    "Uploader",
]
