"""Where a benchmark writes its results: a git-ignored folder unless asked otherwise.

Why: ``benchmarks/results/`` holds the committed results that the READMEs
quote. A developer's runs (quick checks, runs on a busy machine, runs of
uncommitted code) used to land there too and overwrite them, so every run
dirtied the work tree and a careless ``git add`` could replace a quiet
reference run with a noisy one. Now every workload writes into
``benchmarks/results/local/`` (ignored by git) by default;
``--update-results`` writes into ``benchmarks/results/`` (to be committed on
purpose), and ``--out DIR`` anywhere else. Logs go under the chosen folder's
``logs/`` as before.
"""

from __future__ import annotations

import argparse
import os

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMITTED_RESULTS = os.path.join(REPO_ROOT, "benchmarks", "results")
LOCAL_RESULTS = os.path.join(COMMITTED_RESULTS, "local")


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """``--out DIR`` and ``--update-results``, the same for every workload."""
    parser.add_argument(
        "--out",
        default=None,
        metavar="DIR",
        help="directory for the results (default: benchmarks/results/local/, ignored by "
        "git; with --update-results: benchmarks/results/, the committed results)",
    )
    parser.add_argument(
        "--update-results",
        action="store_true",
        help="write into benchmarks/results/ (the committed results the READMEs quote) "
        "instead of the ignored benchmarks/results/local/",
    )


def output_dir(args: argparse.Namespace) -> str:
    """The directory ``args`` asks for (see the module docstring); idempotent.

    Shown relative to the working directory when it lies below it, so printed
    paths stay short when run from the repository's root (as ``./dev`` does).
    """
    out = getattr(args, "out", None)
    update = bool(getattr(args, "update_results", False))
    if out and update and os.path.abspath(out) != COMMITTED_RESULTS:
        raise SystemExit("--out and --update-results contradict each other: give one of them")
    if out:
        return str(out)
    return _display(COMMITTED_RESULTS if update else LOCAL_RESULTS)


def _display(path: str) -> str:
    relative = os.path.relpath(path)
    return path if relative.startswith(os.pardir) else relative
