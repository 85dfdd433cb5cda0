"""`streams-runtime run MODULE:ATTR`: start the app and serve it as a daemon.

Runs on the main thread. It starts the app, then hands the main thread to
the admin loop (`runtime.admin.daemon.run_daemon`): signals in gunicorn's
shape (SIGTERM/SIGINT close the app gracefully, SIGTTIN adds a processing
thread, SIGTTOU removes one), the admin socket and the metrics endpoint.
Exit codes: 0 clean shutdown (SIGTERM or SIGINT once the app started
included), 1 the app failed, 2 bad input (config, topology, topics), 130/143
SIGINT/SIGTERM before the app started anything (`runtime.admin.signals`).

With `processes` > 1 (or `processes.resizable`) the admin loop serves a
`runtime.isolation.workers.WorkerPool` instead of an `App`: this process
becomes the supervisor of that many processing processes.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import TYPE_CHECKING, Any

from runtime.commands.common import EXIT_BAD_INPUT, EXIT_FAILED, EXIT_OK, load_config_and_topology
from runtime.gc_tuning import tune_for_app_process

if TYPE_CHECKING:
    from runtime.admin.signals import StartupSignals


def main(args: argparse.Namespace) -> int:
    """`run`: start the app, then serve it until it stops; the exit code."""
    # SIGTERM and SIGINT are handled before anything else is done: until the
    # app starts they end the command with one line and 128 + the signal's
    # number; from App.start() on they close the app gracefully, exit 0
    # (runtime.admin.signals). Whatever the parent set (a shell's background
    # job inherits SIGINT ignored).
    from runtime.admin.signals import Interrupted, StartupSignals

    signals = StartupSignals().install()
    try:
        return _run(args, signals)
    except Interrupted as exc:
        print(
            f"streams-runtime: {exc.signal.name} during start-up; stopped before "
            "the app started anything",
            file=sys.stderr,
        )
        return exc.exit_code


def _run(args: argparse.Namespace, signals: StartupSignals) -> int:
    """`run` under `signals` (a StartupSignals), which may raise Interrupted
    until `App.start()` is called, and during its wait for the cluster."""
    from runtime.admin.daemon import run_daemon
    from runtime.admin.preflight import (
        DaemonSetupError,
        preflight,
        raise_open_files_limit,
    )
    from runtime.app import App
    from runtime.config import ConfigError
    from runtime.kafka.cluster import wait_for_cluster
    from runtime.kafka.topics import TopicError
    from runtime.topology.errors import SerializationError
    from runtime.topology.named_queries import QueryError

    loaded = load_config_and_topology(args, named=True)
    if isinstance(loaded, int):
        return loaded
    config, topology = loaded
    try:
        admin_socket = preflight(config)
        raise_open_files_limit()
        app: Any
        if config.processes > 1 or config.processes_resizable:
            # A supervisor and `processes` processing processes
            # (runtime.isolation.workers); each checks topics and waits for
            # the cluster itself, and one that cannot start fails the start.
            from runtime.isolation.workers import WorkerPool
            from runtime.logging import configure_logging

            # One log stream: the supervisor's lines say so, its processes'
            # say `p<i>` (runtime.isolation.child).
            configure_logging(
                config.log_level, fields={"process": "supervisor", "pid": os.getpid()}
            )
            app = WorkerPool(config, args.target)
            signals.defer()
            try:
                app.start()
            except RuntimeError as exc:
                reason = str(exc).replace("MODULE:ATTR", args.target)
                print(f"streams-runtime: {reason}", file=sys.stderr)
                return EXIT_BAD_INPUT
        else:
            app = App(topology, config, source=args.target)
            # From here a signal is recorded, and acted on by the daemon once
            # start() returns (start() may be half-way through starting
            # threads), except in the wait for the cluster: nothing started yet.
            signals.defer(wait_for_cluster)
            app.start()
    except (ConfigError, TopicError, DaemonSetupError, SerializationError, QueryError) as exc:
        print(f"streams-runtime: {str(exc).replace('MODULE:ATTR', args.target)}", file=sys.stderr)
        return EXIT_BAD_INPUT

    # The daemon owns its process: its GC settings are ours (runtime.gc_tuning).
    tune_for_app_process()
    code = run_daemon(app, signals=signals, admin_socket=admin_socket)
    if code == EXIT_FAILED and app.failure is not None:
        # The last line a user sees says why (the log has the details).
        print(f"streams-runtime: the app failed: {_reason(app.failure)}", file=sys.stderr)
    elif signals.first_shutdown is not None:
        outcome = "shut down gracefully" if code == EXIT_OK else "the shutdown failed (see the log)"
        print(f"streams-runtime: {signals.first_shutdown.name}: {outcome}", file=sys.stderr)
    return code


def _reason(failure: BaseException) -> str:
    """A task failure says which task and stage and the user's error; other
    failures get their type."""
    if isinstance(getattr(failure, "cause", None), BaseException):
        return str(failure)
    return f"{type(failure).__name__}: {failure}"
