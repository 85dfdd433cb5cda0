"""Per-task checkpoint file: changelog topic-partition -> position.

Written by the polling thread after each commit, read when a task's state is
opened (before restoration). The format is Kafka Streams' `.checkpoint`
(OffsetCheckpoint): a version line `0`, a count line, then one
`<topic> <partition> <offset>` line per changelog partition. Here an offset is
a position: the next changelog offset the local store does not contain.

Writing is atomic: a temp file in the same directory, fsync, `os.replace`,
fsync of the directory. A missing file, or one that does not parse, means
"no checkpoint": restore from the changelog's beginning. A corrupt file is
logged, never raised.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from runtime.logging import get_logger

log = get_logger("runtime.state.checkpoint")

CHECKPOINT_FILE = ".checkpoint"
_VERSION = 0

Offsets = dict[tuple[str, int], int]


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
    except (OSError, UnicodeDecodeError) as exc:
        log.warning("checkpoint_unreadable", path=str(path), error=f"{type(exc).__name__}: {exc}")
        return None
    try:
        return _parse(text)
    except ValueError as exc:
        log.warning("checkpoint_corrupt", path=str(path), error=str(exc))
        return None


def _parse(text: str) -> Offsets:
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
