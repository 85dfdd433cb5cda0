"""The admin protocol and its Unix socket server.

Protocol: newline-delimited JSON over a Unix stream socket. Each request is one
line holding a JSON object, `{"command": "<name>", ...arguments}`; each reply is
one line, `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`.
Every line gets exactly one reply, in order, including malformed ones (not
JSON, not an object, unknown command, wrong argument, longer than
`MAX_LINE_BYTES`); the connection stays open. Several clients may be connected
at once. Commands and their arguments are in `COMMANDS`.

Threads: `parse_request` and `AdminHandler` may be called from any thread;
`AdminHandler.handle_line` blocks (it calls into the `App`), so the server runs
it on an executor thread. `AdminServer` lives on the admin loop's thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import socket
import stat
from collections.abc import AsyncIterator, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from runtime.logging import get_logger

__all__ = [
    "COMMANDS",
    "MAX_LINE_BYTES",
    "AdminHandler",
    "AdminServer",
    "AdminSocketError",
    "CommandError",
    "ProtocolError",
    "check_socket_path",
    "Request",
    "encode_reply",
    "parse_request",
]

log = get_logger("runtime.admin")

MAX_LINE_BYTES = 1 << 20
"""Longest request line accepted (1 MiB, newline excluded)."""

MAX_THREADS = 1024
"""Upper bound for `threads.set`: a typo must not start a million threads."""

DEFAULT_REMOVE_TIMEOUT_S = 30.0
_MAX_TIMEOUT_S = 3600.0
_TASK_ID = re.compile(r"\d+_\d+")
_UNIX_PATH_MAX = 107  # sun_path is 108 bytes, NUL included


class ProtocolError(ValueError):
    """A request line that is not a valid request (the reply says why)."""


class CommandError(RuntimeError):
    """A valid request the app could not carry out (the reply says why)."""


class AdminSocketError(RuntimeError):
    """The admin socket cannot be created (path in use, too long, not a socket)."""


# --- requests ------------------------------------------------------------------


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"'timeout' must be a number of seconds, got {_show(value)}")
    if not math.isfinite(value) or not 0 <= value <= _MAX_TIMEOUT_S:
        raise ProtocolError(f"'timeout' must be between 0 and {_MAX_TIMEOUT_S:g} seconds")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"'count' must be an integer, got {_show(value)}")
    if not 0 <= value <= MAX_THREADS:
        raise ProtocolError(f"'count' must be between 0 and {MAX_THREADS}, got {value}")
    return value


def _task(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _TASK_ID.fullmatch(value):
        raise ProtocolError(
            f"'task' must be a task id such as \"0_1\" (or null for all), got {_show(value)}"
        )
    return value


@dataclass(frozen=True)
class Argument:
    parse: Callable[[Any], Any]
    required: bool = False


COMMANDS: Mapping[str, Mapping[str, Argument]] = {
    "status": {},
    "tasks": {},
    "threads": {},
    "threads.add": {},
    "threads.remove": {"timeout": Argument(_timeout)},
    "threads.set": {"count": Argument(_count, required=True), "timeout": Argument(_timeout)},
    "pause": {"task": Argument(_task)},
    "resume": {"task": Argument(_task)},
    "shutdown": {},
}
"""Command name -> its arguments (name -> validator). Unknown arguments are errors."""


@dataclass(frozen=True)
class Request:
    command: str
    args: dict[str, Any] = field(default_factory=dict)


def _show(value: Any, limit: int = 60) -> str:
    """A short repr for error messages (requests may be up to 1 MiB)."""
    text = json.dumps(value, default=repr) if not isinstance(value, bytes) else repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_request(line: bytes | str) -> Request:
    """Validate one request line (without or with its newline). Raises ProtocolError."""
    if isinstance(line, bytes):
        if len(line.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            raise ProtocolError(f"request longer than {MAX_LINE_BYTES} bytes")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("request is not UTF-8") from None
    else:
        text = line
    if not text.strip():
        raise ProtocolError('empty request; send a JSON object such as {"command": "status"}')
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"request is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"request must be a JSON object, got {type(message).__name__}")
    command = message.get("command")
    if not isinstance(command, str):
        raise ProtocolError('request needs a "command" string, e.g. {"command": "status"}')
    spec = COMMANDS.get(command)
    if spec is None:
        known = ", ".join(COMMANDS)
        raise ProtocolError(f"unknown command {_show(command)}; known: {known}")
    args: dict[str, Any] = {}
    for name, value in message.items():
        if name == "command":
            continue
        argument = spec.get(name)
        if argument is None:
            allowed = ", ".join(spec) or "none"
            raise ProtocolError(
                f"unexpected argument {_show(name)} for {command!r} (arguments: {allowed})"
            )
        args[name] = argument.parse(value)
    for name, argument in spec.items():
        if argument.required and name not in args:
            raise ProtocolError(f"{command!r} needs the argument {name!r}")
    return Request(command, args)


def encode_reply(reply: Mapping[str, Any]) -> bytes:
    """One reply as one line of ASCII JSON (newlines inside strings are escaped)."""
    try:
        text = json.dumps(reply, separators=(",", ":"), default=str, allow_nan=False)
    except (ValueError, TypeError) as exc:
        text = json.dumps({"ok": False, "error": f"reply not encodable as JSON: {exc}"})
    return text.encode("ascii") + b"\n"


# --- dispatch --------------------------------------------------------------------


def task_rows(status: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The status's tasks, each with `lag`: the summed lag of its input partitions."""
    lag = status.get("lag") or {}
    rows = []
    for task in status.get("tasks", []):
        row = dict(task)
        row["lag"] = sum(int(lag.get(p, 0)) for p in task.get("partitions", []))
        rows.append(row)
    return rows


