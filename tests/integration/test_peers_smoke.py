"""The benchmarks' real peers still work and produce the runtime's output bytes.

``benchmarks/peers`` runs Kafka Streams (a Maven project, built on demand into a
cache) and quixstreams (its own virtualenv) beside the runtime. Nothing else
exercises them between benchmark sessions, so this test runs each peer through
the harness's child protocol (ready -> go -> stop) on a small input and checks
the output exactly: the stateless map writes every input record's transformed
value once, byte for byte what the runtime's ``serdes.JSON`` writes; the
stateful count ends at the true count per key (8-byte big-endian), with the
store's changelog topic under Kafka Streams' name.

Kafka Streams needs Java 17+ and Maven (skipped with the reason otherwise); the
first run builds the jar (Maven downloads its dependencies) and creates the
quixstreams virtualenv, later runs reuse both. All peers of a test run at once.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from benchmarks.compare.session import Child
from benchmarks.compare.workloads import WORKLOADS, generate
from benchmarks.peers import build
from benchmarks.peers.models import Launcher
from benchmarks.workloads.stateless import raw_transform
from runtime import serdes
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]

RECORDS = 3_000
PARTITIONS = 4


@pytest.fixture(scope="module")
def launcher() -> Launcher:
    """The peers' launcher with the jar and the quixstreams virtualenv (built if needed)."""
    missing = build.java_missing()
    if missing:
        pytest.skip(missing)
    return Launcher(jar=build.kafka_streams_jar(), quix_python=build.quix_python())


class _PeerRun:
    """One peer on its own topics, driven like a benchmark run (no timing)."""

    def __init__(
        self,
        bootstrap: str,
        launcher: Launcher,
        log_dir: Path,
        model: str,
        workload: str,
        threads: int,
        records: list[tuple[bytes, bytes, int]],
    ) -> None:
        self.app_id = unique_name(f"peers-{model}-{workload}")
        self.source, self.sink = f"{self.app_id}-in", f"{self.app_id}-out"
        create_topic(bootstrap, self.source, PARTITIONS)
        create_topic(bootstrap, self.sink, PARTITIONS)
        produce(bootstrap, self.source, records)
        spec: dict[str, Any] = {
            "model": model,
            "workload": workload,
            "threads": threads,
            "partitions": PARTITIONS,
            "bootstrap": bootstrap,
            "application_id": self.app_id,
            "input_topic": self.source,
            "output_topic": self.sink,
            "topology": WORKLOADS[workload].topology,
            "config": {
                "commit.interval.ms": 300,
                "consumer.session.timeout.ms": 6000,
                "consumer.heartbeat.interval.ms": 1000,
            },
            "backlog": len(records),
            "settle_s": 0.3,
        }
        argv, spec = launcher(model, spec)
        self.log = log_dir / f"{self.app_id}.log"
        self.child = Child(spec, str(self.log), argv)

    def go(self) -> None:
        self.child.wait_event("ready", 180)
        self.child.send("go")
        self.child.wait_event("go", 30)

    def stop(self) -> dict[str, Any]:
        self.child.send("stop")
        try:
            return self.child.wait_event("result", 90)
        finally:
            self.child.close(60)

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def _start(
    bootstrap: str, launcher: Launcher, tmp_path: Path, workload: str, models: list[tuple[str, int]]
) -> tuple[list[tuple[bytes, bytes, int]], list[_PeerRun]]:
    records = generate(WORKLOADS[workload], 0, RECORDS, PARTITIONS)
    runs = [
        _PeerRun(bootstrap, launcher, tmp_path, model, workload, threads, records)
        for model, threads in models
    ]
    return records, runs


def _stop_all(runs: list[_PeerRun]) -> None:
    for run in runs:
        if run.child.proc.poll() is None:
            run.child.send("stop")
        run.child.close(60)


def test_peers_stateless_map_exact_output(
    bootstrap: str, launcher: Launcher, tmp_path: Path
) -> None:
    records, runs = _start(
        bootstrap,
        launcher,
        tmp_path,
        "stateless",
        [("ks-classic", 2), ("ks-proc", 1), ("quixstreams", 1)],
    )
    # Every input record once, transformed exactly as the runtime's JSON serde writes it.
    expected = Counter((key, raw_transform(value)) for key, value, _p in records)
    try:
        for run in runs:
            run.go()
        for run in runs:
            out = consume_all(bootstrap, run.sink, expected=RECORDS, timeout=120, idle=0.5)
            got = Counter((m.key, m.value) for m in out)
            assert got == expected, (
                f"{run.app_id}: {len(out)} records, {sum((got - expected).values())} unexpected, "
                f"{sum((expected - got).values())} missing; e.g. "
                f"{next(iter(got - expected), None)!r}\n{run.log_tail()}"
            )
            result = run.stop()
            assert result["closed_cleanly"], run.log_tail()
            assert result["status"]["processed"] == RECORDS
    finally:
        _stop_all(runs)


def test_peers_stateful_count_final_counts(
    bootstrap: str, launcher: Launcher, tmp_path: Path
) -> None:
    records, runs = _start(
        bootstrap,
        launcher,
        tmp_path,
        "stateful",
        [("ks-classic", 1), ("ks-proc", 2), ("quixstreams", 1)],
    )
    expected = Counter(key for key, _v, _p in records)
    try:
        for run in runs:
            run.go()
        for run in runs:

            def latest(run: _PeerRun = run) -> dict[bytes, int]:
                counts: dict[bytes, int] = {}
                for m in consume_all(bootstrap, run.sink, timeout=30):
                    assert m.key is not None and m.value is not None and len(m.value) == 8
                    counts[m.key] = serdes.INT64.deserialize(m.value)
                return counts

            wait_until(
                lambda latest=latest: sum(latest().values()) >= RECORDS,
                120,
                interval=0.5,
                message=f"{run.app_id}: counts add up to the input",
            )
            assert latest() == dict(expected), run.log_tail()
            result = run.stop()
            assert result["closed_cleanly"], run.log_tail()
        # Kafka Streams keeps the store's changelog under the runtime's name.
        ks = next(r for r in runs if r.app_id.startswith("peers-ks-classic"))
        changelog = consume_all(bootstrap, f"{ks.app_id}-counts-changelog", timeout=30)
        assert {m.key for m in changelog} == set(expected)
    finally:
        _stop_all(runs)


def test_peer_json_bytes_match_runtime_serde() -> None:
    """The harness's check above compares with raw_transform; it is the runtime's serde."""
    for i in range(0, 10_000, 7):
        _key, value, _p = WORKLOADS["stateless"].make(i, PARTITIONS)
        assert raw_transform(value) == serdes.JSON.serialize({**json.loads(value), "seen": True})
