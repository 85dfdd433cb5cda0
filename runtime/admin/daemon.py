"""The admin loop of `streams-runtime run`: signals, admin socket, metrics, exit code.

gunicorn's arbiter shape on asyncio: signal handlers (installed with
`loop.add_signal_handler`) only enqueue the signal's name; the loop takes events
off the queue one at a time and acts. Blocking `App` calls (close, removing a
thread, status for a scrape) run on the loop's executor threads, so the loop
stays responsive while, say, a processing thread finishes its batch.

    SIGTERM, SIGINT   graceful shutdown: `app.close()` (final commit), exit
    SIGTTIN           add a processing thread
    SIGTTOU           remove one (after its current batch)

`run_daemon(app)` returns when the app reaches NOT_RUNNING (exit code 0) or
ERROR (1), or when a graceful shutdown did not finish within
`shutdown.timeout.ms` (1). Threads: `run_daemon` must be called on the main
thread (signal handlers); `Daemon.request_shutdown` may be called from any.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import threading
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvloop

from runtime.admin.server import AdminHandler, AdminServer, AdminSocketError, check_socket_path
from runtime.config import StreamsConfig
from runtime.logging import get_logger
from runtime.metrics import MetricsServer

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "Daemon",
    "DaemonSetupError",
    "preflight",
    "run_daemon",
]

log = get_logger("runtime.admin")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)
_SHUTDOWN = "shutdown"  # the admin command, queued like a signal
_FINISHED = "finished"  # the app reached NOT_RUNNING or ERROR


class DaemonSetupError(RuntimeError):
    """The admin socket or the metrics endpoint cannot be set up (exit code 2)."""


def preflight(config: StreamsConfig) -> None:
    """Check, before `app.start()`, what would stop the daemon's set-up.

    A stale admin socket is removed; a live one (another daemon), a path that is
    not a socket or is too long, or a metrics address that cannot be bound
    raise DaemonSetupError. Called on the main thread by `streams-runtime run`.
    """
    if config.admin_socket is not None:
        try:
            check_socket_path(os.path.abspath(config.admin_socket))
        except AdminSocketError as exc:
            raise DaemonSetupError(str(exc)) from None
    if config.metrics_port:  # 0 (any free port) always binds
        try:
            infos = socket.getaddrinfo(
                config.metrics_host, config.metrics_port, type=socket.SOCK_STREAM
            )
            family, kind, proto, _, address = infos[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except OSError as exc:
            raise DaemonSetupError(
                f"cannot listen on metrics {config.metrics_host}:{config.metrics_port}: {exc}"
            ) from None


def run_daemon(app: Any, *, install_signals: bool = True) -> int:
    """Run the admin loop (uvloop) until the app stops; the process exit code.

    `app` must be started. With `install_signals` (the default) this must run on
    the main thread.
    """
    daemon = Daemon(app)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(daemon.run(install_signals=install_signals))
    except Exception:  # a bug in the admin loop must not leave the app running headless
        log.exception("daemon_failed")
        app.close()
        return EXIT_FAILED


class Daemon:
    """The admin loop's state. Lives on the loop thread, but `request_shutdown`."""

    def __init__(self, app: Any) -> None:
        self.app = app
        config: StreamsConfig = app.config
        self.config = config
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="admin")
        self.admin: AdminServer | None = None
        self.metrics: MetricsServer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._events: asyncio.Queue[str] | None = None
        self._closing = False
        self._exit_code: int | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # --- entry ---------------------------------------------------------------------

    async def run(self, install_signals: bool = True) -> int:
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._events = asyncio.Queue()
        loop.set_default_executor(self.executor)
        if install_signals:
            for sig in SIGNALS:
                loop.add_signal_handler(sig, self._events.put_nowait, sig.name)
        threading.Thread(target=self._watch_app, name="admin-watch", daemon=True).start()
        try:
            try:
                await self._start_servers()
            except DaemonSetupError as exc:
                log.error("daemon_setup_failed", error=str(exc))
                await loop.run_in_executor(None, self.app.close)
                return EXIT_BAD_INPUT
            log.info("daemon_ready", **self.describe())
            while self._exit_code is None:
                self._handle(await self._events.get())
            return self._exit_code
        finally:
            if install_signals:
                for sig in SIGNALS:
                    loop.remove_signal_handler(sig)
            await self._stop_servers()
            for task in list(self._tasks):
                task.cancel()
            self.executor.shutdown(wait=False, cancel_futures=True)

    def describe(self) -> dict[str, Any]:
        """Daemon facts for `status` and the logs: pid, socket path, metrics address."""
        return {
            "pid": os.getpid(),
            "admin_socket": self.admin.path if self.admin else None,
            "metrics": (
                {"host": self.metrics.host, "port": self.metrics.port, "url": self.metrics.url}
                if self.metrics
                else None
            ),
        }

    def request_shutdown(self) -> None:
        """Start a graceful shutdown, as SIGTERM does. Any thread; does not wait."""
        loop, events = self._loop, self._events
        if loop is not None and events is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(events.put_nowait, _SHUTDOWN)

    # --- events (loop thread) --------------------------------------------------------

    def _handle(self, event: str) -> None:
        if event == _FINISHED:
            state = str(self.app.state)
            self._exit_code = EXIT_OK if state == "NOT_RUNNING" else EXIT_FAILED
            log.info("daemon_exiting", state=state, exit_code=self._exit_code)
            return
        if event.startswith("SIG"):
            log.info("signal_received", signal=event)
        else:
            log.info("admin_request", request=event)
        if event in ("SIGTERM", "SIGINT", _SHUTDOWN):
            if self._closing:
                log.info("shutdown_already_in_progress")
            else:
                self._closing = True
                self._spawn(self._close())
        elif event == "SIGTTIN":
            self._spawn(self._add_thread())
        elif event == "SIGTTOU":
            self._spawn(self._remove_thread())

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _close(self) -> None:
        loop = asyncio.get_running_loop()
        closed = await loop.run_in_executor(None, self.app.close)
        if not closed and self._exit_code is None:
            log.error(
                "shutdown_timed_out",
                timeout_ms=self.config.shutdown_timeout_ms,
                state=str(self.app.state),
            )
            self._exit_code = EXIT_FAILED
            assert self._events is not None
            self._events.put_nowait("timeout")  # wakes the loop

    async def _add_thread(self) -> None:
        loop = asyncio.get_running_loop()
        name = await loop.run_in_executor(None, self.app.add_processing_thread)
        if name is None:
            log.warning("signal_thread_not_added", state=str(self.app.state))
        else:
            log.info("signal_thread_added", name=name)

    async def _remove_thread(self) -> None:
        loop = asyncio.get_running_loop()
        timeout = self.config.shutdown_timeout_ms / 1000.0
        try:
            name = await loop.run_in_executor(None, self.app.remove_processing_thread, timeout)
        except TimeoutError as exc:
            log.warning("signal_thread_remove_timed_out", error=str(exc))
            return
        if name is None:
            log.warning("signal_thread_not_removed", state=str(self.app.state))
        else:
            log.info("signal_thread_removed", name=name)

    def _watch_app(self) -> None:
        """Wake the loop when the app has finished (its own daemon thread)."""
        self.app.wait()
        loop, events = self._loop, self._events
        if loop is not None and events is not None:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(events.put_nowait, _FINISHED)

    # --- servers ----------------------------------------------------------------------

    async def _start_servers(self) -> None:
        config = self.config
        if config.admin_socket is not None:
            handler = AdminHandler(self.app, self.request_shutdown, self.describe)
            admin = AdminServer(config.admin_socket, handler)
            try:
                await admin.start()
            except AdminSocketError as exc:
                raise DaemonSetupError(str(exc)) from None
            self.admin = admin
        if config.metrics_port is not None:
            metrics = MetricsServer(self.app, config.metrics_host, config.metrics_port)
            try:
                await metrics.start()
            except OSError as exc:
                raise DaemonSetupError(
                    f"cannot listen on metrics {config.metrics_host}:{config.metrics_port}: {exc}"
                ) from None
            self.metrics = metrics

    async def _stop_servers(self) -> None:
        if self.admin is not None:
            await self.admin.stop()
        if self.metrics is not None:
            await self.metrics.stop()
