"""The cleanup thread deletes only directories unused here for the delay."""

from __future__ import annotations

import os
from pathlib import Path

from runtime.state.cleanup import CleanupThread


def make_dir(root: Path, name: str, mtime: float) -> Path:
    path = root / name
    path.mkdir(parents=True)
    (path / ".checkpoint").write_text("0\n0\n")
    os.utime(path / ".checkpoint", (mtime, mtime))
    os.utime(path, (mtime, mtime))
    return path


def test_deletes_unowned_old_directories_only(tmp_path: Path) -> None:
    now = 10_000.0
    make_dir(tmp_path, "0_0", now - 5000)  # owned: kept
    make_dir(tmp_path, "0_1", now - 5000)  # unowned and old: deleted after the delay
    make_dir(tmp_path, "0_2", now + 30)  # unowned but written recently: kept
    (tmp_path / "not-a-task").mkdir()
    owned = frozenset({"0_0"})
    cleaner = CleanupThread("c", tmp_path, delay_ms=60_000, owned=lambda: owned)
    # First sighting starts the unowned clock: nothing goes at once.
    assert cleaner.clean_once(now=now) == []
    assert cleaner.clean_once(now=now + 61) == ["0_1"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["0_0", "0_2", "not-a-task"]


def test_a_directory_that_becomes_owned_again_is_kept(tmp_path: Path) -> None:
    make_dir(tmp_path, "1_3", 0.0)
    owned: set[str] = set()
    cleaner = CleanupThread("c", tmp_path, delay_ms=1000, owned=lambda: frozenset(owned))
    cleaner.clean_once(now=100.0)
    owned.add("1_3")
    assert cleaner.clean_once(now=200.0) == []
    owned.clear()
    assert cleaner.clean_once(now=200.5) == []  # the clock restarted
    assert cleaner.clean_once(now=202.0) == ["1_3"]
