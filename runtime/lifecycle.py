"""The app's state machine: Kafka Streams' client states and their changes.

`App` (runtime.app) is a facade over one `Lifecycle`; the parts that change
the state besides it (the failure policy, runtime.failure_policy; the named
query operations, runtime.query_operations, which only read it) share the
same object, so the rules for what may follow what live in one place.

Any thread: one re-entrant lock guards the state and the failure; state
listeners run on the thread that caused the change, outside the lock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from enum import Enum

from runtime.logging import get_logger

log = get_logger("runtime.app")


class AppState(Enum):
    """Kafka Streams' client states."""

    CREATED = "CREATED"
    REBALANCING = "REBALANCING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    PENDING_ERROR = "PENDING_ERROR"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value


TRANSITIONS: dict[AppState, set[AppState]] = {
    AppState.CREATED: {AppState.REBALANCING, AppState.PENDING_SHUTDOWN, AppState.PENDING_ERROR},
    AppState.REBALANCING: {
        AppState.RUNNING,
        AppState.REBALANCING,
        AppState.PENDING_SHUTDOWN,
        AppState.PENDING_ERROR,
    },
    AppState.RUNNING: {AppState.REBALANCING, AppState.PENDING_SHUTDOWN, AppState.PENDING_ERROR},
    AppState.PENDING_SHUTDOWN: {AppState.NOT_RUNNING},
    AppState.NOT_RUNNING: set(),
    AppState.PENDING_ERROR: {AppState.ERROR},
    AppState.ERROR: set(),
}

# The states in which the app has threads and takes requests (threads,
# queries, store reads).
ACTIVE = (AppState.RUNNING, AppState.REBALANCING)

StateListener = Callable[[AppState, AppState], None]


class IllegalStateError(RuntimeError):
    """An operation the app's current state does not allow."""


def failure_text(failure: BaseException | None) -> str | None:
    """`Type: message` for status and progress (a repr would escape the quotes
    of a failed record's preview), None without a failure."""
    if failure is None:
        return None
    return f"{type(failure).__name__}: {failure}"


class Lifecycle:
    """The app's state, the error that ended it, and the listeners."""

    def __init__(self) -> None:
        # Re-entrant: `set_state` takes it and is called with it held.
        self.lock = threading.RLock()
        self.state = AppState.CREATED
        # The error that put the app into ERROR; written under `lock`.
        self.failure: BaseException | None = None
        # Set once the app is NOT_RUNNING or ERROR.
        self.finished = threading.Event()
        self._listeners: list[StateListener] = []

    def set_listener(self, listener: StateListener) -> None:
        with self.lock:
            self._listeners = [listener]

    def set_state(self, new: AppState) -> None:
        """Change to `new`; IllegalStateError unless TRANSITIONS allow it."""
        with self.lock:
            old = self.state
            if new not in TRANSITIONS[old]:
                raise IllegalStateError(f"state change {old} -> {new} is not allowed")
            self.force_state(new)

    def force_state(self, new: AppState) -> None:
        """Change to `new` whatever the state is (a failure, the final state)."""
        with self.lock:
            old = self.state
            if old is new:
                return
            self.state = new
            listeners = list(self._listeners)
        log.info("app_state_changed", old=str(old), new=str(new))
        for listener in listeners:
            try:
                listener(new, old)
            except Exception as exc:
                log.warning("state_listener_failed", error=str(exc))

    def require_active(self, what: str) -> None:
        """IllegalStateError unless RUNNING or REBALANCING; `what` names the
        call in the message (`add_query()`)."""
        with self.lock:
            if self.state not in ACTIVE:
                raise IllegalStateError(f"{what} needs a running app, it is {self.state}")

    # --- the polling thread's hooks and the supervisor's end -----------------------

    def on_assigned(self) -> None:
        """Tasks assigned: REBALANCING -> RUNNING (polling thread)."""
        with self.lock:
            if self.state is AppState.REBALANCING:
                self.set_state(AppState.RUNNING)

    def on_revoking(self) -> None:
        """A rebalance began: RUNNING -> REBALANCING (polling thread)."""
        with self.lock:
            if self.state is AppState.RUNNING:
                self.set_state(AppState.REBALANCING)

    def finish(self, fatal_error: BaseException | None, stop_requested: bool) -> None:
        """The final state once every thread stopped (supervisor thread):
        ERROR if a failure was recorded or the polling thread ended with
        `fatal_error`, or ended without being asked to stop
        (`stop_requested` False: whatever ended it was lost), else
        NOT_RUNNING; then `finished` is set."""
        with self.lock:
            failure = self.failure or fatal_error
            if failure is None and not stop_requested:
                failure = RuntimeError(
                    "the polling thread stopped without being asked to and without "
                    "an error it could record; its log says what it did last"
                )
            if failure is not None:
                self.failure = failure
                if self.state is not AppState.PENDING_ERROR:
                    self.force_state(AppState.PENDING_ERROR)
                self.set_state(AppState.ERROR)
                log.error("app_failed", error=f"{type(failure).__name__}: {failure}")
            else:
                if self.state is not AppState.PENDING_SHUTDOWN:
                    self.force_state(AppState.PENDING_SHUTDOWN)
                self.set_state(AppState.NOT_RUNNING)
                log.info("app_closed")
        self.finished.set()
