"""Entry point of every child process: `python -m runtime.isolation.child`.

Two roles (`ChildSpec.role`): a process-isolated named query, and a
processing process (`worker`) of a daemon with `processes` > 1, which runs
the whole topology with its slot's identity (runtime.isolation.workers).

Protocol (JSON lines; the parent's side is runtime.isolation.process): the
daemon writes a `ChildSpec` line, then commands (`{"cmd": "pause" |
"resume" | "stop"}`, and requests `{"cmd": "request", "id": n, "op": ...}`
answered by a `reply` event: `status`, `metrics`, `threads.add`,
`threads.remove`, `threads.set`, `pause`, `resume`, `prepare_leave`, and a
worker's `query.add|remove|pause|resume`) on stdin; the child
writes events on stdout: `started`, `status` (every `STATUS_INTERVAL_S`),
`failed` (start-up or the app failed), `reply`. Logs go to stderr, which
the child shares with the daemon; each line says whose it is. stdin closing (the daemon died, even by kill -9) stops the child
gracefully. Not PR_SET_PDEATHSIG: that fires when the *thread* that started
the child ends, and `resume_query` may run on any short-lived thread.

Threads: the main thread runs the app's lifecycle and the status loop; one
reader thread takes the commands; each request runs on a short-lived thread
of its own (`threads.remove` may wait for a batch to end).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
from typing import IO, Any

from runtime.gc_tuning import tune_for_app_process

STATUS_INTERVAL_S = 0.5


def _write(out: IO[str], lock: threading.Lock, event: str, **fields: Any) -> bool:
    """One event line; False once the daemon no longer reads them."""
    with lock:
        try:
            out.write(json.dumps({"event": event, **fields}) + "\n")
            out.flush()
        except (BrokenPipeError, ValueError):  # ValueError: written after close
            return False
    return True


def main() -> int:
    # stdout carries the protocol only: whatever else prints goes to stderr.
    out = sys.stdout
    sys.stdout = sys.stderr
    write_lock = threading.Lock()
    line = sys.stdin.readline()
    if not line:
        return 0
    from runtime.isolation.plan import ChildSpec

    spec = ChildSpec.from_line(line)
    if spec.nice:
        os.nice(spec.nice)  # before any thread: every thread inherits it

    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())

    try:
        app = _start(spec)
    except BaseException as exc:  # any start-up failure is the query's, reported as such
        _write(out, write_lock, "failed", error=f"{type(exc).__name__}: {exc}")
        return 2
    # As `streams-runtime run` does (runtime.gc_tuning).
    tune_for_app_process()
    _write(out, write_lock, "started", pid=os.getpid())

    def read_commands() -> None:
        for command_line in sys.stdin:
            try:
                message = json.loads(command_line)
                command = message.get("cmd")
            except (ValueError, AttributeError):
                continue
            if command == "request":
                threading.Thread(
                    target=_answer,
                    args=(app, message, out, write_lock),
                    name="child-request",
                    daemon=True,
                ).start()
            elif command == "pause":
                app.pause()
            elif command == "resume":
                app.resume()
            elif command == "stop":
                break
        stop.set()  # "stop", or stdin closed: the daemon is gone or done with us

    threading.Thread(target=read_commands, name="query-child-commands", daemon=True).start()
    return _run(app, spec, out, write_lock, stop)


def _answer(app: Any, message: dict[str, Any], out: IO[str], lock: threading.Lock) -> None:
    """Carry out one request of the parent and write its reply."""
    request_id = message.get("id")
    try:
        result = _request(app, str(message.get("op")), message)
    except Exception as exc:  # the reply carries it; the child goes on
        _write(out, lock, "reply", id=request_id, error=f"{type(exc).__name__}: {exc}")
        return
    _write(out, lock, "reply", id=request_id, result=result)


def _request(app: Any, op: str, message: dict[str, Any]) -> Any:
    timeout = message.get("timeout")
    if op == "status":
        return app.status().to_dict()
    if op == "metrics":
        from prometheus_client import generate_latest

        from runtime.metrics.families import make_registry

        return generate_latest(make_registry(app)).decode()
    if op == "threads":
        return list(app.processing_threads)
    if op == "threads.add":
        return app.add_processing_thread()
    if op == "threads.remove":
        return app.remove_processing_thread(timeout)
    if op == "threads.set":
        return app.set_processing_threads(int(message["count"]), timeout)
    if op in ("pause", "resume"):
        getattr(app, op)(message.get("task"))
        return None
    if op == "prepare_leave":
        app.prepare_leave()  # the process exits 0 once its tasks are handed over
        return None
    if op.startswith("query."):
        return _query_request(app, op, message)
    raise ValueError(f"unknown request {op!r}")


def _query_request(app: Any, op: str, message: dict[str, Any]) -> Any:
    """A worker's part of the pool's named-query changes
    (runtime.isolation.pool_queries); a thread-isolated query always."""
    from runtime.topology.loading import load_topology

    name = str(message["name"])
    timeout = float(message.get("timeout") or 60.0)
    if op == "query.add":
        app.add_query(
            name,
            load_topology(str(message["source"])),
            priority=message.get("priority"),
            weight=message.get("weight"),
            max_threads=message.get("max_threads"),
            timeout=timeout,
            source=str(message["source"]),
            isolation="thread",
        )
        return None
    if op == "query.remove":
        app.remove_query(name, reset=bool(message.get("reset")), timeout=timeout)
        return None
    if op == "query.pause":
        app.pause_query(name)
        return None
    if op == "query.rewind":
        loaded = load_topology(str(message["source"]), named=True)
        app.rewind_query_input(name, loaded[name] if isinstance(loaded, dict) else loaded, timeout)
        return None
    if op == "query.resume":
        app.resume_query(name)
        return None
    raise ValueError(f"unknown request {op!r}")


def _start(spec: Any) -> Any:
    from runtime.app import App
    from runtime.config import StreamsConfig
    from runtime.isolation.offsets import carry_into_child
    from runtime.isolation.plan import WORKER_ROLE
    from runtime.logging import configure_logging
    from runtime.topology.loading import load_topology

    config = StreamsConfig.from_dict(spec.config)
    if spec.role == WORKER_ROLE:
        # One log stream: every line says which process wrote it.
        configure_logging(config.log_level, fields={"process": f"p{spec.slot}", "pid": os.getpid()})
        worker = App(_worker_topology(spec), config, source=spec.source)
        # Paused before it starts, as the daemon's other processes are: a task
        # moving here must not run for a moment before a `pause` reaches it.
        for name in spec.queries_paused:
            worker.pause_query(name)
        if spec.paused_all:
            worker.pause()
        for task_id in spec.paused_tasks:
            worker.pause(task_id)
        worker.start()
        return worker
    # Every line of the child's log says whose it is (it shares the daemon's stderr).
    configure_logging(config.log_level, fields={"query": spec.query, "query_pid": os.getpid()})
    loaded = load_topology(spec.source, named=True)
    topology = loaded[spec.query] if isinstance(loaded, dict) else loaded
    carry_into_child(config, topology, spec.parent_group)
    app = App(topology, config, isolated_query=spec.query)
    app.start()
    return app


def _worker_topology(spec: Any) -> Any:
    """The topology a worker starts with: its source, with the named queries
    added and removed at runtime since the daemon started (their settings
    are in the config, runtime.isolation.pool_queries)."""
    from runtime.topology.loading import load_topology

    loaded = load_topology(spec.source, named=True)
    if not (spec.queries_added or spec.queries_removed) or not isinstance(loaded, dict):
        return loaded
    queries = {name: t for name, t in loaded.items() if name not in spec.queries_removed}
    for added in spec.queries_added:
        queries[added["name"]] = load_topology(added["source"])
    return queries


def _run(app: Any, spec: Any, out: IO[str], lock: threading.Lock, stop: threading.Event) -> int:
    from runtime.app import AppState

    while True:
        status = app.status()
        figures = app.query_figures()
        reported = _write(
            out,
            lock,
            "status",
            state=status.state,
            tasks=len(status.tasks),
            threads=len(app.processing_threads),
            consumed=status.consumed,
            processed=status.processed,
            produced=status.produced,
            commits=status.commits,
            last_commit=status.last_commit,
            lag=status.total_lag,
            busy_seconds=figures[0].get(spec.query, 0.0),
            p99_latency_ms=figures[1].get(spec.query),
        )
        if app.state in (AppState.NOT_RUNNING, AppState.ERROR):
            break
        # The daemon is gone (its end of the pipe closed): close gracefully.
        if not reported or stop.wait(STATUS_INTERVAL_S):
            app.close()
            break
    if app.state is AppState.ERROR:
        _write(out, lock, "failed", error=app.status().failure or "its app failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