class AdminHandler:
    """Carries out admin requests on an `App`. Any thread; its methods block.

    `shutdown` is called (from the handling thread) for the `shutdown` command
    and must only start the shutdown, not wait for it. `extra_status` adds
    daemon facts (socket path, metrics address, pid) to the `status` result.
    """

    def __init__(
        self,
        app: Any,
        shutdown: Callable[[], None] | None = None,
        extra_status: Callable[[], Mapping[str, Any]] | None = None,
    ) -> None:
        self._app = app
        self._shutdown = shutdown
        self._extra_status = extra_status

    def handle_line(self, line: bytes | str) -> dict[str, Any]:
        """Parse and carry out one request line; the reply. Never raises."""
        try:
            request = parse_request(line)
        except ProtocolError as exc:
            return {"ok": False, "error": str(exc)}
        try:
            return {"ok": True, "result": self.handle(request)}
        except (CommandError, ValueError, TimeoutError) as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:
            log.warning("admin_command_failed", command=request.command, error=repr(exc))
            return {"ok": False, "error": f"{request.command} failed: {type(exc).__name__}: {exc}"}

    def handle(self, request: Request) -> Any:
        """Carry out one parsed request; its result. Raises CommandError."""
        app = self._app
        command, args = request.command, request.args
        if command == "status":
            status = dict(app.status())
            status["tasks"] = task_rows(status)
            if self._extra_status is not None:
                status["daemon"] = dict(self._extra_status())
            return status
        if command == "tasks":
            return {"tasks": task_rows(app.status())}
        if command == "threads":
            return {"names": app.processing_threads, "threads": app.status()["threads"]}
        if command == "threads.add":
            added = app.add_processing_thread()
            if added is None:
                raise CommandError(f"cannot add a processing thread: the app is {app.state}")
            log.info("admin_thread_added", name=added)
            return {"added": added, "names": app.processing_threads}
        if command == "threads.remove":
            removed = app.remove_processing_thread(args.get("timeout", DEFAULT_REMOVE_TIMEOUT_S))
            if removed is None:
                state = str(app.state)
                if state in ("RUNNING", "REBALANCING"):
                    raise CommandError("no processing thread to remove")
                raise CommandError(f"cannot remove a processing thread: the app is {state}")
            log.info("admin_thread_removed", name=removed)
            return {"removed": removed, "names": app.processing_threads}
        if command == "threads.set":
            names = app.set_processing_threads(args["count"], args.get("timeout"))
            log.info("admin_threads_set", count=args["count"], names=len(names))
            return {"names": list(names)}
        if command in ("pause", "resume"):
            task = args.get("task")
            getattr(app, command)(task)
            known = None if task is None else any(t["id"] == task for t in app.status()["tasks"])
            return {command + "d": task or "all", "assigned": known}
        if command == "shutdown":
            if self._shutdown is None:
                raise CommandError("shutdown is not available here")
            self._shutdown()
            return {"state": str(app.state)}
        raise CommandError(f"command {command!r} is not implemented")  # COMMANDS and this differ


