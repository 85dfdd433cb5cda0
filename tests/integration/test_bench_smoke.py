"""The benchmarks' thread-per-client baseline still works: complete output, committed offsets.

``benchmarks/baseline`` is built from the runtime's own task, state and client
code, so a change there can break it without any benchmark running in CI. Two
stream threads (two consumers in one group, two producers, two restore
consumers) on a small input: the stateless JSON map of the benchmarks, and the
stateful count (RocksDB store, changelog, cache, checkpoint) whose output counts
must add up to the input.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.baseline import BaselineApp
from benchmarks.compare.workloads import build_topology
from runtime import serdes
from tests.configs import app_config
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

RECORDS = 2_000
PARTITIONS = 4


def _config(bootstrap: str, app_id: str, state_dir: Path) -> dict[str, object]:
    return app_config(bootstrap, app_id, state_dir, heartbeat_ms=None)


def test_baseline_stateless_map_two_threads(bootstrap: str, tmp_path: Path) -> None:
    app_id = unique_name("bench-baseline")
    source, sink = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    app = BaselineApp(
        build_topology("stateless", source, sink), _config(bootstrap, app_id, tmp_path)
    )
    app.start()
    try:
        # Both threads take part: the input is written once the group has spread the
        # partitions over them. (On Kafka the first thread's join completes at once and the
        # second one's rebalance follows a heartbeat later; had the input been there from the
        # start, the first thread would have processed all of it alone.)
        wait_until(
            lambda: all(len(a) == PARTITIONS // 2 for a in app.assignment()),
            60,
            message=f"the partitions were not spread over both threads: {app.assignment()}",
        )
        produce(
            bootstrap,
            source,
            ((f"user-{i % 97}", json.dumps({"id": i})) for i in range(RECORDS)),
        )
        out = consume_all(bootstrap, sink, expected=RECORDS, timeout=60, idle=0.3)
        assert len(out) == RECORDS
        assert sorted(json.loads(m.value)["id"] for m in out) == list(range(RECORDS))  # type: ignore[arg-type]
        assert all(json.loads(m.value)["seen"] is True for m in out)  # type: ignore[arg-type]
        # Every task processed input, and the tasks sit two and two on the threads.
        processed = app.task_processed()
        assert len(processed) == PARTITIONS and all(n > 0 for n in processed.values()), processed
        assert all(len(a) == PARTITIONS // 2 for a in app.assignment())
        wait_until(
            lambda: sum(committed_offsets(bootstrap, app_id, source).values()) == RECORDS,
            30,
            message="offsets of every processed record committed",
        )
        assert app.failure is None
    finally:
        assert app.close(30)


def test_baseline_stateful_count_two_threads(bootstrap: str, tmp_path: Path) -> None:
    app_id = unique_name("bench-baseline")
    source, sink = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    produce(bootstrap, source, ((f"key-{i % 50}", "x") for i in range(RECORDS)))
    app = BaselineApp(build_topology("count", source, sink), _config(bootstrap, app_id, tmp_path))
    app.start()
    try:

        def latest() -> dict[bytes, int]:
            counts: dict[bytes, int] = {}
            for m in consume_all(bootstrap, sink, timeout=30):
                assert m.key is not None
                counts[m.key] = serdes.INT64.deserialize(m.value)
            return counts

        wait_until(lambda: sum(latest().values()) == RECORDS, 60, interval=0.3)
        assert latest() == {f"key-{k}".encode(): RECORDS // 50 for k in range(50)}
        changelog = f"{app_id}-counts-changelog"
        assert {m.key for m in consume_all(bootstrap, changelog, timeout=30)} == set(latest())
        assert app.failure is None
    finally:
        assert app.close(30)
    # A clean close wrote each task's checkpoint.
    checkpoints = list(tmp_path.glob(f"{app_id}/*/.checkpoint"))
    assert len(checkpoints) == PARTITIONS
