"""Linux's SCHED_IDLE class for processing threads while they run a
lower-priority named query's task (`sched.idle.lower.priorities`).

Why: query priorities order the scheduler's choices, but a CPU-bound
lower-priority batch still competes with everything the higher query's
record needs on its way: the polling thread (consume, route, produce), the
client library's threads and a co-located broker. The OS cannot tell them
apart; the GIL and two cores make every such wait visible in the light
query's tail latency. A thread in SCHED_IDLE is preempted at once by any
normal thread that wakes up, and the kernel places waking threads on a core
that runs only SCHED_IDLE work as if it were idle. Measured on 2 cores beside
a CPU-bound backlog (queries benchmark, Apache Kafka 4.4.0): the light query's
p99 9.2-17.3 ms with it (median 11.7 of 12 runs), 12.1-18.5 ms without (and
85 ms in a run with a stall; median 16.5 of 11), the heavy query's throughput 3-7% lower.

The thread switches class per task it takes (one syscall, only when the
class changes). Leaving SCHED_IDLE needs CAP_SYS_NICE or an RLIMIT_NICE of 20:
`idle_class_unavailable` tries both ways once on a throwaway thread, and
without them the feature stays off (a thread stuck in SCHED_IDLE would starve
the high-priority work it later takes).

The risk it takes, and why it is off by default: a SCHED_IDLE thread holding
the GIL on a host whose cores are saturated by other processes waits long for
a core, and the whole process with it (the high-priority query too). Inside a
container's own cgroup it competes with the container's threads only. The gain
measured (a quarter off the p99) does not outweigh that risk for an app that
does not know its host: turn it on where the host is known (a container, a
machine of its own).
"""

from __future__ import annotations

import functools
import os
import sys
import threading

from runtime.logging import get_logger

log = get_logger("runtime.processing")


@functools.cache
def idle_class_unavailable() -> str | None:
    """None if a thread may enter SCHED_IDLE and leave it again; else why not.

    Probed once per process on a throwaway thread. Any thread."""
    if not sys.platform.startswith("linux") or not hasattr(os, "SCHED_IDLE"):
        return f"SCHED_IDLE is Linux only (this is {sys.platform})"
    outcome: list[str | None] = []

    def both_ways() -> None:
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
            os.sched_setscheduler(0, os.SCHED_OTHER, os.sched_param(0))
            outcome.append(None)
        except OSError as exc:
            outcome.append(
                f"a thread may not leave SCHED_IDLE here ({exc.strerror}): "
                "needs CAP_SYS_NICE or `ulimit -e 20`"
            )

    probe = threading.Thread(target=both_ways, name="sched-idle-probe", daemon=True)
    probe.start()
    probe.join()
    return outcome[0] if outcome else "the probe thread failed"


class ThreadSchedClass:
    """The calling processing thread's class: SCHED_IDLE or SCHED_OTHER.

    `set_idle` is called by the thread that owns it (the class of the calling
    thread changes); a failed switch turns it off for good, never the thread."""

    def __init__(self) -> None:
        self.idle = False
        self._broken = False

    def set_idle(self, idle: bool) -> None:
        if idle == self.idle or self._broken:
            return
        try:
            os.sched_setscheduler(0, os.SCHED_IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
        except OSError as exc:
            self._broken = True
            log.warning("sched_class_switch_failed", idle=idle, error=str(exc))
            return
        self.idle = idle
