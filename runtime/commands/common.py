"""What the CLI's commands share: their exit codes, and loading `--config`,
`--set` and `STREAMS_RUNTIME_*` with the MODULE:ATTR topology.

Exit codes: 0 done (a clean shutdown included), 1 the app or job failed,
2 bad input (config, topology, topics), 130 interrupted (as a shell reports
a process ended by SIGINT). The CLI process's main thread.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from runtime.topology.loading import load_topology

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT


def load_config_and_topology(
    args: argparse.Namespace,
    base: dict[str, Any] | None = None,
    log_level: str | None = None,
    named: bool = False,
) -> tuple[Any, Any] | int:
    """`--config`/`--set`/env and MODULE:ATTR, with logging set up; an exit
    code (bad input) instead when either is wrong, the reason on stderr.
    `base`: values the config sources override; `log_level`: instead of
    `log.level` (a one-shot command's own output is what the user reads)."""
    from runtime.config import ConfigError, load_config
    from runtime.logging import configure_logging

    try:
        config = load_config(args.config, args.set or (), base=base)
    except ConfigError as exc:
        print(f"streams-runtime: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    configure_logging(log_level or config.log_level)
    try:
        topology = load_topology(args.target, named=named)
    except Exception as exc:
        # One line whatever the target or the user's exception says.
        from runtime.config_values import one_line

        print(
            f"streams-runtime: cannot load topology {one_line(args.target)}: {one_line(str(exc))}",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    return config, topology
