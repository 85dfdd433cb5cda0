"""Workload "compare": the shared-client runtime against the thread-per-client baseline.

One invocation runs, per workload, both models on identical data at every
thread count, ``--repeats`` times, alternating the models, and writes
``<out>/compare[-TAG].json``, ``.md`` and one PNG per workload. Workloads:
stateless, stateful, io, skew, restore (see ``benchmarks/compare/workloads.py``).

Default sizes finish the whole suite in about 20-25 minutes on a 2-core machine
(``--quick`` for a ~5-minute smoke run). ``--report FILE.json`` re-renders the
markdown and plots from a result file without running anything.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.report import choose, rerender

NAME = "compare"
ALL_WORKLOADS = ("stateless", "stateful", "io", "skew", "restore")
MODELS = ("runtime", "baseline")
# Also runnable: workload io1 (the io topology, every record on partition 0),
# model keypar (the runtime with num.threads.per.task, --threads-per-task),
# model runtime-p2 (the runtime in 2 processes, `processes=2`, each with the
# run's thread count: the `processes` axis, issue 36) and
# model raw (the raw consume-transform-produce loop, benchmarks/raw_loop.py:
# stateless and stateful only, one thread, so it runs at the lowest thread
# count only).
# Workloads join and session (two-input stream-stream join, session-windowed
# count: workloads.py) run in compare too, for the runtime and the baseline.
EXTRA_WORKLOADS = ("io1", "join", "session")
EXTRA_MODELS = ("keypar", "runtime-p2", "raw")

# Same for both models; everything else is the runtime's defaults.
# - commit.interval.ms=1000: as the stateless benchmark (the default is 30 s).
# - session.timeout.ms=3000 (heartbeat 1000): Tansu holds a group's first join
#   for about session.timeout.ms / 2; 3 s instead of 6 s saves ~1.5 s per run.
#   (The Kafka test broker allows session timeouts down to 1 s for this.)
BASE_CONFIG: dict[str, Any] = {
    "commit.interval.ms": 1000,
    "consumer.session.timeout.ms": 3000,
    "consumer.heartbeat.interval.ms": 1000,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads",
        default=",".join(ALL_WORKLOADS),
        help=f"comma-separated subset of {','.join(ALL_WORKLOADS + EXTRA_WORKLOADS)} "
        f"(default: {','.join(ALL_WORKLOADS)}; io1: the io workload on one partition)",
    )
    parser.add_argument(
        "--threads",
        default="1,2,4,8",
        help="thread counts (runtime: processing.threads; baseline: stream "
        "threads); default 1,2,4,8",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds per workload (default 3)")
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help="default runtime,baseline; keypar = the runtime in key-parallel mode "
        "(num.threads.per.task, see --threads-per-task); raw = the raw consume-then-produce "
        "loop (stateless and stateful only, at the lowest thread count)",
    )
    parser.add_argument(
        "--threads-per-task",
        type=int,
        default=0,
        help="model keypar: num.threads.per.task (default 0: the run's thread count)",
    )
    parser.add_argument("--partitions", type=int, default=8, help="input partitions (default 8)")
    parser.add_argument(
        "--records",
        action="append",
        default=[],
        metavar="WORKLOAD=N",
        help="backlog records of a workload, e.g. --records stateless=100000 "
        "(defaults: stateless 200000, stateful 500000, io 6000, skew 4000)",
    )
    parser.add_argument(
        "--feed-rate",
        action="append",
        default=[],
        metavar="WORKLOAD=R",
        help="records/s of the latency phase (restore: while restoring); "
        "defaults: 4000 (io/skew: 400)",
    )
    parser.add_argument(
        "--feed-seconds",
        type=float,
        default=1.5,
        help="length of the latency phase (default 1.5 s)",
    )
    parser.add_argument(
        "--restore-records",
        type=int,
        default=1_000_000,
        help="changelog records task 0_0 restores in 'restore' (default 1000000)",
    )
    parser.add_argument(
        "--echo-delay-ms",
        type=float,
        default=1.0,
        help="echo server delay per record for io/skew (default 1.0)",
    )
    parser.add_argument(
        "--baseline-restore",
        choices=("blocking", "interleaved"),
        default="blocking",
        help="baseline restoration: blocking (restore a task completely before "
        "the thread does anything else; default) or interleaved (one batch "
        "per loop, as Kafka Streams 2.6-3.x)",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config for BOTH models (repeatable)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, 1 repeat, threads 1,4: a smoke run of a few minutes",
    )
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before each run wait up to this long for other processes to use "
        "< 0.25 cores (default 20; 0: off)",
    )
    parser.add_argument(
        "--redo-noisy", type=int, default=1, help="run a noisy run again up to N times (default 1)"
    )
    parser.add_argument(
        "--report", metavar="FILE.json", help="only re-render markdown and plots from a result file"
    )
    from benchmarks.harness import add_broker_argument

    add_broker_argument(parser)


def parse_pairs(items: list[str], cast: Any) -> dict[str, Any]:
    """``["stateless=100", ...]`` -> ``{"stateless": cast("100"), ...}`` (per-workload options)."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"expected NAME=VALUE, got {item!r}")
        out[key.strip()] = cast(value)
    return out


