"""`App.status()`: one typed snapshot of an instance, read by metrics, the
autoscaler, the admin socket, the demo and tests.

A tree of frozen dataclasses, so that readers use attributes and mypy catches
a renamed field. `to_dict()` gives the JSON shape of the admin socket's
`status` reply. Mapping access (`status["total_lag"]`) still works for scripts
written against the earlier dict API; code in this project uses attributes.

Built by `App.status()` on any thread from figures the other threads write
(racy reads: each figure is current, the snapshot as a whole is not atomic).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

NO_PROCESSING_THREADS = (
    "no processing threads: input is read but not processed, and lag grows; add threads "
    "with `streams-runtime admin threads set N` (N >= 1), SIGTTIN or processing.threads"
)
"""`AppStatus.waiting_for` of a running instance with no processing thread
(`processing.threads=0`, `admin threads set 0`, the last one removed): the
admin socket's reply and the log say the same when it happens."""


@dataclass(frozen=True)
class RestoreProgress:
    """A restoring task's progress (figures from the restoration thread)."""

    restored: int = 0
    remaining: int = -1  # changelog records left; -1 while unknown
    rate: float = 0.0  # records/s since the restore started


@dataclass(frozen=True)
class TaskStatus:
    """One active task: RUNNING, PAUSED, FAILED or RESTORING."""

    id: str
    state: str
    owner: str | None  # the processing thread holding it now, if any
    partitions: tuple[str, ...]  # "<topic>-<partition>"
    buffered: int
    processed: int
    skipped: int
    dead_lettered: int
    restore: RestoreProgress | None = None
    # Key-parallel mode (num.threads.per.task, processing.retry.*): the most
    # threads that may share the task, records dispatched to key lanes and not
    # yet completed, records completed above the watermark (reprocessed after
    # a crash), threads busy on it on average over the last second, retries;
    # and why it shares its threads or not: `cpu_bound` records take one
    # thread (a second one would only contend for the GIL), judged from the
    # CPU time and the wait off the GIL per record (moving averages, in us)
    # and from grabs run alone (`probes`: grabs run alone to settle it).
    key_parallel: bool = False
    threads_per_task: int = 1
    in_flight: int = 0
    watermark_lag: int = 0
    parallelism: float = 0.0
    retried: int = 0
    cpu_bound: bool = False
    record_cpu_us: float = 0.0
    record_wait_us: float = 0.0
    probes: int = 0
    # Under `processes` > 1: the processing process that owns it ("p<i>").
    process: str | None = None
    # Records taken while an empty input partition was given up on
    # (`max.task.idle.ms` ran out; Kafka Streams' enforced-processing-total).
    enforced_processing: int = 0


@dataclass(frozen=True)
class ThreadStatus:
    """One processing thread: `state` is processing, idle, stopping or stopped;
    `task` the task it holds now, `last_task` the task of its latest batch;
    `sched_idle` whether that batch ran in SCHED_IDLE (a lower-priority named
    query's task, `sched.idle.lower.priorities`)."""

    name: str
    alive: bool
    task: str | None
    batches: int
    busy_seconds: float
    state: str = "idle"
    last_task: str | None = None
    sched_idle: bool = False


@dataclass(frozen=True)
class ProcessStatus:
    """One processing process of a daemon with `processes` > 1 (its
    supervisor's view): slot name `p<i>`, pid (None while it does not run),
    its app's state, whether it runs, restarts since the daemon started,
    why it last exited (None: never), when it started (wall clock), and its
    own figures."""

    name: str
    slot: int
    pid: int | None
    state: str
    up: bool
    restarts: int = 0
    last_exit: str | None = None
    started_at: float | None = None
    tasks: int = 0
    threads: int = 0
    processed: int = 0
    lag: int = 0


@dataclass(frozen=True)
class QueryStatus:
    """One named query (App({name: topology})): `state` is RUNNING, PAUSED or
    FAILED (`failure` says why); its scheduling settings; its tasks here,
    records processed and per second, busy time and its share of all queries'
    busy time since start, lag of its input partitions, and the p99
    end-to-end latency of its recent batches (ms from the timestamp of a
    batch's last record to the batch's end, over the last 2048 batches;
    None before any)."""

    name: str
    state: str
    priority: int = 0
    weight: int = 1
    max_threads: int | None = None
    tasks: int = 0
    processed: int = 0
    records_per_s: float = 0.0
    busy_seconds: float = 0.0
    busy_share: float = 0.0
    lag: int = 0
    p99_latency_ms: float | None = None
    failure: str | None = None
    # `query.<name>.isolation`; for "process", the child's pid (None while
    # it does not run).
    isolation: str = "thread"
    pid: int | None = None


