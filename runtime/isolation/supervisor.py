"""The daemon's side of a process-isolated query (`query.<name>.isolation=process`).

`QueryProcess` starts the child (`python -m runtime.isolation.child`), reads
its event lines on a reader thread, forwards pause/resume and stops it. The
child's last status line is what `App.status()` reports for the query; a
child that exits on its own (its app failed, or it was killed) marks the
query FAILED through `on_exit`, and the daemon's other queries go on.

Threads: `start`, `stop`, `pause`, `resume`, `figures` from any thread (one
lock); the reader thread calls `on_exit` once, when a child that started
exits without being asked to (one that never started makes `start` raise).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

from runtime.isolation.plan import ChildSpec
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
    """One child process running one named query."""

    def __init__(self, spec: ChildSpec, on_exit: ExitListener) -> None:
        self.spec = spec
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._figures = ChildFigures()
        # Figures of earlier children of this query (a restart after a
        # failure starts counting at 0 again).
        self._carried = 0
        self._started = threading.Event()
        self._start_error: str | None = None
        self._stopping = False

    @property
    def pid(self) -> int | None:
        """The running child's pid; None before the start and once it exited."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def alive(self) -> bool:
        process = self._process
        return process is not None and process.poll() is None

    def start(self, timeout: float) -> None:
        """Start the child and wait until its app started. Raises RuntimeError
        with the child's reason when it could not start (it has exited then)."""
        with self._lock:
            if self.alive:
                return
            old = self._figures
            self._carried += old.processed
            self._figures = ChildFigures()
            self._started.clear()
            self._start_error = None
            self._stopping = False
            process = subprocess.Popen(
                [sys.executable, "-m", "runtime.isolation.child"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                # Its own session: a terminal's Ctrl-C reaches the daemon
                # only, which then stops the child itself (final commit,
                # no FAILED state for a child that merely obeyed SIGINT).
                start_new_session=True,
            )
            self._process = process
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(self.spec.to_line())
            process.stdin.flush()
            threading.Thread(
                target=self._read,
                args=(process, process.stdout),
                name=f"query-{self.spec.query}-reader",
                daemon=True,
            ).start()
        log.info("query_process_starting", query=self.spec.query, pid=process.pid)
        if not self._started.wait(timeout):
            self._kill(process)
            raise RuntimeError(
                f"query {self.spec.query!r}: its process did not start within {timeout:.0f} s"
            )
        if self._start_error is not None:
            raise RuntimeError(f"query {self.spec.query!r} could not start: {self._start_error}")

    def _read(self, process: subprocess.Popen[str], stdout: IO[str]) -> None:
        failure: str | None = None
        for line in stdout:
            try:
                event: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "status":
                self._figures = ChildFigures(
                    tasks=int(event.get("tasks", 0)),
                    processed=int(event.get("processed", 0)),
                    lag=int(event.get("lag", 0)),
                    busy_seconds=float(event.get("busy_seconds", 0.0)),
                    p99_latency_ms=event.get("p99_latency_ms"),
                )
            elif kind == "started":
                self._started.set()
            elif kind == "failed":
                failure = str(event.get("error"))
        code = process.wait()
        # Its tasks went with it; the counts stay (the next child adds to them).
        self._figures = dataclasses.replace(self._figures, tasks=0)
        log.info("query_process_exited", query=self.spec.query, pid=process.pid, code=code)
        if not self._started.is_set():
            # `start` reports this one (it raises with the reason).
            self._start_error = failure or f"its process exited with code {code}"
            self._started.set()
        elif not self._stopping:
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

    def _send(self, command: str) -> None:
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None or process.stdin is None:
                return
            try:
                process.stdin.write(json.dumps({"cmd": command}) + "\n")
                process.stdin.flush()
            except (BrokenPipeError, ValueError):  # it is exiting; the reader reports it
                pass

    def pause(self) -> None:
        self._send("pause")

    def resume(self) -> None:
        self._send("resume")

    def request_stop(self) -> None:
        """Ask the child to close gracefully (final commit); no wait."""
        with self._lock:
            self._stopping = True
        self._send("stop")

    def stop(self, timeout: float) -> bool:
        """`request_stop`, then wait; kill it after `timeout`. True if it
        stopped in time."""
        self.request_stop()
        process = self._process
        if process is None or process.poll() is not None:
            return True
        try:
            process.wait(timeout)
            return True
        except subprocess.TimeoutExpired:
            log.warning("query_process_killed", query=self.spec.query, pid=process.pid)
            self._kill(process)
            return False

    @staticmethod
    def _kill(process: subprocess.Popen[str]) -> None:
        process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10.0)