def main(args: argparse.Namespace) -> int:
    from benchmarks.compare import report

    if args.report:
        return rerender(args.report, report.summarize, report.write)

    from benchmarks.compare.workloads import WORKLOADS
    from benchmarks.workloads.stateless import parse_settings

    workloads = choose(args.workloads, WORKLOADS, "workload")
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    models = choose(args.models, MODELS + EXTRA_MODELS, "model")
    records = parse_pairs(args.records, int)
    rates = parse_pairs(args.feed_rate, float)
    repeats = args.repeats
    restore_records = args.restore_records
    if args.quick:
        threads = [1, 4] if args.threads == "1,2,4,8" else threads
        repeats = 1
        records = {
            "stateless": 50_000,
            "stateful": 50_000,
            "io": 2_000,
            "skew": 2_000,
            "io1": 2_000,
            **records,
        }
        restore_records = min(restore_records, 200_000)
    suite = Suite(
        name=f"{NAME}-{args.tag}" if args.tag else NAME,
        command="python -m benchmarks compare " + " ".join(argv_echo(args, NAME)),
        workloads=workloads,
        models=models,
        threads=threads,
        repeats=repeats,
        partitions=args.partitions,
        records=records,
        rates=rates,
        feed_seconds=args.feed_seconds,
        restore_records=restore_records,
        echo_delay_ms=args.echo_delay_ms,
        config={**BASE_CONFIG, **parse_settings(args.settings)},
        out_dir=output_dir(args),
        quiet_wait=args.quiet_wait,
        redo_noisy=args.redo_noisy,
        broker=args.broker,
        baseline_restore=args.baseline_restore,
        report=report,
        threads_per_task=args.threads_per_task,
        runs_model=lowest_threads_only(RAW_MODELS, threads),
    )
    return report.exit_code(run_suite(suite))


# Models that run one thread whatever the thread count: run at the lowest only.
RAW_MODELS = ("raw",)


def lowest_threads_only(
    single: tuple[str, ...], threads: list[int]
) -> Callable[[str, str, int], bool]:
    """``Suite.runs_model``: the models in ``single`` run at the lowest thread count only
    (a one-thread model's figure is the same at every count; ratios at the others use it)."""
    lowest = min(threads) if threads else 1

    def runs(model: str, _workload: str, n_threads: int) -> bool:
        return model not in single or n_threads == lowest

    return runs


