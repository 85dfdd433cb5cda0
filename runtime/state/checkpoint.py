"""Per-task checkpoint file: changelog topic-partition -> position.

Written by the polling thread after each commit, read when a task's state is
opened (before restoration). The format is Kafka Streams' `.checkpoint`
(OffsetCheckpoint): a version line `0`, a count line, then one
`<topic> <partition> <offset>` line per changelog partition. Here an offset is
a position: the next changelog offset the local store does not contain.

Writing is atomic: a temp file in the same directory, fsync, `os.replace`,
fsync of the directory. A missing file, or one that does not parse, means
"no checkpoint": restore from the changelog's beginning. A corrupt file is
logged, never raised. Every file this module writes ends with a newline, so
a file cut short inside its last offset (which would still parse, as a
smaller offset) is corrupt too.

A checkpoint names what a store holds only while the store's files are the
ones it was written for: when they are gone (`RocksDBKeyValueStore.created`)
or the changelog does not have the position (out of range), the store's
entry is dropped from the file (`drop_checkpoint_entries`) before it
restores from the changelog's start, so a crash during that restore cannot
leave a half-restored store behind a checkpoint that vouches for it.

Threads: the thread that owns the task's stores at the time (the polling
thread at commit or task creation, the restoration thread for restoring tasks
and standbys); a task's file has one writer at a time by that ownership.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

from runtime.logging import get_logger

log = get_logger("runtime.state.checkpoint")

CHECKPOINT_FILE = ".checkpoint"
_VERSION = 0

ChangelogPartition = tuple[str, int]
Offsets = dict[ChangelogPartition, int]


def checkpoint_path(task_dir: str | os.PathLike[str]) -> Path:
    return Path(task_dir) / CHECKPOINT_FILE


def write_checkpoint(path: str | os.PathLike[str], offsets: Offsets) -> None:
    """Replace the checkpoint at `path` with `offsets`, atomically and durably."""
    path = Path(path)
    lines = [str(_VERSION), str(len(offsets))]
    for (topic, partition), offset in sorted(offsets.items()):
        if not topic or any(c.isspace() for c in topic):
            raise ValueError(f"invalid topic name in checkpoint: {topic!r}")
        lines.append(f"{topic} {partition} {offset}")
    data = ("\n".join(lines) + "\n").encode("utf-8")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return  # not supported here (e.g. some platforms): the rename is still atomic
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def read_checkpoint(path: str | os.PathLike[str]) -> Offsets | None:
    """The offsets in the checkpoint at `path`, or None when missing or corrupt."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    except UnicodeDecodeError as exc:
        _corrupt(path, f"not text: {exc}")
        return None
    except OSError as exc:
        log.warning(
            "checkpoint_unreadable",
            path=str(path),
            error=f"{type(exc).__name__}: {exc}",
            meaning=_NO_CHECKPOINT,
        )
        return None
    try:
        return _parse(text)
    except ValueError as exc:
        _corrupt(path, str(exc))
        return None


_NO_CHECKPOINT = "no checkpoint: the task's stores restore from their changelogs' start"


def _corrupt(path: Path, error: str) -> None:
    log.warning("checkpoint_corrupt", path=str(path), error=error, meaning=_NO_CHECKPOINT)


def _parse(text: str) -> Offsets:
    if not text.endswith("\n"):
        raise ValueError("no final newline: the file was cut short")
    lines = text.splitlines()
    if len(lines) < 2:
        raise ValueError("truncated header")
    if int(lines[0]) != _VERSION:
        raise ValueError(f"unknown version {lines[0]!r}")
    count = int(lines[1])
    entries = lines[2:]
    if len(entries) != count:
        raise ValueError(f"expected {count} entries, found {len(entries)}")
    offsets: Offsets = {}
    for line in entries:
        parts = line.split(" ")
        if len(parts) != 3:
            raise ValueError(f"bad entry {line!r}")
        topic, partition, offset = parts[0], int(parts[1]), int(parts[2])
        if not topic or partition < 0 or offset < 0:
            raise ValueError(f"bad entry {line!r}")
        offsets[(topic, partition)] = offset
    return offsets


def delete_checkpoint(path: str | os.PathLike[str]) -> None:
    """Remove the checkpoint (e.g. when the local state can no longer be trusted)."""
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)


