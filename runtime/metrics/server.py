"""The HTTP endpoint: `/metrics`, `/healthz`, `/readyz`, with a connection cap.

`MetricsServer` answers `GET /metrics` (Prometheus text format),
`/healthz` (200 unless the app is in ERROR: the process is up and not failed)
and `/readyz` (200 only while RUNNING) with a minimal HTTP/1.1 handler on an
asyncio loop. The daemon runs it on its admin loop (no extra thread);
`start_metrics_server` runs it on a background thread for embedded apps.

Limits (`MetricsLimits`, from the `metrics.*` keys), so that no client can take
the process's file descriptors (issue 31: 1,100 idle connections exhausted
them and the app died writing a checkpoint): at most `max_connections`
connections at once, and a client that has not sent its whole request head
within `idle_timeout_s` of connecting (a slowloris client trickling a request
line it never finishes), or leaves its response unread that long, is cut off.
At the cap a new connection evicts the oldest one still waiting for its
request head, so idle or slow clients cannot lock out a real scrape (which
sends its request at once); only when every slot is busy answering is the new
connection refused (`503`, closed). Refusals, evictions and timeouts are
logged at most once per 10 s, with counts. Concurrent `/metrics` requests
share one `generate_latest` run, so a flood of scrapes costs one status
snapshot at a time and takes at most one executor thread.

Threads: `MetricsServer` belongs to the loop it was started on;
`BackgroundMetricsServer.close` may be called from any other thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, generate_latest

from runtime.logging import get_logger
from runtime.metrics.families import make_registry

if TYPE_CHECKING:
    from runtime.config import StreamsConfig

log = get_logger("runtime.metrics")

# The classic text format every Prometheus version parses (generate_latest writes it
# for names like ours; newer prometheus-client versions advertise 1.0.0 by default).
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
_MAX_HEADER_LINES = 100
_LINE_LIMIT_BYTES = 16 * 1024  # the StreamReader's limit: one request or header line
_REPORT_INTERVAL_S = 10.0  # a flood of refused, evicted or timed-out clients: one line per 10 s
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_BUSY_BODY = b"metrics endpoint busy: every connection is answering; try again\n"
_BUSY = (
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\n"
    b"Content-Length: %d\r\nConnection: close\r\n\r\n%s" % (len(_BUSY_BODY), _BUSY_BODY)
)


@dataclass(frozen=True)
class MetricsLimits:
    """What the metrics endpoint holds at most (see the module doc); `metrics.*` keys.

    The defaults are what `start_metrics_server` uses for embedded apps.
    """

    max_connections: int = 64
    """Connections open at once. Each holds one file descriptor and at most
    about 32 KiB of read buffer (twice the 16 KiB line limit)."""
    idle_timeout_s: float = 10.0
    """How long a client has to send its whole request head after connecting,
    and again to take its whole response; then it is cut off."""

    @classmethod
    def from_config(cls, config: StreamsConfig) -> MetricsLimits:
        return cls(
            max_connections=config.metrics_max_connections,
            idle_timeout_s=config.metrics_idle_timeout_ms / 1000.0,
        )


class MetricsServer:
    """`/metrics`, `/healthz`, `/readyz` on an asyncio server (its loop's thread only).

    `port` 0 picks a free port; after `start()`, `port` is the real one.
    Scrapes call `app.status()` on `executor` (None: the loop's default), one
    at a time whatever the number of clients. `limits`: see `MetricsLimits`.
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        registry: CollectorRegistry | None = None,
        executor: Executor | None = None,
        limits: MetricsLimits | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.registry = registry if registry is not None else make_registry(app)
        self.limits = limits or MetricsLimits()
        self._executor = executor
        self._server: asyncio.AbstractServer | None = None
        # Connections still waiting for their request head, oldest first (a
        # dict keeps insertion order): the ones a new connection may evict.
        self._waiting: dict[asyncio.StreamWriter, None] = {}
        # Connections whose request is being answered: never evicted, they
        # end within `idle_timeout_s` of their response being written.
        self._answering: set[asyncio.StreamWriter] = set()
        self._scrape: asyncio.Future[bytes] | None = None
        self.refused_total = 0
        self.evicted_total = 0
        self.timed_out_total = 0
        self._unreported: Counter[str] = Counter()
        self._reported_at: float | None = None
        self._report_later: asyncio.TimerHandle | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    @property
    def connections(self) -> int:
        """Client connections open now (refused ones excluded)."""
        return len(self._waiting) + len(self._answering)

    async def start(self) -> None:
        """Listen; raises OSError if the address is taken or invalid."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=_LINE_LIMIT_BYTES, reuse_address=True
        )
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info(
            "metrics_listening",
            host=self.host,
            port=self.port,
            url=self.url + "/metrics",
            max_connections=self.limits.max_connections,
            idle_timeout_s=self.limits.idle_timeout_s,
        )

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        # Open connections would keep wait_closed() waiting (Python 3.12+).
        for writer in [*self._waiting, *self._answering]:
            writer.transport.abort()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)
        if self._report_later is not None:
            self._report_later.cancel()
        self._report(force=True)

    def state(self) -> str:
        return str(self.app.state)

    async def respond(self, method: str, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        """(status, content type, body, extra headers) for one request."""
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, text, b"method not allowed\n", {"Allow": "GET, HEAD"}
        if path == "/metrics":
            return 200, CONTENT_TYPE, await self._exposition(), {}
        if path == "/healthz":
            state = self.state()
            return (503 if state == "ERROR" else 200), text, f"{state}\n".encode(), {}
        if path == "/readyz":
            state = self.state()
            return (200 if state == "RUNNING" else 503), text, f"{state}\n".encode(), {}
        return 404, text, b"not found; try /metrics, /healthz or /readyz\n", {}

    async def _exposition(self) -> bytes:
        """The `/metrics` body. Requests that arrive while one is being made
        share it: a flood of scrapes then costs one status snapshot at a time
        and holds at most one executor thread (the daemon's close runs on the
        same executor), for a body at most one generation old."""
        running = self._scrape
        if running is None:
            loop = asyncio.get_running_loop()
            running = loop.run_in_executor(self._executor, generate_latest, self.registry)
            self._scrape = running
            running.add_done_callback(self._scrape_done)
        # shield: a client that goes away must not cancel the others' scrape.
        return await asyncio.shield(running)

    def _scrape_done(self, future: asyncio.Future[bytes]) -> None:
        if self._scrape is future:
            self._scrape = None
        if not future.cancelled():
            future.exception()  # retrieved: the awaiters (if any) report it

    # --- connections (loop thread) ----------------------------------------------

    def _admit(self, writer: asyncio.StreamWriter) -> bool:
        """Take a new connection within `max_connections`; False: refuse it.

        At the cap, the oldest connection still waiting for its request head
        is cut off to make room. Why not refuse the newcomer, as the admin
        socket does: idle clients would then hold every slot and lock real
        scrapes out for as long as they like (reconnecting as they are timed
        out). A scrape sends its request at once, so it is answered unless
        `max_connections` newer connections arrive before its request does.
        """
        if self.connections >= self.limits.max_connections:
            if not self._waiting:  # every slot answers a request: they end soon
                self.refused_total += 1
                self._note("refused")
                return False
            oldest = next(iter(self._waiting))
            del self._waiting[oldest]
            oldest.transport.abort()  # its descriptor is freed now, not after a flush
            self.evicted_total += 1
            self._note("evicted")
        self._waiting[writer] = None
        return True

    def _note(self, kind: str) -> None:
        self._unreported[kind] += 1
        self._report()

    def _report(self, force: bool = False) -> None:
        """Log what the limits did since the last line, at most once per
        `_REPORT_INTERVAL_S` (a flood must not flood the log as well); what
        comes sooner is logged when the interval is over."""
        if not self._unreported:
            return
        now = time.monotonic()
        if (
            not force
            and self._reported_at is not None
            and now - self._reported_at < _REPORT_INTERVAL_S
        ):
            if self._report_later is None and self._server is not None:
                wait = self._reported_at + _REPORT_INTERVAL_S - now
                self._report_later = asyncio.get_running_loop().call_later(wait, self._report_due)
            return
        log.warning(
            "metrics_connections_limited",
            refused=self._unreported["refused"],
            evicted=self._unreported["evicted"],
            timed_out=self._unreported["timed_out"],
            connections=self.connections,
            max_connections=self.limits.max_connections,
            idle_timeout_s=self.limits.idle_timeout_s,
            refused_total=self.refused_total,
            evicted_total=self.evicted_total,
            timed_out_total=self.timed_out_total,
        )
        self._unreported.clear()
        self._reported_at = now

    def _report_due(self) -> None:
        self._report_later = None
        self._report()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if not self._admit(writer):
            writer.write(_BUSY)  # a fresh socket's send buffer takes it at once
            if writer.transport.get_write_buffer_size():
                writer.transport.abort()  # it did not: no descriptor waits on a flush
            else:
                writer.close()
            return
        timeout = self.limits.idle_timeout_s
        abort = False
        try:
            try:
                request = await asyncio.wait_for(_read_request(reader), timeout)
            except TimeoutError:  # no whole request head in time: slowloris or idle
                self.timed_out_total += 1
                self._note("timed_out")
                abort = True
                return
            if writer not in self._waiting:  # evicted meanwhile (and aborted)
                return
            del self._waiting[writer]
            self._answering.add(writer)
            extra: dict[str, str]
            if request is None:
                status, ctype, body, extra = 400, "text/plain", b"bad request\n", {}
                method = "GET"
            else:
                method, path = request
                try:
                    status, ctype, body, extra = await self.respond(method, path)
                except Exception as exc:
                    log.warning("metrics_scrape_failed", error=repr(exc))
                    status, ctype, body, extra = 500, "text/plain", b"scrape failed\n", {}
            head = [
                f"HTTP/1.1 {status} {_REASONS.get(status, '')}",
                f"Content-Type: {ctype}",
                f"Content-Length: {len(body)}",
                "Connection: close",
                *(f"{k}: {v}" for k, v in extra.items()),
            ]
            # drain() then waits until the kernel has taken every byte, so the
            # close below frees the descriptor at once: a client that reads
            # nothing cannot keep the connection (uncounted) behind a flush.
            writer.transport.set_write_buffer_limits(high=0)
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            try:
                await asyncio.wait_for(writer.drain(), timeout)
            except TimeoutError:  # the response was not taken in time
                self.timed_out_total += 1
                self._note("timed_out")
                abort = True
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:
            log.warning("metrics_connection_failed", error=repr(exc))
        finally:
            self._waiting.pop(writer, None)
            self._answering.discard(writer)
            if abort:
                writer.transport.abort()
            else:
                writer.close()


async def _read_request(reader: asyncio.StreamReader) -> tuple[str, str] | None:
    """(method, path) of an HTTP/1.x request head, or None if it is malformed."""
    try:
        first = await reader.readline()
        for _ in range(_MAX_HEADER_LINES):
            line = await reader.readline()
            if line in (b"\r\n", b"\n", b""):
                break
        else:
            return None
    except (ValueError, asyncio.LimitOverrunError):
        return None
    parts = first.decode("latin-1").split()
    if len(parts) != 3 or not parts[2].startswith("HTTP/1."):
        return None
    return parts[0], parts[1].split("?", 1)[0]


class BackgroundMetricsServer:
    """A `MetricsServer` on its own loop in a daemon thread (for embedded apps)."""

    def __init__(self, server: MetricsServer) -> None:
        self.server = server
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="metrics-http", daemon=True)

    @property
    def port(self) -> int:
        return self.server.port

    @property
    def url(self) -> str:
        return self.server.url

    def start(self) -> BackgroundMetricsServer:
        self._thread.start()
        self._ready.wait()
        if self._error is not None:
            raise self._error
        return self

    def close(self, timeout: float = 5.0) -> None:
        """Stop serving and end the thread. Any thread but the server's; idempotent."""
        loop, stop = self._loop, self._stop
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # the loop has ended already
                loop.call_soon_threadsafe(stop.set)
        self._thread.join(timeout)

    def _run(self) -> None:
        import uvloop

        async def main() -> None:
            self._loop = asyncio.get_running_loop()
            self._stop = asyncio.Event()
            try:
                await self.server.start()
            except BaseException as exc:
                self._error = exc
                return
            finally:
                self._ready.set()
            await self._stop.wait()
            await self.server.stop()

        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            runner.run(main())


def start_metrics_server(
    app: Any, host: str = "127.0.0.1", port: int = 0, limits: MetricsLimits | None = None
) -> BackgroundMetricsServer:
    """Serve `/metrics`, `/healthz`, `/readyz` for `app` from a background thread.

    For apps embedded in another program (the daemon serves metrics from its
    own loop instead). Returns once listening; `.port` is the bound port,
    `.close()` stops it. Raises OSError if the address cannot be bound.
    `limits`: connections and timeouts (`MetricsLimits()`'s defaults if None).
    """
    return BackgroundMetricsServer(MetricsServer(app, host, port, limits=limits)).start()