@dataclass
class Suite:
    """One invocation: which runs, their sizes, and where the results go.

    ``runs_model(model, workload, threads)`` says whether a model takes part in
    a workload at a thread count (a single-threaded peer runs at 1 only);
    ``launch`` is ``RunSettings.launch`` (how a model's child is started);
    ``report`` is a module with ``summarize(result)`` and ``write(out_dir, name,
    result)``; ``extra`` goes into the result as is. ``external_broker``: a
    running broker (``runtime.brokers.Broker``, e.g. a test session's) used
    for every workload instead of starting one each (``broker`` then only
    names it); ``print_report``: print the markdown at the end.
    """

    name: str
    command: str
    workloads: list[str]
    models: list[str]
    threads: list[int]
    repeats: int
    partitions: int
    records: dict[str, int]
    rates: dict[str, float]
    feed_seconds: float
    restore_records: int
    echo_delay_ms: float
    config: dict[str, Any]
    out_dir: str
    quiet_wait: float
    redo_noisy: int
    report: Any
    broker: str = "tansu"
    baseline_restore: str = "blocking"
    launch: Callable[[str, dict[str, Any]], tuple[list[str], dict[str, Any]]] | None = None
    runs_model: Callable[[str, str, int], bool] = lambda _m, _w, _t: True
    extra: dict[str, Any] = field(default_factory=dict)
    tag: str = NAME
    threads_per_task: int = 0
    external_broker: Any = None
    print_report: bool = True


def run_suite(suite: Suite) -> dict[str, Any]:
    """Run every workload of ``suite`` (one broker each) and write the results after each.

    Per workload: ``repeats`` rounds over every thread count; at each thread
    count the models taking part run back to back, their order rotated by one
    from one thread count (and round) to the next, so no model always runs
    first or right after another. Returns the result (also written to
    ``<out_dir>/<name>.json`` etc.).

    Ctrl-C (``benchmarks.interrupt``) ends the whole session: the running
    child is stopped by its run's clean-up, the broker by the session's, and
    the results of the runs that finished are written with ``partial`` set
    (the reports then give no verdict, the exit code is 130).
    """
    from benchmarks import interrupt
    from benchmarks.compare.report import failure_lines
    from benchmarks.harness import machine_info

    name = suite.name
    out_dir = suite.out_dir
    log_dir = os.path.join(out_dir, "logs", name)
    os.makedirs(log_dir, exist_ok=True)
    session_id = uuid.uuid4().hex[:6]
    started = time.monotonic()
    result: dict[str, Any] = {
        "name": name,
        "command": suite.command,
        "threads": suite.threads,
        "models": suite.models,
        "repeats": suite.repeats,
        "partitions": suite.partitions,
        "config": suite.config,
        "baseline_restore": suite.baseline_restore,
        "echo_delay_ms": suite.echo_delay_ms,
        "threads_per_task": suite.threads_per_task,
        "broker": suite.broker,
        "machine": machine_info(suite.broker),
        **suite.extra,
        "workloads": {},
        "runs": [],
    }
    tag = suite.tag
    print(
        f"[{tag}] workloads {suite.workloads}, threads {suite.threads}, models "
        f"{suite.models}, repeats {suite.repeats}, broker {suite.broker}",
        flush=True,
    )
    # What was running when an interrupt came (for the partial results' note).
    doing = {"what": ""}
    try:
        for wl_name in suite.workloads:
            doing["what"] = f"{wl_name} (starting its broker)"
            _run_workload(suite, result, wl_name, session_id, log_dir, doing)
            _write(suite, result, started)
    except KeyboardInterrupt:
        interrupt.mark()
        result["partial"] = {
            "reason": "interrupted (SIGINT)",
            "during": doing["what"],
            "runs_done": sum(1 for r in result["runs"] if not r.get("discarded")),
        }
        print(f"\n[{tag}] interrupted during {doing['what']}: stopping", flush=True)
    finally:
        # Whatever a run's own clean-up did not get to (its child), before the
        # results are written and the process exits.
        interrupt.stop_children()
        _write(suite, result, started)
    if suite.print_report:
        with open(os.path.join(out_dir, f"{name}.md")) as f:
            print(f.read(), flush=True)
    if result.get("partial"):
        print(
            f"[{tag}] PARTIAL: interrupted; results of the {result['partial']['runs_done']} "
            f"finished run(s) written to {os.path.join(out_dir, name)}.*, no verdict",
            flush=True,
        )
    failures = failure_lines(result)
    if failures:
        print(f"[{tag}] FAILED, no verdict:", flush=True)
        for line in failures:
            print(f"  {line}", flush=True)
    return result


