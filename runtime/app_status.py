"""The parts of `App.status()`: figures gathered from the app's threads.

`App.status()` is read by metrics, the admin socket, the demo and tests, at
any moment from any thread: everything here reads the threads' counters
racily (each figure is a snapshot, the whole is not atomic) and copies what
it keeps. One function per part of runtime.status.AppStatus, so that the App
class only composes them; and `App.progress()`, the cheap running totals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.isolation.queries import merge_figures
from runtime.isolation.supervisor import ChildFigures
from runtime.kafka.topics import TopicLayout
from runtime.polling.polling_thread import PollingThread
from runtime.processing.key_parallel import key_parallel_figures
from runtime.processing.task import StreamTask
from runtime.processing.task_manager import TaskManager
from runtime.processing.threads import ProcessingThread
from runtime.query_control import NamedQueries
from runtime.state.remote.capture import SnapshotCapture
from runtime.state.restoration import RestorationThread
from runtime.state.rocksdb_metrics import RocksDBMetricsThread
from runtime.status import (
    NO_PROCESSING_THREADS,
    AppStatus,
    Progress,
    QueryStatus,
    RestoreProgress,
    TaskStatus,
    ThreadStatus,
)
from runtime.topology.topology import Topology


def sum_dicts(dicts: Iterable[dict[str, int]]) -> dict[str, int]:
    """Key-wise sums (counts per reason, per task)."""
    total: dict[str, int] = {}
    for d in dicts:
        for k, v in d.items():
            total[k] = total.get(k, 0) + v
    return total


def task_statuses(
    manager: TaskManager,
    live_tasks: list[StreamTask],
    polling: PollingThread | None,
    restoration: RestorationThread | None,
) -> tuple[TaskStatus, ...]:
    """Processable tasks (RUNNING, PAUSED or FAILED, their owner and counts)
    and restoring ones (with their restore progress), sorted by id."""
    owners = manager.owners()
    failed = manager.failed_task_ids()
    tasks = [
        TaskStatus(
            id=task.id,
            state="FAILED"
            if task.id in failed
            else ("PAUSED" if manager.is_paused(task.id) else "RUNNING"),
            owner=owners.get(task.id),
            partitions=tuple(f"{t}-{task.partition}" for t in task.queues),
            buffered=task.input_buffered,
            processed=task.processed_count,
            skipped=task.skipped_count,
            dead_lettered=task.dead_lettered_count,
            enforced_processing=task.enforced_processing,
            **key_parallel_figures(task),
        )
        for task in live_tasks
    ]
    progress = dict(restoration.progress) if restoration else {}
    for task in polling.tasks.restoring() if polling else []:
        figures = progress.get(task.id, {})
        tasks.append(
            TaskStatus(
                id=task.id,
                state="RESTORING",
                owner=None,
                partitions=tuple(f"{t}-{task.partition}" for t in task.queues),
                buffered=task.buffered,
                processed=0,
                skipped=0,
                dead_lettered=0,
                restore=RestoreProgress(
                    restored=int(figures.get("restored", 0)),
                    remaining=int(figures.get("remaining", -1)),
                    rate=float(figures.get("rate", 0.0)),
                ),
            )
        )
    tasks.sort(key=lambda t: t.id)
    return tuple(tasks)


def thread_statuses(threads: Iterable[ProcessingThread]) -> tuple[ThreadStatus, ...]:
    return tuple(
        ThreadStatus(
            name=t.name,
            alive=t.is_alive(),
            task=t.current_task,
            batches=t.batches,
            busy_seconds=round(t.busy_seconds, 3),
            state=t.state,
            last_task=t.last_task,
            sched_idle=t.sched_class is not None and t.sched_class.idle,
        )
        for t in threads
    )


def remote_state_figures(
    restoration: RestorationThread | None, capture: SnapshotCapture | None
) -> dict[str, Any] | None:
    """Remote state's counters (uploads, downloads, captures); None without it."""
    if restoration is None or restoration.remote is None:
        return None
    figures = restoration.remote.stats.as_dict()
    if capture is not None:
        figures["captures"] = capture.captured
        figures["capture_seconds"] = round(capture.capture_seconds, 3)
    return figures


def state_memory_figures(metrics: RocksDBMetricsThread | None) -> dict[str, Any] | None:
    """The RocksDB metrics thread's last figures (None: no RocksDB state, or
    not read yet)."""
    figures = metrics.figures if metrics is not None else None
    return figures.as_dict() if figures is not None else None


