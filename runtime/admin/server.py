"""The admin socket server: a Unix socket, its connections and their limits.

Each connection sends request lines (runtime.admin.protocol) and gets one
reply line per request, in order, including malformed ones and lines over the
buffer budget; the connection stays open. `AdminHandler`
(runtime.admin.handler) carries the requests out.

Limits (`AdminLimits`, from the `admin.socket.*` keys), so that no client can
take the daemon's memory or file descriptors: at most `max_connections`
clients at once (one more gets one "busy" error line and is closed; the
refusal is logged), at most `max_buffered_bytes` of unfinished request lines
across all clients (a line that would go over gets an error reply and is
dropped), and a client that sends no complete line for `idle_timeout_s` (or
does not read its replies for that long) is disconnected.

Threads: `AdminServer` lives on the admin loop's thread; it runs
`AdminHandler.handle_line`, which blocks (it calls into the `App`), on an
executor thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import stat
from collections.abc import AsyncGenerator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import Any

from runtime.admin.handler import AdminHandler
from runtime.admin.protocol import MAX_LINE_BYTES, encode_reply
from runtime.config import StreamsConfig
from runtime.logging import get_logger

__all__ = ["AdminLimits", "AdminServer", "AdminSocketError", "check_socket_path"]

log = get_logger("runtime.admin")

_UNIX_PATH_MAX = 107  # sun_path is 108 bytes, NUL included


class AdminSocketError(RuntimeError):
    """The admin socket cannot be created (path in use, too long, not a socket)."""


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
