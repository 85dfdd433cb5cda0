"""The thread autoscaler's decisions (`processing.threads.autoscale`).

Pure: `Autoscaler.observe(status, now)` reads one status snapshot per
`AutoscalePolicy.interval_s` and may answer a `Decision` to add or remove one
processing thread, with its reason; the daemon's loop (runtime.admin.daemon)
carries it out and logs it (`autoscale_decision`). An added thread that does
not raise throughput by `min_gain` is taken back, and adding backs off.

Threads: the admin loop only (no lock).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runtime.config import StreamsConfig
from runtime.status import AppStatus

__all__ = ["AutoscalePolicy", "Autoscaler", "Decision"]


@dataclass(frozen=True)
class AutoscalePolicy:
    """When the autoscaler acts. Counts are in observation intervals."""

    min_threads: int = 1
    max_threads: int = 8
    interval_s: float = 10.0
    busy_fraction: float = 0.9
    """A thread is busy when it spent at least this share of the interval in batches."""
    idle_fraction: float = 0.05
    """A thread is idle when it spent at most this share of the interval in batches."""
    grow_intervals: int = 3
    """Total lag must have grown this many intervals in a row (and all threads be busy)."""
    idle_intervals: int = 6
    """A thread must have been idle this many intervals in a row to remove one."""
    min_gain: float = 0.1
    """An added thread must raise throughput by this share, or it is taken back."""
    backoff_intervals: int = 30
    """After taking back a thread that did not help, no adding for this many intervals."""

    @classmethod
    def from_config(cls, config: StreamsConfig) -> AutoscalePolicy:
        return cls(
            min_threads=config.processing_threads_min, max_threads=config.processing_threads_max
        )


@dataclass(frozen=True)
class Decision:
    action: str  # "add" or "remove"
    reason: str
    facts: dict[str, Any] = field(default_factory=dict)


class Autoscaler:
    """Decides processing-thread changes from successive `App.status()` snapshots.

    Pure: it never calls the app, so tests feed it snapshots. One decision at a
    time; after any change in the thread set it starts observing afresh.

    CPython's GIL caveat: for pure-Python processing, threads waiting for the GIL
    look busy, so "lag grows and every thread is busy" also holds when one more
    thread cannot help. Hence the check after each addition: if throughput did
    not rise by `min_gain` within `grow_intervals`, the thread is taken back and
    adding pauses for `backoff_intervals`.
    """

    def __init__(self, policy: AutoscalePolicy) -> None:
        self.policy = policy
        self._last: AppStatus | None = None
        self._last_time = 0.0
        self._lag_grew = 0
        self._idle: dict[str, int] = {}
        self._trial: tuple[float, int] | None = None  # (rate before, intervals since add)
        self._backoff = 0

    def observe(self, status: AppStatus, now: float) -> Decision | None:
        """Take one snapshot (taken at monotonic `now`); a decision or None."""
        last, last_time = self._last, self._last_time
        self._last, self._last_time = status, now
        alive = [t for t in status.threads if t.alive]
        count = len(alive)
        policy = self.policy
        if status.state != "RUNNING":
            self._reset()
            return None
        if count < policy.min_threads:
            return self._decide("add", f"{count} threads, below processing.threads.min", count)
        if count > policy.max_threads:
            return self._decide("remove", f"{count} threads, above processing.threads.max", count)
        if last is None or now <= last_time:
            return None
        names = {t.name for t in alive}
        before = {t.name: t for t in last.threads if t.alive}
        if names != set(before):
            self._reset(keep_trial=True)  # the set changed (our decision, admin, a failure)
            return None
        elapsed = now - last_time
        busy = {
            t.name: max(0.0, t.busy_seconds - before[t.name].busy_seconds) / elapsed for t in alive
        }
        rate = max(0, status.processed - last.processed) / elapsed
        lag, lag_before = status.total_lag, last.total_lag
        self._lag_grew = self._lag_grew + 1 if lag > lag_before else 0
        for name, fraction in busy.items():
            self._idle[name] = (
                self._idle.get(name, 0) + 1 if fraction <= policy.idle_fraction else 0
            )
        self._backoff = max(0, self._backoff - 1)
        facts = {"threads": count, "total_lag": lag, "records_per_s": round(rate, 1)}

        if self._trial is not None:
            rate_before, waited = self._trial
            waited += 1
            self._trial = (rate_before, waited)
            if waited >= policy.grow_intervals:
                self._trial = None
                no_gain = rate < rate_before * (1 + policy.min_gain)
                if no_gain and lag > 0 and count > policy.min_threads:
                    self._backoff = policy.backoff_intervals
                    return self._decide(
                        "remove",
                        f"the last added thread did not raise throughput "
                        f"({rate_before:.0f} -> {rate:.0f} records/s); adding pauses for "
                        f"{policy.backoff_intervals} intervals",
                        count,
                        facts,
                    )
        idle = sorted(name for name, n in self._idle.items() if n >= policy.idle_intervals)
        if idle and count > policy.min_threads:
            return self._decide(
                "remove",
                f"{idle[0]} idle for {policy.idle_intervals} intervals "
                f"(busy {busy[idle[0]]:.0%} of the last)",
                count,
                facts,
            )
        least_busy = min(busy.values(), default=1.0)  # no threads: vacuously all busy
        all_busy = least_busy >= policy.busy_fraction
        if (
            self._lag_grew >= policy.grow_intervals
            and all_busy
            and count < policy.max_threads
            and self._backoff == 0
        ):
            self._trial = (rate, 0)
            return self._decide(
                "add",
                f"total lag grew {self._lag_grew} intervals in a row and every thread was "
                f"busy (least {least_busy:.0%})",
                count,
                facts,
            )
        return None

    def _decide(
        self, action: str, reason: str, count: int, facts: dict[str, Any] | None = None
    ) -> Decision:
        self._reset(keep_trial=True)
        return Decision(action, reason, {"threads": count, **(facts or {})})

    def _reset(self, keep_trial: bool = False) -> None:
        self._lag_grew = 0
        self._idle.clear()
        if not keep_trial:
            self._trial = None
