"""`streams-runtime demo`: broker, sample app and load with a live view
(runtime.demo). The CLI process's main thread."""

from __future__ import annotations

import argparse


def main(args: argparse.Namespace) -> int:
    """`demo`: run it until `--duration` or Ctrl-C; the exit code."""
    from runtime.demo import run_demo

    return run_demo(
        duration=args.duration,
        rate=args.rate,
        threads=args.threads,
        partitions=args.partitions,
        broker_kind=args.broker,
    )
