"""Client side of the admin socket, and the `streams-runtime admin` command.

`request(path, command, **arguments)` sends one request and returns its result
(raising `AdminCommandFailed` for an `{"ok": false}` reply); `AdminConnection`
keeps one connection for several requests. `format_*` render results as the
tables the command prints; `--json` prints the raw result instead.

Threads: everything here may be called from any thread; each connection is
used by one thread at a time.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = [
    "AdminCommandFailed",
    "AdminConnection",
    "AdminUnavailable",
    "format_status",
    "format_tasks",
    "format_threads",
    "locate_socket",
    "request",
    "resolve_socket",
    "run_admin",
]

SOCKET_ENV = "STREAMS_RUNTIME_ADMIN_SOCKET"
"""Same variable `load_config` maps to `admin.socket`: daemon and client agree."""

DEFAULT_TIMEOUT_S = 10.0
_MAX_REPLY_BYTES = 64 << 20


class AdminUnavailable(RuntimeError):
    """No daemon answers on the socket (absent, refused, closed, timed out)."""


class AdminCommandFailed(RuntimeError):
    """The daemon answered `{"ok": false, "error": ...}`."""


class AdminConnection:
    """One connection to the admin socket; `call` sends a request, waits for the reply."""

    def __init__(self, path: str, timeout: float = DEFAULT_TIMEOUT_S) -> None:
        self.path = path
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.settimeout(timeout)
        self._buffer = b""
        try:
            self._sock.connect(path)
        except FileNotFoundError:
            self._sock.close()
            raise AdminUnavailable(
                f"no admin socket at {path} (is the daemon running with admin.socket set?)"
            ) from None
        except OSError as exc:
            self._sock.close()
            raise AdminUnavailable(f"cannot connect to admin socket {path}: {exc}") from None

    def __enter__(self) -> AdminConnection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._sock.close()

    def send_line(self, line: bytes, timeout: float | None = None) -> dict[str, Any]:
        """Send raw bytes (a newline is added if missing) and return the parsed reply."""
        if not line.endswith(b"\n"):
            line += b"\n"
        if timeout is not None:
            self._sock.settimeout(timeout)
        try:
            self._sock.sendall(line)
            return self.read_reply()
        except TimeoutError:
            raise AdminUnavailable(f"no reply from {self.path} in time") from None
        except OSError as exc:
            raise AdminUnavailable(f"admin socket {self.path}: {exc}") from None

    def read_reply(self) -> dict[str, Any]:
        """Read one reply line; AdminUnavailable if the daemon closes first."""
        while b"\n" not in self._buffer:
            chunk = self._sock.recv(65536)
            if not chunk:
                raise AdminUnavailable(f"the daemon closed the connection on {self.path}")
            self._buffer += chunk
            if len(self._buffer) > _MAX_REPLY_BYTES:
                raise AdminUnavailable("reply too long")
        line, _, self._buffer = self._buffer.partition(b"\n")
        reply = json.loads(line)
        if not isinstance(reply, dict) or "ok" not in reply:
            raise AdminUnavailable(f"not an admin reply: {line[:200]!r}")
        return reply

    def call(self, command: str, timeout: float | None = None, **arguments: Any) -> Any:
        """The result of one command; raises AdminCommandFailed for an error reply."""
        payload = {"command": command, **arguments}
        reply = self.send_line(json.dumps(payload).encode(), timeout)
        if not reply["ok"]:
            raise AdminCommandFailed(str(reply.get("error")))
        return reply.get("result")


def _timeout_for(arguments: Mapping[str, Any], timeout: float) -> float:
    """Commands that wait for a thread's batch get their own timeout plus a margin."""
    waits = arguments.get("timeout")
    return max(timeout, float(waits) + 5.0) if isinstance(waits, int | float) else timeout


def request(path: str, command: str, timeout: float = DEFAULT_TIMEOUT_S, **arguments: Any) -> Any:
    """Send one command on a new connection and return its result."""
    with AdminConnection(path, _timeout_for(arguments, timeout)) as conn:
        return conn.call(command, **arguments)


APPLICATION_ID_ENV = "STREAMS_RUNTIME_APPLICATION_ID"
"""Same variable `load_config` maps to `application.id`."""

_OFF_WORDS = ("", "none")  # admin.socket values that turn the socket off (runtime.config)


def resolve_socket(explicit: str | None, config_path: str | None = None) -> str | None:
    """The socket path configured: `--socket`, else the env, else the config
    file's `admin.socket`; None if none is (or it is turned off)."""
    if explicit:
        return explicit
    from_env = os.environ.get(SOCKET_ENV)
    if from_env is not None:
        return None if _off(from_env) else from_env
    if config_path:
        value = _toml_value(_read_toml(config_path), "admin.socket")
        if isinstance(value, str) and not _off(value):
            return value
    return None


