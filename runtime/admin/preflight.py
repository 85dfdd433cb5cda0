"""What `streams-runtime run` checks and prepares before the app starts:
the admin socket path, the metrics address, the open-files limit.

`preflight(config)` raises DaemonSetupError (exit code 2) for what would stop
the daemon's set-up later: a live admin socket (another daemon), a path that
is not a socket or is too long, a metrics address that cannot be bound,
`processing.threads.min` above `.max`. With `admin.socket` unset it picks the
default path (`runtime.admin.paths`, issue 32).

File descriptors (issue 31): `raise_open_files_limit` raises the soft
RLIMIT_NOFILE to the hard limit before the app opens anything;
`open_files_limit` is what the daemon sizes its endpoints' connection caps by.

Threads: the main thread, before the app's threads start (`open_files_limit`:
any).
"""

from __future__ import annotations

import os
import resource
import socket

from runtime.admin.paths import DefaultSocketError, choose_default_socket
from runtime.admin.server import AdminSocketError, check_socket_path
from runtime.config import StreamsConfig
from runtime.logging import get_logger

__all__ = [
    "DaemonSetupError",
    "open_files_limit",
    "preflight",
    "raise_open_files_limit",
]

log = get_logger("runtime.admin")

_NR_OPEN_FALLBACK = 1 << 20  # Linux's default fs.nr_open


class DaemonSetupError(RuntimeError):
    """The admin socket or the metrics endpoint cannot be set up (exit code 2)."""


def preflight(config: StreamsConfig) -> str | None:
    """Check, before `app.start()`, what would stop the daemon's set-up; the
    admin socket path the daemon will listen on (None: no socket).

    A stale admin socket is removed; a live one (another daemon), a path that is
    not a socket or is too long, or a metrics address that cannot be bound
    raise DaemonSetupError. With `admin.socket` unset the path is the default
    one (`runtime.admin.paths.choose_default_socket`; its directory is made if
    missing); when none can be used the daemon runs without a socket, which
    is logged (`admin_socket_unavailable`), rather than not at all. Called on
    the main thread by `streams-runtime run`; pass the path to `run_daemon`.
    """
    if config.processing_threads_autoscale and (
        config.processing_threads_min > config.processing_threads_max
    ):
        raise DaemonSetupError(
            f"processing.threads.min ({config.processing_threads_min}) is above "
            f"processing.threads.max ({config.processing_threads_max})"
        )
    path: str | None = None
    if config.admin_socket:
        path = os.path.abspath(config.admin_socket)
        try:
            check_socket_path(path)
        except AdminSocketError as exc:
            raise DaemonSetupError(str(exc)) from None
    elif config.admin_socket is None:
        path = _default_socket(config.application_id)
    if config.metrics_port:  # 0 (any free port) always binds
        try:
            infos = socket.getaddrinfo(
                config.metrics_host, config.metrics_port, type=socket.SOCK_STREAM
            )
            family, kind, proto, _, address = infos[0]
            with socket.socket(family, kind, proto) as probe:
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                probe.bind(address)
        except (OSError, UnicodeError) as exc:  # UnicodeError: a name IDNA cannot encode
            raise DaemonSetupError(
                f"cannot listen on metrics {config.metrics_host}:{config.metrics_port}: {exc}"
            ) from None
    return path


def _default_socket(application_id: str) -> str | None:
    """The default admin socket path (issue 32), a stale socket there removed;
    None, logged, when there is none to use."""
    try:
        path = choose_default_socket(application_id)
        check_socket_path(path)  # a daemon that started since: the next try is ours
    except (DefaultSocketError, AdminSocketError) as exc:
        log.warning(
            "admin_socket_unavailable",
            reason=str(exc),
            hint="set admin.socket to a path in a directory of your own, or admin.socket=none",
        )
        return None
    return path


def raise_open_files_limit() -> int:
    """Raise the soft RLIMIT_NOFILE to the hard limit; the soft limit in force.

    Main thread, before the app opens anything. Why: a Linux soft limit is
    often 1024 while the hard one is far higher (systemd's 524288); RocksDB's
    files, the Kafka clients' sockets, checkpoints and the endpoints' clients
    all draw on it, and whichever meets EMFILE first fails (issue 31: a
    checkpoint write). Nothing in the process uses select() (FD_SETSIZE 1024),
    so a higher limit is safe. A limit that cannot be raised is kept, logged.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard
    if hard == resource.RLIM_INFINITY:  # Linux takes at most fs.nr_open
        try:
            with open("/proc/sys/fs/nr_open") as f:
                target = int(f.read())
        except (OSError, ValueError):
            target = _NR_OPEN_FALLBACK
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (OSError, ValueError) as exc:
            log.warning("open_files_limit_not_raised", soft=soft, hard=hard, error=str(exc))
            return soft
        log.info("open_files_limit_raised", soft=target, was=soft, hard=hard)
        return target
    return soft


def open_files_limit() -> int:
    """The soft RLIMIT_NOFILE in force (unlimited: what Linux takes at most)."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return _NR_OPEN_FALLBACK if soft == resource.RLIM_INFINITY else soft
