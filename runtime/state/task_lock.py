"""One owner per task directory at a time: `TaskDirectoryLock`.

Under `processes` > 1 the processing processes of one daemon share
`state.dir/<application.id>/`: a task that moves from one to another opens
the directory its old owner closed (and restores only the changelog tail
after the checkpoint it left). The lock makes "closed" checkable: opening a
task's stores (active, restoring or standby) takes an exclusive
`fcntl.flock` on `<task dir>/.lock`, held until the task closes; the kernel
releases it when its process dies, even by kill -9. A new owner whose old
owner is still closing waits for it (`acquire`, bounded: Kafka Streams
retries a `LockException` the same way); the cleanup thread of every
process deletes only the directories it can lock. RocksDB's own `LOCK`
file stays a second guard.

A waiting active task *claims* the directory: `<task dir>/.claim` holds its
pid while it waits. A standby kept by another process of the daemon (the
group's assignor knows nothing of standbys, so it may give the task to a
sibling of the standby's process) gives the directory up when it sees a
live claim (`directory_claimed`, read by standby placement at each
reconcile, and by `while_waiting` of a process's own waiting task: two
processes may each wait for a directory the other's standby holds).

Threads: a lock belongs to the task's owner thread (the polling thread opens
and closes tasks; the cleanup thread takes its own locks).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable
from pathlib import Path

from runtime.logging import get_logger

log = get_logger("runtime.state")

LOCK_FILE = ".lock"
CLAIM_FILE = ".claim"
ACQUIRE_TIMEOUT_S = 60.0  # an old owner's close: its final commit and checkpoint
_RETRY_S = 0.05
_WHILE_WAITING_S = 0.25


class TaskDirectoryLocked(RuntimeError):
    """Another process holds the task's directory (it still owns the task)."""


class TaskDirectoryLock:
    """The exclusive lock of one task directory (see the module doc)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def try_acquire(self) -> bool:
        """Take the lock if it is free (creating the directory); True if taken."""
        if self._fd is not None:
            return True
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.directory / LOCK_FILE, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._fd = fd
        return True

    def acquire(
        self,
        timeout: float = ACQUIRE_TIMEOUT_S,
        claim: bool = True,
        while_waiting: Callable[[], None] | None = None,
    ) -> None:
        """Take the lock, waiting up to `timeout` for its holder to close the
        task; while waiting, `claim` it (see the module doc: an active
        task's open claims, a standby's does not) and call `while_waiting`
        every `_WHILE_WAITING_S` (the caller's own claimed standbys go: its
        thread is the one that would release them). Raises
        TaskDirectoryLocked after that."""
        deadline = time.monotonic() + timeout
        next_call = time.monotonic()
        waited = False
        try:
            while not self.try_acquire():
                if not waited:
                    log.info("task_directory_locked_waiting", path=str(self.directory))
                    waited = True
                    if claim:
                        (self.directory / CLAIM_FILE).write_text(str(os.getpid()))
                if while_waiting is not None and time.monotonic() >= next_call:
                    next_call = time.monotonic() + _WHILE_WAITING_S
                    while_waiting()
                if time.monotonic() >= deadline:
                    raise TaskDirectoryLocked(
                        f"{self.directory} is locked by another process of this daemon "
                        f"for more than {timeout:.0f} s"
                    )
                time.sleep(_RETRY_S)
        finally:
            if waited and claim:
                _drop_claim(self.directory)
        if waited:
            log.info("task_directory_lock_taken", path=str(self.directory))

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        with contextlib.suppress(OSError):
            os.close(fd)


def directory_claimed(directory: Path) -> bool:
    """Whether a live process waits to open the task in `directory` as its
    active owner (its `.claim`; a claim left by a dead process is none)."""
    try:
        pid = int((directory / CLAIM_FILE).read_text())
    except (OSError, ValueError):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _drop_claim(directory: Path) -> None:
    """Remove this process's claim (not a newer waiter's)."""
    path = directory / CLAIM_FILE
    with contextlib.suppress(OSError, ValueError):
        if int(path.read_text()) == os.getpid():
            path.unlink()
