"""`emit_strategy(EmitStrategy.on_window_close())` on time-windowed aggregations, on real stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.topology import StreamsBuilder, TimeWindows, TopologyError, Windowed, serdes
from runtime.topology.suppressed import EmitStrategy
from runtime.topology.testing import RecordingTaskContext

KEY = serdes.windowed(serdes.STRING, 10)


def topology(windows: TimeWindows) -> Any:
    builder = StreamsBuilder()
    (
        builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .windowed_by(windows)
        .emit_strategy(EmitStrategy.on_window_close())
        .count(store="counts")
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )
    return builder.build()


def feed(ctx: RecordingTaskContext, graph: Any, records: list[tuple[str, int]]) -> list[Any]:
    ctx.clear()
    for key, ts in records:
        ctx.process(graph, "in", key, "v", ts)
    return [
        (KEY.deserialize(s.key), serdes.INT64.deserialize(s.value), s.timestamp)
        for s in ctx.output("out")
    ]


@pytest.mark.parametrize("cache", [0, 1 << 20])
def test_each_window_is_forwarded_once_when_it_closes(tmp_path: Path, cache: int) -> None:
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=cache)
    graph = ctx.instantiate(topology(TimeWindows.of_size_and_grace(10, 5)).subtopologies[0])
    assert feed(ctx, graph, [("a", 1), ("b", 9), ("a", 4), ("a", 14)]) == []
    out = feed(ctx, graph, [("a", 15), ("a", 3), ("b", 40)])
    # [0, 10) closes at 15 (end + grace); the late 3 is dropped; [10, 20) at 25
    assert out == [
        (Windowed("a", 0, 10), 2, 9),
        (Windowed("b", 0, 10), 1, 9),
        (Windowed("a", 10, 20), 2, 19),
    ]
    ctx.commit()
    assert feed(ctx, graph, []) == []  # a commit forwards nothing


def test_restart_neither_repeats_nor_loses(tmp_path: Path) -> None:
    subtopology = topology(TimeWindows.of_size_with_no_grace(10)).subtopologies[0]
    assert "counts-emit-time" in {spec.name for spec in subtopology.store_specs}
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="rocksdb")
    graph = ctx.instantiate(subtopology)
    assert len(feed(ctx, graph, [("a", 1), ("a", 12), ("a", 19)])) == 1  # [0, 10)
    ctx.commit()
    ctx.close()
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="rocksdb")
    graph = ctx.instantiate(subtopology)
    assert feed(ctx, graph, [("a", 30)]) == [(Windowed("a", 10, 20), 2, 19)]  # 12 and 19


def test_emit_strategy_validation_and_on_window_update() -> None:
    builder = StreamsBuilder()
    windowed = builder.stream("in").group_by_key().windowed_by(TimeWindows(10))
    assert windowed.emit_strategy(EmitStrategy.on_window_update()) is windowed
    with pytest.raises(TopologyError, match="EmitStrategy"):
        windowed.emit_strategy("close")
