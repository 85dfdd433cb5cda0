"""The status of a daemon with `processes` > 1: its processes' statuses merged (pure; any thread).

Each processing process answers `status` with its own `AppStatus` (as a
dict); `merge_statuses` makes one `AppStatus` of them as the admin socket,
the metrics endpoint and the autoscaler read it: counts summed, tasks and
threads listed together (each task says which process owns it, `process`),
lag and restores merged (a partition and a task belong to one process at a
time), and one `ProcessStatus` row per slot, a dead or starting one
included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

from runtime.status import AppStatus, ProcessStatus, QueryStatus

# AppStatus fields that are counts: the daemon's is the sum of its processes'.
_SUMMED = (
    "consumed",
    "processed",
    "produced",
    "skipped",
    "dead_lettered",
    "commits",
    "commit_failures",
    "transactions_committed",
    "transactions_aborted",
    "failed_threads",
    "total_lag",
    "restored",
    "partition_expansions",
    "tasks_created_by_expansion",
    "partition_stalls",
)


def merge_statuses(
    base: Mapping[str, Any],
    rows: Sequence[ProcessStatus],
    statuses: Mapping[str, AppStatus],
) -> AppStatus:
    """One status for the daemon. `base`: its own fields (application_id,
    client_id, instance_id, state, started_at, processing_guarantee,
    failure); `rows`: one per slot; `statuses`: slot name -> the status
    that process answered (missing: it did not answer)."""
    parts = list(statuses.items())
    tasks = tuple(
        dataclasses.replace(task, process=name) for name, status in parts for task in status.tasks
    )
    threads = tuple(thread for _, status in parts for thread in status.threads)
    merged: dict[str, Any] = {field: sum(getattr(s, field) for _, s in parts) for field in _SUMMED}
    lag: dict[str, int] = {}
    restores: dict[str, dict[str, Any]] = {}
    standbys: dict[str, dict[str, int]] = {}
    dropped: dict[str, int] = {}
    partitions: dict[str, int] = {}
    global_stores: dict[str, dict[str, Any]] = {}  # each process has its own copy
    for name, status in parts:
        for store, figures in status.global_stores.items():
            global_stores[f"{store}@{name}"] = {**figures, "process": name}
        lag.update(status.lag)
        restores.update({task: {**r, "process": name} for task, r in status.restores.items()})
        standbys.update(status.standbys)
        partitions.update(status.partitions)
        for reason, count in status.dropped.items():
            dropped[reason] = dropped.get(reason, 0) + count
    commits = [s.last_commit for _, s in parts if s.last_commit is not None]
    stalled = sorted({p for _, s in parts for p in s.stalled_partitions})
    first = parts[0][1] if parts else None
    return AppStatus(
        application_id=str(base["application_id"]),
        client_id=str(base["client_id"]),
        instance_id=str(base["instance_id"]),
        state=str(base["state"]),
        started_at=base.get("started_at"),
        processing_guarantee=str(base["processing_guarantee"]),
        assignment_strategy=first.assignment_strategy if first else None,
        threads=threads,
        tasks=tasks,
        lag=lag,
        restores=restores,
        standbys=standbys,
        dropped=dropped,
        partitions=partitions,
        stalled_partitions=stalled,
        last_commit=max(commits) if commits else None,
        last_commit_duration_s=max((s.last_commit_duration_s for _, s in parts), default=0.0),
        failure=base.get("failure"),
        waiting_for=_waiting_for(parts),
        processes=tuple(rows),
        global_stores=global_stores,
        queries=_merge_queries(parts),
        **merged,
    )


def _merge_queries(parts: Sequence[tuple[str, AppStatus]]) -> tuple[QueryStatus, ...]:
    """Each named query once: it runs in every process (thread isolation),
    each with its share of the query's tasks. Counts summed, the worst p99,
    FAILED if it failed in any process (the first failure named), PAUSED
    only where every process has it paused; busy shares over the sums."""
    by_name: dict[str, list[QueryStatus]] = {}
    for _, status in parts:
        for query in status.queries:
            by_name.setdefault(query.name, []).append(query)
    busy = {name: sum(q.busy_seconds for q in rows) for name, rows in by_name.items()}
    total_busy = sum(busy.values())
    merged = []
    for name, rows in by_name.items():
        failed = [q for q in rows if q.state == "FAILED"]
        paused = all(q.state == "PAUSED" for q in rows)
        state = "FAILED" if failed else "PAUSED" if paused else "RUNNING"
        p99s = [q.p99_latency_ms for q in rows if q.p99_latency_ms is not None]
        merged.append(
            dataclasses.replace(
                rows[0],
                state=state,
                tasks=sum(q.tasks for q in rows),
                processed=sum(q.processed for q in rows),
                records_per_s=sum(q.records_per_s for q in rows),
                busy_seconds=busy[name],
                busy_share=busy[name] / total_busy if total_busy else 0.0,
                lag=sum(q.lag for q in rows),
                p99_latency_ms=max(p99s) if p99s else None,
                failure=failed[0].failure if failed else None,
            )
        )
    return tuple(merged)


def _waiting_for(parts: Sequence[tuple[str, AppStatus]]) -> str | None:
    """What the first process still starting waits for, named."""
    for name, status in parts:
        if status.waiting_for:
            return f"{name}: {status.waiting_for}"
    return None
