"""Workload "peers": the runtime against Kafka Streams (Java) and quixstreams, one run.

One invocation runs, per workload, every model at every thread count on
identical data with the compare harness (``benchmarks/compare/``), ``--repeats``
times, the models' order rotated from one thread count to the next, and writes
``<out>/peers[-TAG].json``, ``.md`` and ``peers-<workload>.png``.

Models: ``runtime``; ``ks-classic`` (Kafka Streams 4.3.1, ``num.stream.threads``
= N); ``ks-proc`` (the same with its internal processing-threads mode);
``quixstreams`` (one thread; stateless, stateful and session); ``keypar`` (the
runtime with ``num.threads.per.task`` = N; io1 and skew only). Workloads:
stateless, stateful, io, io1 (the I/O workload on one partition: threads beyond
one help only key-parallel processing), skew, join (a windowed stream-stream
join of two topics), session (a session-windowed count)
(``benchmarks/compare/workloads.py``). The Kafka
Streams peer is built with Maven and quixstreams gets its own virtualenv, both
on first use into ``~/.cache/streams-runtime/peers`` (``benchmarks/peers/build.py``).

The full default was estimated at about 45 minutes on a quiet 2-core machine
before join and session were added (114 runs; they add 57: 3 repeats x 19 at
threads 1,2,4, 500,000 records each, not yet timed); ``--quick`` is a smoke run of about 8 minutes. ``--report FILE.json`` re-renders the markdown and
plots from a result file. See ``benchmarks/peers/README.md``.
"""

from __future__ import annotations

import argparse
import shlex
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.report import choose, rerender

NAME = "peers"
ALL_WORKLOADS = ("stateless", "stateful", "io", "io1", "skew", "join", "session")
DEFAULT_MODELS = (
    "runtime",
    "runtime-p2",
    "keypar",
    "ks-classic",
    "ks-proc",
    "quixstreams",
    "quixstreams-p2",
)
DEFAULT_THREADS = "1,2,4"
# Records the JVM processes before the measured run (benchmarks/peers/kafka_streams/
# README.md, "Warm-up"); the I/O-bound workloads take ~1 ms per record, so fewer.
DEFAULT_WARMUP = {
    "stateless": 100_000,
    "stateful": 100_000,
    "io": 2_000,
    "io1": 1_000,
    "skew": 2_000,
    "join": 100_000,
    "session": 100_000,
}
QUICK_RECORDS = {
    "stateless": 30_000,
    "stateful": 30_000,
    "io": 1_000,
    "io1": 1_000,
    "skew": 1_000,
    "join": 30_000,
    "session": 30_000,
}
QUICK_WARMUP = {
    "stateless": 20_000,
    "stateful": 20_000,
    "io": 500,
    "skew": 500,
    "join": 20_000,
    "session": 20_000,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--workloads",
        default=",".join(ALL_WORKLOADS),
        help=f"comma-separated subset of {','.join(ALL_WORKLOADS)} (default: all)",
    )
    parser.add_argument(
        "--models",
        default=",".join(DEFAULT_MODELS),
        help=f"comma-separated subset of {','.join(DEFAULT_MODELS)} (default: all)",
    )
    parser.add_argument(
        "--threads",
        default=DEFAULT_THREADS,
        help="thread counts (runtime: processing.threads; Kafka Streams: num.stream.threads; "
        f"quixstreams runs at 1 only); default {DEFAULT_THREADS}",
    )
    parser.add_argument("--repeats", type=int, default=3, help="rounds per workload (default 3)")
    parser.add_argument("--partitions", type=int, default=8, help="input partitions (default 8)")
    parser.add_argument(
        "--records",
        action="append",
        default=[],
        metavar="WORKLOAD=N",
        help="backlog records of a workload (defaults as compare: stateless 200000, "
        "stateful 500000, io 6000, skew 4000, join 500000 (both topics), session 500000)",
    )
    parser.add_argument(
        "--feed-rate",
        action="append",
        default=[],
        metavar="WORKLOAD=R",
        help="records/s of the latency phase; defaults 4000 (io/skew: 400)",
    )
    parser.add_argument(
        "--feed-seconds", type=float, default=1.5, help="length of the latency phase (1.5 s)"
    )
    parser.add_argument(
        "--echo-delay-ms", type=float, default=1.0, help="echo server delay for io/skew (1.0)"
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra runtime config (repeatable); commit.interval.ms and the consumer session "
        "and heartbeat settings also go to the peers",
    )
    parser.add_argument(
        "--ks-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra Kafka Streams config (StreamsConfig names, e.g. producer.linger.ms=5)",
    )
    parser.add_argument(
        "--quix-set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra quixstreams client config (consumer.X / producer.X)",
    )
    parser.add_argument(
        "--jvm-opts", default="", help="options of the Kafka Streams peer's JVM (one string)"
    )
    parser.add_argument(
        "--jvm-warmup",
        action="append",
        default=[],
        metavar="WORKLOAD=N",
        help="records the Kafka Streams peer processes in a throw-away instance before the "
        "measured one (defaults: stateless 100000, stateful 100000, io 2000, skew 2000, "
        "join 100000, session 100000; "
        "0: a cold JVM)",
    )
    parser.add_argument(
        "--broker",
        choices=("auto", "kafka", "tansu"),
        default="auto",
        help="the broker: kafka (real Apache Kafka, runtime.brokers), tansu (the "
        "development broker), auto (kafka if this checkout has it, else tansu; default)",
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="small sizes, 1 repeat, threads 1,2: a smoke run of a few minutes",
    )
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=20.0,
        help="before each run wait up to this long for other processes to use < 0.25 cores "
        "(default 20; 0: off)",
    )
    parser.add_argument(
        "--redo-noisy", type=int, default=1, help="run a noisy run again up to N times (default 1)"
    )
    parser.add_argument(
        "--report", metavar="FILE.json", help="only re-render markdown and plots from a result file"
    )