def _off(value: str) -> bool:
    return value.strip().lower() in _OFF_WORDS


def locate_socket(
    explicit: str | None, config_path: str | None = None, application_id: str | None = None
) -> str:
    """The socket `streams-runtime admin` talks to (issue 32): as configured
    (`resolve_socket`), else the daemon's default one (`runtime.admin.paths`)
    of `application_id` (`--application-id`, else the config file's or the
    env's application.id), else the only daemon answering there.

    Raises OSError/ValueError for a config file that cannot be read, and
    DefaultSocketError saying what was looked for (the socket turned off
    included). Main thread of the command.
    """
    from runtime.admin.paths import DefaultSocketError, find_default_socket

    configured = resolve_socket(explicit, config_path)
    if configured:
        return configured
    document = _read_toml(config_path) if config_path else {}
    socket_value = os.environ.get(SOCKET_ENV, _toml_value(document, "admin.socket"))
    if isinstance(socket_value, str) and _off(socket_value):
        raise DefaultSocketError(
            f"admin.socket is off ({socket_value!r}): the daemon opens no socket; set "
            "admin.socket to a path there and pass it with --socket"
        )
    app_id = application_id or _toml_value(document, "application.id")
    if not isinstance(app_id, str) or not app_id:
        app_id = os.environ.get(APPLICATION_ID_ENV) or None
    return find_default_socket(app_id)


def _read_toml(path: str) -> dict[str, Any]:
    import tomllib

    with open(path, "rb") as f:
        return tomllib.load(f)


def _toml_value(table: Mapping[str, Any], key: str) -> Any:
    """`key` (dotted) of a TOML document, written as one key, as tables, or a
    mix (`"admin.socket" = ...`, `[admin] socket = ...`); None if absent."""
    if key in table:
        return table[key]
    parts = key.split(".")
    for i in range(1, len(parts)):
        head = ".".join(parts[:i])
        inner = table.get(head)
        if isinstance(inner, Mapping):
            found = _toml_value(inner, ".".join(parts[i:]))
            if found is not None:
                return found
    return None


# --- rendering ------------------------------------------------------------------------


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
    rows = []
    for t in tasks:
        row: tuple[Any, ...] = (
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
    header: tuple[str, ...] = ("TASK", "STATE", "OWNER", "BUFFERED", "LAG", "PROCESSED")
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
    width = max(len(k) for k, _ in lines)
    head = "\n".join(f"{k.ljust(width)}  {v}" for k, v in lines)
    return head + "\n\n" + format_tasks(tasks)


def _mib(n: Any) -> str:
    return f"{float(n or 0) / (1 << 20):.1f} MiB"


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
        f"{_mib(readers)}), {len(stores)} stores, {keys} keys, SST {_mib(sst)}; write stalls: "
    )
    text += f"{len(stalled)} ({', '.join(stalled[:4])})" if stalled else "none"
    if memory.get("stall_seconds"):
        text += f"; waited {float(memory['stall_seconds']):.1f} s for memtable flushes"
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
    if command == "queries" or command.startswith("query."):
        return format_queries(result.get("queries") or [])
    return json.dumps(result, indent=2)


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


def run_admin(
    socket_path: str | None,
    command: str,
    arguments: Mapping[str, Any],
    as_json: bool = False,
    timeout: float = DEFAULT_TIMEOUT_S,
) -> int:
    """The `streams-runtime admin` command: 0 ok, 1 failed or unreachable, 2 no socket."""
    if not socket_path:
        print(
            f"streams-runtime admin: no socket; pass --socket PATH, --config app.toml "
            f"(with admin.socket), --application-id ID or set {SOCKET_ENV}",
            file=sys.stderr,
        )
        return 2
    try:
        result = request(socket_path, command, timeout=timeout, **arguments)
    except AdminUnavailable as exc:
        print(f"streams-runtime admin: {exc}", file=sys.stderr)
        return 1
    except AdminCommandFailed as exc:
        print(f"streams-runtime admin: {command}: {exc}", file=sys.stderr)
        return 1
    if as_json:
        print(json.dumps(result, indent=2, sort_keys=True))
    else:
        print(_format(command, result))
        warning = result.get("warning") if isinstance(result, dict) else None
        if warning:
            # On stderr: the reply itself (stdout) is what scripts read.
            print(f"streams-runtime admin: warning: {warning}", file=sys.stderr)
    return 0
