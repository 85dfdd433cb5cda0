"""Prometheus metrics and health endpoints, read from `App.status()` at scrape time.

Nothing here sits on a hot path: `AppCollector` asks the app for one status
snapshot per scrape and turns it into metric families, so processing and polling
threads keep plain integer counters and pay nothing for metrics.

HTTP: `MetricsServer` answers `GET /metrics` (Prometheus text format),
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

Threads: `AppCollector.collect` runs on whichever thread scrapes (an executor
thread of the admin loop). `MetricsServer` belongs to the loop it was started on.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Executor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, ProcessCollector, generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from runtime.logging import get_logger
from runtime.status import AppStatus

if TYPE_CHECKING:
    from runtime.config import StreamsConfig

__all__ = [
    "APP_STATES",
    "FAMILIES",
    "METRIC_NAMES",
    "AppCollector",
    "BackgroundMetricsServer",
    "MetricsLimits",
    "MetricsServer",
    "make_registry",
    "start_metrics_server",
]

log = get_logger("runtime.metrics")

APP_STATES = (
    "CREATED",
    "REBALANCING",
    "RUNNING",
    "PENDING_SHUTDOWN",
    "NOT_RUNNING",
    "PENDING_ERROR",
    "ERROR",
)
_TASK_STATES = ("RUNNING", "RESTORING", "PAUSED", "FAILED")

# name -> (type, help). Counters are exposed with a `_total` suffix, the summary
# as `_count` and `_sum`, the info metric with `_info`.
FAMILIES: dict[str, tuple[str, str]] = {
    "streams_app": ("info", "The application: id, client id, processing guarantee."),
    "streams_app_state": ("gauge", "1 for the app's current state, 0 for the others."),
    "streams_records_consumed": ("counter", "Records the polling thread consumed."),
    "streams_records_processed": ("counter", "Records the processing threads processed."),
    "streams_records_produced": (
        "counter",
        "Records handed to the producer (output, changelogs, DLQ).",
    ),
    "streams_records_skipped": (
        "counter",
        "Records that failed and were skipped by a handler (log_and_continue or dead_letter_queue).",
    ),
    "streams_records_dead_lettered": ("counter", "Records written to the dead-letter topic."),
    "streams_poison_records": (
        "counter",
        "Records that failed deserialization or processing and were handled (skipped, dead-lettered included).",
    ),
    "streams_commits": ("counter", "Successful commits."),
    "streams_commit_failures": (
        "counter",
        "Failed commit attempts (retried with the next commit).",
    ),
    "streams_commit_duration_seconds": ("gauge", "Duration of the last successful commit."),
    "streams_transactions_committed": ("counter", "Transactions committed (exactly_once_v2)."),
    "streams_transactions_aborted": (
        "counter",
        "Transactions aborted, each followed by a rewind of every task (exactly_once_v2).",
    ),
    "streams_restored_records": ("counter", "Changelog records applied by restoration."),
    "streams_task_restore_remaining_records": (
        "gauge",
        "Changelog records a restoring task still has to apply.",
    ),
    "streams_task_restore_seconds": (
        "gauge",
        "Duration of a task's last restore, labelled with its source (changelog or snapshot+tail).",
    ),
    "streams_remote_snapshots_uploaded": ("counter", "Remote state snapshots uploaded."),
    "streams_remote_snapshot_failures": ("counter", "Remote state snapshot uploads that failed."),
    "streams_remote_uploaded_bytes": ("counter", "Bytes of snapshot files uploaded."),
    "streams_remote_downloaded_bytes": ("counter", "Bytes of snapshot files downloaded."),
    "streams_remote_snapshot_restore_failures": (
        "counter",
        "Restores that found no usable snapshot, or a store that failed to install.",
    ),
    "streams_task_last_snapshot_timestamp_seconds": (
        "gauge",
        "Wall-clock time the newest uploaded snapshot of each task was taken.",
    ),
    "streams_dropped_records": ("counter", "Records a node dropped on purpose, by reason."),
    "streams_last_commit_timestamp_seconds": (
        "gauge",
        "Wall-clock time of the last successful commit (absent before the first).",
    ),
    "streams_task_buffered_records": ("gauge", "Input records buffered per task."),
    "streams_task_in_flight_records": (
        "gauge",
        "Key-parallel tasks: records dispatched to key lanes and not yet completed.",
    ),
    "streams_task_watermark_lag_records": (
        "gauge",
        "Key-parallel tasks: records completed above the committable offset (the watermark).",
    ),
    "streams_task_parallelism": (
        "gauge",
        "Key-parallel tasks: threads busy on the task, averaged over about a second.",
    ),
    "streams_task_cpu_bound": (
        "gauge",
        "Key-parallel tasks: 1 while records count as CPU-bound (one thread works the task, "
        "a second would only contend for the GIL), else 0.",
    ),
    "streams_task_threads_max": (
        "gauge",
        "Most threads that may share a task (num.threads.per.task; 1 for one-thread tasks).",
    ),
    "streams_task_processing_retries": (
        "counter",
        "Key-parallel tasks: failed processing attempts retried (processing.retry.attempts).",
    ),
    "streams_consumer_lag": (
        "gauge",
        "Records between the processed position and the end of each input partition.",
    ),
    "streams_tasks": ("gauge", "Tasks of this process by state."),
    "streams_processing_threads_alive": ("gauge", "Processing threads alive."),
    "streams_failed_processing_threads": (
        "counter",
        "Processing threads that failed with an uncaught error.",
    ),
    "streams_broker_unreachable": ("gauge", "1 while the brokers are unreachable, else 0."),
    "streams_coordinator_retry_seconds": (
        "gauge",
        "How long the polling thread has been retrying a coordinator call (a transaction's "
        "init, commit or abort, a rewind's committed offsets), 0 when it is not.",
    ),
    "streams_topic_partitions": (
        "gauge",
        "Partition count in force per topic of the app (grows with a followed expansion).",
    ),
    "streams_partition_expansions": (
        "counter",
        "Partition expansions of input topics this instance followed.",
    ),
    "streams_tasks_created_by_expansion": (
        "counter",
        "Tasks created here for partition numbers the app did not have at start-up.",
    ),
    "streams_held_partitions": (
        "gauge",
        "Assigned partitions held back from becoming tasks (expansion not followed yet, "
        "or co-partitioned partitions not all here).",
    ),
    "streams_stalled_partitions": (
        "gauge",
        "Input partitions not paused by the runtime, with records to fetch, whose position "
        "has not moved for a minute (the watchdog resumes them; a non-zero value is a bug "
        "or a stuck upstream transaction).",
    ),
    "streams_partition_stalls": (
        "counter",
        "Input partition stalls the watchdog found (and resumed) since start.",
    ),
    "streams_partition_expansion_waiting": (
        "gauge",
        "1 while an expansion waits (co-partitioned topics differ, internal topics growing).",
    ),
    "streams_placement_handovers": (
        "counter",
        "Tasks handed over to this instance (task.assignment=runtime).",
    ),
    "streams_placement_handover_pause_max_seconds": (
        "gauge",
        "Longest hand-over pause seen here: from the task's release to its take-over.",
    ),
    "streams_placement_learners": (
        "gauge",
        "Learners (warm-up copies) in the current placement plan (task.assignment=runtime).",
    ),
    "streams_process_batch_seconds": (
        "summary",
        "Time processing threads spent per task batch (count and sum, per thread).",
    ),
    # Named queries (App({name: topology})), label `query`.
    "streams_query_state": ("gauge", "1 for the query's current state (RUNNING, PAUSED, FAILED)."),
    "streams_query_tasks": (
        "gauge",
        "Tasks of the query in this process (or in its child process, isolation=process).",
    ),
    "streams_query_records_processed": ("counter", "Records the query's live tasks processed."),
    "streams_query_records_per_second": ("gauge", "Records processed per second by the query."),
    "streams_query_busy_seconds": ("counter", "Processing threads' busy time spent on the query."),
    "streams_query_busy_share": (
        "gauge",
        "The query's share of all queries' busy time since start (0-1).",
    ),
    "streams_query_lag": ("gauge", "Consumer lag of the query's input partitions (records)."),
    "streams_query_latency_p99_seconds": (
        "gauge",
        "p99 end-to-end latency of the query's recent batches (record timestamp to batch end).",
    ),
}


def _sample_names(name: str, kind: str) -> tuple[str, ...]:
    if kind == "counter":
        return (name + "_total",)
    if kind == "summary":
        return (name + "_count", name + "_sum")
    if kind == "info":
        return (name + "_info",)
    return (name,)


METRIC_NAMES: frozenset[str] = frozenset(
    sample for name, (kind, _) in FAMILIES.items() for sample in _sample_names(name, kind)
)
"""Every sample name the runtime exports (dashboards and alerts may use only these)."""


def _counter(name: str, value: Any) -> CounterMetricFamily:
    return CounterMetricFamily(name, FAMILIES[name][1], value=float(value or 0))


def _gauge(name: str, value: Any = None, labels: list[str] | None = None) -> GaugeMetricFamily:
    if labels is not None:
        return GaugeMetricFamily(name, FAMILIES[name][1], labels=labels)
    return GaugeMetricFamily(name, FAMILIES[name][1], value=float(value or 0))


def _remote_state_metrics(status: Any) -> Any:
    restore_seconds = _gauge("streams_task_restore_seconds", labels=["task", "source"])
    for task_id, restore in sorted(status.restores.items()):
        restore_seconds.add_metric([task_id, str(restore["source"])], float(restore["seconds"]))
    yield restore_seconds
    # Zero when remote state is off: every family is always exposed.
    remote = status.remote_state or {"last_snapshot": {}}
    yield _counter("streams_remote_snapshots_uploaded", remote.get("snapshots_uploaded", 0))
    yield _counter("streams_remote_snapshot_failures", remote.get("snapshot_failures", 0))
    yield _counter("streams_remote_uploaded_bytes", remote.get("bytes_uploaded", 0))
    yield _counter("streams_remote_downloaded_bytes", remote.get("bytes_downloaded", 0))
    yield _counter(
        "streams_remote_snapshot_restore_failures", remote.get("snapshot_restore_failures", 0)
    )
    last = _gauge("streams_task_last_snapshot_timestamp_seconds", labels=["task"])
    for task_id, snapshot in sorted(remote["last_snapshot"].items()):
        last.add_metric([task_id], float(snapshot["created"]))
    yield last


class AppCollector(Collector):
    """A prometheus-client collector reading one `app.status()` per scrape."""

    def __init__(self, app: Any) -> None:
        self._app = app

    def describe(self) -> Iterator[Metric]:
        return iter(())  # registration must not call status()

    def collect(self) -> Iterator[Metric]:
        status = self._app.status()
        yield from self.families(status)

    @staticmethod
    def families(status: AppStatus) -> Iterator[Metric]:
        """The metric families for one status snapshot."""
        info = InfoMetricFamily("streams_app", FAMILIES["streams_app"][1])
        info.add_metric(
            [],
            {
                "application_id": status.application_id,
                "client_id": status.client_id,
                "processing_guarantee": status.processing_guarantee,
            },
        )
        yield info

        state = _gauge("streams_app_state", labels=["state"])
        current = status.state
        for name in APP_STATES if current in APP_STATES else (*APP_STATES, current):
            state.add_metric([name], 1.0 if name == current else 0.0)
        yield state

        yield _counter("streams_records_consumed", status.consumed)
        yield _counter("streams_records_processed", status.processed)
        yield _counter("streams_records_produced", status.produced)
        yield _counter("streams_records_skipped", status.skipped)
        yield _counter("streams_records_dead_lettered", status.dead_lettered)
        # A dead-lettered record is also counted as skipped, so the skipped
        # count is every failed record that was handled.
        yield _counter("streams_poison_records", status.skipped)
        yield _counter("streams_commits", status.commits)
        yield _counter("streams_commit_failures", status.commit_failures)
        yield _gauge("streams_commit_duration_seconds", status.last_commit_duration_s)
        yield _counter("streams_transactions_committed", status.transactions_committed)
        yield _counter("streams_transactions_aborted", status.transactions_aborted)
        yield _counter("streams_restored_records", status.restored)
        remaining = _gauge("streams_task_restore_remaining_records", labels=["task"])
        for task in status.tasks:
            if task.restore is not None and task.restore.remaining >= 0:
                remaining.add_metric([task.id], float(task.restore.remaining))
        yield remaining
        yield from _remote_state_metrics(status)
        dropped = CounterMetricFamily(
            "streams_dropped_records", FAMILIES["streams_dropped_records"][1], labels=["reason"]
        )
        for reason, count in status.dropped.items():
            dropped.add_metric([reason], float(count))
        yield dropped
        if status.last_commit is not None:
            yield _gauge("streams_last_commit_timestamp_seconds", status.last_commit)

        buffered = _gauge("streams_task_buffered_records", labels=["task"])
        for task in status.tasks:
            buffered.add_metric([task.id], float(task.buffered))
        yield buffered
        yield from _key_parallel_families(status)

        lag = _gauge("streams_consumer_lag", labels=["topic", "partition"])
        for key, value in status.lag.items():
            topic, _, partition = key.rpartition("-")
            lag.add_metric([topic, partition], float(value))
        yield lag

        by_state = Counter(task.state for task in status.tasks)
        task_states = _gauge("streams_tasks", labels=["state"])
        for name in sorted(set(_TASK_STATES) | set(by_state)):
            task_states.add_metric([name], float(by_state.get(name, 0)))
        yield task_states

        alive = sum(1 for t in status.threads if t.alive)
        yield _gauge("streams_processing_threads_alive", alive)
        yield _counter("streams_failed_processing_threads", status.failed_threads)
        yield _gauge("streams_broker_unreachable", 1 if status.broker_down_since is not None else 0)
        since = status.retrying_since
        yield _gauge("streams_coordinator_retry_seconds", time.time() - since if since else 0)

        partitions = _gauge("streams_topic_partitions", labels=["topic"])
        for topic, count in status.partitions.items():
            partitions.add_metric([topic], float(count))
        yield partitions
        yield _counter("streams_partition_expansions", status.partition_expansions)
        yield _counter("streams_tasks_created_by_expansion", status.tasks_created_by_expansion)
        yield _gauge("streams_held_partitions", len(status.held_partitions))
        yield _gauge("streams_stalled_partitions", len(status.stalled_partitions))
        yield _counter("streams_partition_stalls", status.partition_stalls)
        waiting = 1 if status.expansion_waiting_for is not None else 0
        yield _gauge("streams_partition_expansion_waiting", waiting)
        placement = status.placement or {}
        yield _counter("streams_placement_handovers", placement.get("handovers", 0))
        yield _gauge(
            "streams_placement_handover_pause_max_seconds",
            placement.get("max_handover_pause_s", 0.0),
        )
        yield _gauge("streams_placement_learners", len(placement.get("learners") or {}))

        batches = SummaryMetricFamily(
            "streams_process_batch_seconds",
            FAMILIES["streams_process_batch_seconds"][1],
            labels=["thread"],
        )
        for t in status.threads:
            batches.add_metric([t.name], count_value=t.batches, sum_value=t.busy_seconds)
        yield batches
        yield from _query_families(status)  # no samples for a plain topology


def make_registry(app: Any, process_metrics: bool = True) -> CollectorRegistry:
    """A registry of its own (not the global one) with the app's metrics.

    `process_metrics` adds prometheus-client's `process_*` metrics (CPU, memory,
    open files) read from /proc.
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(AppCollector(app))
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


