"""Checkpoint files: round trip, atomic replace, corrupt or missing means none."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.state.checkpoint import (
    checkpoint_path,
    delete_checkpoint,
    read_checkpoint,
    write_checkpoint,
)


def test_round_trip(tmp_path: Path) -> None:
    path = checkpoint_path(tmp_path / "0_1")
    offsets = {("app-counts-changelog", 1): 42, ("app-other-changelog", 1): 0}
    write_checkpoint(path, offsets)
    assert read_checkpoint(path) == offsets
    assert path.read_text().splitlines()[:2] == ["0", "2"]  # Kafka's OffsetCheckpoint layout


def test_empty_round_trip(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    write_checkpoint(path, {})
    assert read_checkpoint(path) == {}


def test_missing_file_is_no_checkpoint(tmp_path: Path) -> None:
    assert read_checkpoint(tmp_path / "nope") is None


def test_replace_is_atomic_through_a_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".checkpoint"
    write_checkpoint(path, {("t", 0): 1})
    seen: list[tuple[str, str]] = []
    real_replace = os.replace

    def spy(src: str, dst: str) -> None:
        # At the moment of the rename the old checkpoint is still intact.
        assert read_checkpoint(path) == {("t", 0): 1}
        seen.append((str(src), str(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", spy)
    write_checkpoint(path, {("t", 0): 2})
    assert seen == [(str(path) + ".tmp", str(path))]
    assert read_checkpoint(path) == {("t", 0): 2}
    assert not Path(str(path) + ".tmp").exists()


def test_failed_write_leaves_the_old_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / ".checkpoint"
    write_checkpoint(path, {("t", 0): 1})

    def boom(fd: int) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "fsync", boom)
    with pytest.raises(OSError):
        write_checkpoint(path, {("t", 0): 2})
    assert read_checkpoint(path) == {("t", 0): 1}


@pytest.mark.parametrize(
    "content",
    [
        "",
        "0\n",
        "1\n1\nt 0 5\n",  # unknown version
        "0\n2\nt 0 5\n",  # count mismatch
        "0\n1\nt 0\n",  # short entry
        "0\n1\nt x 5\n",  # not a number
        "0\n1\nt 0 -5\n",
        "garbage",
    ],
)
def test_corrupt_file_is_no_checkpoint(tmp_path: Path, content: str) -> None:
    path = tmp_path / ".checkpoint"
    path.write_text(content)
    assert read_checkpoint(path) is None


def test_binary_garbage_is_no_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    path.write_bytes(b"\xff\xfe\x00\x01")
    assert read_checkpoint(path) is None


def test_delete(tmp_path: Path) -> None:
    path = tmp_path / ".checkpoint"
    write_checkpoint(path, {("t", 0): 1})
    delete_checkpoint(path)
    delete_checkpoint(path)
    assert read_checkpoint(path) is None


def test_topic_with_whitespace_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        write_checkpoint(tmp_path / ".checkpoint", {("bad topic", 0): 1})
