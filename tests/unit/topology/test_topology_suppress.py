"""`KTable.suppress`: final window results, time limits, buffer bounds and restarts, on real stores."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.topology import StreamsBuilder, TimeWindows, TopologyError, Windowed, serdes
from runtime.topology.session_store import session_windowed
from runtime.topology.session_windows import SessionWindows
from runtime.topology.suppress import SuppressionBufferFull
from runtime.topology.suppressed import BufferConfig, Suppressed
from runtime.topology.testing import RecordingTaskContext


def _source(builder: StreamsBuilder) -> Any:
    return builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)


def _run(
    topology: Any, tmp_path: Path, records: list[tuple[str, int]], kind: str = "memory"
) -> RecordingTaskContext:
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind=kind, cache_max_bytes=0)
    graph = ctx.instantiate(topology.subtopologies[0])
    for key, ts in records:
        ctx.process(graph, "in", key, "v", ts)
    return ctx


def test_buffer_config_and_suppressed_validation() -> None:
    assert BufferConfig.unbounded().strict
    bounded = BufferConfig.max_records(3).with_max_bytes(100)
    assert (bounded.records_limit, bounded.bytes_limit, bounded.when_full) == (3, 100, "emit")
    assert bounded.shut_down_when_full().strict
    with pytest.raises(ValueError, match="strict"):
        Suppressed.until_window_closes(BufferConfig.max_records(3))
    with pytest.raises(ValueError, match="records"):
        BufferConfig.max_records(-1)
    with pytest.raises(TopologyError, match="windowed table"):
        _source(StreamsBuilder()).group_by_key().count().suppress(
            Suppressed.until_window_closes(BufferConfig.unbounded())
        )


def test_tumbling_window_final_results_once_grace_passes(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        _source(builder)
        .group_by_key()
        .windowed_by(TimeWindows.of_size_and_grace(10, 5))
        .count()
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )
    topology = builder.build()
    # Kafka Streams' names and numbering
    described = str(topology.describe())
    assert "KTABLE-SUPPRESS-0000000003 (stores: [KTABLE-SUPPRESS-STATE-STORE-0000000004])" in (
        described
    )
    ctx = _run(topology, tmp_path, [("a", 1), ("a", 4), ("b", 9), ("a", 14), ("a", 3), ("a", 15)])
    key = serdes.windowed(serdes.STRING, 10)
    out = [(key.deserialize(s.key), serdes.INT64.deserialize(s.value)) for s in ctx.output("out")]
    # [0, 10) closes at stream time 15 (end + grace): a=3 (the late 3 still counted), b=1
    assert out == [(Windowed("a", 0, 10), 3), (Windowed("b", 0, 10), 1)]
    assert len(ctx.changelog("KTABLE-SUPPRESS-STATE-STORE-0000000004")) > 0


def test_session_final_results_drop_retractions(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        _source(builder)
        .group_by_key()
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(10, 2))
        .count()
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )
    ctx = _run(builder.build(), tmp_path, [("a", 0), ("a", 20), ("a", 10), ("a", 40), ("a", 60)])
    key = session_windowed(serdes.STRING)
    out = [
        (key.deserialize(s.key), serdes.INT64.deserialize(s.value), s.timestamp)
        for s in ctx.output("out")
    ]
    # [0, 0] closes at 0 + 10 + 2 = 12: final at 20, and no longer visible to 10
    # (it ended more than gap + grace before 20, as in Kafka Streams' store), which
    # merges with [20, 20] only; [10, 20] closes at 32 (emitted at 40), [40, 40] at
    # 52 (emitted at 60). The retraction of [20, 20] is dropped.
    assert out == [
        (Windowed("a", 0, 0), 1, 0),
        (Windowed("a", 10, 20), 2, 20),
        (Windowed("a", 40, 40), 1, 40),
    ]


def _time_limited(limit: int, buffer: BufferConfig) -> Any:
    builder = StreamsBuilder()
    (
        _source(builder)
        .to_table()
        .suppress(Suppressed.until_time_limit(limit, buffer).with_name("hold"))
        .to_stream()
        .to("out")
    )
    return builder.build()


def test_time_limit_keeps_the_first_place_and_the_latest_value(tmp_path: Path) -> None:
    topology = _time_limited(10, BufferConfig.unbounded())
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory")
    graph = ctx.instantiate(topology.subtopologies[0])
    for key, value, ts in (("a", "1", 0), ("b", "1", 3), ("a", "2", 8), ("b", None, 9)):
        ctx.process(graph, "in", key, value, ts)
    assert ctx.output("out") == []
    ctx.process(graph, "in", "c", "1", 13)  # a (buffered at 0) and b (at 3) are due
    out = [(s.key, s.value, s.timestamp) for s in ctx.output("out")]
    assert out == [(b"a", b"2", 8), (b"b", None, 9)]  # time-limited: tombstones go out


def test_bounded_buffer_emits_early_or_shuts_down(tmp_path: Path) -> None:
    records = [("a", 0), ("b", 1), ("c", 2)]
    ctx = _run(_time_limited(1000, BufferConfig.max_records(2)), tmp_path / "e", records)
    assert [s.key for s in ctx.output("out")] == [b"a"]  # the oldest, early
    strict = BufferConfig.max_records(2).shut_down_when_full()
    with pytest.raises(SuppressionBufferFull, match="hold.*3/2 records"):
        _run(_time_limited(1000, strict), tmp_path / "s", records)


def test_buffer_is_restored_after_a_restart(tmp_path: Path) -> None:
    topology = _time_limited(10, BufferConfig.unbounded())
    ctx = _run(topology, tmp_path, [("a", 0), ("b", 5)], kind="rocksdb")
    ctx.commit()
    ctx.close()
    ctx2 = _run(topology, tmp_path, [("c", 12)], kind="rocksdb")
    assert [s.key for s in ctx2.output("out")] == [b"a"]


@settings(max_examples=50, deadline=None)
@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(0, 50)), max_size=25),
    st.integers(1, 4),
)
def test_buffer_never_holds_more_than_its_bound(records: list[tuple[str, int]], bound: int) -> None:
    """Emit-early: after every record the buffer holds at most `bound` keys,
    and every key's latest value comes out exactly once per buffering."""
    topology = _time_limited(1000, BufferConfig.max_records(bound))
    with tempfile.TemporaryDirectory() as tmp:
        ctx = RecordingTaskContext(state_dir=Path(tmp), store_kind="memory")
        graph = ctx.instantiate(topology.subtopologies[0])
        for key, ts in records:
            ctx.process(graph, "in", key, "v", ts)
            assert ctx.stores["hold-store"].approximate_num_entries() <= bound
        held = {k for k, _ts in records} - {s.key.decode() for s in ctx.output("out")}
        # what was not emitted is still buffered: nothing lost
        assert ctx.stores["hold-store"].approximate_num_entries() >= 0
        buffered = {k[8:].decode() for k, _v in ctx.stores["hold-store"].all()}
        assert held <= buffered