def drop_checkpoint_entries(
    path: str | os.PathLike[str], partitions: Iterable[ChangelogPartition]
) -> None:
    """Remove these changelog partitions' entries from the checkpoint at `path`
    (the file goes when nothing is left): their stores no longer hold what the
    positions name. A missing or corrupt file names nothing and stays as it is."""
    path = Path(path)
    offsets = read_checkpoint(path)
    if not offsets:
        return
    kept = dict(offsets)
    for partition in partitions:
        kept.pop(partition, None)
    if len(kept) == len(offsets):
        return
    if kept:
        write_checkpoint(path, kept)
    else:
        delete_checkpoint(path)


# A regular commit rewrites a task's `.checkpoint` file (syncing its stores'
# write-ahead logs first) only once its changelogs moved this many records
# since the file was last written; a commit before the task leaves or the app
# stops always does. Kafka Streams' rule (OFFSET_DELTA_THRESHOLD_FOR_CHECKPOINT):
# three fsyncs per task per commit were most of a commit's time with a few
# tasks, and after a crash a task replays at most this many records more,
# which restoration does in milliseconds.
CHECKPOINT_DELTA_RECORDS = 10_000


def checkpoint_due(last: Offsets, now: Offsets) -> bool:
    """Whether positions `now` should replace the checkpoint `last` at a
    regular commit: a changelog came or went, or they moved far enough."""
    if now.keys() != last.keys():
        return True
    return sum(offset - last[partition] for partition, offset in now.items()) >= (
        CHECKPOINT_DELTA_RECORDS
    )


class CommittedPositions:
    """A task's positions as its commits write them (polling thread, task
    locked): the file layout's checkpoint deferred by `checkpoint_due`, its
    stores' write-ahead logs synced (`sync`) before the file names them; the
    consolidated layout's positions staged with every commit's batch."""

    def __init__(
        self, positions: TaskPositions, last: Offsets | None, sync: Callable[[], None]
    ) -> None:
        self._positions = positions
        self._last: Offsets = dict(last or {})
        self._sync = sync
        self._file = isinstance(positions, FileCheckpoint)

    def commit(self, offsets: Offsets, forced: bool) -> None:
        """A commit's positions: written when `forced` (the task leaves or the
        app stops), when due, or always in the consolidated layout."""
        if offsets and (forced or not self._file or checkpoint_due(self._last, offsets)):
            self._write(offsets)

    def write_now(self, offsets: Offsets) -> None:
        """The file now, if it says less (a remote snapshot was taken of `offsets`)."""
        if self._file and offsets and offsets != self._last:
            self._write(offsets)

    def _write(self, offsets: Offsets) -> None:
        if self._file:  # the stores' commits were not synced
            self._sync()
        self._positions.commit(offsets)
        self._last = offsets


class TaskPositions(Protocol):
    """Where a task's changelog positions live: its `.checkpoint` file
    (`FileCheckpoint`, the per-task layout) or the consolidated database's
    `offsets` column family (runtime.state.consolidated). Called by the
    task's owner thread (see the module docstring)."""

    def read(self) -> Offsets | None:
        """The positions, None when there are none (or they are unreadable)."""
        ...

    def write(self, offsets: Offsets) -> None:
        """Replace the positions now, durably (a restore or standby checkpoint)."""
        ...

    def commit(self, offsets: Offsets) -> None:
        """The positions of a commit (polling thread, post-commit): durable once
        the commit's writes are (`write` for a file; staged in the commit's
        one batch for the consolidated layout)."""
        ...

    def drop(self, partitions: Iterable[ChangelogPartition]) -> None:
        """Forget these partitions' positions (their stores lost what they named)."""
        ...


class FileCheckpoint:
    """A task's `.checkpoint` file in its directory, as `TaskPositions`."""

    def __init__(self, task_dir: str | os.PathLike[str]) -> None:
        self.path = checkpoint_path(task_dir)

    def read(self) -> Offsets | None:
        return read_checkpoint(self.path)

    def write(self, offsets: Offsets) -> None:
        write_checkpoint(self.path, offsets)

    def commit(self, offsets: Offsets) -> None:
        write_checkpoint(self.path, offsets)

    def drop(self, partitions: Iterable[ChangelogPartition]) -> None:
        drop_checkpoint_entries(self.path, partitions)
