"""Session windows, sliding windows and suppression restored from their changelogs.

A click-stream sessionization with suppress (session aggregation, on-close
session count, sliding count, final-results suppression) runs under
exactly_once_v2 on the suite's Kafka over the first half of an input; the app
closes, its state directory is deleted, and a new app finishes the input from
the changelogs alone. The committed output must be exactly what one
uninterrupted run gives (computed with the test driver), so every store these
operators add (session store, sliding windows, the suppression buffer, the
emit-time store) is change-logged and restored correctly.

Input timestamps only increase: stream time restarts after a restart (as in
Kafka Streams), which with increasing timestamps changes nothing.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from confluent_kafka import Producer

from runtime import App, StreamsBuilder, serdes
from runtime.topology.session_windows import SessionWindows
from runtime.topology.sliding_windows import SlidingWindows
from runtime.topology.suppressed import BufferConfig, EmitStrategy, Suppressed
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.topology import Topology
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


def topology(topic: str, out: str) -> Topology:
    builder = StreamsBuilder()
    grouped = builder.stream(topic, key_serde=STR, value_serde=STR).group_by_key()
    (
        grouped.windowed_by(SessionWindows.of_inactivity_gap_with_grace(1_000, 500))
        .aggregate(lambda: "", lambda k, v, agg: agg + v, lambda k, a, b: a + b, value_serde=STR)
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .map(lambda wk, v: (wk.key, f"session {wk.start}-{wk.end}:{v}"))
        .to(out, key_serde=STR, value_serde=STR)
    )
    (
        grouped.windowed_by(SessionWindows.of_inactivity_gap_with_no_grace(1_000))
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .map(lambda wk, v: (wk.key, f"closed {wk.start}-{wk.end}:{v}"))
        .to(out, key_serde=STR, value_serde=STR)
    )
    (
        grouped.windowed_by(SlidingWindows.of_time_difference_and_grace(700, 200))
        .count()
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .map(lambda wk, v: (wk.key, f"sliding {wk.start}-{wk.end}:{v}"))
        .to(out, key_serde=STR, value_serde=STR)
    )
    return builder.build()


def inputs(count: int) -> list[tuple[str, str, int]]:
    """Increasing timestamps with gaps that end sessions now and then."""
    records = []
    ts = 10_000
    for i in range(count):
        ts += 1_500 if i % 7 == 6 else 150 + (i * 37) % 200
        records.append((f"k{i % 3}", "abcdefg"[i % 7], ts))
    return records


def produce_timed(bootstrap: str, topic: str, records: list[tuple[str, str, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, ts in records:
        producer.produce(topic, value=value, key=key, timestamp=ts)
    assert producer.flush(30) == 0


def oracle(records: list[tuple[str, str, int]], tmp: Path) -> list[tuple[bytes, bytes]]:
    t = topology("in", "out")
    ctx = RecordingTaskContext(state_dir=tmp, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(t.subtopologies[0])
    for key, value, ts in records:
        ctx.process(graph, "in", key, value, ts)
    return [(s.key, s.value) for s in ctx.output("out")]


def test_restored_from_changelogs_the_output_is_exactly_an_uninterrupted_runs(
    bootstrap: str, tmp_path: Path
) -> None:
    topic, out = unique_name("sess-in"), unique_name("sess-out")
    create_topic(bootstrap, topic, 1)
    create_topic(bootstrap, out, 1)
    records = inputs(240)
    expected = oracle(records, tmp_path / "oracle")
    assert len(expected) > 40 and any(v.startswith(b"closed") for _k, v in expected)
    app_id = unique_name("sess")
    state = tmp_path / "state"
    # Caching off, as the oracle's: the session stores are cached at defaults,
    # and the output interleaves three branches, so only per-update output is exact.
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
    # What the second app restores: the session and sliding stores, both
    # suppression buffers and the on-close session store (with its emit time)
    for store in (
        "KSTREAM-AGGREGATE-STATE-STORE-0000000001",
        "KTABLE-SUPPRESS-STATE-STORE-0000000004",
        "KSTREAM-AGGREGATE-STATE-STORE-0000000008",
        "KSTREAM-AGGREGATE-STATE-STORE-0000000013",
        "KTABLE-SUPPRESS-STATE-STORE-0000000016",
    ):
        assert end_offsets(bootstrap, f"{app_id}-{store}-changelog")[0] > 0, store
    shutil.rmtree(state)  # the second app has nothing but the changelogs
    produce_timed(bootstrap, topic, records[half:])
    run_until(len(records))
    got = [(m.key, m.value) for m in consume_all(bootstrap, out, expected=len(expected))]
    assert got == expected
