"""A cogroup's shared stores, and headers kept by suppression, restored from changelogs.

Two cogroups of the same two streams (one input topic, split by value), a
key-value aggregate and a tumbling-window aggregate with final-results
suppression, run under exactly_once_v2 on the suite's Kafka over the first
half of an input whose records carry headers; the app closes, its state
directory is deleted, and a new app finishes the input from the changelogs
alone. The committed output, headers included, must be exactly what one
uninterrupted run gives (the test driver, caching off on both), so the
shared stores and the suppression buffer's headers are change-logged and
restored.

Input timestamps only increase: stream time restarts after a restart (as in
Kafka Streams), which with increasing timestamps changes nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Producer

from runtime import App, StreamsBuilder, serdes
from runtime.topology.suppressed import BufferConfig, Suppressed
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.topology import Topology
from runtime.topology.windows import TimeWindows
from tests.configs import app_config
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

STR = serdes.STRING
Input = tuple[str, str, int, list[tuple[str, bytes | None]]]


def topology(topic: str, out: str) -> Topology:
    builder = StreamsBuilder()
    source = builder.stream(topic, key_serde=STR, value_serde=STR)
    vowels = source.filter(lambda k, v: v in "aeiou").group_by_key()
    others = source.filter(lambda k, v: v not in "aeiou").group_by_key()

    def cogrouped() -> Any:
        return vowels.cogroup(lambda k, v, agg: agg + v.upper()).cogroup(
            others, lambda k, v, agg: agg + v
        )

    (
        cogrouped()
        .aggregate(lambda: "", store="cg-agg", value_serde=STR)
        .to_stream()
        .map_values(lambda v: f"total:{v[-12:]}")
        .to(out, key_serde=STR, value_serde=STR)
    )
    (
        cogrouped()
        .windowed_by(TimeWindows.of_size_and_grace(1_000, 200))
        .aggregate(lambda: "", store="cg-win", value_serde=STR)
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()).with_name("cg-final"))
        .to_stream()
        .map(lambda wk, v: (wk.key, f"window {wk.start}:{v}"))
        .to(out, key_serde=STR, value_serde=STR)
    )
    return builder.build()


def inputs(count: int) -> list[Input]:
    records = []
    ts = 10_000
    for i in range(count):
        ts += 90 + (i * 37) % 200
        records.append((f"k{i % 3}", "abcdefghij"[i % 10], ts, [("n", str(i).encode())]))
    return records


def produce_timed(bootstrap: str, topic: str, records: list[Input]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, ts, headers in records:
        producer.produce(topic, value=value, key=key, timestamp=ts, headers=headers)
    assert producer.flush(30) == 0


def oracle(records: list[Input], tmp: Path) -> list[tuple[bytes | None, bytes | None, object]]:
    t = topology("in", "out")
    ctx = RecordingTaskContext(state_dir=tmp, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(t.subtopologies[0])
    for key, value, ts, headers in records:
        ctx.process(graph, "in", key, value, ts, headers)
    return [(s.key, s.value, tuple(s.headers or ())) for s in ctx.output("out")]


def test_restored_from_changelogs_the_output_is_exactly_an_uninterrupted_runs(
    bootstrap: str, tmp_path: Path
) -> None:
    topic, out = unique_name("cogroup-in"), unique_name("cogroup-out")
    create_topic(bootstrap, topic, 1)
    create_topic(bootstrap, out, 1)
    records = inputs(200)
    expected = oracle(records, tmp_path / "oracle")
    assert any(v and v.startswith(b"window") for _k, v, _h in expected)
    assert all(h for _k, _v, h in expected), "every output record carries its input's header"
    app_id = unique_name("cogroup")
    state = tmp_path / "state"
    config = app_config(
        bootstrap,
        app_id,
        state,
        threads=1,
        commit_ms=100,
        guarantee="exactly_once_v2",
        **{"cache.max.bytes": 0},
    )

    def run_until(n: int) -> None:
        app = App(topology(topic, out), config)
        app.start()
        try:
            wait_until(
                lambda: committed_offsets(bootstrap, app_id, topic).get(0) == n,
                60,
                message=f"the app did not commit offset {n}",
            )
        finally:
            assert app.close(30)

    half = len(records) // 2
    produce_timed(bootstrap, topic, records[:half])
    run_until(half)
    for store in ("cg-agg", "cg-win", "cg-final-store"):
        assert end_offsets(bootstrap, f"{app_id}-{store}-changelog")[0] > 0, store
    shutil.rmtree(state)  # the second app has nothing but the changelogs
    produce_timed(bootstrap, topic, records[half:])
    run_until(len(records))
    got = [
        (m.key, m.value, tuple(m.headers))
        for m in consume_all(bootstrap, out, expected=len(expected))
    ]
    assert got == expected
