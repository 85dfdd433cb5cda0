"""A fake app behind the real admin server, and that server on its own loop thread.

For tests of the admin socket that need no Kafka: the socket, the line reader, the
limits and the handler are the real ones (`runtime.admin.server`, `handler`); only the app is
fake. `ServerThread` runs the server's asyncio loop on a daemon thread so tests can
talk to it with blocking sockets from the test's thread.
"""

from __future__ import annotations

import asyncio
import socket
import threading
from pathlib import Path
from types import TracebackType
from typing import Any

from runtime.admin.handler import AdminHandler
from runtime.admin.protocol import MAX_THREADS
from runtime.admin.server import AdminLimits, AdminServer
from runtime.status import AppStatus

STATUS: dict[str, Any] = {
    "application_id": "app",
    "state": "RUNNING",
    "threads": [],
    "tasks": [
        {"id": "0_0", "state": "RUNNING", "owner": None, "partitions": ["in-0"], "buffered": 0},
    ],
    "lag": {"in-0": 3},
    "total_lag": 3,
}


class FakeAdminApp:
    """Answers the handler's calls like `App`, instantly, without threads or Kafka.

    Thread-safe enough for the server's executor (a lock around the name list).
    """

    def __init__(self) -> None:
        self.state = "RUNNING"
        self._names = ["app-ProcessingThread-1"]
        self._lock = threading.Lock()
        self.shutdowns = 0

    def status(self) -> AppStatus:
        return AppStatus.from_dict(
            {**STATUS, "threads": [{"name": n, "alive": True} for n in self.processing_threads]}
        )

    @property
    def processing_threads(self) -> list[str]:
        with self._lock:
            return list(self._names)

    def add_processing_thread(self) -> str | None:
        with self._lock:
            name = f"app-ProcessingThread-{len(self._names) + 1}"
            self._names.append(name)
            return name

    def remove_processing_thread(self, timeout: float | None = None) -> str | None:
        with self._lock:
            return self._names.pop() if self._names else None

    def set_processing_threads(self, count: int, timeout: float | None = None) -> list[str]:
        with self._lock:
            self._names = [f"app-ProcessingThread-{i}" for i in range(1, count + 1)]
            return list(self._names)

    def pause(self, task_id: str | None = None) -> None:
        pass

    def resume(self, task_id: str | None = None) -> None:
        pass


class ServerThread:
    """A real `AdminServer` at `path` on its own event loop thread (a context manager)."""

    def __init__(
        self,
        path: Path,
        app: FakeAdminApp,
        limits: AdminLimits | None = None,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self.app = app
        handler = AdminHandler(app, shutdown=self._shutdown, max_threads=max_threads)
        self.server = AdminServer(str(path), handler, limits=limits)
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def _shutdown(self) -> None:
        self.app.shutdowns += 1

    def call(self, coro_fn: Any) -> Any:
        """Run `coro_fn()` on the server's loop; its result."""
        return asyncio.run_coroutine_threadsafe(coro_fn(), self.loop).result(10)

    def on_loop(self, fn: Any) -> Any:
        """`fn()` evaluated on the loop thread (to read server state safely)."""

        async def run() -> Any:
            return fn()

        return self.call(run)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self.call(self.server.start)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.call(self.server.stop)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


def connect(path: Path, timeout: float = 10.0) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(timeout)
    sock.connect(str(path))
    return sock


def read_replies(sock: socket.socket, count: int, buffer: bytearray | None = None) -> list[bytes]:
    """Exactly `count` reply lines (without newline); fails on EOF before that."""
    buffer = buffer if buffer is not None else bytearray()
    lines: list[bytes] = []
    while len(lines) < count:
        end = buffer.find(b"\n")
        if end >= 0:
            lines.append(bytes(buffer[:end]))
            del buffer[: end + 1]
            continue
        chunk = sock.recv(1 << 16)
        if not chunk:
            raise AssertionError(f"connection closed after {len(lines)} of {count} replies")
        buffer += chunk
    return lines
