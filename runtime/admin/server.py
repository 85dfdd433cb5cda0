"""The admin protocol and its Unix socket server.

Protocol: newline-delimited JSON over a Unix stream socket. Each request is one
line holding a JSON object, `{"command": "<name>", ...arguments}`; each reply is
one line, `{"ok": true, "result": ...}` or `{"ok": false, "error": "..."}`.
Every line gets exactly one reply, in order, including malformed ones (not
JSON, not an object, nested too deep, unknown command, wrong argument, longer
than `MAX_LINE_BYTES`, over the buffer budget); the connection stays open.
Commands and their arguments are in `COMMANDS`.

Limits (`AdminLimits`, from the `admin.socket.*` keys), so that no client can
take the daemon's memory or file descriptors: at most `max_connections`
clients at once (one more gets one "busy" error line and is closed; the
refusal is logged), at most `max_buffered_bytes` of unfinished request lines
across all clients (a line that would go over gets an error reply and is
dropped), and a client that sends no complete line for `idle_timeout_s` (or
does not read its replies for that long) is disconnected.

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
from collections.abc import AsyncGenerator, Callable, Mapping
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from runtime.config import QUERY_SETTINGS, StreamsConfig
from runtime.config_values import THREADS_CEILING
from runtime.logging import get_logger
from runtime.status import NO_PROCESSING_THREADS, AppStatus

__all__ = [
    "COMMANDS",
    "MAX_LINE_BYTES",
    "MAX_THREADS",
    "AdminHandler",
    "AdminLimits",
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

MAX_THREADS = THREADS_CEILING
"""Upper bound for `threads.set` in any config; the daemon's own bound is
`processing.threads.limit` (`AdminHandler(max_threads=...)`)."""

DEFAULT_REMOVE_TIMEOUT_S = 30.0
_MAX_TIMEOUT_S = 3600.0
_TASK_ID = re.compile(r"(?:[A-Za-z0-9_-]{1,64}__)?\d+_\d+")
_QUERY_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")
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


def _query(value: Any) -> str:
    if not isinstance(value, str) or not _QUERY_NAME.fullmatch(value):
        raise ProtocolError(
            f"'name' must be a query name (1-64 letters, digits, '_' or '-'), got {_show(value)}"
        )
    return value


def _target(value: Any) -> str:
    if not isinstance(value, str) or not _TARGET.fullmatch(value):
        raise ProtocolError(f"'target' must be MODULE:ATTR, got {_show(value)}")
    return value


def _int_in(name: str, low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ProtocolError(
                f"{name!r} must be an integer from {low} to {high}, got {_show(value)}"
            )
        return value

    return parse


def _isolation(value: Any) -> str:
    choices = QUERY_SETTINGS["isolation"].choices
    if value not in choices:
        shown = " or ".join(repr(c) for c in choices)
        raise ProtocolError(f"'isolation' must be {shown}, got {_show(value)}")
    return str(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"'reset' must be true or false, got {_show(value)}")
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
    "queries": {},
    "query.add": {
        "target": Argument(_target, required=True),
        "name": Argument(_query, required=True),
        "priority": Argument(_int_in("priority", -1000, 1000)),
        "weight": Argument(_int_in("weight", 1, 10000)),
        "max_threads": Argument(_int_in("max_threads", 1, MAX_THREADS)),
        "isolation": Argument(_isolation),
        "timeout": Argument(_timeout),
    },
    "query.remove": {
        "name": Argument(_query, required=True),
        "reset": Argument(_flag),
        "timeout": Argument(_timeout),
    },
    "query.pause": {"name": Argument(_query, required=True)},
    "query.resume": {"name": Argument(_query, required=True)},
    "shutdown": {},
    "prepare-leave": {},
}
"""Command name -> its arguments (name -> validator). Unknown arguments are errors."""


@dataclass(frozen=True)
class Request:
    command: str
    args: dict[str, Any] = field(default_factory=dict)


def _show(value: Any, limit: int = 60) -> str:
    """A short repr for error messages (requests may be up to 1 MiB).

    A value nested nearly as deep as `json.loads` allows can be too deep to
    encode again on a thread with a few more frames (RecursionError): then
    only its type is shown.
    """
    if isinstance(value, bytes):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=repr)
        except (RecursionError, ValueError, TypeError):
            text = f"a deeply nested {type(value).__name__}"
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
    except (ValueError, TypeError, RecursionError) as exc:
        text = json.dumps({"ok": False, "error": f"reply not encodable as JSON: {exc}"})
    return text.encode("ascii") + b"\n"


# --- dispatch --------------------------------------------------------------------


def task_rows(status: AppStatus) -> list[dict[str, Any]]:
    """The status's tasks as JSON rows, each with `lag`: the summed lag of its
    input partitions."""
    rows = status.to_dict()["tasks"]
    for row, task in zip(rows, status.tasks, strict=True):
        row["lag"] = sum(status.lag.get(p, 0) for p in task.partitions)
    return rows


class AdminHandler:
    """Carries out admin requests on an `App`. Any thread; its methods block.

    `shutdown` is called (from the handling thread) for the `shutdown` command
    and must only start the shutdown, not wait for it. `extra_status` adds
    daemon facts (socket path, metrics address, pid) to the `status` result.
    `max_threads` bounds `threads.set` (the daemon passes
    `processing.threads.limit`).
    """

    def __init__(
        self,
        app: Any,
        shutdown: Callable[[], None] | None = None,
        extra_status: Callable[[], Mapping[str, Any]] | None = None,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self._app = app
        self._shutdown = shutdown
        self._extra_status = extra_status
        self._max_threads = max_threads

    def handle_line(self, line: bytes | str) -> dict[str, Any]:
        """Parse and carry out one request line; the reply. Never raises."""
        try:
            request = parse_request(line)
        except ProtocolError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # e.g. RecursionError: still one reply, the line's own
            log.warning("admin_request_unparsable", error=repr(exc)[:200])
            return {"ok": False, "error": f"request not understood: {type(exc).__name__}"}
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
            snapshot: AppStatus = app.status()
            reply = snapshot.to_dict()
            reply["tasks"] = task_rows(snapshot)
            if self._extra_status is not None:
                reply["daemon"] = dict(self._extra_status())
            return reply
        if command == "tasks":
            snapshot = app.status()
            reply = {"tasks": task_rows(snapshot)}
            if snapshot.placement is not None:
                reply["placement"] = snapshot.placement
            return reply
        if command == "prepare-leave":
            try:
                app.prepare_leave()
            except Exception as exc:  # IllegalStateError: wrong mode or state
                raise CommandError(str(exc)) from None
            return {"leaving": True}
        if command == "threads":
            return {"names": app.processing_threads, "threads": app.status().to_dict()["threads"]}
        if command == "threads.add":
            if len(app.processing_threads) >= self._max_threads:
                raise CommandError(self._limit_reached())
            added = app.add_processing_thread()
            if added is None:
                if str(app.state) in ("RUNNING", "REBALANCING"):
                    raise CommandError(self._limit_reached())
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
            return _warn_without_threads({"removed": removed, "names": app.processing_threads})
        if command == "threads.set":
            if args["count"] > self._max_threads:
                raise CommandError(
                    f"'count' {args['count']} is above processing.threads.limit "
                    f"({self._max_threads})"
                )
            names = app.set_processing_threads(args["count"], args.get("timeout"))
            log.info("admin_threads_set", count=args["count"], names=len(names))
            return _warn_without_threads({"names": list(names)})
        if command in ("pause", "resume"):
            task = args.get("task")
            getattr(app, command)(task)
            known = None if task is None else any(t.id == task for t in app.status().tasks)
            return {command + "d": task or "all", "assigned": known}
        if command == "queries" or command.startswith("query."):
            return self._query_command(command, args)
        if command == "shutdown":
            if self._shutdown is None:
                raise CommandError("shutdown is not available here")
            self._shutdown()
            return {"state": str(app.state)}
        raise CommandError(f"command {command!r} is not implemented")  # COMMANDS and this differ

    def _query_command(self, command: str, args: Mapping[str, Any]) -> Any:
        """`queries` and `query.*` (named queries, runtime.query_control).

        `query.add` imports MODULE:ATTR in the daemon's process, as `run` did
        for the app's own topology: whoever may use the admin socket may run
        code as the daemon (the socket is a Unix socket; mind its mode).
        """
        from runtime.topology.errors import TopologyError
        from runtime.topology.loading import load_topology

        app = self._app
        try:
            if command == "query.add":
                topology = load_topology(args["target"])
                app.add_query(
                    args["name"],
                    topology,
                    priority=args.get("priority"),
                    weight=args.get("weight"),
                    max_threads=args.get("max_threads"),
                    timeout=args.get("timeout", 60.0),
                    source=args["target"],
                    isolation=args.get("isolation"),
                )
                log.info("admin_query_added", query=args["name"], target=args["target"])
            elif command == "query.remove":
                app.remove_query(
                    args["name"], reset=args.get("reset", False), timeout=args.get("timeout", 60.0)
                )
                log.info("admin_query_removed", query=args["name"])
            elif command == "query.pause":
                app.pause_query(args["name"])
            elif command == "query.resume":
                app.resume_query(args["name"])
        except (TopologyError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        return {"queries": [dict(q) for q in app.status().to_dict()["queries"]]}

    def _limit_reached(self) -> str:
        return f"processing.threads.limit ({self._max_threads}) threads are running already"


def _warn_without_threads(reply: dict[str, Any]) -> dict[str, Any]:
    """`reply` with a `warning` when no processing thread is left: the app
    then reads input and processes none, and `streams-runtime admin` prints
    the warning (the app logs `no_processing_threads` too)."""
    if not reply.get("names"):
        reply["warning"] = NO_PROCESSING_THREADS
    return reply


# --- the socket server -------------------------------------------------------------


class _TooLong:
    """Marks a request line that exceeded MAX_LINE_BYTES (its bytes were dropped)."""


class _OverBudget:
    """Marks a request line dropped because all clients' unfinished lines together
    reached `AdminLimits.max_buffered_bytes`."""


_TOO_LONG = _TooLong()
_OVER_BUDGET = _OverBudget()

_READ_CHUNK = 65536


class ByteBudget:
    """Bytes of unfinished request lines held across all connections.

    Loop thread only (no lock: every `take`/`give` runs on the admin loop).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.used = 0

    def take(self, n: int) -> bool:
        """Reserve `n` more bytes; False (nothing reserved) if that would exceed the total."""
        if self.used + n > self.total:
            return False
        self.used += n
        return True

    def give(self, n: int) -> None:
        self.used -= n


