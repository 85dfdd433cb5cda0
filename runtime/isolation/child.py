"""Entry point of a process-isolated query's child: `python -m runtime.isolation.child`.

Protocol (JSON lines): the daemon writes a `ChildSpec` line, then commands
(`{"cmd": "pause" | "resume" | "stop"}`) on stdin; the child writes events
on stdout: `started`, `status` (every `STATUS_INTERVAL_S`), `failed` (start-up
or the app failed). Logs go to stderr, which the child shares with
the daemon. stdin closing (the daemon died, even by kill -9) stops the child
gracefully. Not PR_SET_PDEATHSIG: that fires when the *thread* that started
the child ends, and `resume_query` may run on any short-lived thread.

Threads: the main thread runs the app's lifecycle and the status loop; one
reader thread takes the commands.
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
                command = json.loads(command_line).get("cmd")
            except ValueError:
                continue
            if command == "pause":
                app.pause()
            elif command == "resume":
                app.resume()
            elif command == "stop":
                break
        stop.set()  # "stop", or stdin closed: the daemon is gone or done with us

    threading.Thread(target=read_commands, name="query-child-commands", daemon=True).start()
    return _run(app, spec, out, write_lock, stop)


def _start(spec: Any) -> Any:
    from runtime.app import App
    from runtime.config import StreamsConfig
    from runtime.isolation.offsets import carry_into_child
    from runtime.logging import configure_logging
    from runtime.topology.loading import load_topology

    config = StreamsConfig.from_dict(spec.config)
    # Every line of the child's log says whose it is (it shares the daemon's stderr).
    configure_logging(config.log_level, fields={"query": spec.query, "query_pid": os.getpid()})
    loaded = load_topology(spec.source, named=True)
    topology = loaded[spec.query] if isinstance(loaded, dict) else loaded
    carry_into_child(config, topology, spec.parent_group)
    app = App(topology, config, isolated_query=spec.query)
    app.start()
    return app


def _run(app: Any, spec: Any, out: IO[str], lock: threading.Lock, stop: threading.Event) -> int:
    from runtime.app import AppState

    while True:
        status = app.status()
        figures = app.query_figures()
        reported = _write(
            out,
            lock,
            "status",
            tasks=len(status.tasks),
            processed=status.processed,
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
        _write(out, lock, "failed", error=app.status().failure or "the query's app failed")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