# --- HTTP ------------------------------------------------------------------------

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


def _key_parallel_families(status: AppStatus) -> Iterator[Any]:
    """Per-task figures of key-parallel mode (samples only for such tasks)."""
    tasks = [t for t in status.tasks if t.key_parallel]
    in_flight = _gauge("streams_task_in_flight_records", labels=["task"])
    lag = _gauge("streams_task_watermark_lag_records", labels=["task"])
    parallelism = _gauge("streams_task_parallelism", labels=["task"])
    cpu_bound = _gauge("streams_task_cpu_bound", labels=["task"])
    retries = CounterMetricFamily(
        "streams_task_processing_retries",
        FAMILIES["streams_task_processing_retries"][1],
        labels=["task"],
    )
    for task in tasks:
        in_flight.add_metric([task.id], float(task.in_flight))
        lag.add_metric([task.id], float(task.watermark_lag))
        parallelism.add_metric([task.id], task.parallelism)
        cpu_bound.add_metric([task.id], 1.0 if task.cpu_bound else 0.0)
        retries.add_metric([task.id], float(task.retried))
    threads = _gauge("streams_task_threads_max", labels=["task"])
    for task in status.tasks:
        threads.add_metric([task.id], float(task.threads_per_task))
    yield from (in_flight, lag, parallelism, cpu_bound, retries, threads)


