"""What start-up waits for: joining the group, the assignment, restoration.

A new instance can sit for seconds between `app_started` and its first
record: the group coordinator answers a first JoinGroup only after a delay
(Kafka's `group.initial.rebalance.delay.ms`; on Tansu about half of
`session.timeout.ms`), a previous instance that did not leave is waited for
until its session times out, and stateful tasks restore their stores before
they process. `StartupProgress` names the phase in the log (`startup_phase`,
one line per phase, and `startup_waiting` every 10 s with a hint while one
lasts) and in `App.status()` (`startup_phase`, `waiting_for`,
`startup_phase_since`).

Phases, in order: `joining_group` (subscribed; no member id from the
coordinator yet), `awaiting_assignment` (a member; the rebalance has not
assigned partitions yet), `restoring` (tasks assigned, some restoring their
stores), `processing` (start-up is over; not tracked after that).

Threads: `subscribed` and `observe` are called by the polling thread only;
the attributes are read racily by `App.status()` on any thread (each is
replaced whole).
"""

from __future__ import annotations

import time

from runtime.logging import get_logger

log = get_logger("runtime.startup")

__all__ = ["StartupProgress"]

JOINING_GROUP = "joining_group"
AWAITING_ASSIGNMENT = "awaiting_assignment"
RESTORING = "restoring"
PROCESSING = "processing"

_REMIND_EVERY_S = 10.0


class StartupProgress:
    """The start-up phase of one polling thread (see the module docstring)."""

    def __init__(self, group: str, bootstrap: str, session_timeout_ms: int | None) -> None:
        self._group = group
        self._bootstrap = bootstrap
        self._session_timeout_ms = session_timeout_ms
        self._started = time.monotonic()
        self._phase_started = self._started
        self._last_reminder = self._started
        self.phase: str | None = None
        self.waiting_for: str | None = None
        self.phase_since: float | None = None  # wall-clock time the phase began

    @property
    def done(self) -> bool:
        return self.phase == PROCESSING

    def subscribed(self) -> None:
        """The consumer has subscribed: the group join begins."""
        self._enter(
            JOINING_GROUP,
            f"joining consumer group {self._group!r} at {self._bootstrap}",
        )

    def observe(self, member_id: str | None, joined: bool, restoring: int) -> None:
        """One look per polling loop turn until start-up is over.

        `member_id`: the consumer's id in the group, once the coordinator gave
        one; `joined`: the first assignment has arrived; `restoring`: tasks
        restoring their stores now.
        """
        if joined and restoring:
            if self.phase != RESTORING:
                self._enter(
                    RESTORING,
                    f"restoring {restoring} task{'s' if restoring != 1 else ''} "
                    "from their changelogs before they process",
                    tasks=restoring,
                )
        elif joined:
            self._enter(PROCESSING, "nothing: processing")
            return
        elif member_id and self.phase == JOINING_GROUP:
            self._enter(
                AWAITING_ASSIGNMENT,
                f"consumer group {self._group!r} to assign partitions",
                member_id=member_id,
            )
        now = time.monotonic()
        if now - self._last_reminder >= _REMIND_EVERY_S:
            self._last_reminder = now
            log.info(
                "startup_waiting",
                phase=self.phase,
                waiting_for=self.waiting_for,
                waited_s=round(now - self._phase_started, 1),
                hint=self._hint(),
            )

    def _enter(self, phase: str, waiting_for: str, **fields: object) -> None:
        now = time.monotonic()
        self.phase = phase
        self.waiting_for = None if phase == PROCESSING else waiting_for
        self.phase_since = time.time()
        self._phase_started = now
        self._last_reminder = now
        log.info(
            "startup_phase",
            phase=phase,
            waiting_for=self.waiting_for,
            since_start_s=round(now - self._started, 2),
            **fields,
        )

    def _hint(self) -> str:
        if self.phase == RESTORING:
            return "stores restore from their changelogs; `admin status` shows each task's progress"
        session = (
            f"{self._session_timeout_ms} ms"
            if self._session_timeout_ms is not None
            else "the broker's setting"
        )
        return (
            "the group coordinator answers a new member's join after "
            "group.initial.rebalance.delay.ms on Kafka (about half of session.timeout.ms "
            f"on Tansu; session.timeout.ms is {session}), and waits for a previous "
            "instance that did not leave until its session times out"
        )