async def read_lines(
    reader: asyncio.StreamReader,
    limit: int = MAX_LINE_BYTES,
    budget: ByteBudget | None = None,
    idle_timeout: float | None = None,
) -> AsyncGenerator[bytes | _TooLong | _OverBudget, None]:
    """Yield request lines (without newline); a marker once per dropped line.

    Memory stays bounded: an over-long line (`_TOO_LONG`) or one that would
    take `budget` over its total (`_OVER_BUDGET`) is discarded up to its
    newline. A last line without newline is yielded at EOF. With
    `idle_timeout`, raises TimeoutError when no line has been completed for
    that many seconds (counted from the start, or from when the consumer asked
    for the next line): a client trickling bytes without ever ending a line
    is idle too. Complete lines inside one read are not counted against
    `budget` (at most one read, 64 KiB, per connection).
    """
    loop = asyncio.get_running_loop()
    budget = budget if budget is not None else ByteBudget(1 << 62)
    buffer = bytearray()
    reserved = 0  # bytes of `buffer` counted in `budget`
    discarding = False
    deadline = None if idle_timeout is None else loop.time() + idle_timeout

    def drop() -> None:
        nonlocal reserved
        buffer.clear()
        budget.give(reserved)
        reserved = 0

    try:
        while True:
            if deadline is None:
                chunk = await reader.read(_READ_CHUNK)
            else:
                remaining = deadline - loop.time()
                if remaining <= 0:
                    raise TimeoutError("no complete request line")
                chunk = await asyncio.wait_for(reader.read(_READ_CHUNK), remaining)
            if not chunk:
                if buffer and not discarding:
                    line = bytes(buffer)
                    drop()
                    yield line
                return
            start = 0
            while (end := chunk.find(b"\n", start)) >= 0:
                if discarding:
                    discarding = False
                else:
                    buffer += chunk[start:end]
                    item: bytes | _TooLong = _TOO_LONG if len(buffer) > limit else bytes(buffer)
                    drop()
                    yield item
                    if idle_timeout is not None:
                        deadline = loop.time() + idle_timeout
                start = end + 1
            if discarding or start == len(chunk):
                continue
            buffer += chunk[start:]
            marker: _TooLong | _OverBudget | None = None
            if len(buffer) > limit:
                marker = _TOO_LONG
            elif budget.take(len(buffer) - reserved):
                reserved = len(buffer)
            else:
                marker = _OVER_BUDGET
            if marker is not None:
                drop()
                discarding = True
                yield marker
                if idle_timeout is not None:
                    deadline = loop.time() + idle_timeout
    finally:
        budget.give(reserved)


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

    Binds under a temporary name, restricts it, listens, then renames it into
    place: whoever sees the path can connect (a client waiting for the file to
    appear was refused when the rename came before `listen`). Falls back to
    bind-then-chmod-then-listen when the temporary name would be too long
    (there, a connect right after the file appears can still be refused).
    """
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        temp = f"{path}.{os.getpid()}.tmp"
        if len(os.fsencode(temp)) <= _UNIX_PATH_MAX:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(temp)
            sock.bind(temp)
            os.chmod(temp, 0o600)
            sock.listen(64)
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


@dataclass(frozen=True)
class AdminLimits:
    """What the admin socket holds at most (see the module doc); `admin.socket.*` keys."""

    max_connections: int = 32
    max_buffered_bytes: int = 8 << 20
    idle_timeout_s: float = 300.0

    @classmethod
    def from_config(cls, config: StreamsConfig) -> AdminLimits:
        return cls(
            max_connections=config.admin_socket_max_connections,
            max_buffered_bytes=config.admin_socket_max_buffered_bytes,
            idle_timeout_s=config.admin_socket_idle_timeout_ms / 1000.0,
        )


_REFUSAL_LOG_INTERVAL_S = 10.0  # a flood of refused clients logs one line per interval


class AdminServer:
    """The admin socket: accepts clients, one task each (admin loop thread only).

    `executor` runs the (blocking) handler calls; give it one of its own, so
    that slow admin commands never delay the daemon's own work (a shutdown).
    """

    def __init__(
        self,
        path: str,
        handler: AdminHandler,
        executor: Executor | None = None,
        limits: AdminLimits | None = None,
    ) -> None:
        self.path = os.path.abspath(path)
        self.limits = limits or AdminLimits()
        self._handler = handler
        self._executor = executor
        self._server: asyncio.AbstractServer | None = None
        self._inode: int | None = None
        self._writers: set[asyncio.StreamWriter] = set()
        self._budget = ByteBudget(self.limits.max_buffered_bytes)
        self.refused_total = 0
        self._refused_unlogged = 0
        self._refusal_logged_at: float | None = None

    @property
    def connections(self) -> int:
        """Clients connected now (refused ones excluded)."""
        return len(self._writers)

    @property
    def buffered_bytes(self) -> int:
        """Bytes of unfinished request lines held now, across all clients."""
        return self._budget.used

    async def start(self) -> None:
        """Create the socket (mode 0600), replacing a stale one. Raises AdminSocketError."""
        check_socket_path(self.path)
        sock = _bind_private(self.path)
        self._inode = os.stat(self.path).st_ino
        self._server = await asyncio.start_unix_server(self._serve, sock=sock)
        log.info(
            "admin_socket_listening",
            path=self.path,
            max_connections=self.limits.max_connections,
            max_buffered_bytes=self.limits.max_buffered_bytes,
            idle_timeout_s=self.limits.idle_timeout_s,
        )

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
        if len(self._writers) >= self.limits.max_connections:
            await self._refuse(writer)
            return
        self._writers.add(writer)
        idle = self.limits.idle_timeout_s
        abort = False
        try:
            lines = read_lines(reader, MAX_LINE_BYTES, self._budget, idle)
            async with contextlib.aclosing(lines):
                async for line in lines:
                    reply = await self._reply_to(line)
                    writer.write(encode_reply(reply))
                    # A client that does not read its replies is idle as well.
                    await asyncio.wait_for(writer.drain(), idle)
        except TimeoutError:
            log.info("admin_connection_idle_closed", idle_timeout_s=idle)
            # close() would wait to flush replies the client is not reading.
            abort = True
        except ConnectionError:
            pass
        except Exception as exc:  # a bug here must not take the daemon down
            log.warning("admin_connection_failed", error=repr(exc)[:300])
        finally:
            self._writers.discard(writer)
            if abort:
                writer.transport.abort()
            else:
                writer.close()

    async def _reply_to(self, line: bytes | _TooLong | _OverBudget) -> dict[str, Any]:
        if isinstance(line, _TooLong):
            return {"ok": False, "error": f"request longer than {MAX_LINE_BYTES} bytes"}
        if isinstance(line, _OverBudget):
            return {
                "ok": False,
                "error": (
                    "admin socket buffers are full (admin.socket.max.buffered.bytes = "
                    f"{self.limits.max_buffered_bytes} across all clients); request dropped, "
                    "try again"
                ),
            }
        loop = asyncio.get_running_loop()
        try:
            reply: dict[str, Any] = await loop.run_in_executor(
                self._executor, self._handler.handle_line, line
            )
        except Exception as exc:  # handle_line never raises; an executor shut down may
            log.warning("admin_request_failed", error=repr(exc)[:300])
            reply = {"ok": False, "error": f"request failed: {type(exc).__name__}"}
        return reply

    async def _refuse(self, writer: asyncio.StreamWriter) -> None:
        """Tell one client over the connection cap that the socket is busy, then close."""
        self.refused_total += 1
        self._refused_unlogged += 1
        now = asyncio.get_running_loop().time()
        if (
            self._refusal_logged_at is None
            or now - self._refusal_logged_at >= _REFUSAL_LOG_INTERVAL_S
        ):
            log.warning(
                "admin_connection_refused",
                reason="admin.socket.max.connections reached",
                connections=len(self._writers),
                max_connections=self.limits.max_connections,
                refused=self._refused_unlogged,
                refused_total=self.refused_total,
            )
            self._refusal_logged_at = now
            self._refused_unlogged = 0
        busy = {
            "ok": False,
            "error": (
                f"admin socket busy: {len(self._writers)} clients connected "
                "(admin.socket.max.connections); try again later"
            ),
        }
        try:
            writer.write(encode_reply(busy))
            await asyncio.wait_for(writer.drain(), 1.0)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()