def _query_families(status: AppStatus) -> Iterator[Any]:
    """Per named query families, label `query` (runtime.query_control)."""
    state = _gauge("streams_query_state", labels=["query", "state"])
    tasks = _gauge("streams_query_tasks", labels=["query"])
    processed = CounterMetricFamily(
        "streams_query_records_processed",
        FAMILIES["streams_query_records_processed"][1],
        labels=["query"],
    )
    rate = _gauge("streams_query_records_per_second", labels=["query"])
    busy = CounterMetricFamily(
        "streams_query_busy_seconds", FAMILIES["streams_query_busy_seconds"][1], labels=["query"]
    )
    share = _gauge("streams_query_busy_share", labels=["query"])
    lag = _gauge("streams_query_lag", labels=["query"])
    latency = _gauge("streams_query_latency_p99_seconds", labels=["query"])
    for q in status.queries:
        for name in ("RUNNING", "PAUSED", "FAILED"):
            state.add_metric([q.name, name], 1.0 if q.state == name else 0.0)
        tasks.add_metric([q.name], float(q.tasks))
        processed.add_metric([q.name], float(q.processed))
        rate.add_metric([q.name], q.records_per_s)
        busy.add_metric([q.name], q.busy_seconds)
        share.add_metric([q.name], q.busy_share)
        lag.add_metric([q.name], float(q.lag))
        if q.p99_latency_ms is not None:
            latency.add_metric([q.name], q.p99_latency_ms / 1000.0)
    yield from (state, tasks, processed, rate, busy, share, lag, latency)