@dataclass(frozen=True)
class Progress:
    """The running totals of `App.progress()`: what a watcher polling many times
    a second needs, without `status()`'s per-task, per-thread and lag detail.

    Why: `status()` builds a snapshot of everything, and the benchmarks that
    polled it every 20-50 ms were spending several percent of the GIL time on
    it (py-spy), time the models they compare it with did not pay."""

    state: str
    failure: str | None
    consumed: int
    processed: int
    produced: int
    commits: int
    last_commit: float | None
    last_commit_duration_s: float | None


@dataclass(frozen=True)
class AppStatus:
    """One instance: state, threads, tasks, counts, lag, commits, failure."""

    application_id: str
    client_id: str
    instance_id: str
    state: str
    started_at: float | None
    processing_guarantee: str
    assignment_strategy: str | None
    threads: tuple[ThreadStatus, ...]
    tasks: tuple[TaskStatus, ...]
    consumed: int = 0
    processed: int = 0
    produced: int = 0
    skipped: int = 0
    dead_lettered: int = 0
    commits: int = 0
    commit_failures: int = 0
    transactions_committed: int = 0
    transactions_aborted: int = 0
    last_commit: float | None = None  # wall-clock time of the last commit
    last_commit_duration_s: float = 0.0
    failed_threads: int = 0
    lag: dict[str, int] = field(default_factory=dict)  # "<topic>-<partition>" -> records
    total_lag: int = 0
    broker_down_since: float | None = None
    # The coordinator call the polling thread keeps retrying (init_transactions,
    # commit_transaction, abort_transaction, committed_offsets) and since when
    # (wall clock): its loop, and the figures it moves, stand still meanwhile.
    retrying_call: str | None = None
    retrying_since: float | None = None
    failure: str | None = None
    restored: int = 0  # changelog records restored since start
    standbys: dict[str, dict[str, int]] = field(default_factory=dict)
    # task id -> its last restore: "source" ("changelog" or "snapshot+tail"),
    # "seconds", "records" (changelog records replayed), "snapshot" (id or
    # None), "downloaded_bytes".
    restores: dict[str, dict[str, Any]] = field(default_factory=dict)
    # Remote state figures (runtime.state.remote.stats), None when off:
    # snapshots_uploaded, snapshot_failures, bytes_uploaded, files_uploaded,
    # files_reused, bytes_downloaded, snapshot_restores,
    # snapshot_restore_failures, captures and capture_seconds (checkpoints
    # taken at commits, and the time they held the commit), and last_snapshot
    # (task id -> "snapshot", "created", "offsets", "bytes", "uploaded_bytes",
    # "seconds"), installed (task id -> "snapshot", "standby", "bytes",
    # "seconds": the newest snapshot an active task or a standby started from).
    remote_state: dict[str, Any] | None = None
    # RocksDB memory and per-store figures (runtime.state.rocksdb_metrics,
    # read by the RocksDB metrics thread at its interval), None without
    # RocksDB stores or before the first read: read_at, memory_bytes (the
    # budget), write_buffer_limit_bytes, block_cache_usage_bytes,
    # block_cache_pinned_bytes, write_buffer_usage_bytes, write_stalls, and
    # stores (one dict per open store: task, store, estimated_keys,
    # memtable_bytes, table_readers_bytes, pending_compaction_bytes,
    # live_sst_bytes, delayed_write_rate, write_stopped; gets, get_seconds,
    # writes, write_seconds with state.rocksdb.statistics).
    state_memory: dict[str, Any] | None = None
    dropped: dict[str, int] = field(default_factory=dict)  # records dropped, by reason
    # Start-up (runtime.polling.startup): joining_group, awaiting_assignment,
    # restoring, then processing; `waiting_for` says what in words (None once
    # processing), `startup_phase_since` is the wall-clock time the phase began.
    # Once started, `waiting_for` is NO_PROCESSING_THREADS while no processing
    # thread runs (nothing else stops a running instance's processing).
    startup_phase: str | None = None
    waiting_for: str | None = None
    startup_phase_since: float | None = None
    # Partition expansion (runtime.polling.expansion): the partition counts
    # in force per topic of the app, expansions followed, tasks created for
    # partitions the app did not have at start-up, assigned partitions held
    # back from becoming tasks ("<topic>-<partition>"), and what an expansion
    # waits for (co-partitioned topics that differ, internal topics growing).
    partitions: dict[str, int] = field(default_factory=dict)
    partition_expansions: int = 0
    tasks_created_by_expansion: int = 0
    held_partitions: list[str] = field(default_factory=list)
    expansion_waiting_for: str | None = None
    # Input partitions the stall watch (runtime.polling.stall_watch) found not
    # moving while not paused by the runtime and with records to fetch
    # ("<topic>-<partition>"), and how many such stalls it found since start.
    stalled_partitions: list[str] = field(default_factory=list)
    partition_stalls: int = 0
    # Runtime-owned placement (task.assignment=runtime), None otherwise:
    # "placer" (this instance places), "plan_version", "applied", "leaving",
    # "owners" (task -> instance), "learners" (task -> instance and lag),
    # "moves" (tasks being handed over -> to whom), "handovers" taken here,
    # "last_handover_pause_s" and "max_handover_pause_s" (from the task's
    # release to its take-over here).
    placement: dict[str, Any] | None = None
    # Named queries (empty when the app runs one plain topology).
    queries: tuple[QueryStatus, ...] = ()
    # A daemon with `processes` > 1: one row per processing process (empty
    # for one process); the figures above are their totals.
    processes: tuple[ProcessStatus, ...] = ()
    # Global tables (runtime.state.global_thread): store -> "state"
    # (restoring, running, stopped, failed), "topic", "lag", "records"
    # applied, "bootstrap_seconds"; with `processes` > 1 also "process".
    global_stores: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AppStatus:
        """The inverse of `to_dict` (an admin client's reply, a test's fixture).

        Missing fields take empty values, so partial snapshots are accepted.
        """
        threads = tuple(
            ThreadStatus(
                name=str(t.get("name", "")),
                alive=bool(t.get("alive", False)),
                task=t.get("task"),
                batches=int(t.get("batches", 0)),
                busy_seconds=float(t.get("busy_seconds", 0.0)),
                state=str(t.get("state", "idle")),
                last_task=t.get("last_task"),
            )
            for t in data.get("threads") or ()
        )
        tasks = tuple(
            TaskStatus(
                id=str(t.get("id", "")),
                state=str(t.get("state", "RUNNING")),
                owner=t.get("owner"),
                partitions=tuple(t.get("partitions") or ()),
                buffered=int(t.get("buffered", 0)),
                processed=int(t.get("processed", 0)),
                skipped=int(t.get("skipped", 0)),
                dead_lettered=int(t.get("dead_lettered", 0)),
                restore=RestoreProgress(**t["restore"]) if t.get("restore") else None,
                key_parallel=bool(t.get("key_parallel", False)),
                threads_per_task=int(t.get("threads_per_task", 1)),
                in_flight=int(t.get("in_flight", 0)),
                watermark_lag=int(t.get("watermark_lag", 0)),
                parallelism=float(t.get("parallelism", 0.0)),
                retried=int(t.get("retried", 0)),
                cpu_bound=bool(t.get("cpu_bound", False)),
                record_cpu_us=float(t.get("record_cpu_us", 0.0)),
                record_wait_us=float(t.get("record_wait_us", 0.0)),
                probes=int(t.get("probes", 0)),
                process=t.get("process"),
                enforced_processing=int(t.get("enforced_processing", 0)),
            )
            for t in data.get("tasks") or ()
        )
        simple = {
            f.name: data[f.name]
            for f in dataclasses.fields(cls)
            if f.name in data and f.name not in ("threads", "tasks", "queries", "processes")
        }
        simple["queries"] = tuple(
            QueryStatus(**{k: v for k, v in q.items() if k in _QUERY_FIELDS})
            for q in data.get("queries") or ()
        )
        simple["processes"] = tuple(
            ProcessStatus(**{k: v for k, v in p.items() if k in _PROCESS_FIELDS})
            for p in data.get("processes") or ()
        )
        for name in ("application_id", "client_id", "instance_id", "state", "processing_guarantee"):
            simple.setdefault(name, "")
        simple.setdefault("started_at", None)
        simple.setdefault("assignment_strategy", None)
        return cls(threads=threads, tasks=tasks, **simple)

    def to_dict(self) -> dict[str, Any]:
        """Plain dicts and lists, for JSON."""
        data = dataclasses.asdict(self)
        data["threads"] = list(data["threads"])
        data["queries"] = list(data["queries"])
        data["processes"] = list(data["processes"])
        data["tasks"] = [
            {**task, "partitions": list(task["partitions"])}
            if task["restore"] is not None
            else {k: v for k, v in task.items() if k != "restore"}
            | {"partitions": list(task["partitions"])}
            for task in data["tasks"]
        ]
        return data

    def __getitem__(self, key: str) -> Any:
        """The earlier dict API: `status["tasks"]` etc., values as in `to_dict()`."""
        if key not in _FIELDS:
            raise KeyError(key)
        if key in ("threads", "tasks", "queries", "processes"):
            return self.to_dict()[key]
        return getattr(self, key)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in _FIELDS else default

    def __contains__(self, key: object) -> bool:
        return key in _FIELDS

    def keys(self) -> list[str]:
        """With `__getitem__`, lets `dict(status)` work as it did for the dict API."""
        return [f.name for f in dataclasses.fields(self)]


_FIELDS = frozenset(f.name for f in dataclasses.fields(AppStatus))
_QUERY_FIELDS = frozenset(f.name for f in dataclasses.fields(QueryStatus))
_PROCESS_FIELDS = frozenset(f.name for f in dataclasses.fields(ProcessStatus))
