"""One slot of a daemon's processing processes, and the rules of its restart (pure).

`Slot` is what `runtime.isolation.workers.WorkerPool` keeps per slot `p<i>`
(its process, restarts, backoff, last status line); `restart_delay_ms` is
the backoff, `exit_reason` says in words why a process exited.

Threads: a `Slot` is changed under its pool's lock; the functions are pure.
"""

from __future__ import annotations

import signal
from dataclasses import dataclass, field
from typing import Any

from runtime.isolation.process import ChildProcess

STABLE_UPTIME_S = 60.0  # a slot up this long starts its backoff over


@dataclass
class Slot:
    """One slot's process and its history (under the pool's lock)."""

    index: int
    child: ChildProcess | None = None
    restarts: int = 0
    early_deaths: int = 0  # deaths in a row within STABLE_UPTIME_S of the start
    last_exit: str | None = None
    started_at: float | None = None  # wall clock of the running child's start
    started_mono: float = 0.0
    next_start: float = 0.0  # monotonic; a dead slot is started again from then
    figures: dict[str, Any] = field(default_factory=dict)  # its last status line
    removing: bool = False

    @property
    def name(self) -> str:
        return f"p{self.index}"

    @property
    def up(self) -> bool:
        return self.child is not None and self.child.alive


def restart_delay_ms(early_deaths: int, base_ms: int, max_ms: int) -> int:
    """How long to wait before restarting a slot that died `early_deaths`
    times in a row within a minute of its start before this death: at once
    the first time (its open transaction holds back read_committed readers
    until its successor's init aborts it), then `base_ms` doubling up to
    `max_ms`."""
    if early_deaths <= 0:
        return 0
    return int(min(base_ms * 2 ** min(early_deaths - 1, 32), max_ms))


def exit_reason(code: int, failure: str | None) -> str:
    """Why a process exited, in words: the signal that ended it, or its code
    and what it said."""
    if code < 0:
        try:
            text = f"killed by {signal.Signals(-code).name}"
        except ValueError:
            text = f"killed by signal {-code}"
    else:
        text = f"exited with code {code}"
    return f"{text}: {failure}" if failure else text
