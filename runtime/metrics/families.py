"""The metric families, read from `App.status()` at scrape time.

Nothing here sits on a hot path: `AppCollector` asks the app for one status
snapshot per scrape and turns it into metric families, so processing and polling
threads keep plain integer counters and pay nothing for metrics. `FAMILIES`
names every family with its type and help; `METRIC_NAMES` is every sample name
the runtime exports (dashboards and alerts may use only these).

Threads: `AppCollector.collect` runs on whichever thread scrapes (an executor
thread of the admin loop, or of the background server's loop).

A little over 500 lines, most of it the `FAMILIES` table: one table of every
exported name is what keeps dashboards, alerts and their tests honest. If the
collector grows further, its per-area sample builders (remote state, RocksDB)
are the part to move out, with the `_gauge`/`_counter` helpers they share.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)
from prometheus_client.registry import Collector

from runtime.status import AppStatus

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
    "streams_enforced_processing": (
        "counter",
        "Records a task with several input partitions took while it gave up waiting for an empty one (max.task.idle.ms ran out), tasks live now.",
    ),
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
    # RocksDB (runtime.state.rocksdb_metrics), read by the RocksDB metrics
    # thread every state.rocksdb.metrics.interval.ms: the shared budget once,
    # then per open store (labels task, store).
    "streams_rocksdb_memory_budget_bytes": (
        "gauge",
        "state.rocksdb.memory.bytes: the shared block cache's capacity, memtables included.",
    ),
    "streams_rocksdb_block_cache_usage_bytes": (
        "gauge",
        "Bytes charged to the shared RocksDB block cache (data, index and filter blocks, "
        "memtable reservations).",
    ),
    "streams_rocksdb_block_cache_pinned_bytes": (
        "gauge",
        "Bytes of the shared block cache pinned (in use: memtable reservations, blocks read now).",
    ),
    "streams_rocksdb_memtable_limit_bytes": (
        "gauge",
        "The memtables' share of the budget (state.rocksdb.write.buffer.ratio).",
    ),
    "streams_rocksdb_memtable_usage_bytes": (
        "gauge",
        "Bytes of memtables of all RocksDB stores (the write-buffer manager's count).",
    ),
    "streams_rocksdb_forced_flushes": (
        "counter",
        "Memtables of idle stores the runtime flushed to keep all memtables within their share.",
    ),
    "streams_rocksdb_memtable_stall_seconds": (
        "counter",
        "Time commits and restores waited for memtable flushes (writes faster than RocksDB "
        "flushes).",
    ),
    "streams_rocksdb_memtable_stalls_without_progress": (
        "counter",
        "Waits for memtable flushes that gave up because the memtables did not shrink: their "
        "share of state.rocksdb.memory.bytes is too small for the stores' settings (the log "
        "says rocksdb_memtables_over_budget and what to change).",
    ),
    "streams_rocksdb_estimated_keys": ("gauge", "RocksDB's estimate of a store's keys."),
    "streams_rocksdb_store_memtable_bytes": ("gauge", "Bytes of a store's memtables."),
    "streams_rocksdb_table_readers_bytes": (
        "gauge",
        "Memory of a store's open SST readers outside the block cache (not bounded by the "
        "budget; grows with the number of SST files).",
    ),
    "streams_rocksdb_pending_compaction_bytes": (
        "gauge",
        "Bytes RocksDB estimates compaction has to rewrite in a store.",
    ),
    "streams_rocksdb_live_sst_bytes": ("gauge", "Bytes of a store's live SST files."),
    "streams_rocksdb_delayed_write_rate_bytes": (
        "gauge",
        "Write rate (bytes/s) RocksDB slows a store's writes to; 0 when writes are not delayed.",
    ),
    "streams_rocksdb_write_stopped": (
        "gauge",
        "1 while RocksDB stops a store's writes (too many L0 files, memtables or pending "
        "compaction bytes), else 0.",
    ),
    "streams_rocksdb_get_seconds": (
        "summary",
        "RocksDB gets of a store: count and total time (state.rocksdb.statistics only).",
    ),
    "streams_rocksdb_write_seconds": (
        "summary",
        "RocksDB write batches of a store: count and total time (state.rocksdb.statistics only).",
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
        yield _counter(
            "streams_enforced_processing", sum(t.enforced_processing for t in status.tasks)
        )
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
        yield from _rocksdb_families(status)
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


_ROCKSDB_STORE_GAUGES = (
    ("streams_rocksdb_estimated_keys", "estimated_keys"),
    ("streams_rocksdb_store_memtable_bytes", "memtable_bytes"),
    ("streams_rocksdb_table_readers_bytes", "table_readers_bytes"),
    ("streams_rocksdb_pending_compaction_bytes", "pending_compaction_bytes"),
    ("streams_rocksdb_live_sst_bytes", "live_sst_bytes"),
    ("streams_rocksdb_delayed_write_rate_bytes", "delayed_write_rate"),
    ("streams_rocksdb_write_stopped", "write_stopped"),
)


def _rocksdb_families(status: AppStatus) -> Iterator[Any]:
    """RocksDB's figures (runtime.state.rocksdb_metrics): zero before the
    metrics thread's first read or without RocksDB stores, so every family
    is always exposed; per-store samples for the stores open at that read."""
    memory = status.state_memory or {}
    yield _gauge("streams_rocksdb_memory_budget_bytes", memory.get("memory_bytes", 0))
    yield _gauge("streams_rocksdb_block_cache_usage_bytes", memory.get("block_cache_usage_bytes"))
    yield _gauge("streams_rocksdb_block_cache_pinned_bytes", memory.get("block_cache_pinned_bytes"))
    yield _gauge("streams_rocksdb_memtable_limit_bytes", memory.get("write_buffer_limit_bytes"))
    yield _gauge("streams_rocksdb_memtable_usage_bytes", memory.get("write_buffer_usage_bytes"))
    yield _counter("streams_rocksdb_forced_flushes", memory.get("forced_flushes", 0))
    yield _counter("streams_rocksdb_memtable_stall_seconds", memory.get("stall_seconds", 0.0))
    yield _counter(
        "streams_rocksdb_memtable_stalls_without_progress",
        memory.get("stalls_without_progress", 0),
    )
    stores = memory.get("stores") or []
    for name, key in _ROCKSDB_STORE_GAUGES:
        family = _gauge(name, labels=["task", "store"])
        for store in stores:
            family.add_metric([store["task"], store["store"]], float(store.get(key, 0)))
        yield family
    for name, count, seconds in (
        ("streams_rocksdb_get_seconds", "gets", "get_seconds"),
        ("streams_rocksdb_write_seconds", "writes", "write_seconds"),
    ):
        summary = SummaryMetricFamily(name, FAMILIES[name][1], labels=["task", "store"])
        for store in stores:
            if count in store:
                summary.add_metric(
                    [store["task"], store["store"]],
                    count_value=store[count],
                    sum_value=store[seconds],
                )
        yield summary


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