def _run_workload(
    suite: Suite,
    result: dict[str, Any],
    wl_name: str,
    session_id: str,
    log_dir: str,
    doing: dict[str, str],
) -> None:
    """One workload of ``run_suite``: its broker, its runs, its latency floor."""
    from benchmarks import interrupt
    from benchmarks.compare.session import RunSettings, latency_floor, run_one
    from benchmarks.compare.workloads import WORKLOADS, generate
    from benchmarks.harness import BenchSession

    tag = suite.tag
    wl = WORKLOADS[wl_name]
    backlog_n = int(suite.records.get(wl_name, wl.records))
    rate = float(suite.rates.get(wl_name, wl.feed_rate))
    # The restore workload feeds while restoring; the timed ones (join, session)
    # have no latency phase (workloads.py).
    feed_seconds = suite.feed_seconds if wl.latency and not wl.restore else 0.0
    restore_records = suite.restore_records
    backlog = generate(wl, 0, backlog_n, suite.partitions)
    per_partition = [0] * suite.partitions
    for record in backlog:
        per_partition[record[2]] += 1
    output_target = wl.expected(backlog) if wl.expected is not None else None
    result["workloads"][wl_name] = {
        "title": wl.title,
        "description": wl.description,
        "backlog": backlog_n,
        "backlog_per_partition": per_partition,
        "feed_rate": rate,
        "feed_seconds": feed_seconds,
        "restore_records": restore_records if wl.restore else None,
        "output_check": wl.output,
        "output_target": output_target,
        "inputs": 2 if wl.two_inputs else 1,
    }
    wl_started = time.monotonic()
    print(
        f"[{tag}] {wl_name}: {wl.title}; backlog {backlog_n} "
        f"(per partition {per_partition})" + (f", restore {restore_records}" if wl.restore else ""),
        flush=True,
    )
    echo_proc = None
    with BenchSession(log_dir, suite.broker, external=suite.external_broker) as session:
        echo = None
        if wl.echo:
            echo_proc, echo = start_echo(suite.echo_delay_ms)
        try:
            settings = RunSettings(
                workload=wl,
                partitions=suite.partitions,
                backlog=backlog,
                feed_rate=rate,
                feed_seconds=feed_seconds,
                restore_records=restore_records,
                config=suite.config,
                log_dir=log_dir,
                session_id=session_id,
                quiet_wait=suite.quiet_wait,
                echo=echo,
                echo_pid=echo_proc.pid if echo_proc else None,
                output_target=output_target,
                restore_mode=suite.baseline_restore,
                launch=suite.launch,
                threads_per_task=suite.threads_per_task,
            )
            for repeat in range(1, suite.repeats + 1):
                for k, n_threads in enumerate(suite.threads):
                    taking_part = [
                        m for m in suite.models if suite.runs_model(m, wl_name, n_threads)
                    ]
                    if not taking_part:
                        continue
                    shift = (repeat - 1 + k) % len(taking_part)
                    order = taking_part[shift:] + taking_part[:shift]
                    for model in order:
                        for redo in range(suite.redo_noisy + 1):
                            doing["what"] = f"{wl_name} {model} t={n_threads} r{repeat}"
                            run = run_one(session, settings, model, n_threads, repeat)
                            run["redo"] = redo
                            if interrupt.interrupted():
                                # The run ended because of the interrupt (its
                                # child got the same Ctrl-C): not a result.
                                run["discarded"] = "interrupted"
                                result["runs"].append(run)
                                raise KeyboardInterrupt
                            result["runs"].append(run)
                            again = (
                                run.get("noisy") and "error" not in run and redo < suite.redo_noisy
                            )
                            if again:
                                run["discarded"] = "noisy: other processes were busy"
                            print_run(run)
                            if not again:
                                break
            if suite.feed_seconds > 0 and wl.latency:
                doing["what"] = f"{wl_name} latency floor"
                floor = latency_floor(session, wl, suite.partitions, rate, suite.feed_seconds)
                result["workloads"][wl_name]["latency_floor"] = floor
                print(
                    f"  latency floor (feeder -> broker -> reader, no model): "
                    f"p50 {floor['p50_ms']:.1f} ms, p99 {floor['p99_ms']:.1f} ms",
                    flush=True,
                )
        finally:
            if echo_proc is not None:
                echo_proc.terminate()
                echo_proc.wait(10)
    result["workloads"][wl_name]["session_s"] = time.monotonic() - wl_started


