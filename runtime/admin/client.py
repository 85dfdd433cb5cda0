"""Client side of the admin socket, and the `streams-runtime admin` command.

`request(path, command, **arguments)` sends one request and returns its result
(raising `AdminCommandFailed` for an `{"ok": false}` reply); `AdminConnection`
keeps one connection for several requests. `format_*` (in
`runtime.admin.formatting`) render results as the tables the command prints;
`--json` prints the raw result instead.

Threads: everything here may be called from any thread; each connection is
used by one thread at a time.
"""

from __future__ import annotations

import json
import os
import socket
import sys
from collections.abc import Mapping
from typing import Any

from runtime.admin.formatting import (
    _format,
    format_status,
    format_tasks,
    format_threads,
)

__all__ = [
    "AdminCommandFailed",
    "AdminConnection",
    "AdminUnavailable",
    "format_status",
    "format_tasks",
    "format_threads",
    "locate_socket",
    "request",
    "resolve_socket",
    "run_admin",
]

SOCKET_ENV = "STREAMS_RUNTIME_ADMIN_SOCKET"
"""Same variable `load_config` maps to `admin.socket`: daemon and client agree."""

DEFAULT_TIMEOUT_S = 10.0
_MAX_REPLY_BYTES = 64 << 20


class AdminUnavailable(RuntimeError):
    """No daemon answers on the socket (absent, refused, closed, timed out)."""


class AdminCommandFailed(RuntimeError):
    """The daemon answered `{"ok": false, "error": ...}`."""


class AdminConnection:
    """One connection to the admin socket; `call` sends a request, waits for the reply."""

    def __init__(self, path: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._buffer = b""
        try:
            self._sock.connect(path)
        except FileNotFoundError:
            self._sock.close()
            raise AdminUnavailable(
                f"no admin socket at {path} (is the daemon running with admin.socket set?)"
            ) from None
        except OSError as exc:
            self._sock.close()
            raise AdminUnavailable(f"cannot connect to admin socket {path}: {exc}") from None

    def __enter__(self) -> AdminConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def send_line(self, line: bytes, timeout: float | None = None) -> dict[str, Any]:
        """Send raw bytes (a newline is added if missing) and return the parsed reply."""
        if not line.endswith(b"\n"):
            line += b"\n"
        if timeout is not None:
            self._sock.settimeout(timeout)
        try:
            self._sock.sendall(line)
            return self.read_reply()
        except TimeoutError:
            raise AdminUnavailable(f"no reply from {self.path} in time") from None
        except OSError as exc:
            raise AdminUnavailable(f"admin socket {self.path}: {exc}") from None

    def read_reply(self) -> dict[str, Any]:
        """Read one reply line; AdminUnavailable if the daemon closes first."""
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise AdminUnavailable(f"the daemon closed the connection on {self.path}")
            self._buffer += chunk
            if len(self._buffer) > _MAX_REPLY_BYTES:
                raise AdminUnavailable("reply too long")
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply = json.loads(line)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise AdminUnavailable(f"not an admin reply: {line[:200]!r}")
        return reply

    def call(self, command: str, timeout: float | None = None, **arguments: Any) -> Any:
        """The result of one command; raises AdminCommandFailed for an error reply."""
        payload = {"command": command, **arguments}
        reply = self.send_line(json.dumps(payload).encode(), timeout)
        if not reply["ok"]:
            raise AdminCommandFailed(str(reply.get("error")))
        return reply.get("result")


def _timeout_for(arguments: Mapping[str, Any], timeout: float) -> float:
    """Commands that wait for a thread's batch get their own timeout plus a margin."""
    waits = arguments.get("timeout")
    return max(timeout, float(waits) + 5.0) if isinstance(waits, int | float) else timeout


def request(path: str, command: str, timeout: float = DEFAULT_TIMEOUT_S, **arguments: Any) -> Any:
    """Send one command on a new connection and return its result."""
    with AdminConnection(path, _timeout_for(arguments, timeout)) as conn:
        return conn.call(command, **arguments)


APPLICATION_ID_ENV = "STREAMS_RUNTIME_APPLICATION_ID"
"""Same variable `load_config` maps to `application.id`."""

_OFF_WORDS = ("", "none")  # admin.socket values that turn the socket off (runtime.config)


def resolve_socket(explicit: str | None, config_path: str | None = None) -> str | None:
    """The socket path configured: `--socket`, else the env, else the config
    file's `admin.socket`; None if none is (or it is turned off)."""
    if explicit:
        return explicit
    from_env = os.environ.get(SOCKET_ENV)
    if from_env is not None:
        return None if _off(from_env) else from_env
    if config_path:
        value = _toml_value(_read_toml(config_path), "admin.socket")
        if isinstance(value, str) and not _off(value):
            return value
    return None


def _off(value: str) -> bool:
    return value.strip().lower() in _OFF_WORDS


def locate_socket(
    explicit: str | None, config_path: str | None = None, application_id: str | None = None
) -> str:
    """The socket `streams-runtime admin` talks to (issue 32): as configured
    (`resolve_socket`), else the daemon's default one (`runtime.admin.paths`)
    of `application_id` (`--application-id`, else the config file's or the
    env's application.id), else the only daemon answering there.

    Raises OSError/ValueError for a config file that cannot be read, and
    DefaultSocketError saying what was looked for (the socket turned off
    included). Main thread of the command.
    """
    from runtime.admin.paths import DefaultSocketError, find_default_socket

    configured = resolve_socket(explicit, config_path)
    if configured:
        return configured
    document = _read_toml(config_path) if config_path else {}
    socket_value = os.environ.get(SOCKET_ENV, _toml_value(document, "admin.socket"))
    if isinstance(socket_value, str) and _off(socket_value):
        raise DefaultSocketError(
            f"admin.socket is off ({socket_value!r}): the daemon opens no socket; set "
            "admin.socket to a path there and pass it with --socket"
        )
    app_id = application_id or _toml_value(document, "application.id")
    if not isinstance(app_id, str) or not app_id:
        app_id = os.environ.get(APPLICATION_ID_ENV) or None
    return find_default_socket(app_id)


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)


