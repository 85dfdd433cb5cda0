"""Sliding windows: window creation, boundaries, grace and their invariants, on real stores."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.topology import StreamsBuilder, TopologyError, serdes
from runtime.topology.sliding_windows import SlidingWindows
from runtime.topology.suppressed import BufferConfig, EmitStrategy, Suppressed
from runtime.topology.testing import RecordingTaskContext


def run(
    tmp_path: Path,
    windows: SlidingWindows,
    records: list[tuple[Any, Any, int]],
    suppress: bool = False,
) -> tuple[list[tuple[Any, int, int, int, int]], RecordingTaskContext]:
    builder = StreamsBuilder()
    table = (
        builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .windowed_by(windows)
        .count(store="sliding")
    )
    if suppress:
        table = table.suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
    table.to_stream().to("out", value_serde=serdes.INT64)
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    for key, value, ts in records:
        ctx.process(graph, "in", key, value, ts)
    key_serde = serdes.windowed(serdes.STRING, windows.difference_ms)
    rows = []
    for s in ctx.output("out"):
        w = key_serde.deserialize(s.key)
        assert w is not None
        rows.append((w.key, w.start, w.end, serdes.INT64.deserialize(s.value), s.timestamp))
    return rows, ctx


def test_sliding_windows_constructors_and_validation() -> None:
    w = SlidingWindows.of_time_difference_and_grace(10, 5)
    assert (w.difference_ms, w.grace_ms, w.retention_ms, w.close_delay_ms) == (10, 5, 25, 5)
    assert SlidingWindows.of_time_difference_with_no_grace(10).grace_ms == 0
    with pytest.raises(ValueError, match="difference"):
        SlidingWindows(0)
    with pytest.raises(ValueError, match="grace"):
        SlidingWindows(10, -1)


def test_left_and_right_windows_as_kafka_streams_creates_them(tmp_path: Path) -> None:
    windows = SlidingWindows.of_time_difference_and_grace(10, 5)
    rows, _ = run(
        tmp_path, windows, [("a", "v", 5), ("a", "v", 12), ("a", "v", 30), ("a", "v", 25)]
    )
    assert rows == [
        ("a", 0, 10, 1, 5),  # an early record: the shared window [0, 10]
        ("a", 6, 16, 1, 12),  # the right window of 5, now that 12 falls in it
        ("a", 2, 12, 2, 12),  # 12's left window, seeded from the window before it
        ("a", 20, 30, 1, 30),
        ("a", 20, 30, 2, 30),  # 25 falls in 30's left window
        ("a", 15, 25, 1, 25),  # 25's own left window
        ("a", 26, 36, 1, 30),  # 25's right window holds 30 (stamped with 30)
    ]


def test_late_records_and_null_values_are_dropped(tmp_path: Path) -> None:
    windows = SlidingWindows.of_time_difference_and_grace(10, 5)
    rows, ctx = run(
        tmp_path, windows, [("a", "v", 30), ("a", "v", 14), ("a", None, 31), (None, "v", 31)]
    )
    assert [r[1:4] for r in rows] == [(20, 30, 1)]
    assert (ctx.dropped["late"], ctx.dropped["null_value"], ctx.dropped["null_key"]) == (1, 1, 1)


def test_final_results_through_suppress(tmp_path: Path) -> None:
    windows = SlidingWindows.of_time_difference_and_grace(10, 0)
    rows, _ = run(
        tmp_path, windows, [("a", "v", 20), ("a", "v", 25), ("a", "v", 50)], suppress=True
    )
    # a window goes out once its end <= stream time - grace (Kafka's suppression):
    # at 50, all of them, [40, 50] included
    assert [r[1:4] for r in rows] == [(10, 20, 1), (15, 25, 2), (21, 31, 1), (40, 50, 1)]


def test_sliding_topology_opts_out_of_key_parallel() -> None:
    builder = StreamsBuilder()
    builder.stream("in").group_by_key().windowed_by(SlidingWindows(10)).count().to_stream().to("o")
    assert not builder.build().subtopologies[0].key_parallel
    with pytest.raises(TopologyError, match="SlidingWindows"):
        builder.stream("in2").group_by_key().windowed_by(10)
    sliding = builder.stream("in3").group_by_key().windowed_by(SlidingWindows(10))
    with pytest.raises(TopologyError, match="suppress"):
        sliding.emit_strategy(EmitStrategy.on_window_close())


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(min_value=0, max_value=120), min_size=1, max_size=25))
def test_each_window_counts_exactly_the_records_within_its_bounds(times: list[int]) -> None:
    """With no record late, in any arrival order: every record's left window
    exists (early records: [0, d]), and each window's latest count is the
    number of records with start <= t <= end (both ends inclusive)."""
    d = 10
    windows = SlidingWindows.of_time_difference_and_grace(d, 10_000)
    with tempfile.TemporaryDirectory() as tmp:
        rows, _ = run(Path(tmp), windows, [("k", "v", t) for t in times])
    final: dict[tuple[int, int], tuple[int, int]] = {}
    for _key, start, end, count, ts in rows:
        final[(start, end)] = (count, ts)
    for (start, end), (count, ts) in final.items():
        inside = [t for t in times if start <= t <= end]
        assert count == len(inside), (start, end, sorted(times))
        assert ts == max(inside)
    for t in times:
        assert (max(t - d, 0), max(t, d)) in final
