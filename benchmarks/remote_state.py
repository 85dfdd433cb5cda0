"""Workload "remote-state": restore from a snapshot + tail vs the full changelog,
and what taking and uploading snapshots costs processing.

Two measurements, one run each (no repeats: the machine is shared and noisy, so
read the ratios as one sample each):

1. Restore time. A count store of ``--keys`` keys (1,000,000 by default, the
   issue's case), one task: its compacted changelog is written directly. An app
   with remote state on restores it from the changelog (that restore is the
   *full replay* time), then its first snapshot is uploaded to S3Proxy. A
   second app on the same local state, remote state off, processes ``--tail``
   input records (the changelog moves past the snapshot). The local state is
   then deleted and a third app restores: from the snapshot plus the tail. The
   figures are the restoration thread's own (``status().restores``: download,
   install and tail replay included), and a sample of keys is checked against
   the truth.
2. Processing rate with uploads under way. The same count topology over a
   backlog of ``--rate-records`` records (2 partitions, 2 threads), once with
   remote state off and once with snapshots every ``--interval-ms`` (so an
   upload is under way for most of the run), alternated ``--rate-repeats``
   times; records/s of each, and the share of the commit time spent taking
   checkpoints.

Writes ``<out>/remote-state.json`` and ``.md``. Starts its own Apache Kafka (one
KRaft node) and S3Proxy (file-system backend) on loopback. About 5 minutes
with the defaults on a 2-core machine; ``--quick`` is a smoke run.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.harness import git_version
from benchmarks.outputs import add_output_arguments, output_dir
from runtime import App, StreamsBuilder, serdes

NAME = "remote-state"
STORE = "counts"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--keys", type=int, default=1_000_000, help="store size (default 1e6)")
    parser.add_argument("--tail", type=int, default=20_000, help="tail input records (20000)")
    parser.add_argument(
        "--rate-records",
        type=int,
        default=1_000_000,
        help="backlog of the rate runs (1000000: at ~70,000 records/s a run lasts long enough "
        "for several snapshots at the default interval)",
    )
    parser.add_argument("--rate-repeats", type=int, default=2, help="off/on pairs (default 2)")
    parser.add_argument(
        "--interval-ms", type=int, default=2000, help="snapshot interval of the rate runs"
    )
    parser.add_argument(
        "--layout",
        default="per-task",
        choices=("per-task", "consolidated"),
        help="state.store.layout of every app (per-task)",
    )
    add_output_arguments(parser)
    parser.add_argument("--quick", action="store_true", help="smoke run (small sizes)")


def _wait(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise TimeoutError(f"{what} not within {timeout:.0f} s")


class Session:
    """Kafka, S3Proxy, a bucket, a scratch directory; `close()` stops them."""

    def __init__(self, layout: str = "per-task") -> None:
        from benchmarks.harness import start_broker

        self.layout = layout
        from runtime.brokers.s3proxy import S3Proxy

        self.scratch = Path(tempfile.mkdtemp(prefix="bench-remote-"))
        self.broker = start_broker("kafka", str(self.scratch / "kafka.log"))
        self.s3 = S3Proxy(self.scratch / "s3").start()
        self.s3.create_bucket("bench")
        os.environ.update(self.s3.env())
        self.bootstrap: str = self.broker.bootstrap

    def remote(self, interval_ms: int) -> dict[str, object]:
        return {
            "state.remote.url": "s3://bench/snapshots",
            "state.remote.endpoint": self.s3.endpoint,
            "state.remote.checkpoint.interval.ms": interval_ms,
        }

    def app(
        self, app_id: str, source: str, sink: str, state: Path, extra: dict[str, object]
    ) -> App:
        builder = StreamsBuilder()
        (
            builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
            .group_by_key()
            .count(store=STORE)
            .to_stream()
            .to(sink, value_serde=serdes.INT64)
        )
        config: dict[str, object] = {
            "application.id": app_id,
            "bootstrap.servers": self.bootstrap,
            "processing.threads": 2,
            "state.dir": str(state),
            "log.level": "warning",
            "consumer.session.timeout.ms": 6000,
            "state.store.layout": self.layout,
        }
        config.update(extra)
        return App(builder.build(), config)

    def close(self) -> None:
        self.s3.stop()
        self.broker.stop()
        shutil.rmtree(self.scratch, ignore_errors=True)


def _restored(app: App, task_ids: set[str]) -> dict[str, Any]:
    _wait(
        lambda: (
            set(app.status().restores) >= task_ids
            and all(t.state == "RUNNING" for t in app.status().tasks)
        ),
        1800,
        "restore",
    )
    return dict(app.status().restores)


def measure_restore(session: Session, keys: int, tail: int) -> dict[str, Any]:
    from tests.kafka_helpers import create_topic, produce

    app_id = f"bench-remote-{random.randrange(1 << 30)}"
    source, sink = f"{app_id}-in", f"{app_id}-out"
    changelog = f"{app_id}-{STORE}-changelog"
    create_topic(session.bootstrap, source, 1)
    create_topic(session.bootstrap, sink, 1)
    create_topic(session.bootstrap, changelog, 1, config={"cleanup.policy": "compact"})
    truth = {f"key-{i}": i % 7 + 1 for i in range(keys)}
    started = time.monotonic()
    produce(
        session.bootstrap,
        changelog,
        ((k.encode(), serdes.INT64.serialize(v), 0) for k, v in truth.items()),
    )
    load_s = time.monotonic() - started
    state = session.scratch / f"state-{app_id}"

    # Snapshots are taken at commits: commit every second, not every 30 s.
    first = session.app(
        app_id, source, sink, state, {**session.remote(1000), "commit.interval.ms": 1000}
    )
    first.start()
    try:
        full = _restored(first, {"0_0"})["0_0"]

        def uploaded() -> bool:
            remote = first.status().remote_state or {}
            return "0_0" in remote.get("last_snapshot", {})

        _wait(uploaded, 600, "first snapshot")
        snapshot = (first.status().remote_state or {})["last_snapshot"]["0_0"]
    finally:
        first.close(60)

    tail_keys = [f"key-{(i * 7919) % keys}" for i in range(tail)]
    produce(session.bootstrap, source, ((k, "x") for k in tail_keys))
    for key in tail_keys:
        truth[key] += 1
    second = session.app(app_id, source, sink, state, {})
    second.start()
    try:
        _wait(lambda: second.status().processed >= tail, 600, "tail processing")
    finally:
        second.close(60)

    shutil.rmtree(state)
    third = session.app(app_id, source, sink, state, session.remote(3_600_000))
    third.start()
    try:
        from_snapshot = _restored(third, {"0_0"})["0_0"]
        store = third.store(STORE, timeout=60)
        sample = random.Random(7).sample(sorted(truth), min(2000, len(truth)))
        wrong = [k for k in sample if store.get(k) != truth[k]]
        if wrong:
            raise AssertionError(f"{len(wrong)} of {len(sample)} sampled counts wrong: {wrong[:5]}")
    finally:
        third.close(60)
    return {
        "keys": keys,
        "tail_records": tail,
        "changelog_load_seconds": round(load_s, 1),
        "full_replay": full,
        "snapshot": snapshot,
        "snapshot_plus_tail": from_snapshot,
        "speedup": round(full["seconds"] / from_snapshot["seconds"], 2),
        "sampled_keys_checked": len(sample),
    }


def measure_rate(session: Session, records: int, repeats: int, interval_ms: int) -> dict[str, Any]:
    from tests.kafka_helpers import create_topic, produce

    source = f"bench-remote-rate-{random.randrange(1 << 30)}"
    create_topic(session.bootstrap, source, 2)
    produce(
        session.bootstrap,
        source,
        ((f"key-{(i * 7919) % (records // 2)}", "x") for i in range(records)),
    )
    runs: list[dict[str, Any]] = []
    for repeat in range(repeats):
        for mode in ("off", "on"):
            app_id = f"bench-remote-rate-{mode}-{repeat}-{random.randrange(1 << 30)}"
            sink = f"{app_id}-out"
            create_topic(session.bootstrap, sink, 2)
            extra = session.remote(interval_ms) if mode == "on" else {}
            extra["commit.interval.ms"] = 1000
            app = session.app(app_id, source, sink, session.scratch / app_id, extra)
            app.start()
            try:
                _wait(lambda a=app: a.status().processed > 0, 120, "first record")
                started = time.monotonic()
                first = app.status().processed
                _wait(lambda a=app: a.status().processed >= records, 900, "backlog")
                elapsed = time.monotonic() - started
                status = app.status()
                remote = status.remote_state or {}
                runs.append(
                    {
                        "mode": mode,
                        "repeat": repeat,
                        "records_per_s": round((records - first) / elapsed),
                        "seconds": round(elapsed, 2),
                        "snapshots_uploaded": remote.get("snapshots_uploaded", 0),
                        "bytes_uploaded": remote.get("bytes_uploaded", 0),
                        "captures": remote.get("captures", 0),
                        "capture_seconds": remote.get("capture_seconds", 0.0),
                    }
                )
            finally:
                app.close(60)
    off = statistics.median(r["records_per_s"] for r in runs if r["mode"] == "off")
    on = statistics.median(r["records_per_s"] for r in runs if r["mode"] == "on")
    return {
        "records": records,
        "interval_ms": interval_ms,
        "runs": runs,
        "median_off": off,
        "median_on": on,
        "cost": round(1 - on / off, 3),
    }


def markdown(result: dict[str, Any]) -> str:
    restore, rate = result["restore"], result["rate"]
    full, snap = restore["full_replay"], restore["snapshot_plus_tail"]
    lines = [
        "# Remote state: restore time and upload cost",
        "",
        f"{result.get('date', 'no date')}, git {result.get('git', '?')}; "
        f"one run, {result['machine']}; Apache Kafka (one KRaft node) and S3Proxy "
        "(file-system backend) on loopback. The machine is shared with other work: "
        "each figure is one noisy sample. "
        f"Store layout: {result.get('layout', 'per-task')}.",
        "",
        f"## Restore of a {restore['keys']:,}-key count store (one task)",
        "",
        "| source | seconds | changelog records replayed | downloaded bytes |",
        "| --- | ---: | ---: | ---: |",
        f"| full changelog | {full['seconds']} | {full['records']:,} | 0 |",
        f"| snapshot + tail | {snap['seconds']} | {snap['records']:,} | "
        f"{snap['downloaded_bytes']:,} |",
        "",
        f"Snapshot + tail is **{restore['speedup']}x** faster (target >= 5x). "
        f"The snapshot was {restore['snapshot']['bytes']:,} bytes; "
        f"{restore['sampled_keys_checked']} sampled keys matched the truth.",
        "",
        f"## Processing rate with snapshots every {rate['interval_ms']} ms",
        "",
        "| run | remote state | records/s | snapshots | uploaded bytes | "
        "checkpoint time (commit held) |",
        "| --- | --- | ---: | ---: | ---: | ---: |",
    ]
    for run in rate["runs"]:
        lines.append(
            f"| {run['repeat']} | {run['mode']} | {run['records_per_s']:,} | "
            f"{run['snapshots_uploaded']} | {run['bytes_uploaded']:,} | "
            f"{run['capture_seconds']} s |"
        )
    uploads = sum(run["snapshots_uploaded"] for run in rate["runs"] if run["mode"] == "on")
    if uploads:
        verdict = (
            f"Median {rate['median_on']:,} records/s with uploads vs {rate['median_off']:,} "
            f"without: a cost of **{rate['cost'] * 100:.1f}%** (target <= 10%)."
        )
    else:
        verdict = (
            "No verdict: no snapshot was uploaded during the runs with remote state on (each "
            "run was shorter than the snapshot interval); rerun with a larger --rate-records."
        )
    lines += ["", verdict, ""]
    return "\n".join(lines)


def main(args: argparse.Namespace) -> int:
    # benchmarks/results/local/ unless --update-results or --out (benchmarks/outputs.py).
    args.out = output_dir(args)
    if args.quick:
        args.keys, args.tail, args.rate_records, args.rate_repeats = 20_000, 1_000, 20_000, 1
    session = Session(args.layout)
    try:
        restore = measure_restore(session, args.keys, args.tail)
        print(json.dumps(restore, indent=1), flush=True)
        rate = measure_rate(session, args.rate_records, args.rate_repeats, args.interval_ms)
        print(json.dumps(rate, indent=1), flush=True)
    finally:
        session.close()
    result = {
        "machine": f"{os.cpu_count()} CPUs, shared",
        "quick": args.quick,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "git": git_version(),
        "layout": args.layout,
        "restore": restore,
        "rate": rate,
    }
    os.makedirs(args.out, exist_ok=True)
    name = "remote-state-quick" if args.quick else "remote-state"
    if args.layout != "per-task":
        name += f"-{args.layout}"
    with open(os.path.join(args.out, f"{name}.json"), "w") as handle:
        json.dump(result, handle, indent=1)
    text = markdown(result)
    with open(os.path.join(args.out, f"{name}.md"), "w") as handle:
        handle.write(text)
    print(text)
    return 0
