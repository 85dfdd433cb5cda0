"""One child process of the daemon, spoken to over its stdin and stdout: `ChildProcess`.

The one way the codebase runs a child (`python -m runtime.isolation.child`):
a process-isolated named query (`QueryProcess`) and a processing process
of a daemon with `processes` > 1 (`runtime.isolation.workers`) are both
this. The protocol is JSON lines. The parent writes the spec line first,
then commands (`{"cmd": "stop"}`, `{"cmd": "pause"}`, ...) and requests
(`{"cmd": "request", "id": n, "op": ...}`, answered by the child's
`{"event": "reply", "id": n, "result": ...}` or `..."error": ...}`); the
child writes events (`started`, `status`, `failed`, `reply`). The child is
started in its own session (a terminal's Ctrl-C reaches the daemon only,
which then stops its children itself), shares the daemon's stderr (one log
stream), and closes gracefully when its stdin closes: the daemon gone,
even by kill -9, takes its children along.

Threads: `launch`, `wait_started`, `send`, `request`, `stop` from any thread
(one lock for the pipe); one reader thread per child calls `on_event` for
each event line and `on_exit` once when the child has exited.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import IO, Any

from runtime.logging import get_logger

log = get_logger("runtime.isolation")

EventListener = Callable[[dict[str, Any]], None]
# (code, failure, asked to stop, had started)
ExitHandler = Callable[[int, str | None, bool, bool], None]


class ChildProcess:
    """One child: start it with a spec line, read its events, ask it things, stop it.

    `name` names it in the log and the reader thread. `on_event` gets every
    event line but `reply` (the reader thread); `on_exit(code, failure,
    stopping)` is called once the child has exited: `failure` is what its
    last `failed` event said, `stopping` whether it was asked to stop.
    """

    def __init__(
        self,
        name: str,
        spec_line: str,
        on_event: EventListener | None = None,
        on_exit: ExitHandler | None = None,
    ) -> None:
        self.name = name
        self._spec_line = spec_line
        self._on_event = on_event
        self._on_exit = on_exit
        self._lock = threading.Lock()
        self._process: subprocess.Popen[str] | None = None
        self._started = threading.Event()
        self._exited = threading.Event()
        self._stopping = False
        self._started_ok = False  # its `started` event came
        self.failure: str | None = None
        self.exit_code: int | None = None
        self._ids = itertools.count(1)
        self._replies: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}

    @property
    def pid(self) -> int | None:
        """The running child's pid; None before the start and once it exited."""
        process = self._process
        return process.pid if process is not None and process.poll() is None else None

    @property
    def alive(self) -> bool:
        process = self._process
        return process is not None and process.poll() is None

    @property
    def stopping(self) -> bool:
        return self._stopping

    def launch(self) -> int:
        """Start the child and hand it its spec; its pid. Does not wait."""
        with self._lock:
            process = subprocess.Popen(
                [sys.executable, "-m", "runtime.isolation.child"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
                bufsize=1,
                start_new_session=True,
            )
            self._process = process
            assert process.stdin is not None and process.stdout is not None
            process.stdin.write(self._spec_line)
            process.stdin.flush()
            threading.Thread(
                target=self._read,
                args=(process, process.stdout),
                name=f"{self.name}-reader",
                daemon=True,
            ).start()
        return process.pid

    def wait_started(self, timeout: float) -> None:
        """Wait for the child's `started` event. Raises RuntimeError with the
        child's reason when it exited first (or is killed after `timeout`)."""
        if not self._started.wait(timeout):
            self.kill()
            raise RuntimeError(f"its process did not start within {timeout:.0f} s")
        if not self._started_ok:
            raise RuntimeError(self.failure or "its process exited")

    def _read(self, process: subprocess.Popen[str], stdout: IO[str]) -> None:
        for line in stdout:
            try:
                event: dict[str, Any] = json.loads(line)
            except ValueError:
                continue
            kind = event.get("event")
            if kind == "reply":
                waiter = self._replies.pop(int(event.get("id", 0)), None)
                if waiter is not None:
                    waiter[1].append(event)
                    waiter[0].set()
                continue
            if kind == "started":
                self._started_ok = True
                self._started.set()
            elif kind == "failed":
                self.failure = str(event.get("error"))
            if self._on_event is not None:
                self._on_event(event)
        code = process.wait()
        self.exit_code = code
        if not self._started_ok:
            self.failure = self.failure or f"its process exited with code {code}"
        self._exited.set()
        self._started.set()
        for event_, _ in list(self._replies.values()):
            event_.set()  # a request in flight gets no reply now
        log.info("child_process_exited", child=self.name, pid=process.pid, code=code)
        if self._on_exit is not None:
            self._on_exit(code, self.failure, self._stopping, self._started_ok)

    def wait(self, timeout: float | None = None) -> bool:
        """Wait until the child has exited (and its reader has seen it)."""
        return self._exited.wait(timeout)

    def send(self, command: str, **fields: Any) -> bool:
        """Write one command line; False if the child no longer reads them."""
        with self._lock:
            process = self._process
            if process is None or process.poll() is not None or process.stdin is None:
                return False
            try:
                process.stdin.write(json.dumps({"cmd": command, **fields}) + "\n")
                process.stdin.flush()
            except (BrokenPipeError, ValueError):  # it is exiting; the reader reports it
                return False
        return True

    def request(self, op: str, wait_s: float = 10.0, **fields: Any) -> Any:
        """Ask the child `op` (its arguments: `fields`) and wait for its
        reply's result. Raises RuntimeError (its error, it exited, no reply
        within `wait_s`)."""
        request_id = next(self._ids)
        done = threading.Event()
        box: list[dict[str, Any]] = []
        self._replies[request_id] = (done, box)
        if not self.send("request", id=request_id, op=op, **fields):
            self._replies.pop(request_id, None)
            raise RuntimeError(f"{self.name} is not running")
        if not done.wait(wait_s) or not box:
            self._replies.pop(request_id, None)
            if self._exited.is_set():
                raise RuntimeError(f"{self.name} exited")
            raise RuntimeError(f"{self.name} did not answer {op!r} within {wait_s:.0f} s")
        reply = box[0]
        if "error" in reply:
            raise RuntimeError(str(reply["error"]))
        return reply.get("result")

    def request_stop(self) -> None:
        """Ask the child to close gracefully (its final commit); no wait."""
        self._stopping = True
        self.send("stop")

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
            log.warning("child_process_killed", child=self.name, pid=process.pid)
            self.kill()
            return False

    def kill(self) -> None:
        process = self._process
        if process is None:
            return
        with contextlib.suppress(ProcessLookupError):
            process.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10.0)
