"""Workload "eos": exactly_once_v2 over at_least_once throughput, stateless and stateful.

The compare harness (``benchmarks/compare/``) runs the runtime only, as four
models that differ in two settings: ``processing.guarantee`` (``alos`` =
at_least_once, ``eos`` = exactly_once_v2) and ``commit.interval.ms`` (100 and
1000): ``alos-c100``, ``eos-c100``, ``alos-c1000``, ``eos-c1000``. Workloads:
``stateless`` (the stateless benchmark's JSON map, ``workloads/stateless.py``)
and ``stateful`` (``group_by_key().count()``, RocksDB store with changelog).
Each run: a fresh input (the same backlog bytes), output topic and
application.id, a fresh child process, the backlog processed from the start;
then a short latency phase at a fixed feed rate. The harness's reader is a
``read_committed`` consumer (librdkafka's default), so under exactly_once_v2 an
output record counts once its transaction committed; every run's output is
checked complete.

Writes ``<out>/eos[-TAG].json`` and ``.md``: per workload and commit interval,
records/s of each guarantee and eos/alos (of the medians, and paired per
repeat), p50/p99 latency, CPU s per million records. On Apache Kafka (one KRaft
node) by default; ``--quick`` is a smoke run (small backlogs, 1 repeat).
Default sizes: about 10 minutes on a 2-core machine.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
from dataclasses import dataclass
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.report import choose, rerender

NAME = "eos"
WORKLOADS = ("stateless", "stateful")
GUARANTEES = {"alos": "at_least_once", "eos": "exactly_once_v2"}
COMMIT_INTERVALS = (100, 1000)
DEFAULT_RECORDS = {"stateless": 200_000, "stateful": 300_000}
QUICK_RECORDS = {"stateless": 5_000, "stateful": 5_000}


def model_name(guarantee: str, commit_ms: int) -> str:
    """``eos-c100`` and the like: the guarantee's short name and the commit interval."""
    return f"{guarantee}-c{commit_ms}"


def parse_model(model: str) -> tuple[str, int]:
    """``eos-c100`` -> (``exactly_once_v2``, 100)."""
    short, _, commit = model.partition("-c")
    if short not in GUARANTEES or not commit.isdigit():
        raise ValueError(f"not an eos benchmark model: {model!r}")
    return GUARANTEES[short], int(commit)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workloads", default=",".join(WORKLOADS), help="default: both")
    parser.add_argument(
        "--commit-intervals",
        default=",".join(str(c) for c in COMMIT_INTERVALS),
        help="commit.interval.ms values (default 100,1000)",
    )
    parser.add_argument("--threads", type=int, default=2, help="processing.threads (default 2)")
    parser.add_argument("--repeats", type=int, default=3, help="rounds (default 3)")
    parser.add_argument("--partitions", type=int, default=8, help="input partitions (default 8)")
    parser.add_argument(
        "--records",
        action="append",
        default=[],
        metavar="WORKLOAD=N",
        help="backlog records, e.g. stateless=100000 (defaults: stateless 200000, stateful 300000)",
    )
    parser.add_argument(
        "--feed-seconds", type=float, default=1.5, help="latency phase length (default 1.5 s)"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config for every model (repeatable)",
    )
    parser.add_argument("--quick", action="store_true", help="small backlogs, 1 repeat")
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before each run wait up to this long for other processes to go quiet (0: off)",
    )
    parser.add_argument("--redo-noisy", type=int, default=1, help="redo a noisy run (default 1)")
    parser.add_argument("--report", metavar="FILE.json", help="only re-render a result file")
    from benchmarks.harness import add_broker_argument

    add_broker_argument(parser)


