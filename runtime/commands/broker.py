"""`streams-runtime broker`: one local development broker until Ctrl-C
(runtime.brokers). The CLI process's main thread."""

from __future__ import annotations

import argparse


def main(args: argparse.Namespace) -> int:
    """`broker`: run it in the foreground; the exit code."""
    from runtime.brokers import run_foreground

    return run_foreground(kind=args.kind, port=args.port, host=args.host)
