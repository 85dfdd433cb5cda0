"""The `streams-runtime` command: run, broker, demo (and admin, later).

Runs on the main thread. Signal handlers only set flags; the main loop acts on
them (gunicorn's shape): SIGTERM/SIGINT close the app gracefully, SIGTTIN adds a
processing thread, SIGTTOU removes one.
"""

from __future__ import annotations

import argparse
import importlib
import os
import signal
import sys
import threading
from collections.abc import Sequence
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2


def load_topology(target: str) -> Any:
    """Resolve MODULE:ATTR to a Topology (calling ATTR if it is a factory)."""
    from runtime.topology.topology import Topology

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"expected MODULE:ATTR, got {target!r}")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"cannot import {module_name!r}: {exc}") from exc
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(f"module {module_name!r} has no attribute {attr!r}") from None
    if not isinstance(obj, Topology) and callable(obj):
        obj = obj()
    if not isinstance(obj, Topology):
        raise ValueError(
            f"{target} is a {type(obj).__name__}, not a Topology (builder.build()) "
            "or a function returning one"
        )
    return obj


def cmd_run(args: argparse.Namespace) -> int:
    from runtime.app import App, AppState
    from runtime.config import ConfigError, load_config
    from runtime.logging import configure_logging, get_logger
    from runtime.polling.topics import TopicError

    try:
        config = load_config(args.config, args.set or ())
    except ConfigError as exc:
        print(f"streams-runtime: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    configure_logging(config.log_level)
    log = get_logger("runtime.cli")
    try:
        topology = load_topology(args.target)
    except Exception as exc:
        print(f"streams-runtime: cannot load topology {args.target}: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    try:
        app = App(topology, config)
        app.start()
    except (ConfigError, TopicError) as exc:
        print(f"streams-runtime: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT

    requests: list[str] = []
    wake = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        requests.append(signal.Signals(signum).name)
        wake.set()

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(sig, on_signal)

    closing = False
    while not app.wait(0.0):
        wake.wait(0.2)
        wake.clear()
        while requests:
            name = requests.pop(0)
            log.info("signal_received", signal=name)
            if name in ("SIGTERM", "SIGINT") and not closing:
                closing = True
                threading.Thread(target=app.close, name="closer", daemon=True).start()
            elif name == "SIGTTIN":
                log.info("signal_add_thread", thread=app.add_processing_thread())
            elif name == "SIGTTOU":
                threading.Thread(
                    target=app.remove_processing_thread, name="remover", daemon=True
                ).start()
    return EXIT_OK if app.state is AppState.NOT_RUNNING else EXIT_FAILED


def cmd_broker(args: argparse.Namespace) -> int:
    from runtime.devbroker import run_foreground

    return run_foreground(port=args.port, host=args.host)


def cmd_demo(args: argparse.Namespace) -> int:
    from runtime.demo import run_demo

    return run_demo(
        duration=args.duration, rate=args.rate, threads=args.threads, partitions=args.partitions
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="streams-runtime", description="Run Kafka stream-processing topologies."
    )
    sub = parser.add_subparsers(dest="command", required=True)

    run = sub.add_parser("run", help="run a topology as a daemon")
    run.add_argument("target", metavar="MODULE:ATTR", help="a Topology or a function returning one")
    run.add_argument("--config", metavar="app.toml", help="TOML configuration file")
    run.add_argument(
        "--set", action="append", metavar="key=value", help="a configuration value (repeatable)"
    )
    run.set_defaults(func=cmd_run)

    broker = sub.add_parser("broker", help="start the embedded development broker (Tansu)")
    broker.add_argument("--port", type=int, default=9092)
    broker.add_argument("--host", default="127.0.0.1")
    broker.set_defaults(func=cmd_broker)

    demo = sub.add_parser("demo", help="broker + sample app + load, with a live view")
    demo.add_argument(
        "--duration", type=float, default=None, help="seconds (default: until Ctrl-C)"
    )
    demo.add_argument("--rate", type=int, default=20000, help="input records per second")
    demo.add_argument("--threads", type=int, default=2, help="processing threads")
    demo.add_argument("--partitions", type=int, default=8)
    demo.set_defaults(func=cmd_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    result: int = args.func(args)
    return result


if __name__ == "__main__":
    sys.exit(main())
