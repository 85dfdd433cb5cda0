"""``python -m benchmarks <workload> [options]``: run a benchmark workload.

Subcommands come from ``benchmarks.workloads.WORKLOADS``; ``python -m benchmarks
<workload> --help`` lists a workload's options. See ``benchmarks/README.md``.
"""

from __future__ import annotations

import argparse
import importlib
import signal
import sys

from benchmarks import interrupt
from benchmarks.workloads import WORKLOADS


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Benchmarks of streams-runtime against raw confluent-kafka baselines.",
    )
    sub = parser.add_subparsers(dest="workload", required=True, metavar="WORKLOAD")
    modules = {}
    for name, module_name in WORKLOADS.items():
        module = importlib.import_module(module_name)
        modules[name] = module
        doc = (module.__doc__ or "").strip().splitlines()[0]
        module.add_arguments(
            sub.add_parser(
                name,
                help=doc,
                description=module.__doc__,
                formatter_class=argparse.RawDescriptionHelpFormatter,
            )
        )
    args = parser.parse_args(argv)
    # SIGTERM unwinds like Ctrl-C, so the session's broker is stopped on the way out;
    # Ctrl-C ends the whole invocation once, cleanly (benchmarks/interrupt.py).
    signal.signal(signal.SIGTERM, _raise_system_exit)
    interrupt.install()
    try:
        return int(modules[args.workload].main(args))
    except KeyboardInterrupt:
        # A workload without partial results of its own: its clean-up ran on the
        # way out (children, broker); say so instead of a traceback.
        print("[bench] interrupted", file=sys.stderr, flush=True)
        return interrupt.EXIT_INTERRUPTED


def _raise_system_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
