"""``python -m benchmarks.compare [options]``: the same as ``python -m benchmarks compare``."""

from __future__ import annotations

import argparse
import signal
import sys

from benchmarks import interrupt
from benchmarks.compare.main import add_arguments, main


def _raise_system_exit(signum: int, _frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.compare",
        description=sys.modules["benchmarks.compare.main"].__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_arguments(parser)
    signal.signal(signal.SIGTERM, _raise_system_exit)
    interrupt.install()
    sys.exit(main(parser.parse_args()))
