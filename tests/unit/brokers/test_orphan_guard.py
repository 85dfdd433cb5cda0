"""The broker guard: a broker's process group dies with the process that started it.

No broker here: the guarded child is a `sleep` in its own session, started by an
owner process that the test SIGKILLs (as a killed test run or demo would be).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from runtime.brokers.orphan_guard import start_guard

ROOT = Path(__file__).resolve().parents[3]

OWNER = textwrap.dedent(
    """
    import subprocess, sys, time
    from runtime.brokers.orphan_guard import start_guard
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    guard = start_guard(child.pid)
    print(child.pid, guard.pid, flush=True)
    time.sleep(600)
    """
)


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


def _wait_until(condition, deadline_s: float) -> bool:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return condition()


pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")


def test_the_child_dies_when_its_owner_is_killed() -> None:
    owner = subprocess.Popen(
        [sys.executable, "-c", OWNER],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert owner.stdout is not None
    child, guard = (int(x) for x in owner.stdout.readline().split())
    try:
        assert _alive(child) and _alive(guard)
        owner.kill()
        owner.wait()
        assert _wait_until(lambda: not _alive(child), 10), "the orphaned child still runs"
        assert _wait_until(lambda: not _alive(guard), 10), "the guard did not leave"
    finally:
        for pid in (child, guard):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_guard_leaves_the_child_alone_while_its_owner_lives_and_leaves_with_the_child() -> None:
    child = subprocess.Popen(["sleep", "600"], start_new_session=True)
    guard = start_guard(child.pid)
    assert guard is not None
    try:
        # Two of the guard's checks pass: it must not have touched the child.
        assert not _wait_until(lambda: guard.poll() is not None, 2.5)
        assert child.poll() is None
        child.kill()
        child.wait()  # reaped: the guard sees it gone and exits by itself
        assert guard.wait(timeout=10) == 0
    finally:
        child.kill()
        guard.kill()
        guard.wait()
