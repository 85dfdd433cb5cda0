"""What `streams-runtime admin` prints: replies of the admin socket as tables and lines.

Apart from `runtime.admin.client` (the socket's client side) because it is a
different job: rendering `App.status()` and the other replies for a person,
`--json` printing the raw reply instead. Pure functions of the reply.

Threads: any (the CLI's main thread in practice).
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from typing import Any


def _table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    cells = [list(header)] + [["-" if c is None else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _age(wall_time: float | None, now: float) -> str:
    if wall_time is None:
        return "never"
    seconds = max(0.0, now - wall_time)
    if seconds < 120:
        return f"{seconds:.1f} s ago"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min ago"
    return f"{seconds / 3600:.1f} h ago"


def format_tasks(tasks: Sequence[Mapping[str, Any]]) -> str:
    """The task table; with key-parallel tasks (num.threads.per.task) also
    IN_FLIGHT, WM_LAG (completed above the watermark) and PARALLEL (threads
    busy on average / the most allowed)."""
    if not tasks:
        return "no tasks assigned"
    key_parallel = any(t.get("key_parallel") for t in tasks)
    # A daemon with processes > 1: which process owns each task.
    by_process = any(t.get("process") for t in tasks)
    rows = []
    for t in tasks:
        row: tuple[Any, ...] = (t.get("process"),) if by_process else ()
        row += (
            t.get("id"),
            t.get("state"),
            t.get("owner"),
            t.get("buffered"),
            t.get("lag"),
            t.get("processed"),
        )
        if key_parallel:
            row += (
                (t.get("in_flight"), t.get("watermark_lag"), _parallel(t))
                if t.get("key_parallel")
                else (None, None, None)
            )
        rows.append(row + (",".join(t.get("partitions", [])),))
    header: tuple[str, ...] = ("PROCESS",) if by_process else ()
    header += ("TASK", "STATE", "OWNER", "BUFFERED", "LAG", "PROCESSED")
    if key_parallel:
        header += ("IN_FLIGHT", "WM_LAG", "PARALLEL")
    return _table(header + ("PARTITIONS",), rows)


def _parallel(task: Mapping[str, Any]) -> str:
    """Threads busy / most allowed; "cpu": records count as CPU-bound, one thread."""
    used = f"{float(task.get('parallelism') or 0.0):.1f}/{task.get('threads_per_task')}"
    return used + " cpu" if task.get("cpu_bound") else used


def format_threads(result: Mapping[str, Any]) -> str:
    threads = result.get("threads") or []
    if not threads:
        return "no processing threads"
    live = set(result.get("names") or [])
    rows = [
        (
            t["name"],
            _thread_state(t, live),
            t.get("task"),
            t.get("last_task"),
            t.get("batches"),
            t.get("busy_seconds"),
        )
        for t in threads
    ]
    return _table(("THREAD", "STATE", "TASK", "LAST_TASK", "BATCHES", "BUSY_S"), rows)


def _thread_state(thread: Mapping[str, Any], live: set[str]) -> str:
    """processing / idle / stopping / stopped (a daemon older than the
    `state` field: alive or stopping)."""
    if thread.get("name") not in live and thread.get("alive"):
        return "stopping"
    state = thread.get("state")
    if state:
        return str(state)
    return "alive" if thread.get("alive") else "stopped"


def _thread_brief(thread: Mapping[str, Any]) -> str:
    """`name (processing 0_3)`, `name (idle, last 0_1)`; just the name from a
    daemon older than the `state` field."""
    state = thread.get("state")
    if not state:
        return str(thread["name"])
    task = thread.get("task")
    if task:
        return f"{thread['name']} ({state} {task})"
    last = thread.get("last_task")
    return f"{thread['name']} ({state}{', last ' + str(last) if last else ''})"


def format_status(status: Mapping[str, Any], now: float | None = None) -> str:
    now = time.time() if now is None else now
    threads = status.get("threads") or []
    alive = [_thread_brief(t) for t in threads if t.get("alive")]
    tasks = status.get("tasks") or []
    by_state: dict[str, int] = {}
    for t in tasks:
        by_state[str(t.get("state"))] = by_state.get(str(t.get("state")), 0) + 1
    daemon = status.get("daemon") or {}
    down = status.get("broker_down_since")
    lines = [
        ("state", status.get("state")),
        (
            "application",
            f"{status.get('application_id')} (client {status.get('client_id')}, "
            f"{status.get('processing_guarantee')}, pid {daemon.get('pid', '?')})",
        ),
        ("threads", f"{len(alive)} alive" + (": " + ", ".join(alive) if alive else "")),
        (
            "tasks",
            f"{len(tasks)}"
            + (
                " (" + ", ".join(f"{k} {v}" for k, v in sorted(by_state.items())) + ")"
                if tasks
                else ""
            ),
        ),
        (
            "records",
            f"consumed {status.get('consumed', 0)}  processed {status.get('processed', 0)}  "
            f"produced {status.get('produced', 0)}  skipped {status.get('skipped', 0)}  "
            f"dead-lettered {status.get('dead_lettered', 0)}",
        ),
        ("lag", f"{status.get('total_lag', 0)} records"),
        (
            "last commit",
            f"{_age(status.get('last_commit'), now)} ({status.get('commits', 0)} commits"
            + (
                f", last took {1000 * float(status['last_commit_duration_s']):.0f} ms)"
                if status.get("last_commit") is not None and "last_commit_duration_s" in status
                else ")"
            ),
        ),
        ("broker", "reachable" if down is None else f"unreachable since {_age(down, now)}"),
    ]
    if status.get("retrying_call"):
        lines.append(
            (
                "retrying",
                f"{status['retrying_call']} since {_age(status.get('retrying_since'), now)} "
                "(the polling thread waits for the coordinator)",
            )
        )
    waiting = status.get("waiting_for")
    if waiting:
        since = status.get("startup_phase_since")
        # Past start-up (phase `processing`) it is not a phase that waits:
        # no processing thread runs (runtime.status.NO_PROCESSING_THREADS).
        started = status.get("startup_phase") in (None, "processing")
        lines.insert(
            1,
            (
                "waiting for",
                f"{waiting} ({status.get('startup_phase')}, since {_age(since, now)})"
                if since is not None and not started
                else str(waiting),
            ),
        )
    expansion = status.get("expansion_waiting_for")
    if expansion:
        lines.insert(1, ("expansion", f"waiting: {expansion}"))
    held = status.get("held_partitions") or []
    if held:
        lines.append(("held", f"{len(held)} partitions not tasks yet: {', '.join(held[:8])}"))
    for store, g in sorted((status.get("global_stores") or {}).items()):
        lines.append(
            (
                "global store",
                f"{store} ({g.get('topic')}): {g.get('state')}, lag {g.get('lag', 0)}, "
                f"{g.get('records', 0)} records applied",
            )
        )
    stalled = status.get("stalled_partitions") or []
    if stalled:
        lines.append(
            (
                "stalled",
                f"{len(stalled)} partitions not fetching while records wait "
                f"(resumed by the watchdog): {', '.join(stalled[:8])}",
            )
        )
    if status.get("partition_expansions"):
        lines.append(
            (
                "expansions",
                f"{status['partition_expansions']} followed, "
                f"{status.get('tasks_created_by_expansion', 0)} tasks created by them",
            )
        )
    memory = status.get("state_memory")
    if memory:
        lines.append(("state memory", format_state_memory(memory)))
    if status.get("failed_threads"):
        lines.append(("failed threads", status["failed_threads"]))
    if status.get("failure"):
        lines.append(("failure", status["failure"]))
    metrics = daemon.get("metrics")
    if metrics:
        lines.append(("metrics", f"{metrics.get('url')}/metrics"))
    processes = status.get("processes") or []
    if processes:
        up = sum(1 for p in processes if p.get("up"))
        lines.insert(3, ("processes", f"{up} up of {len(processes)}"))
    width = max(len(k) for k, _ in lines)
    head = "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)
    if processes:
        head += "\n\n" + format_processes(processes)
    return head + "\n\n" + format_tasks(tasks)


def _mib(n: Any) -> str:
    return f"{float(n or 0) / (1 << 20):.1f} MiB"


def _counted(stores: list[Mapping[str, Any]]) -> str:
    """ "N stores", or with the consolidated layout, whose figures are per
    column family (task `*`), "N column families"."""
    if stores and all(s.get("task") == "*" for s in stores):
        return f"{len(stores)} column families"
    return f"{len(stores)} stores"


def format_state_memory(memory: Mapping[str, Any]) -> str:
    """The `state memory` line of `admin status`: RocksDB's shared budget and
    its use, the stores, and write stalls (runtime.state.rocksdb_metrics)."""
    stores = memory.get("stores") or []
    keys = sum(int(s.get("estimated_keys", 0)) for s in stores)
    sst = sum(int(s.get("live_sst_bytes", 0)) for s in stores)
    readers = sum(int(s.get("table_readers_bytes", 0)) for s in stores)
    stalled = [
        f"{s.get('task')}/{s.get('store')} {'stopped' if s.get('write_stopped') else 'delayed'}"
        for s in stores
        if s.get("write_stopped") or s.get("delayed_write_rate")
    ]
    text = (
        f"RocksDB {_mib(memory.get('block_cache_usage_bytes'))} of "
        f"{_mib(memory.get('memory_bytes'))} (memtables "
        f"{_mib(memory.get('write_buffer_usage_bytes'))} of "
        f"{_mib(memory.get('write_buffer_limit_bytes'))}, pinned "
        f"{_mib(memory.get('block_cache_pinned_bytes'))}; outside it: SST readers "
        f"{_mib(readers)}), {_counted(stores)}, {keys} keys, SST {_mib(sst)}; write stalls: "
    )
    text += f"{len(stalled)} ({', '.join(stalled[:4])})" if stalled else "none"
    if memory.get("stall_seconds"):
        text += f"; waited {float(memory['stall_seconds']):.1f} s for memtable flushes"
    if memory.get("stalls_without_progress"):
        text += (
            f", {memory['stalls_without_progress']} waits gave up (memtables over their "
            "budget: see the log's rocksdb_memtables_over_budget)"
        )
    return text


def format_placement(placement: Mapping[str, Any]) -> str:
    """The plan of runtime-owned placement, one task per line."""
    lines = [
        f"placement plan v{placement.get('plan_version')} (applied here: "
        f"v{placement.get('applied')}; placer here: {placement.get('placer')}; "
        f"leaving: {placement.get('leaving')}; hand-overs here: {placement.get('handovers')})"
    ]
    owners = placement.get("owners") or {}
    learners = placement.get("learners") or {}
    moves = placement.get("moves") or {}
    for task in sorted(set(owners) | set(learners) | set(moves)):
        line = f"  {task}  owner {owners.get(task, '-')}"
        if task in moves:
            line += f"  moving to {moves[task]}"
        if task in learners:
            learner = learners[task]
            line += f"  learner {learner.get('instance')} (lag {learner.get('lag')})"
        lines.append(line)
    return "\n".join(lines)


def _format(command: str, result: Any) -> str:
    if command == "status":
        return format_status(result)
    if command == "tasks":
        text = format_tasks(result["tasks"])
        placement = result.get("placement")
        if placement:
            text += "\n\n" + format_placement(placement)
        return text
    if command == "prepare-leave":
        return "leaving: the tasks move to other instances, then the daemon exits"
    if command == "threads":
        return format_threads(result)
    if command == "threads.add":
        return f"added {result['added']}; threads: {', '.join(result['names']) or 'none'}"
    if command == "threads.remove":
        return f"removed {result['removed']}; threads: {', '.join(result['names']) or 'none'}"
    if command == "threads.set":
        return f"threads: {', '.join(result['names']) or 'none'}"
    if command in ("pause", "resume"):
        what = result.get(command + "d")
        target = "all tasks" if what == "all" else f"task {what}"
        note = " (not assigned to this process now)" if result.get("assigned") is False else ""
        return f"{command}d {target}{note}"
    if command == "shutdown":
        return f"shutting down (state {result.get('state')})"
    if command == "processes" or command.startswith("processes."):
        return format_processes(result.get("rows") or [])
    if command == "queries" or command.startswith("query."):
        return format_queries(result.get("queries") or [])
    return json.dumps(result, indent=2)


def format_processes(rows: Sequence[Mapping[str, Any]]) -> str:
    """The processing processes of a daemon with `processes` > 1 (`admin
    processes`, the status's PROCESSES block)."""
    if not rows:
        return "one process (processes=1)"
    table = [
        (
            r.get("name"),
            r.get("pid"),
            r.get("state"),
            r.get("tasks"),
            r.get("threads"),
            r.get("processed"),
            r.get("lag"),
            r.get("restarts"),
            r.get("last_exit"),
        )
        for r in rows
    ]
    return _table(
        (
            "PROCESS",
            "PID",
            "STATE",
            "TASKS",
            "THREADS",
            "PROCESSED",
            "LAG",
            "RESTARTS",
            "LAST_EXIT",
        ),
        table,
    )


def format_queries(queries: list[Mapping[str, Any]]) -> str:
    """Named queries as a table (`admin queries`, `admin query ...`)."""
    if not queries:
        return "no named queries"
    header = (
        "query",
        "state",
        "prio",
        "weight",
        "tasks",
        "rec/s",
        "busy",
        "lag",
        "p99 ms",
        "runs in",
    )
    rows = [
        (
            str(q.get("name")),
            str(q.get("state")),
            str(q.get("priority")),
            str(q.get("weight")),
            str(q.get("tasks")),
            f"{float(q.get('records_per_s') or 0):.0f}",
            f"{100 * float(q.get('busy_share') or 0):.0f}%",
            str(q.get("lag")),
            "-" if q.get("p99_latency_ms") is None else f"{float(q['p99_latency_ms']):.0f}",
            "daemon" if q.get("pid") is None else f"pid {q['pid']}",
        )
        for q in queries
    ]
    widths = [max(len(r[i]) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in (header, *rows)]
    failures = [f"{q.get('name')} failed: {q.get('failure')}" for q in queries if q.get("failure")]
    return "\n".join(lines + failures)
