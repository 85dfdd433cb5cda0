"""Prometheus metrics and health endpoints, read from `App.status()` at scrape time.

Nothing here sits on a hot path: `AppCollector` asks the app for one status
snapshot per scrape and turns it into metric families, so processing and polling
threads keep plain integer counters and pay nothing for metrics.

HTTP: `MetricsServer` answers `GET /metrics` (Prometheus text format),
`/healthz` (200 unless the app is in ERROR: the process is up and not failed)
and `/readyz` (200 only while RUNNING) with a minimal HTTP/1.1 handler on an
asyncio loop. The daemon runs it on its admin loop (no extra thread);
`start_metrics_server` runs it on a background thread for embedded apps.

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
from typing import Any

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

__all__ = [
    "APP_STATES",
    "FAMILIES",
    "METRIC_NAMES",
    "AppCollector",
    "BackgroundMetricsServer",
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
_READ_TIMEOUT_S = 10.0
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    500: "Internal Server Error",
    503: "Service Unavailable",
}


class MetricsServer:
    """`/metrics`, `/healthz`, `/readyz` on an asyncio server (its loop's thread only).

    `port` 0 picks a free port; after `start()`, `port` is the real one.
    Scrapes call `app.status()` on `executor` (None: the loop's default).
    """

    def __init__(
        self,
        app: Any,
        host: str = "127.0.0.1",
        port: int = 0,
        registry: CollectorRegistry | None = None,
        executor: Executor | None = None,
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.registry = registry if registry is not None else make_registry(app)
        self._executor = executor
        self._server: asyncio.AbstractServer | None = None

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    async def start(self) -> None:
        """Listen; raises OSError if the address is taken or invalid."""
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=16 * 1024, reuse_address=True
        )
        sockets = self._server.sockets
        if sockets:
            self.port = int(sockets[0].getsockname()[1])
        log.info("metrics_listening", host=self.host, port=self.port, url=self.url + "/metrics")

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 2.0)

    def state(self) -> str:
        return str(self.app.state)

    async def respond(self, method: str, path: str) -> tuple[int, str, bytes, dict[str, str]]:
        """(status, content type, body, extra headers) for one request."""
        text = "text/plain; charset=utf-8"
        if method not in ("GET", "HEAD"):
            return 405, text, b"method not allowed\n", {"Allow": "GET, HEAD"}
        if path == "/metrics":
            loop = asyncio.get_running_loop()
            body = await loop.run_in_executor(self._executor, generate_latest, self.registry)
            return 200, CONTENT_TYPE, body, {}
        if path == "/healthz":
            state = self.state()
            return (503 if state == "ERROR" else 200), text, f"{state}\n".encode(), {}
        if path == "/readyz":
            state = self.state()
            return (200 if state == "RUNNING" else 503), text, f"{state}\n".encode(), {}
        return 404, text, b"not found; try /metrics, /healthz or /readyz\n", {}

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(_read_request(reader), _READ_TIMEOUT_S)
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
            writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1"))
            if method != "HEAD":
                writer.write(body)
            await writer.drain()
        except (ConnectionError, TimeoutError, asyncio.IncompleteReadError):
            pass
        except Exception as exc:
            log.warning("metrics_connection_failed", error=repr(exc))
        finally:
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
    app: Any, host: str = "127.0.0.1", port: int = 0
) -> BackgroundMetricsServer:
    """Serve `/metrics`, `/healthz`, `/readyz` for `app` from a background thread.

    For apps embedded in another program (the daemon serves metrics from its
    own loop instead). Returns once listening; `.port` is the bound port,
    `.close()` stops it. Raises OSError if the address cannot be bound.
    """
    return BackgroundMetricsServer(MetricsServer(app, host, port)).start()


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
    """Per named query families, label `query` (runtime.named_queries)."""
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
