"""Workload "rebalance": how long a second instance's join takes, classic vs KIP-848.

Per group protocol (``classic``: the client-side cooperative-sticky protocol;
``consumer``: KIP-848, ``consumer.group.protocol=consumer``, the broker assigns
incrementally) and per repeat: a fresh 8-partition topic and application.id,
instance A started and waited for until it is RUNNING with all 8 tasks, then
instance B started; the figure is the time from ``B.start()`` until both are
RUNNING, each owns some tasks, none twice, all 8 together. The two instances
are ``runtime.App`` objects in this process (a daemon's Python start-up would
otherwise be part of the figure), each with its own consumer, producer and
state directory, on ONE Kafka node started by the harness. Input is fed at a
low rate throughout, so the tasks being moved have work in flight.

Writes ``<out>/rebalance[-TAG].json`` and ``.md`` (medians, min-max over the
repeats). ``--quick``: 2 repeats. Default 7 repeats: about 2 minutes here.

Only the main thread drives the apps; each app runs its own threads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import uuid
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir

NAME = "rebalance"
PROTOCOLS = ("classic", "consumer")
PARTITIONS = 8
ALL_TASKS = {f"0_{p}" for p in range(PARTITIONS)}

# The classic protocol's timing as the tests use it (the broker-side KIP-848
# timing is the test broker's: 1 s heartbeat, 6 s session; runtime/brokers/kafka.py).
CLASSIC_CONFIG = {"consumer.session.timeout.ms": 6000, "consumer.heartbeat.interval.ms": 500}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=7, help="joins per protocol (default 7)")
    parser.add_argument("--protocols", default=",".join(PROTOCOLS), help="default classic,consumer")
    parser.add_argument("--feed-rate", type=float, default=500.0, help="input records/s")
    parser.add_argument("--quick", action="store_true", help="2 repeats: a smoke run")
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")


def _tasks(app: Any) -> set[str]:
    return {t["id"] for t in app.status()["tasks"]}


def _running(app: Any) -> bool:
    from runtime import AppState

    if app.state in (AppState.ERROR, AppState.PENDING_ERROR):
        raise RuntimeError(f"instance failed: {app.failure!r}")
    return bool(app.state is AppState.RUNNING)


def _wait(predicate: Any, timeout: float, what: str) -> float:
    """Poll every 10 ms; the monotonic time the predicate first held."""
    deadline = time.monotonic() + timeout
    while True:
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(0.01)


def one_join(session: Any, protocol: str, state_root: str, feed_rate: float) -> dict[str, Any]:
    """One measured join: A alone, then B joins; both figures in seconds."""
    from benchmarks.compare.session import Feeder
    from runtime import App, StreamsBuilder

    bootstrap = session.bootstrap
    app_id = f"rb-{protocol}-{uuid.uuid4().hex[:8]}"
    source, sink = f"{app_id}-in", f"{app_id}-out"
    session.create_topic(source, PARTITIONS)
    session.create_topic(sink, PARTITIONS)
    config: dict[str, Any] = {
        "application.id": app_id,
        "bootstrap.servers": bootstrap,
        "processing.threads": 2,
        "commit.interval.ms": 500,
        "consumer.group.protocol": protocol,
        **(CLASSIC_CONFIG if protocol == "classic" else {}),
    }

    def make(name: str) -> Any:
        builder = StreamsBuilder()
        builder.stream(source).to(sink)
        return App(builder.build(), {**config, "state.dir": os.path.join(state_root, name)})

    a, b = make(f"{app_id}-a"), make(f"{app_id}-b")
    feeder = Feeder(
        bootstrap, source, lambda j: (b"k%d" % (j % 64), b"%d" % j, j % PARTITIONS), feed_rate, None
    )
    feeder.start()
    feeder.begin.set()
    try:
        started_a = time.monotonic()
        a.start()
        alone = _wait(lambda: _running(a) and _tasks(a) == ALL_TASKS, 90, "A owning all tasks")
        started_b = time.monotonic()
        b.start()

        def split() -> bool:
            ta, tb = _tasks(a), _tasks(b)
            return (
                _running(a)
                and _running(b)
                and bool(ta)
                and bool(tb)
                and not ta & tb
                and ta | tb == ALL_TASKS
            )

        both = _wait(split, 120, "both instances RUNNING with their tasks")
        return {
            "protocol": protocol,
            "first_join_s": alone - started_a,
            "second_join_s": both - started_b,
            "split": [sorted(_tasks(a)), sorted(_tasks(b))],
        }
    finally:
        feeder.stop()
        a.close(30)
        b.close(30)
        feeder.join(30)


def main(args: argparse.Namespace) -> int:
    from benchmarks.harness import BenchSession, machine_info

    # benchmarks/results/local/ unless --update-results or --out (benchmarks/outputs.py).
    args.out = output_dir(args)

    protocols = [p.strip() for p in args.protocols.split(",") if p.strip()]
    repeats = 2 if args.quick else args.repeats
    name = f"{NAME}-{args.tag}" if args.tag else NAME
    log_dir = os.path.join(args.out, "logs", name)
    result: dict[str, Any] = {
        "name": name,
        "repeats": repeats,
        "partitions": PARTITIONS,
        "feed_rate": args.feed_rate,
        "classic_config": CLASSIC_CONFIG,
        "machine": machine_info("kafka"),
        "runs": [],
    }
    started = time.monotonic()
    with BenchSession(log_dir, "kafka") as session, tempfile.TemporaryDirectory() as state:
        for repeat in range(1, repeats + 1):
            # Alternate which protocol goes first, so neither always runs on a colder broker.
            order = protocols if repeat % 2 else protocols[::-1]
            for protocol in order:
                try:
                    run = one_join(session, protocol, state, args.feed_rate)
                except Exception as exc:  # noqa: BLE001 - recorded, the session goes on
                    run = {"protocol": protocol, "error": f"{type(exc).__name__}: {exc}"}
                run["repeat"] = repeat
                result["runs"].append(run)
                print(
                    f"  {protocol:<8} r{repeat} "
                    + (
                        f"first {run['first_join_s']:.2f}s, second {run['second_join_s']:.2f}s"
                        if "error" not in run
                        else f"FAILED {run['error']}"
                    ),
                    flush=True,
                )
    result["session_s"] = time.monotonic() - started
    result["summary"] = summarize(result["runs"], protocols)
    for path in write(args.out, name, result):
        print(f"wrote {path}")
    return 1 if any("error" in r for r in result["runs"]) else 0


def summarize(runs: list[dict[str, Any]], protocols: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for protocol in protocols:
        good = [r for r in runs if r["protocol"] == protocol and "error" not in r]
        out[protocol] = {
            key: {
                "median": statistics.median(r[key] for r in good) if good else None,
                "min": min((r[key] for r in good), default=None),
                "max": max((r[key] for r in good), default=None),
                "n": len(good),
            }
            for key in ("first_join_s", "second_join_s")
        }
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]

    def cell(s: dict[str, Any]) -> str:
        if not s["n"]:
            return "n/a"
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    lines = [
        "# Join rebalance time: classic vs KIP-848 (`consumer.group.protocol=consumer`)",
        "",
        f"Broker: {m.get('broker', 'Apache Kafka, one KRaft node')}; {m.get('nproc')} cores "
        f"({m.get('cpu', '?')}), librdkafka {m.get('librdkafka')}, {m.get('date')}, "
        f"git {m.get('git_head', '?')}.",
        "",
        f"{result['partitions']} input partitions, a pass-through, input fed at "
        f"{result['feed_rate']:.0f} records/s, {result['repeats']} repeats per protocol "
        "(median, min-max in seconds). *First join*: instance A's `start()` until it is "
        "RUNNING with all tasks. *Second join*: instance B's `start()` until both are "
        "RUNNING and own the tasks between them, none twice.",
        "",
        "| protocol | first join s | second join s | runs |",
        "|---|---|---|---|",
    ]
    for protocol, s in result["summary"].items():
        lines.append(
            f"| {protocol} | {cell(s['first_join_s'])} | {cell(s['second_join_s'])} | "
            f"{s['second_join_s']['n']} |"
        )
    failed = [r for r in result["runs"] if "error" in r]
    if failed:
        lines += ["", f"{len(failed)} run(s) failed: " + "; ".join(r["error"] for r in failed)]
    lines += [
        "",
        f"Classic timing: {result['classic_config']}; KIP-848 timing is the broker's "
        "(test broker: `group.consumer.heartbeat.interval.ms=1000`, session 6000).",
        "",
    ]
    return "\n".join(lines)


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write(markdown(result))
    return [json_path, md_path]