def query_statuses(
    named: NamedQueries,
    topology: Topology,
    manager: TaskManager,
    polling: PollingThread | None,
    live_tasks: list[StreamTask],
    children: Mapping[str, ChildFigures],
    pids: Mapping[str, int | None],
) -> tuple[QueryStatus, ...]:
    """Per named query: tasks, processed records, busy seconds, lag, p99 latency
    (`children`: the last figures of process-isolated queries)."""
    tasks: dict[str, int] = {}
    processed: dict[str, int] = {}
    for task in [*live_tasks, *(polling.tasks.restoring() if polling else [])]:
        query = task.query
        if query is not None:
            tasks[query] = tasks.get(query, 0) + 1
    for task in live_tasks:
        if task.query is not None:
            processed[task.query] = processed.get(task.query, 0) + task.processed_count
    lag: dict[str, int] = {}
    if polling is not None:
        owner = {s.id: s.query for s in topology.subtopologies}
        sub_of = dict(polling.layout.subtopology_of)
        for (topic, _), records in dict(polling.lag_tracker.lag).items():
            query = owner.get(sub_of.get(topic, -1))
            if query is not None:
                lag[query] = lag.get(query, 0) + records
    busy = manager.query_busy_seconds()
    p99_ms = manager.query_latency_p99_ms()
    merge_figures(children, tasks, processed, busy, lag, p99_ms)
    return named.statuses(tasks, processed, busy, lag, p99_ms, pids)


def with_polling_figures(
    base: AppStatus, polling: PollingThread, layout: TopicLayout | None
) -> AppStatus:
    """`base` with what the polling thread counts: consumed, produced, closed
    tasks' and refused outputs' counts, commits, lag, start-up, expansion."""
    closed = polling.tasks.closed_totals
    # Output records the production handler skipped or dead-lettered.
    refused = polling.output.error_counts
    transactions = polling.output.transactions
    committer = polling.committer
    retrying = polling.health.retrying.now
    lag = dict(polling.lag_tracker.lag)
    return dataclasses.replace(
        base,
        consumed=polling.consumed_total,
        processed=base.processed + closed["processed"],
        produced=polling.output.produced_total,
        skipped=base.skipped + closed["skipped"] + refused.skipped,
        dead_lettered=base.dead_lettered + closed["dead_lettered"] + refused.dead_lettered,
        commits=committer.commits_total,
        commit_failures=committer.failures_total,
        transactions_committed=transactions.committed if transactions else 0,
        transactions_aborted=transactions.aborted if transactions else 0,
        last_commit=committer.last_commit_wall_time,
        last_commit_duration_s=committer.last_commit_duration_s,
        lag={f"{t}-{p}": v for (t, p), v in sorted(lag.items())},
        total_lag=sum(lag.values()),
        broker_down_since=polling.health.down_since,
        retrying_call=retrying[0] if retrying else None,
        retrying_since=retrying[1] if retrying else None,
        startup_phase=polling.startup.phase,
        waiting_for=polling.startup.waiting_for,
        startup_phase_since=polling.startup.phase_since,
        partitions=dict(sorted(layout.partitions.items())) if layout else {},
        partition_expansions=polling.expansion.expansions,
        tasks_created_by_expansion=polling.tasks.created_by_expansion,
        held_partitions=[f"{t}-{p}" for t, p in sorted(polling.tasks.held)],
        stalled_partitions=[f"{t}-{p}" for t, p in sorted(polling.stall_watch.stalled)],
        partition_stalls=polling.stall_watch.stalls_total,
        expansion_waiting_for=polling.expansion.waiting_for,
        placement=polling.runtime.figures() if polling.runtime is not None else None,
    )


def with_thread_warning(status: AppStatus, live_threads: list[str]) -> AppStatus:
    """`status` saying NO_PROCESSING_THREADS in `waiting_for` when a running
    instance has no processing thread (`live_threads`: the pool's names, those
    stopping left out) and start-up has nothing to say there. Why: `admin
    threads set 0` used to be accepted silently while the lag grew."""
    if status.state not in ("RUNNING", "REBALANCING") or live_threads:
        return status
    if status.waiting_for is not None:
        return status
    return dataclasses.replace(status, waiting_for=NO_PROCESSING_THREADS)


def progress_of(
    state: object,
    failure: str | None,
    live_tasks: Iterable[StreamTask],
    polling: PollingThread | None,
) -> Progress:
    """`App.progress()`: running totals from the live tasks and the polling
    thread's counters (None before the app started)."""
    processed = sum(t.processed_count for t in live_tasks)
    if polling is None:
        return Progress(str(state), failure, 0, processed, 0, 0, None, None)
    committer = polling.committer
    return Progress(
        state=str(state),
        failure=failure,
        consumed=polling.consumed_total,
        processed=processed + polling.tasks.closed_totals["processed"],
        produced=polling.output.produced_total,
        commits=committer.commits_total,
        last_commit=committer.last_commit_wall_time,
        last_commit_duration_s=committer.last_commit_duration_s,
    )
