"""One owner per task directory (runtime.state.task_lock): a second owner
waits for the first to close, a dead process's lock is gone, and the
cleanup thread leaves a locked directory alone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from runtime.state.cleanup import CleanupThread
from runtime.state.task_lock import (
    CLAIM_FILE,
    TaskDirectoryLock,
    TaskDirectoryLocked,
    directory_claimed,
)


def test_a_second_owner_waits_until_the_first_releases(tmp_path: Path) -> None:
    first, second = TaskDirectoryLock(tmp_path / "0_1"), TaskDirectoryLock(tmp_path / "0_1")
    assert first.try_acquire()
    assert not second.try_acquire()
    with pytest.raises(TaskDirectoryLocked, match="locked by another process"):
        second.acquire(timeout=0.1)
    threading.Timer(0.2, first.release).start()
    started = time.monotonic()
    second.acquire(timeout=10)
    assert second.held and time.monotonic() - started >= 0.15
    second.release()
    assert not second.held


def test_the_lock_of_a_killed_process_is_free(tmp_path: Path) -> None:
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time; from pathlib import Path; "
            "from runtime.state.task_lock import TaskDirectoryLock; "
            f"TaskDirectoryLock(Path({str(tmp_path / '0_0')!r})).acquire(); "
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        lock = TaskDirectoryLock(tmp_path / "0_0")
        assert not lock.try_acquire()
        holder.kill()
        holder.wait(10)
        assert lock.try_acquire()
        lock.release()
    finally:
        holder.kill()
        holder.wait(10)


def test_cleanup_deletes_only_directories_it_can_lock(tmp_path: Path) -> None:
    owned_elsewhere = TaskDirectoryLock(tmp_path / "0_0")
    assert owned_elsewhere.try_acquire()
    (tmp_path / "0_1").mkdir()
    cleaner = CleanupThread("c", tmp_path, delay_ms=0, owned=frozenset)
    assert cleaner.clean_once(now=time.time() + 10) == ["0_1"]
    assert (tmp_path / "0_0").is_dir()
    owned_elsewhere.release()
    assert cleaner.clean_once(now=time.time() + 20) == ["0_0"]
    assert not (tmp_path / "0_0").exists()


def test_a_waiting_owner_claims_the_directory_until_it_holds_it(tmp_path: Path) -> None:
    directory = tmp_path / "0_2"
    standby, active = TaskDirectoryLock(directory), TaskDirectoryLock(directory)
    assert standby.try_acquire()
    assert not directory_claimed(directory)
    waiter = threading.Thread(target=active.acquire, kwargs={"timeout": 10})
    waiter.start()
    deadline = time.monotonic() + 5
    while not directory_claimed(directory):  # what the standby's placement sees
        assert time.monotonic() < deadline, "the waiting owner never claimed the directory"
        time.sleep(0.01)
    standby.release()
    waiter.join(10)
    assert active.held
    assert not directory_claimed(directory)  # the claim is gone once held
    active.release()


def test_a_standby_open_claims_nothing_and_a_dead_process_claim_is_none(tmp_path: Path) -> None:
    directory = tmp_path / "0_3"
    holder, standby = TaskDirectoryLock(directory), TaskDirectoryLock(directory)
    assert holder.try_acquire()
    with pytest.raises(TaskDirectoryLocked):
        standby.acquire(timeout=0.1, claim=False)
    assert not directory_claimed(directory)
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        check=True,
        capture_output=True,
        text=True,
    )
    (directory / CLAIM_FILE).write_text(dead.stdout.strip())
    assert not directory_claimed(directory)
    holder.release()


def test_a_waiting_owner_runs_its_hook_which_may_free_what_it_waits_for(tmp_path: Path) -> None:
    # Two processes of a daemon each waiting for a directory the other's
    # standby holds: each one's hook gives up its own claimed standbys.
    directory = tmp_path / "0_4"
    standby, active = TaskDirectoryLock(directory), TaskDirectoryLock(directory)
    assert standby.try_acquire()
    calls: list[bool] = []

    def release_claimed() -> None:
        calls.append(directory_claimed(directory))
        if len(calls) == 2:
            standby.release()

    active.acquire(timeout=10, while_waiting=release_claimed)
    assert active.held and calls == [True, True]
    active.release()
