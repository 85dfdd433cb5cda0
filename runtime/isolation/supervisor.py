"""The daemon's side of a process-isolated query (`query.<name>.isolation=process`).

`QueryProcess` starts the child (a `runtime.isolation.process.ChildProcess`,
the codebase's one way to run a child), takes its status lines, forwards
pause/resume and stops it. The
child's last status line is what `App.status()` reports for the query; a
child that exits on its own (its app failed, or it was killed) marks the
query FAILED through `on_exit`, and the daemon's other queries go on.

Threads: `start`, `stop`, `pause`, `resume`, `figures` from any thread (one
lock); the reader thread calls `on_exit` once, when a child that started
exits without being asked to (one that never started makes `start` raise).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.isolation.plan import ChildSpec
from runtime.isolation.process import ChildProcess
from runtime.logging import get_logger

log = get_logger("runtime.isolation")

ExitListener = Callable[[str, str], None]  # (query, why its child exited)


@dataclass(frozen=True)
class ChildFigures:
    """The child's last status line."""

    tasks: int = 0
    processed: int = 0
    lag: int = 0
    busy_seconds: float = 0.0
    p99_latency_ms: float | None = None


class QueryProcess:
    """One child process running one named query (a `ChildProcess`)."""

    def __init__(self, spec: ChildSpec, on_exit: ExitListener) -> None:
        self.spec = spec
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._child: ChildProcess | None = None
        self._figures = ChildFigures()
        # Figures of earlier children of this query (a restart after a
        # failure starts counting at 0 again).
        self._carried = 0

    @property
    def pid(self) -> int | None:
        """The running child's pid; None before the start and once it exited."""
        child = self._child
        return child.pid if child is not None else None

    @property
    def alive(self) -> bool:
        child = self._child
        return child is not None and child.alive

    def start(self, timeout: float) -> None:
        """Start the child and wait until its app started. Raises RuntimeError
        with the child's reason when it could not start (it has exited then)."""
        with self._lock:
            if self.alive:
                return
            self._carried += self._figures.processed
            self._figures = ChildFigures()
            child = ChildProcess(
                f"query-{self.spec.query}", self.spec.to_line(), self._event, self._exited
            )
            self._child = child
            pid = child.launch()
        log.info("query_process_starting", query=self.spec.query, pid=pid)
        try:
            child.wait_started(timeout)
        except RuntimeError as exc:
            raise RuntimeError(f"query {self.spec.query!r} could not start: {exc}") from None

    def _event(self, event: dict[str, Any]) -> None:
        if event.get("event") == "status":
            self._figures = ChildFigures(
                tasks=int(event.get("tasks", 0)),
                processed=int(event.get("processed", 0)),
                lag=int(event.get("lag", 0)),
                busy_seconds=float(event.get("busy_seconds", 0.0)),
                p99_latency_ms=event.get("p99_latency_ms"),
            )

    def _exited(self, code: int, failure: str | None, stopping: bool, started: bool) -> None:
        # Its tasks went with it; the counts stay (the next child adds to them).
        self._figures = dataclasses.replace(self._figures, tasks=0)
        # One that never started: `start` raises with the reason instead.
        if started and not stopping:
            self._on_exit(self.spec.query, failure or f"its process exited with code {code}")

    def figures(self) -> ChildFigures:
        figures = self._figures
        if not self._carried:
            return figures
        return ChildFigures(
            figures.tasks,
            figures.processed + self._carried,
            figures.lag,
            figures.busy_seconds,
            figures.p99_latency_ms,
        )

    def pause(self) -> None:
        if self._child is not None:
            self._child.send("pause")

    def resume(self) -> None:
        if self._child is not None:
            self._child.send("resume")

    def request_stop(self) -> None:
        """Ask the child to close gracefully (final commit); no wait."""
        if self._child is not None:
            self._child.request_stop()

    def stop(self, timeout: float) -> bool:
        """`request_stop`, then wait; kill it after `timeout`. True if it
        stopped in time."""
        child = self._child
        if child is None:
            return True
        stopped = child.stop(timeout)
        if not stopped:
            log.warning("query_process_killed", query=self.spec.query)
        return stopped
