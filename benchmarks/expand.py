"""Workload "expand": a live partition expansion, 4 -> 8, while input flows.

Per repeat: fresh topics and application.id; a stateful count (keys through a
repartition topic into a counting aggregate, so changelogs and a repartition
topic must grow too) with a static partitioner (`runtime.VirtualPartitioner`,
4 virtual partitions; keys `p<N>/...` placed on partition N), one
`runtime.App` in this process on ONE Kafka node started by the harness, fed
at `--feed-rate` records/s over 64 hashed keys. Once it processes, the output
topic grows to 8 partitions, then the input topic (the two CreatePartitions
calls the operator makes); from then on the feeder also writes 16 new keys to
partitions 4-7. The app's status is sampled every 10 ms (`app.status()`, the
processed count of every task).

Figures per repeat, from the input topic's CreatePartitions request:
*first new*: until a task of a new input partition (0_4..0_7) processed a
record; *all new*: until every new task (0_4..0_7 and 1_4..1_7) did.
*Longest gap*: the longest time an old task (0_0..0_3, 1_0..1_3) went
without processing a record, in the `--window-s` (10) s after the
CreatePartitions request; *baseline gap*: the same over the window before it
(the noise floor: scheduling, commits, the 10 ms sampling). The issue's target: no gap longer than one
rebalance plus one commit interval.

Writes `<out>/expand[-TAG].json` and `.md`. Default 3 repeats (about a
minute here); `--quick`: 1.

Only the main thread drives the app and samples; the feeder has its own thread.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import threading
import time
import uuid
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir

NAME = "expand"
OLD_KEYS = [f"k{i}" for i in range(64)]
NEW_KEYS = [f"p{p}/n{i}" for p in range(4, 8) for i in range(4)]
SAMPLE_S = 0.01
CLASSIC_CONFIG = {"consumer.session.timeout.ms": 6000, "consumer.heartbeat.interval.ms": 500}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--repeats", type=int, default=3, help="expansions (default 3)")
    parser.add_argument("--feed-rate", type=float, default=2000.0, help="input records/s")
    parser.add_argument(
        "--guarantee", default="at_least_once", choices=("at_least_once", "exactly_once_v2")
    )
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--check-interval-ms", type=int, default=1000, help="partition.check")
    parser.add_argument(
        "--window-s", type=float, default=10.0, help="gap windows before and after (default 10)"
    )
    parser.add_argument("--quick", action="store_true", help="1 repeat: a smoke run")
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")


def place(key: Any) -> int | None:
    if isinstance(key, str) and key.startswith("p") and "/" in key:
        return int(key[1 : key.index("/")])
    return None


class _Feeder(threading.Thread):
    """Old keys from the start, new keys once `open_new_keys()` ran; round-robin over keys."""

    def __init__(self, bootstrap: str, topic: str, partitioner: Any, rate: float) -> None:
        from confluent_kafka import Producer

        from benchmarks.harness import client_config

        super().__init__(name="expand-feeder", daemon=True)
        self.topic, self.partitioner, self.rate = topic, partitioner, rate
        self.producer = Producer(
            client_config(
                {"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True}
            )
        )
        self.keys = list(OLD_KEYS)
        self.sent = 0
        self.error: str | None = None
        self._halt = threading.Event()

    def open_new_keys(self, deadline: float) -> None:
        """Once this producer sees 8 partitions (it refuses unknown ones)."""
        while len(self.producer.list_topics(self.topic, 10).topics[self.topic].partitions) < 8:
            if time.monotonic() > deadline:
                raise TimeoutError("the feeder never saw 8 partitions")
            time.sleep(0.01)
        self.keys = OLD_KEYS + NEW_KEYS

    def stop(self) -> None:
        self._halt.set()
        self.join(60)

    def run(self) -> None:
        started = time.monotonic()
        try:
            while not self._halt.is_set():
                due = int((time.monotonic() - started) * self.rate)
                keys = self.keys
                while self.sent < due:
                    key = keys[self.sent % len(keys)]
                    partition = self.partitioner.static_partition(self.topic, key, 8)
                    self.producer.produce(self.topic, b"1", key.encode(), partition)
                    self.sent += 1
                self.producer.poll(0)
                time.sleep(0.002)
            self.producer.flush(30)
        except Exception as exc:  # noqa: BLE001 - reported with the run
            self.error = f"{type(exc).__name__}: {exc}"


def _topology(source: str, sink: str) -> Any:
    from runtime import StreamsBuilder, serdes

    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(lambda key, value: key, key_serde=serdes.STRING, name="by-key")
        .count(store="counts")
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    return builder.build()


def _longest_gap(
    samples: list[tuple[float, dict[str, int]]], task: str, lo: float, hi: float
) -> float:
    """The longest time within [lo, hi] in which `task`'s processed count did
    not grow (at the sampling's resolution)."""
    last_progress = lo
    previous: int | None = None
    longest = 0.0
    for t, counts in samples:
        if t > hi:
            break
        value = counts.get(task)
        if value is None:
            continue
        if previous is not None and value > previous and t > lo:
            longest = max(longest, t - last_progress)
            last_progress = t
        previous = value  # a recreated task starts from 0 again
    return max(longest, hi - last_progress)


def one_expansion(session: Any, state_root: str, args: argparse.Namespace) -> dict[str, Any]:
    from confluent_kafka.admin import NewPartitions

    from runtime import App, AppState, VirtualPartitioner

    bootstrap = session.bootstrap
    app_id = f"ex-{uuid.uuid4().hex[:8]}"
    source, sink = f"{app_id}-in", f"{app_id}-out"
    session.create_topic(source, 4)
    session.create_topic(sink, 4)
    partitioner = VirtualPartitioner(4, place=place)
    config = {
        "application.id": app_id,
        "bootstrap.servers": bootstrap,
        "processing.threads": 2,
        "processing.guarantee": args.guarantee,
        "commit.interval.ms": args.commit_interval_ms,
        "partition.check.interval.ms": args.check_interval_ms,
        "static.partitioner": partitioner,
        "state.dir": os.path.join(state_root, app_id),
        **CLASSIC_CONFIG,
    }
    app = App(_topology(source, sink), config)
    feeder = _Feeder(bootstrap, source, partitioner, args.feed_rate)
    samples: list[tuple[float, dict[str, int]]] = []

    def sample() -> None:
        if app.state is AppState.ERROR:
            raise RuntimeError(f"the app failed: {app.failure!r}")
        samples.append((time.monotonic(), {t.id: t.processed for t in app.status().tasks}))

    def sample_until(predicate: Any, timeout: float, what: str) -> float:
        deadline = time.monotonic() + timeout
        while True:
            sample()
            if predicate():
                return samples[-1][0]
            if time.monotonic() > deadline:
                raise TimeoutError(f"{what} not within {timeout:.0f} s")
            time.sleep(SAMPLE_S)

    old = [f"{s}_{p}" for s in (0, 1) for p in range(4)]
    new_inputs = [f"0_{p}" for p in range(4, 8)]
    new = new_inputs + [f"1_{p}" for p in range(4, 8)]
    app.start()
    feeder.start()
    try:
        sample_until(lambda: all(samples[-1][1].get(t, 0) > 0 for t in old), 60, "processing")
        settle = time.monotonic() + args.window_s
        sample_until(lambda: time.monotonic() >= settle, args.window_s + 5, "the baseline window")
        admin = session.admin
        admin.create_partitions([NewPartitions(sink, 8)])[sink].result(30)
        created_at = time.monotonic()
        admin.create_partitions([NewPartitions(source, 8)])[source].result(30)
        feeder.open_new_keys(created_at + 30)
        first_new = sample_until(
            lambda: any(samples[-1][1].get(t, 0) > 0 for t in new_inputs), 60, "a new task"
        )
        all_new = sample_until(
            lambda: all(samples[-1][1].get(t, 0) > 0 for t in new), 60, "every new task"
        )
        end = created_at + args.window_s
        sample_until(lambda: time.monotonic() >= end, args.window_s + 5, "the expansion window")
        status = app.status()
        gaps = {t: _longest_gap(samples, t, created_at, end) for t in old}
        baseline = {
            t: _longest_gap(samples, t, created_at - args.window_s, created_at) for t in old
        }
        return {
            "first_new_s": first_new - created_at,
            "all_new_s": all_new - created_at,
            "longest_gap_s": max(gaps.values()),
            "longest_gap_task": max(gaps, key=lambda t: gaps[t]),
            "baseline_gap_s": max(baseline.values()),
            "expansions": status.partition_expansions,
            "tasks_created_by_expansion": status.tasks_created_by_expansion,
            "processed": status.processed,
            "fed": feeder.sent,
            "states": str(app.state),
        }
    finally:
        feeder.stop()
        app.close(30)
        if feeder.error:
            raise RuntimeError(feeder.error)


def main(args: argparse.Namespace) -> int:
    from benchmarks.harness import BenchSession, machine_info

    # benchmarks/results/local/ unless --update-results or --out (benchmarks/outputs.py).
    args.out = output_dir(args)

    repeats = 1 if args.quick else args.repeats
    name = f"{NAME}-{args.tag}" if args.tag else NAME
    result: dict[str, Any] = {
        "name": name,
        "repeats": repeats,
        "feed_rate": args.feed_rate,
        "guarantee": args.guarantee,
        "commit_interval_ms": args.commit_interval_ms,
        "check_interval_ms": args.check_interval_ms,
        "window_s": args.window_s,
        "classic_config": CLASSIC_CONFIG,
        "machine": machine_info("kafka"),
        # The machine is shared: its load says how much the figures can be trusted.
        "load_average_start": os.getloadavg()[0],
        "runs": [],
    }
    started = time.monotonic()
    log_dir = os.path.join(args.out, "logs", name)
    with BenchSession(log_dir, "kafka") as session, tempfile.TemporaryDirectory() as state:
        for repeat in range(1, repeats + 1):
            try:
                run = one_expansion(session, state, args)
            except Exception as exc:  # noqa: BLE001 - recorded, the session goes on
                run = {"error": f"{type(exc).__name__}: {exc}"}
            run["repeat"] = repeat
            result["runs"].append(run)
            print(
                f"  r{repeat} "
                + (
                    f"first new {run['first_new_s']:.2f}s, all new {run['all_new_s']:.2f}s, "
                    f"longest gap {run['longest_gap_s']:.2f}s "
                    f"(baseline {run['baseline_gap_s']:.2f}s)"
                    if "error" not in run
                    else f"FAILED {run['error']}"
                ),
                flush=True,
            )
    result["session_s"] = time.monotonic() - started
    result["load_average_end"] = os.getloadavg()[0]
    good = [r for r in result["runs"] if "error" not in r]
    result["summary"] = {
        key: {
            "median": statistics.median(r[key] for r in good) if good else None,
            "min": min((r[key] for r in good), default=None),
            "max": max((r[key] for r in good), default=None),
            "n": len(good),
        }
        for key in ("first_new_s", "all_new_s", "longest_gap_s", "baseline_gap_s")
    }
    for path in write(args.out, name, result):
        print(f"wrote {path}")
    return 1 if len(good) < len(result["runs"]) else 0


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]

    def cell(s: dict[str, Any]) -> str:
        if not s["n"]:
            return "n/a"
        return f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"

    s = result["summary"]
    lines = [
        "# Live partition expansion, 4 -> 8 partitions, while input flows",
        "",
        f"Broker: {m.get('broker', 'Apache Kafka, one KRaft node')}; {m.get('nproc')} cores "
        f"({m.get('cpu', '?')}), librdkafka {m.get('librdkafka')}, {m.get('date')}, "
        f"git {m.get('git_head', '?')}.",
        "",
        f"A stateful count through a repartition topic, `{result['guarantee']}`, "
        f"`commit.interval.ms` {result['commit_interval_ms']}, `partition.check.interval.ms` "
        f"{result['check_interval_ms']}, fed at {result['feed_rate']:.0f} records/s; "
        f"{result['repeats']} repeats (median, min-max, seconds, from the input topic's "
        "CreatePartitions request; the status sampled every 10 ms).",
        "",
        "| first record of a new partition processed | every new task processed | "
        f"longest gap of an old task ({result['window_s']:.0f} s after) | same, "
        f"{result['window_s']:.0f} s before (baseline) |",
        "|---|---|---|---|",
        f"| {cell(s['first_new_s'])} | {cell(s['all_new_s'])} | {cell(s['longest_gap_s'])} | "
        f"{cell(s['baseline_gap_s'])} |",
    ]
    failed = [r for r in result["runs"] if "error" in r]
    if failed:
        lines += ["", f"{len(failed)} run(s) failed: " + "; ".join(r["error"] for r in failed)]
    lines += [
        "",
        f"Classic group timing: {result['classic_config']}. Target (issue 15): no gap longer "
        "than one rebalance plus one commit interval.",
        "",
        f"Load average (1 min) at start {result.get('load_average_start', 0):.1f}, at end "
        f"{result.get('load_average_end', 0):.1f} (the machine may be shared).",
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