def argv_echo(args: argparse.Namespace, subcommand: str) -> list[str]:
    """The command line as typed after ``python -m benchmarks <subcommand>``."""
    import sys

    argv = sys.argv[1:]
    return argv[1:] if argv and argv[0] == subcommand else argv


def _write(suite: Suite, result: dict[str, Any], started: float) -> None:
    result["suite_s"] = time.monotonic() - started
    result["summary"] = suite.report.summarize(result)
    paths = suite.report.write(suite.out_dir, suite.name, result)
    print(f"[{suite.tag}] wrote {', '.join(paths)}", flush=True)


def start_echo(delay_ms: float) -> tuple[Any, tuple[str, int]]:
    """Start the echo server process; returns it and its (host, port)."""
    import subprocess
    import sys

    from benchmarks.harness import REPO_ROOT

    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.compare.echo", "--delay-ms", str(delay_ms)],
        stdout=subprocess.PIPE,
        cwd=REPO_ROOT,
    )
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    return proc, ("127.0.0.1", port)


def print_run(run: dict[str, Any]) -> None:
    """One line per run on stdout (the session's progress); a failed run's why on the next."""
    head = f"  {run['workload']:<9} {run['model']:<11} t={run['threads']} r{run['repeat']}"
    if run.get("discarded"):
        head += f" (discarded: {str(run['discarded']).split(':')[0]})"
    error = str(run.get("error", "")).strip()
    why = error.splitlines()[0][:300] if error else ""
    log = f"\n      log: {run['log']}" if run.get("log") else ""
    if "records_per_s" not in run:
        print(f"{head} FAILED: {why}{log}", flush=True)
        return
    lat = run.get("latency") or {}
    extra = ""
    if run["workload"] == "restore":
        extra = f" restore {run.get('restore_s', float('nan')):.2f}s"
    if lat:
        extra += f" p50 {lat.get('p50_ms', float('nan')):.0f}ms p99 {lat.get('p99_ms', float('nan')):.0f}ms"
    print(
        f"{head} {run['records_per_s']:>9,.0f} rec/s ({run['seconds']:.2f}s"
        + (
            f", first to last output {run['records_per_s_first_to_last']:,.0f}/s"
            if "records_per_s_first_to_last" in run
            else ""
        )
        + ") "
        f"cpu {run.get('cpu_s', float('nan')):.2f}s rss {run.get('peak_rss_mb', float('nan')):.0f}MB "
        f"conns {run.get('connections_at_ready')}/{run.get('connections_max')}{extra} "
        f"join {run.get('join_s', float('nan')):.1f}s "
        + ("ok" if run.get("correct") and not error else f"FAILED: {why}{log}")
        + (" NOISY" if run.get("noisy") else ""),
        flush=True,
    )
