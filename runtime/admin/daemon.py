"""The admin loop of `streams-runtime run`: signals, admin socket, metrics, exit code.

gunicorn's arbiter shape on asyncio: signal handlers (installed with
`loop.add_signal_handler`) only enqueue the signal's name; the loop takes events
off the queue one at a time and acts. Blocking `App` calls (close, removing a
thread, status for a scrape) run on the loop's executor threads, so the loop
stays responsive while, say, a processing thread finishes its batch.

    SIGTERM, SIGINT   graceful shutdown: `app.close()` (final commit), exit
    SIGTTIN           add a processing thread
    SIGTTOU           remove one (after its current batch)

With `processing.threads.autoscale`, the loop also runs the `Autoscaler` every
`AutoscalePolicy.interval_s`: it reads one status snapshot and may add or remove
one thread, logging every decision (`autoscale_decision`) with its reason.

`run_daemon(app)` returns when the app reaches NOT_RUNNING (exit code 0) or
ERROR (1), or when a graceful shutdown did not finish within
`shutdown.timeout.ms` (1). So SIGTERM and SIGINT once running exit 0 (a
graceful close with its final commit). Signals from before the loop existed
(`runtime.admin.signals.StartupSignals`: recorded while `App.start()` ran)
are acted on as the loop starts, as if they had just arrived; when the loop
ends, the handlers it replaced are put back (uvloop would leave the default
ones: a late SIGTERM killing the process with no line, a late SIGINT a
KeyboardInterrupt traceback).

The admin socket (issue 32): `admin.socket` as configured, or, unset, a
default path (`runtime.admin.paths`) that `preflight` chooses before the app
starts and `streams-runtime admin` finds by itself; the log says where
(`admin_socket_listening`, `admin_socket_default`). `admin.socket=none`: none.

File descriptors (issue 31): the metrics endpoint's connection cap is lowered
(logged) if it and the admin socket's would together exceed a quarter of the
open-files limit (`_FD_SHARE`), so that the app's own files (RocksDB,
checkpoints, Kafka sockets) always have room. What `run` does before the app
starts (the admin socket path, the metrics address, raising the open-files
limit) is runtime.admin.preflight; the autoscaler's decisions are
runtime.admin.autoscaler.

Threads: `run_daemon` must be called on the main thread (signal handlers);
`Daemon.request_shutdown` may be called from any.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import threading
import time
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvloop

from runtime.admin.autoscaler import AutoscalePolicy, Autoscaler
from runtime.admin.handler import AdminHandler
from runtime.admin.preflight import DaemonSetupError, open_files_limit
from runtime.admin.server import AdminLimits, AdminServer, AdminSocketError
from runtime.admin.signals import SHUTDOWN_SIGNALS, StartupSignals
from runtime.config import StreamsConfig
from runtime.logging import get_logger
from runtime.metrics import MetricsLimits, MetricsServer

__all__ = [
    "EXIT_BAD_INPUT",
    "EXIT_FAILED",
    "EXIT_OK",
    "Daemon",
    "run_daemon",
]

log = get_logger("runtime.admin")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2

SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)
_SHUTDOWN = "shutdown"  # the admin command, queued like a signal
_FINISHED = "finished"  # the app reached NOT_RUNNING or ERROR
_WAKE = "wake"  # re-check the exit code (set by a task)
_CLOSE_TASK = "close"  # the name of the graceful-shutdown task
# The endpoints' clients (metrics and admin socket) may hold at most this
# share of the open-files limit; the rest stays with the app's own files.
_FD_SHARE = 4


_FROM_CONFIG = "<from config>"


def run_daemon(
    app: Any,
    *,
    install_signals: bool = True,
    signals: StartupSignals | None = None,
    admin_socket: str | None = _FROM_CONFIG,
) -> int:
    """Run the admin loop (uvloop) until the app stops; the process exit code.

    `app` must be started. With `install_signals` (the default) this must run on
    the main thread. `signals`: what handled the signals until now (its
    recorded signals are acted on at once, and its handlers are put back at
    the end). `admin_socket`: the path `preflight` chose (None: no socket);
    left out, `admin.socket` as configured (unset: none).
    """
    daemon = Daemon(app, signals, admin_socket)
    try:
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            return runner.run(daemon.run(install_signals=install_signals))
    except Exception:  # a bug in the admin loop must not leave the app running headless
        log.exception("daemon_failed")
        app.close()
        return EXIT_FAILED


class Daemon:
    """The admin loop's state. Loop thread only, but `request_shutdown` (any thread)."""

    def __init__(
        self,
        app: Any,
        signals: StartupSignals | None = None,
        admin_socket: str | None = _FROM_CONFIG,
    ) -> None:
        self.app = app
        self._signals = signals
        config: StreamsConfig = app.config
        self.config = config
        # Where the admin socket goes (None: nowhere); `preflight` chose it.
        self.admin_socket = (
            (config.admin_socket or None) if admin_socket == _FROM_CONFIG else admin_socket
        )
        self.executor = ThreadPoolExecutor(max_workers=8, thread_name_prefix="admin")
        # Admin socket requests get their own workers: a client's slow
        # `threads remove` must never delay the daemon's own close().
        self.socket_executor = ThreadPoolExecutor(max_workers=4, thread_name_prefix="admin-socket")
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
        previous: dict[signal.Signals, Any] = {}
        if install_signals:
            for sig in SIGNALS:
                previous[sig] = signal.getsignal(sig)
                loop.add_signal_handler(sig, self._on_signal, sig)
            if self._signals is not None:
                # Signals from start-up (App.start() was running), in order,
                # as if they arrived now: a SIGTERM there closes the app.
                for sig in self._signals.take():
                    self._on_signal(sig)
        threading.Thread(target=self._watch_app, name="admin-watch", daemon=True).start()
        try:
            try:
                await self._start_servers()
            except DaemonSetupError as exc:
                log.error("daemon_setup_failed", error=str(exc))
                await loop.run_in_executor(None, self.app.close)
                return EXIT_BAD_INPUT
            log.info("daemon_ready", **self.describe())
            if self.config.processing_threads_autoscale:
                self._spawn(self._autoscale(AutoscalePolicy.from_config(self.config)), "autoscale")
            while self._exit_code is None:
                self._handle(await self._events.get())
            return self._exit_code
        finally:
            if install_signals:
                for sig in SIGNALS:
                    loop.remove_signal_handler(sig)
                    # uvloop leaves SIG_DFL (SIGINT: KeyboardInterrupt)
                    # behind; a signal in the microseconds between these two
                    # calls still meets it. None: not set from Python.
                    if previous.get(sig) is not None:
                        signal.signal(sig, previous[sig])
            await self._stop_servers()
            for task in list(self._tasks):
                task.cancel()
            self.executor.shutdown(wait=False, cancel_futures=True)
            self.socket_executor.shutdown(wait=False, cancel_futures=True)

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

    def _on_signal(self, sig: signal.Signals) -> None:
        """A signal arrived (loop thread): queue it as an event."""
        if sig in SHUTDOWN_SIGNALS and self._signals is not None:
            self._signals.shutdown_requested(sig)
        assert self._events is not None
        self._events.put_nowait(sig.name)

    def request_shutdown(self) -> None:
        """Start a graceful shutdown, as SIGTERM does. Any thread; does not wait."""
        loop, events = self._loop, self._events
        if loop is not None and events is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(events.put_nowait, _SHUTDOWN)

    # --- events (loop thread) --------------------------------------------------------

    def _handle(self, event: str) -> None:
        if event == _WAKE:
            return
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
                self._spawn(self._close(), _CLOSE_TASK)
        elif self._closing:
            # Resizing an app that is closing would race its close (both run
            # in the executor): a SIGTTIN/SIGTTOU then changes nothing.
            log.info("signal_ignored_while_closing", signal=event)
        elif event == "SIGTTIN":
            self._spawn(self._add_thread(), "add-thread")
        elif event == "SIGTTOU":
            self._spawn(self._remove_thread(), "remove-thread")

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> None:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        """Log a task's error (never "Task exception was never retrieved"); a failed
        shutdown ends the daemon with exit code 1 instead of PENDING_SHUTDOWN forever."""
        self._tasks.discard(task)
        if task.cancelled():
            return
        exc = task.exception()
        if exc is None:
            return
        log.error(
            "daemon_task_failed",
            task=task.get_name(),
            error=f"{type(exc).__name__}: {exc}",
            state=str(self.app.state),
        )
        if task.get_name() == _CLOSE_TASK and self._exit_code is None:
            self._exit_code = EXIT_FAILED
            if self._events is not None:
                self._events.put_nowait(_WAKE)

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
            self._events.put_nowait(_WAKE)

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

    async def _autoscale(self, policy: AutoscalePolicy) -> None:
        """Every `policy.interval_s`: one snapshot, at most one thread added or removed."""
        loop = asyncio.get_running_loop()
        scaler = Autoscaler(policy)
        log.info(
            "autoscale_enabled",
            min=policy.min_threads,
            max=policy.max_threads,
            interval_s=policy.interval_s,
        )
        while not self._closing:
            await asyncio.sleep(policy.interval_s)
            status = await loop.run_in_executor(None, self.app.status)
            decision = scaler.observe(status, time.monotonic())
            if decision is None or self._closing:
                continue
            log.info(
                "autoscale_decision", action=decision.action, reason=decision.reason,
                **decision.facts,
            )  # fmt: skip
            try:
                if decision.action == "add":
                    name = await loop.run_in_executor(None, self.app.add_processing_thread)
                else:
                    timeout = self.config.shutdown_timeout_ms / 1000.0
                    name = await loop.run_in_executor(
                        None, self.app.remove_processing_thread, timeout
                    )
            except Exception as exc:
                log.warning("autoscale_failed", action=decision.action, error=repr(exc))
                continue
            log.info("autoscale_done", action=decision.action, name=name)

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
        # The metrics endpoint first: a client that reaches the admin socket
        # may ask `status`, which names the metrics address.
        if config.metrics_port is not None:
            # A daemon with processes > 1 serves its processes' metrics
            # merged (runtime.isolation.pool_metrics); an App, its own.
            own_registry = getattr(self.app, "metrics_registry", None)
            metrics = MetricsServer(
                self.app,
                config.metrics_host,
                config.metrics_port,
                registry=own_registry() if callable(own_registry) else None,
                limits=self._metrics_limits(),
            )
            try:
                await metrics.start()
            except OSError as exc:
                raise DaemonSetupError(
                    f"cannot listen on metrics {config.metrics_host}:{config.metrics_port}: {exc}"
                ) from None
            self.metrics = metrics
        if self.admin_socket is not None:
            handler = AdminHandler(
                self.app,
                self.request_shutdown,
                self.describe,
                max_threads=config.processing_threads_limit,
            )
            admin = AdminServer(
                self.admin_socket,
                handler,
                executor=self.socket_executor,
                limits=AdminLimits.from_config(config),
            )
            try:
                await admin.start()
            except AdminSocketError as exc:
                raise DaemonSetupError(str(exc)) from None
            self.admin = admin
            if not config.admin_socket:  # the default path: say how to use it
                log.info(
                    "admin_socket_default",
                    path=admin.path,
                    use="streams-runtime admin status (it finds this socket by itself; with "
                    "several daemons here add --application-id "
                    f"{config.application_id})",
                )

    def _metrics_limits(self) -> MetricsLimits:
        """`metrics.*` limits, the connection cap lowered if need be so that
        the endpoints' clients hold at most 1/`_FD_SHARE` of the open-files
        limit (what the admin socket may hold counts against it)."""
        config = self.config
        limits = MetricsLimits.from_config(config)
        open_files = open_files_limit()
        admin = config.admin_socket_max_connections if self.admin_socket is not None else 0
        allowed = max(1, open_files // _FD_SHARE - admin)
        if limits.max_connections <= allowed:
            return limits
        log.warning(
            "metrics_max_connections_lowered",
            configured=limits.max_connections,
            max_connections=allowed,
            open_files_limit=open_files,
            admin_socket_max_connections=admin,
            reason=f"the endpoints' clients may hold 1/{_FD_SHARE} of the open-files limit",
        )
        return dataclasses.replace(limits, max_connections=allowed)

    async def _stop_servers(self) -> None:
        if self.admin is not None:
            await self.admin.stop()
        if self.metrics is not None:
            await self.metrics.stop()
