"""Session windows: merging, grace, output, the session serde and the emit strategy, on real stores."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.topology import StreamsBuilder, TopologyError, Windowed, serdes
from runtime.topology.session_store import session_windowed
from runtime.topology.session_windows import SessionWindows
from runtime.topology.suppressed import EmitStrategy
from runtime.topology.testing import RecordingTaskContext

SESSION = session_windowed(serdes.STRING)


def session_topology(
    windows: SessionWindows, kind: str = "count", emit_final: bool = False, store: str = "s"
) -> Any:
    builder = StreamsBuilder()
    stream = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    windowed = stream.group_by_key().windowed_by(windows)
    if emit_final:
        windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
    if kind == "count":
        table = windowed.count(store=store)
        value_serde = serdes.INT64
    elif kind == "reduce":
        table = windowed.reduce(lambda a, b: f"{a}|{b}", store=store)
        value_serde = serdes.STRING
    else:
        table = windowed.aggregate(
            lambda: "",
            lambda key, value, agg: agg + value,
            lambda key, a, b: f"({a}+{b})",
            store=store,
            value_serde=serdes.STRING,
        )
        value_serde = serdes.STRING
    table.to_stream().to("out", value_serde=value_serde)
    return builder.build(), value_serde


def run(
    tmp_path: Path,
    windows: SessionWindows,
    records: list[tuple[Any, Any, int]],
    kind: str = "count",
    emit_final: bool = False,
    cache_max_bytes: int = 0,
) -> tuple[list[tuple[Any, int, int, Any, int]], RecordingTaskContext]:
    topology, value_serde = session_topology(windows, kind, emit_final)
    ctx = RecordingTaskContext(
        state_dir=tmp_path, store_kind="memory", cache_max_bytes=cache_max_bytes
    )
    graph = ctx.instantiate(topology.subtopologies[0])
    for key, value, ts in records:
        ctx.process(graph, "in", key, value, ts)
    rows = []
    for s in ctx.output("out"):
        w = SESSION.deserialize(s.key)
        assert w is not None
        value = None if s.value is None else value_serde.deserialize(s.value)
        rows.append((w.key, w.start, w.end, value, s.timestamp))
    return rows, ctx


def test_session_windows_constructors_and_validation() -> None:
    w = SessionWindows.of_inactivity_gap_with_grace(10, 5)
    assert (w.gap_ms, w.grace_ms, w.retention_ms) == (10, 5, 15)
    assert SessionWindows.of_inactivity_gap_with_no_grace(7).grace_ms == 0
    with pytest.raises(ValueError, match="gap"):
        SessionWindows(0)
    with pytest.raises(ValueError, match="grace"):
        SessionWindows(5, -1)


def test_session_serde_is_kafkas_layout() -> None:
    data = SESSION.serialize(Windowed("k", 3, 9))
    assert data == b"k" + (9).to_bytes(8, "big") + (3).to_bytes(8, "big")
    assert SESSION.deserialize(data) == Windowed("k", 3, 9)
    assert SESSION.serialize(None) is None


def test_records_merge_sessions_and_the_merged_ones_are_retracted(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 100)
    rows, _ = run(tmp_path, windows, [("a", "x", 0), ("a", "y", 20), ("a", "z", 10)])
    assert rows == [
        ("a", 0, 0, 1, 0),
        ("a", 20, 20, 1, 20),
        # 10 is within 10 of both (inclusive): one session [0, 20], the old ones retracted
        ("a", 0, 0, None, 0),
        ("a", 20, 20, None, 20),
        ("a", 0, 20, 3, 20),
    ]


def test_reduce_and_aggregate_merge_in_end_order(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 100)
    records = [("a", "x", 0), ("a", "y", 20), ("a", "z", 10)]
    rows, _ = run(tmp_path / "r", windows, records, "reduce")
    assert rows[-1] == ("a", 0, 20, "x|y|z", 20)
    rows, _ = run(tmp_path / "g", windows, records, "aggregate")
    assert rows[-1] == ("a", 0, 20, "((+x)+y)z", 20)


def test_late_records_are_dropped_after_gap_plus_grace(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 5)
    records = [("a", "v", 0), ("b", "v", 100), ("a", "v", 5), ("a", None, 90), ("c", "v", 84)]
    rows, ctx = run(tmp_path, windows, records)
    # close time at 100: 100 - 5 - 10 = 85; [0, 5] is closed, 90 and 84+... : 84 < 85
    assert [r[:4] for r in rows] == [("a", 0, 0, 1), ("b", 100, 100, 1), ("a", 90, 90, 1)]
    assert ctx.dropped["late"] == 2


def test_null_keys_dropped_null_values_counted_but_not_reduced(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_no_grace(10)
    rows, ctx = run(tmp_path / "c", windows, [(None, "v", 0), ("a", None, 1)])
    assert rows == [("a", 1, 1, 1, 1)]
    assert ctx.dropped["null_key"] == 1
    rows, ctx = run(tmp_path / "r", windows, [("a", None, 1), ("a", "x", 2)], "reduce")
    assert rows == [("a", 2, 2, "x", 2)]
    assert ctx.dropped["null_value"] == 1


def test_emit_on_window_close_forwards_each_session_once(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 5)
    records = [("a", "v", 0), ("a", "v", 8), ("b", "v", 12), ("a", "v", 30), ("b", "v", 60)]
    rows, _ = run(tmp_path, windows, records, emit_final=True)
    # close time = stream time - 15: at 30 -> 15 ([0, 8] closed), at 60 -> 45 ([12], [30])
    assert rows == [("a", 0, 8, 2, 8), ("b", 12, 12, 1, 12), ("a", 30, 30, 1, 30)]


def test_emit_on_window_close_survives_a_restart_without_repeating(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_no_grace(10)
    topology, _ = session_topology(windows, emit_final=True)
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="rocksdb")
    graph = ctx.instantiate(topology.subtopologies[0])
    for key, ts in (("a", 0), ("a", 50)):
        ctx.process(graph, "in", key, "v", ts)
    ctx.commit()
    ctx.close()
    assert len(ctx.output("out")) == 1  # [0, 0] closed at 50
    ctx2 = RecordingTaskContext(state_dir=tmp_path, store_kind="rocksdb")
    graph = ctx2.instantiate(topology.subtopologies[0])
    ctx2.process(graph, "in", "a", "v", 100)  # closes [50, 50] only
    out = [SESSION.deserialize(s.key) for s in ctx2.output("out")]
    assert out == [Windowed("a", 50, 50)]


def test_expired_sessions_are_swept_from_the_store(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_no_grace(10)
    _, ctx = run(tmp_path, windows, [(f"k{i}", "v", i * 100) for i in range(20)])
    assert ctx.stores["s"].approximate_num_entries() <= 2


def test_session_topology_describes_and_opts_out_of_key_parallel() -> None:
    topology, _ = session_topology(SessionWindows(10), store="sessions")
    description = topology.describe()
    assert "KSTREAM-AGGREGATE-0000000001 (stores: [sessions])" in str(description)
    assert not topology.subtopologies[0].key_parallel
    builder = StreamsBuilder()
    with pytest.raises(TopologyError, match="SessionWindows"):
        builder.stream("in").group_by_key().windowed_by("10s")


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.integers(min_value=0, max_value=200)),
        max_size=30,
    )
)
def test_sessions_are_the_gap_separated_runs_of_timestamps(records: list[tuple[str, int]]) -> None:
    """Whatever the order (no record late), the final sessions of a key are its
    timestamps split where consecutive ones are more than the gap apart."""
    gap = 10
    windows = SessionWindows.of_inactivity_gap_with_grace(gap, 10_000)
    with tempfile.TemporaryDirectory() as tmp:
        rows, _ = run(Path(tmp), windows, [(k, "v", ts) for k, ts in records])
    final: dict[tuple[str, int, int], int] = {}
    for key, start, end, value, _ts in rows:
        if value is None:
            del final[(key, start, end)]
        else:
            final[(key, start, end)] = value
    expected: dict[tuple[str, int, int], int] = {}
    for key in "ab":
        times = sorted(ts for k, ts in records if k == key)
        runs: list[list[int]] = []
        for ts in times:
            if runs and ts - runs[-1][-1] <= gap:
                runs[-1].append(ts)
            else:
                runs.append([ts])
        for r in runs:
            expected[(key, r[0], r[-1])] = len(r)
    assert final == expected
