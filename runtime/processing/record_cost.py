"""What a key-parallel task's records cost: CPU-bound or waiting off the GIL.

A key-parallel task (runtime.processing.key_lanes) shares its records between
threads only where that pays: where records wait off the GIL (I/O, sleeps, C
code releasing it). Where they are CPU-bound the GIL runs one thread anyway,
and a second thread on the task only adds lanes and contention. This module
measures which it is, per grab, from the grabbing thread's wall and CPU time:

- The wait of a grab is what its wall time leaves beyond its CPU time and
  the GIL wait that the `contenders` (threads competing for the GIL) explain:
  each CPU-bound contender holds the GIL about as long as this thread
  computes, so CPU-bound records wait about nothing at any thread count
  (their wall time per record grows with the thread count, their waiting
  does not), and records waiting on I/O keep most of their wait.
- Grabs that share the task cannot always tell: with k threads on records
  that wait w off the GIL and compute c, the GIL explains the whole wall time
  once k x c reaches c + w (8 threads on records that sleep 1 ms and compute
  150 us look CPU-bound). A grab run alone (no other grab of the task
  overlapped it) settles it, so "fast" also needs the last alone
  measurement to say so; when the shared ones say fast and the last alone
  one is older than PROBE_INTERVAL_S, the task runs its next grab alone: a
  probe (`probe_wanted`).

Threads: `note` runs under the lanes' lock (a processing thread completing a
grab); the figures and properties are read racily by the scheduler and status.
"""

from __future__ import annotations

# Until measured, records are assumed this slow (one-lane grabs, shared).
INITIAL_RECORD_S = 0.001
# Records that wait less than this, or less than their own CPU time, on
# average are fast: CPU-bound work, which the GIL does not run in parallel
# anyway. They are taken in chunks by one thread: the default mode's cost.
CHUNK_BELOW_S = 0.0001
# An alone measurement younger than this settles whether records are fast;
# an older one is refreshed by a probe when the shared measurements say fast
# (a probe idles the task's other threads for about one grab: not more often).
PROBE_INTERVAL_S = 1.0
# Weight of the newest grab in the moving averages.
_NEWEST = 0.2


def _fast(wait_s: float, cpu_s: float) -> bool:
    return wait_s < CHUNK_BELOW_S or wait_s < cpu_s


class RecordCost:
    """Moving averages per attempted record of one key-parallel task: wall
    time (`record_s`, sizes lane grabs), the thread's CPU time (`cpu_s`, sizes
    chunks), the wait beyond CPU and GIL contention (`wait_s`) and the same
    wait from grabs run alone (`alone_wait_s`). Until measured, records are
    slow."""

    __slots__ = ("record_s", "cpu_s", "wait_s", "alone_wait_s", "alone_at", "probes")

    def __init__(self) -> None:
        self.record_s = INITIAL_RECORD_S
        self.cpu_s = INITIAL_RECORD_S
        self.wait_s = INITIAL_RECORD_S
        self.alone_wait_s = INITIAL_RECORD_S
        self.alone_at = float("-inf")
        self.probes = 0  # grabs run alone because the shared ones could not tell

    @property
    def fast(self) -> bool:
        """CPU-bound by the recent grabs and by the last grab run alone."""
        cpu = self.cpu_s
        return _fast(self.wait_s, cpu) and _fast(self.alone_wait_s, cpu)

    def probe_wanted(self, now: float) -> bool:
        """The shared grabs say fast, the last alone one (none yet, or older
        than PROBE_INTERVAL_S) says slow: the next grab should run alone."""
        cpu = self.cpu_s
        if not _fast(self.wait_s, cpu) or _fast(self.alone_wait_s, cpu):
            return False
        return now - self.alone_at > PROBE_INTERVAL_S

    def note(
        self,
        busy_s: float,
        attempted: int,
        cpu_s: float | None,
        contenders: int,
        alone: bool,
        now: float,
    ) -> None:
        """Fold one grab in: `attempted` records in `busy_s` of wall time and
        `cpu_s` of the thread's CPU time (None: not measured, all of it counts
        as waiting), `contenders` threads competing for the GIL meanwhile,
        `alone`: no other grab of the task overlapped it (a stale alone
        figure is replaced, not averaged: it answers a probe)."""
        if not attempted or busy_s <= 0.0:
            return
        per = 1.0 / attempted
        keep = 1.0 - _NEWEST
        self.record_s = keep * self.record_s + _NEWEST * max(busy_s * per, 1e-7)
        if cpu_s is None:
            cpu = wait = busy_s
        else:
            cpu = min(max(cpu_s, 0.0), busy_s)
            wait = max(0.0, busy_s - cpu * max(1, contenders))
        self.cpu_s = keep * self.cpu_s + _NEWEST * max(cpu * per, 1e-7)
        self.wait_s = keep * self.wait_s + _NEWEST * wait * per
        if alone:
            if now - self.alone_at > PROBE_INTERVAL_S:
                self.alone_wait_s = wait * per
            else:
                self.alone_wait_s = keep * self.alone_wait_s + _NEWEST * wait * per
            self.alone_at = now