# --- the socket server -------------------------------------------------------------


class _TooLong:
    """Marks a request line that exceeded MAX_LINE_BYTES (its bytes were dropped)."""


_TOO_LONG = _TooLong()


async def read_lines(
    reader: asyncio.StreamReader, limit: int = MAX_LINE_BYTES
) -> AsyncIterator[bytes | _TooLong]:
    """Yield request lines (without newline); `_TOO_LONG` once per over-long line.

    Memory stays bounded by `limit`: the rest of an over-long line is discarded
    up to its newline. A last line without newline is yielded at EOF.
    """
    buffer = bytearray()
    discarding = False
    while True:
        chunk = await reader.read(65536)
        if not chunk:
            if buffer and not discarding:
                yield bytes(buffer)
            return
        start = 0
        while (end := chunk.find(b"\n", start)) >= 0:
            if discarding:
                discarding = False
            else:
                buffer += chunk[start:end]
                yield _TOO_LONG if len(buffer) > limit else bytes(buffer)
            buffer.clear()
            start = end + 1
        if not discarding:
            buffer += chunk[start:]
            if len(buffer) > limit:
                buffer.clear()
                discarding = True
                yield _TOO_LONG


def check_socket_path(path: str) -> None:
    """Remove a stale socket at `path`; refuse a live one or a non-socket file."""
    if len(os.fsencode(path)) > _UNIX_PATH_MAX:
        raise AdminSocketError(
            f"admin.socket path is too long for a Unix socket ({len(os.fsencode(path))} "
            f"bytes, at most {_UNIX_PATH_MAX}): {path}"
        )
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise AdminSocketError(f"admin.socket {path} exists and is not a socket")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        probe.connect(path)
    except OSError:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)  # nobody listens: a leftover of a process that died
        log.info("admin_socket_stale_removed", path=path)
        return
    finally:
        probe.close()
    raise AdminSocketError(f"another process is listening on admin.socket {path}")


def _bind_private(path: str) -> socket.socket:
    """A listening socket at `path` with mode 0600, never visible with a wider mode.

    Binds under a temporary name, restricts it, then renames it into place;
    falls back to bind-then-chmod when the temporary name would be too long.
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        temp = f"{path}.{os.getpid()}.tmp"
        if len(os.fsencode(temp)) <= _UNIX_PATH_MAX:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            sock.bind(temp)
            os.chmod(temp, 0o600)
            os.replace(temp, path)
        else:
            sock.bind(path)
            os.chmod(path, 0o600)
        sock.listen(64)
        sock.setblocking(False)
    except OSError as exc:
        sock.close()
        raise AdminSocketError(f"cannot create admin.socket {path}: {exc}") from exc
    return sock


class AdminServer:
    """The admin socket: accepts clients, one task each (admin loop thread only)."""

    def __init__(self, path: str, handler: AdminHandler, executor: Executor | None = None) -> None:
        self.path = os.path.abspath(path)
        self._handler = handler
        self._executor = executor
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self) -> None:
        """Create the socket (mode 0600), replacing a stale one. Raises AdminSocketError."""
        check_socket_path(self.path)
        sock = _bind_private(self.path)
        self._inode = os.stat(self.path).st_ino
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        log.info("admin_socket_listening", path=self.path)

    async def stop(self) -> None:
        """Stop accepting, close client connections, remove the socket file."""
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        try:
            if os.stat(self.path).st_ino == self._inode:  # still ours, not a successor's
                os.unlink(self.path)
        except FileNotFoundError:
            pass
        log.info("admin_socket_closed", path=self.path)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        loop = asyncio.get_running_loop()
        self._writers.add(writer)
        try:
            async for line in read_lines(reader):
                if isinstance(line, _TooLong):
                    reply: dict[str, Any] = {
                        "ok": False,
                        "error": f"request longer than {MAX_LINE_BYTES} bytes",
                    }
                else:
                    reply = await loop.run_in_executor(
                        self._executor, self._handler.handle_line, line
                    )
                writer.write(encode_reply(reply))
                await writer.drain()
        except ConnectionError:
            pass
        except Exception as exc:  # a bug here must not take the daemon down
            log.warning("admin_connection_failed", error=repr(exc))
        finally:
            self._writers.discard(writer)
            writer.close()