def _toml_value(table: Mapping[str, Any], key: str) -> Any:
    """`key` (dotted) of a TOML document, written as one key, as tables, or a
    mix (`"admin.socket" = ...`, `[admin] socket = ...`); None if absent."""
    if key in table:
        return table[key]
    parts = key.split(".")
    for i in range(1, len(parts)):
        head = ".".join(parts[:i])
        inner = table.get(head)
        if isinstance(inner, Mapping):
            found = _toml_value(inner, ".".join(parts[i:]))
            if found is not None:
                return found
    return None


# --- rendering ------------------------------------------------------------------------


def run_admin(
    socket_path: str | None,
    command: str,
    arguments: Mapping[str, Any],
    as_json: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> int:
    """The `streams-runtime admin` command: 0 ok, 1 failed or unreachable, 2 no socket."""
    if not socket_path:
        print(
            f"streams-runtime admin: no socket; pass --socket PATH, --config app.toml "
            f"(with admin.socket), --application-id ID or set {SOCKET_ENV}",
            file=sys.stderr,
        )
        return 2
    try:
        # Not `request(...)`: a command's own `timeout` argument (`threads
        # remove --wait`, `processes set --wait`) would collide with its
        # keyword.
        with AdminConnection(socket_path, _timeout_for(arguments, timeout)) as conn:
            result = conn.call(command, **arguments)
    except AdminUnavailable as exc:
        print(f"streams-runtime admin: {exc}", file=sys.stderr)
        return 1
    except AdminCommandFailed as exc:
        print(f"streams-runtime admin: {command}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_format(command, result))
        warning = result.get("warning") if isinstance(result, dict) else None
        if warning:
            # On stderr: the reply itself (stdout) is what scripts read.
            print(f"streams-runtime admin: warning: {warning}", file=sys.stderr)
    return 0