@dataclass
class Launcher:
    """``RunSettings.launch``: every model is the runtime's compare child, with the
    model's guarantee and commit interval put into the spec's config."""

    def __call__(self, model: str, spec: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        guarantee, commit_ms = parse_model(model)
        config = {
            **spec["config"],
            "processing.guarantee": guarantee,
            "commit.interval.ms": commit_ms,
        }
        return [sys.executable, "-m", "benchmarks.compare.child"], {
            **spec,
            "model": "runtime",
            "config": config,
        }


def main(args: argparse.Namespace) -> int:
    if args.report:
        return rerender(args.report, summarize, write)

    from benchmarks.compare.main import BASE_CONFIG, Suite, argv_echo, parse_pairs, run_suite
    from benchmarks.compare.report import exit_code
    from benchmarks.workloads.stateless import parse_settings

    workloads = choose(args.workloads, WORKLOADS, "workload")
    intervals = [int(c) for c in args.commit_intervals.split(",") if c.strip()]
    models = [model_name(g, c) for c in intervals for g in GUARANTEES]
    records = {**DEFAULT_RECORDS, **parse_pairs(args.records, int)}
    repeats = args.repeats
    if args.quick:
        repeats = 1
        records = {**QUICK_RECORDS, **parse_pairs(args.records, int)}
    config = {**BASE_CONFIG, **parse_settings(args.settings)}
    config.pop("commit.interval.ms", None)  # each model's own
    suite = Suite(
        name=f"{NAME}-{args.tag}" if args.tag else NAME,
        command="python -m benchmarks eos " + " ".join(argv_echo(args, NAME)),
        workloads=workloads,
        models=models,
        threads=[args.threads],
        repeats=repeats,
        partitions=args.partitions,
        records=records,
        rates={},
        feed_seconds=args.feed_seconds,
        restore_records=0,
        echo_delay_ms=0.0,
        config=config,
        out_dir=output_dir(args),
        quiet_wait=args.quiet_wait,
        redo_noisy=args.redo_noisy,
        report=_Report(),
        broker=args.broker,
        launch=Launcher(),
        extra={"commit_intervals": intervals, "guarantees": GUARANTEES},
        tag=NAME,
    )
    result: dict[str, Any] = run_suite(suite)
    return exit_code(result)


class _Report:
    """The ``report`` module interface ``run_suite`` calls."""

    summarize = staticmethod(lambda result: summarize(result))
    write = staticmethod(lambda out_dir, name, result: write(out_dir, name, result))


# -- results --------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(finite) if finite else None


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per (workload, commit interval): both guarantees' figures and eos/alos."""
    from benchmarks.compare.report import counted

    good = counted(result["runs"])
    rows = []
    keys = sorted(
        {(r["workload"], parse_model(r["model"])[1]) for r in result["runs"]},
        key=lambda k: (WORKLOADS.index(k[0]) if k[0] in WORKLOADS else 9, k[1]),
    )
    for workload, commit_ms in keys:
        row: dict[str, Any] = {"workload": workload, "commit_interval_ms": commit_ms}
        by_repeat: dict[str, dict[int, float]] = {}
        for short in GUARANTEES:
            model = model_name(short, commit_ms)
            runs = [r for r in good if r["workload"] == workload and r["model"] == model]
            failed = [
                r
                for r in result["runs"]
                if r["workload"] == workload
                and r["model"] == model
                and not r.get("discarded")
                and r not in good
            ]
            row[short] = {
                "runs_ok": len(runs),
                "runs_failed": len(failed),
                "errors": [str(r.get("error", "not complete"))[:300] for r in failed],
                "records_per_s": _median([r["records_per_s"] for r in runs]),
                "records_per_s_all": [round(r["records_per_s"]) for r in runs],
                "p50_ms": _median([(r.get("latency") or {}).get("p50_ms") for r in runs]),
                "p99_ms": _median([(r.get("latency") or {}).get("p99_ms") for r in runs]),
                "cpu_s_per_million": _median([r.get("cpu_s_per_million") for r in runs]),
            }
            by_repeat[short] = {r["repeat"]: r["records_per_s"] for r in runs}
        alos, eos = row["alos"]["records_per_s"], row["eos"]["records_per_s"]
        row["eos_over_alos"] = eos / alos if alos and eos else None
        paired = [
            by_repeat["eos"][k] / by_repeat["alos"][k]
            for k in by_repeat["eos"]
            if by_repeat["alos"].get(k)
        ]
        row["paired_eos_over_alos"] = paired
        rows.append(row)
    return rows


def _fmt(x: float | None, digits: int = 0) -> str:
    return "n/a" if x is None else f"{x:,.{digits}f}"


def markdown(result: dict[str, Any]) -> str:
    from benchmarks.compare.report import status_lines

    m = result["machine"]
    rows = result.get("summary") or summarize(result)
    threads = result["threads"][0] if result.get("threads") else "?"
    lines = [
        "# exactly_once_v2 over at_least_once",
        "",
        f"Broker: {m.get('broker', result.get('broker'))}. Machine: {m.get('nproc')} cores "
        f"({m.get('cpu', '?')}), Python {m.get('python')}, librdkafka {m.get('librdkafka')}, "
        f"{m.get('date')}, git {m.get('git_head', '?')}.",
        "",
        f"Command: `{result['command']}`. The runtime with processing.threads={threads}, "
        f"{result['partitions']} input partitions, {result['repeats']} repeat(s); each run "
        "a fresh child process, input topic, output topic and application.id. "
        "Throughput: the backlog from `go` to its last output record read by a "
        "read_committed consumer; latency: the feed phase after the backlog.",
        "",
        *status_lines(result),
        "| workload | commit.interval.ms | at_least_once rec/s | exactly_once_v2 rec/s "
        "| eos/alos | paired eos/alos | p99 ms alos / eos | CPU s per M alos / eos |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        a, e = row["alos"], row["eos"]
        paired = ", ".join(f"{p:.2f}" for p in row["paired_eos_over_alos"]) or "n/a"
        ratio = row["eos_over_alos"]
        lines.append(
            f"| {row['workload']} | {row['commit_interval_ms']} | {_fmt(a['records_per_s'])} "
            f"| {_fmt(e['records_per_s'])} | {'n/a' if ratio is None else f'{ratio:.2f}x'} "
            f"| {paired} | {_fmt(a['p99_ms'], 1)} / {_fmt(e['p99_ms'], 1)} "
            f"| {_fmt(a['cpu_s_per_million'], 1)} / {_fmt(e['cpu_s_per_million'], 1)} |"
        )
    failures = [
        f"{row['workload']} c{row['commit_interval_ms']} {short}: {err}"
        for row in rows
        for short in GUARANTEES
        for err in row[short]["errors"]
    ]
    if failures:
        lines += ["", "Failed runs:", *(f"- {f}" for f in failures)]
    backlogs = {w: d.get("backlog") for w, d in result.get("workloads", {}).items()}
    lines += [
        "",
        f"Backlogs: {backlogs}. Session {result.get('suite_s', 0):.0f} s.",
        "",
    ]
    return "\n".join(lines)


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    if "summary" not in result:
        result["summary"] = summarize(result)
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write(markdown(result))
    return [json_path, md_path]