def _resolve_broker(choice: str) -> str:
    """``auto``: real Kafka when this checkout has the runtime's Kafka broker module."""
    if choice != "auto":
        return choice
    import importlib.util

    return "kafka" if importlib.util.find_spec("runtime.brokers") is not None else "tansu"


def main(args: argparse.Namespace) -> int:
    from benchmarks.peers import report

    if args.report:
        return rerender(args.report, report.summarize, report.write)

    from benchmarks.compare.main import BASE_CONFIG, Suite, argv_echo, parse_pairs, run_suite
    from benchmarks.compare.report import exit_code
    from benchmarks.peers import build
    from benchmarks.peers.models import MODELS, Launcher, runs
    from benchmarks.workloads.stateless import parse_settings

    workloads = choose(args.workloads, ALL_WORKLOADS, "workload")
    models = choose(args.models, MODELS, "model")
    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    records = parse_pairs(args.records, int)
    repeats = args.repeats
    warmup = {**DEFAULT_WARMUP}
    if args.quick:
        threads = [1, 2] if args.threads == DEFAULT_THREADS else threads
        repeats = 1
        records = {**QUICK_RECORDS, **records}
        warmup = {**QUICK_WARMUP}
    warmup.update(parse_pairs(args.jvm_warmup, int))

    # Build what the chosen models need before any broker starts.
    launcher = Launcher(
        ks_settings=parse_settings(args.ks_set),
        quix_settings=parse_settings(args.quix_set),
        jvm_opts=shlex.split(args.jvm_opts),
        warmup=warmup,
    )
    versions: dict[str, str] = {}
    if any(m.startswith("ks-") for m in models):
        launcher.jar = build.kafka_streams_jar()
        versions["kafka_streams"] = "4.3.1"
        versions["java"] = build.java_version()
    if any(m.startswith("quixstreams") for m in models):
        launcher.quix_python = build.quix_python()
        versions["quixstreams"] = build.quix_version(launcher.quix_python)

    broker = _resolve_broker(args.broker)
    suite = Suite(
        name=f"{NAME}-{args.tag}" if args.tag else NAME,
        command="python -m benchmarks peers " + " ".join(argv_echo(args, NAME)),
        workloads=workloads,
        models=models,
        threads=threads,
        repeats=repeats,
        partitions=args.partitions,
        records=records,
        rates=parse_pairs(args.feed_rate, float),
        feed_seconds=args.feed_seconds,
        restore_records=0,
        echo_delay_ms=args.echo_delay_ms,
        config={**BASE_CONFIG, **parse_settings(args.settings)},
        out_dir=output_dir(args),
        quiet_wait=args.quiet_wait,
        redo_noisy=args.redo_noisy,
        report=report,
        broker=broker,
        launch=launcher,
        runs_model=runs,
        extra={
            "peer_versions": versions,
            "ks_settings": launcher.ks_settings,
            "quix_settings": launcher.quix_settings,
            "jvm_opts": launcher.jvm_opts,
            "jvm_warmup": warmup,
        },
        tag=NAME,
    )
    result: dict[str, Any] = run_suite(suite)
    return exit_code(result)
