"""Admin commands carried out on the app: `AdminHandler`.

One parsed request (runtime.admin.protocol) becomes calls into the `App`
(status, threads, pause/resume, named queries, shutdown, prepare-leave) and
one reply. Any thread; its methods block (they call into the app), so the
socket server (runtime.admin.server) runs them on an executor thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runtime.admin.protocol import (
    MAX_THREADS,
    CommandError,
    ProtocolError,
    Request,
    parse_request,
)
from runtime.logging import get_logger
from runtime.status import NO_PROCESSING_THREADS, AppStatus

__all__ = ["DEFAULT_REMOVE_TIMEOUT_S", "AdminHandler", "task_rows"]

log = get_logger("runtime.admin")

DEFAULT_REMOVE_TIMEOUT_S = 30.0
DEFAULT_PROCESSES_TIMEOUT_S = 120.0

# --- dispatch --------------------------------------------------------------------


def task_rows(status: AppStatus) -> list[dict[str, Any]]:
    """The status's tasks as JSON rows, each with `lag`: the summed lag of its
    input partitions."""
    rows = status.to_dict()["tasks"]
    for row, task in zip(rows, status.tasks, strict=True):
        row["lag"] = sum(status.lag.get(p, 0) for p in task.partitions)
    return rows


class AdminHandler:
    """Carries out admin requests on an `App`. Any thread; its methods block.

    `shutdown` is called (from the handling thread) for the `shutdown` command
    and must only start the shutdown, not wait for it. `extra_status` adds
    daemon facts (socket path, metrics address, pid) to the `status` result.
    `max_threads` bounds `threads.set` (the daemon passes
    `processing.threads.limit`).
    """

    def __init__(
        self,
        app: Any,
        shutdown: Callable[[], None] | None = None,
        extra_status: Callable[[], Mapping[str, Any]] | None = None,
        max_threads: int = MAX_THREADS,
    ) -> None:
        self._app = app
        self._shutdown = shutdown
        self._extra_status = extra_status
        self._max_threads = max_threads

    def handle_line(self, line: bytes | str) -> dict[str, Any]:
        """Parse and carry out one request line; the reply. Never raises."""
        try:
            request = parse_request(line)
        except ProtocolError as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:  # e.g. RecursionError: still one reply, the line's own
            log.warning("admin_request_unparsable", error=repr(exc)[:200])
            return {"ok": False, "error": f"request not understood: {type(exc).__name__}"}
        try:
            return {"ok": True, "result": self.handle(request)}
        except (CommandError, ValueError, TimeoutError) as exc:
            return {"ok": False, "error": str(exc)}
        except Exception as exc:
            log.warning("admin_command_failed", command=request.command, error=repr(exc))
            return {"ok": False, "error": f"{request.command} failed: {type(exc).__name__}: {exc}"}

    def handle(self, request: Request) -> Any:
        """Carry out one parsed request; its result. Raises CommandError."""
        app = self._app
        command, args = request.command, request.args
        if command == "status":
            snapshot: AppStatus = app.status()
            reply = snapshot.to_dict()
            reply["tasks"] = task_rows(snapshot)
            if self._extra_status is not None:
                reply["daemon"] = dict(self._extra_status())
            return reply
        if command == "tasks":
            snapshot = app.status()
            reply = {"tasks": task_rows(snapshot)}
            if snapshot.placement is not None:
                reply["placement"] = snapshot.placement
            return reply
        if command == "prepare-leave":
            try:
                app.prepare_leave()
            except Exception as exc:  # IllegalStateError: wrong mode or state
                raise CommandError(str(exc)) from None
            return {"leaving": True}
        if command == "threads":
            return {"names": app.processing_threads, "threads": app.status().to_dict()["threads"]}
        if command == "threads.add":
            if len(app.processing_threads) >= self._max_threads:
                raise CommandError(self._limit_reached())
            added = app.add_processing_thread()
            if added is None:
                if str(app.state) in ("RUNNING", "REBALANCING"):
                    raise CommandError(self._limit_reached())
                raise CommandError(f"cannot add a processing thread: the app is {app.state}")
            log.info("admin_thread_added", name=added)
            return {"added": added, "names": app.processing_threads}
        if command == "threads.remove":
            removed = app.remove_processing_thread(args.get("timeout", DEFAULT_REMOVE_TIMEOUT_S))
            if removed is None:
                state = str(app.state)
                if state in ("RUNNING", "REBALANCING"):
                    raise CommandError("no processing thread to remove")
                raise CommandError(f"cannot remove a processing thread: the app is {state}")
            log.info("admin_thread_removed", name=removed)
            return _warn_without_threads({"removed": removed, "names": app.processing_threads})
        if command == "threads.set":
            if args["count"] > self._max_threads:
                raise CommandError(
                    f"'count' {args['count']} is above processing.threads.limit "
                    f"({self._max_threads})"
                )
            names = app.set_processing_threads(args["count"], args.get("timeout"))
            log.info("admin_threads_set", count=args["count"], names=len(names))
            return _warn_without_threads({"names": list(names)})
        if command in ("pause", "resume"):
            task = args.get("task")
            getattr(app, command)(task)
            known = None if task is None else any(t.id == task for t in app.status().tasks)
            return {command + "d": task or "all", "assigned": known}
        if command == "queries" or command.startswith("query."):
            return self._query_command(command, args)
        if command == "processes" or command.startswith("processes."):
            return self._processes_command(command, args)
        if command == "shutdown":
            if self._shutdown is None:
                raise CommandError("shutdown is not available here")
            self._shutdown()
            return {"state": str(app.state)}
        raise CommandError(f"command {command!r} is not implemented")  # COMMANDS and this differ

    def _query_command(self, command: str, args: Mapping[str, Any]) -> Any:
        """`queries` and `query.*` (named queries, runtime.query_control).

        `query.add` imports MODULE:ATTR in the daemon's process, as `run` did
        for the app's own topology: whoever may use the admin socket may run
        code as the daemon (the socket is a Unix socket; mind its mode).
        """
        from runtime.topology.errors import TopologyError
        from runtime.topology.loading import load_topology

        app = self._app
        try:
            if command == "query.add":
                topology = load_topology(args["target"])
                app.add_query(
                    args["name"],
                    topology,
                    priority=args.get("priority"),
                    weight=args.get("weight"),
                    max_threads=args.get("max_threads"),
                    timeout=args.get("timeout", 60.0),
                    source=args["target"],
                    isolation=args.get("isolation"),
                )
                log.info("admin_query_added", query=args["name"], target=args["target"])
            elif command == "query.remove":
                app.remove_query(
                    args["name"], reset=args.get("reset", False), timeout=args.get("timeout", 60.0)
                )
                log.info("admin_query_removed", query=args["name"])
            elif command == "query.pause":
                app.pause_query(args["name"])
            elif command == "query.resume":
                app.resume_query(args["name"])
        except (TopologyError, RuntimeError) as exc:
            raise CommandError(str(exc)) from exc
        return {"queries": [dict(q) for q in app.status().to_dict()["queries"]]}

    def _processes_command(self, command: str, args: Mapping[str, Any]) -> Any:
        """`processes` and `processes.add|remove|set` (a daemon with
        `processes` > 1 or `processes.resizable`: runtime.isolation.workers).
        Resizing waits until the new processes run and removed ones have
        exited (`timeout`, default `DEFAULT_PROCESSES_TIMEOUT_S`)."""
        app = self._app
        if not hasattr(app, "set_processes"):
            if command == "processes":
                return {"processes": 1, "rows": []}
            raise CommandError(
                "this daemon runs in one process (processes=1): start it with processes=N "
                "(N > 1 or auto) or processes.resizable=true to change the count at runtime"
            )
        timeout = args.get("timeout", DEFAULT_PROCESSES_TIMEOUT_S)
        try:
            if command == "processes.add":
                app.add_process(timeout)
            elif command == "processes.remove":
                if app.processes <= 1:
                    raise CommandError("one process is the fewest: shut the daemon down instead")
                app.remove_process(timeout)
            elif command == "processes.set":
                app.set_processes(args["count"], timeout)
        except RuntimeError as exc:
            raise CommandError(str(exc)) from None
        if command != "processes":
            log.info("admin_processes_changed", command=command, processes=app.processes)
        return {
            "processes": app.processes,
            "rows": [dict(row.__dict__) for row in app.process_rows()],
        }

    def _limit_reached(self) -> str:
        return f"processing.threads.limit ({self._max_threads}) threads are running already"


def _warn_without_threads(reply: dict[str, Any]) -> dict[str, Any]:
    """`reply` with a `warning` when no processing thread is left: the app
    then reads input and processes none, and `streams-runtime admin` prints
    the warning (the app logs `no_processing_threads` too)."""
    if not reply.get("names"):
        reply["warning"] = NO_PROCESSING_THREADS
    return reply
