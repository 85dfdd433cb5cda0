"""A broker JVM must not outlive the process that started it.

A test run or a demo killed with SIGKILL cannot run its finalizers, and a broker
started in its own session (so that signals reach the JVM alone) then lives on,
reparented to init, holding ports, memory and a data directory. Linux's
``PR_SET_PDEATHSIG`` would do, but it fires when the *thread* that forked exits,
and brokers are started from fixture and harness threads that end long before
the broker should.

So each JVM gets a guard: a tiny Python process, child of the broker's owner,
that checks once a second whether its parent is still the owner. When the owner
is gone (the guard was reparented), it SIGKILLs the broker's process group. It
leaves by itself as soon as the broker has exited. The guard is in its own
session too, so a Ctrl-C at the terminal does not kill it before the owner has
stopped the broker cleanly.

Threads: :func:`start_guard` is called by the broker's owner under its own lock
(``KafkaNode.spawn``); nothing here starts threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time

__all__ = ["start_guard"]


def _start_time(pid: int) -> str | None:
    """Field 22 of /proc/<pid>/stat (clock ticks since boot), None if the process is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its ")".
    fields = stat[stat.rindex(")") + 2 :].split()
    return None if fields[0] == "Z" else fields[19]


def start_guard(child_pid: int) -> subprocess.Popen[bytes] | None:
    """Start a guard that SIGKILLs ``child_pid``'s process group once this process is gone.

    ``child_pid`` must lead its own process group (``start_new_session=True``). Returns
    None where there is no /proc (the guard needs it to tell the child from a reused pid).
    """
    started = _start_time(child_pid)
    if started is None:
        return None
    # Run as a script, not `-m`: importing the runtime package would cost the guard
    # tens of MB; this file imports only the standard library.
    return subprocess.Popen(
        [sys.executable, __file__, str(os.getpid()), str(child_pid), started],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def _guard(owner: int, child: int, started: str) -> None:
    """The guard's loop (in the guard process). A zombie child counts as gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    while _start_time(child) == started:
        if os.getppid() != owner:
            with contextlib.suppress(OSError):
                os.killpg(child, signal.SIGKILL)
            return
        time.sleep(1.0)


if __name__ == "__main__":
    _guard(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
