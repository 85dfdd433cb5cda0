"""The session store's cache: updates fold per commit, as Kafka Streams' CachingSessionStore.

Caching on (the default budget of `RecordingTaskContext`): output appears at
`commit`; a session created and merged away within one commit never goes out;
expiry sweeps are silent; the final table and changelog state equal those of
caching off (hypothesis).
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.topology import StreamsBuilder, Windowed, serdes
from runtime.topology.session_store import session_windowed
from runtime.topology.session_windows import SessionWindows
from runtime.topology.testing import RecordingTaskContext

SESSION = session_windowed(serdes.STRING)
CHANGELOG = "app-s-changelog"


def _context(tmp_path: Path, windows: SessionWindows, cache: int) -> tuple[Any, Any]:
    builder = StreamsBuilder()
    stream = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    table = stream.group_by_key().windowed_by(windows).count(store="s")
    table.to_stream().to("out", value_serde=serdes.INT64)
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=cache)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    return ctx, graph


def _rows(ctx: Any) -> list[tuple[Any, int, int, Any, int]]:
    rows = []
    for s in ctx.output("out"):
        w = SESSION.deserialize(s.key)
        value = None if s.value is None else serdes.INT64.deserialize(s.value)
        rows.append((w.key, w.start, w.end, value, s.timestamp))
    return rows


def _changelog(ctx: Any) -> list[tuple[bytes, bytes | None]]:
    return [(s.key, s.value) for s in ctx.sent if s.topic == CHANGELOG]


GAP10 = SessionWindows.of_inactivity_gap_with_grace(10, 100)


def test_one_commit_folds_a_sessions_updates(tmp_path: Path) -> None:
    ctx, graph = _context(tmp_path, GAP10, 1 << 20)
    for ts in (1, 2, 3):
        ctx.process(graph, "in", "a", "v", ts)
    assert _rows(ctx) == [] and _changelog(ctx) == []
    ctx.commit()
    assert _rows(ctx) == [("a", 1, 3, 3, 3)]
    # (1,1) and (1,2) were merged away before reaching the store: no tombstones.
    assert [SESSION.deserialize(k) for k, _v in _changelog(ctx)] == [Windowed("a", 1, 3)]


def test_a_merge_within_one_commit_gives_no_tombstone(tmp_path: Path) -> None:
    ctx, graph = _context(tmp_path, GAP10, 1 << 20)
    ctx.process(graph, "in", "a", "v", 0)
    ctx.process(graph, "in", "a", "v", 5)  # merges (0,0), which never left the cache
    ctx.commit()
    assert _rows(ctx) == [("a", 0, 5, 2, 5)]
    assert [v is None for _k, v in _changelog(ctx)] == [False]
    # A session already flushed and then merged is retracted at the next commit.
    ctx.process(graph, "in", "a", "v", 12)
    ctx.commit()
    assert _rows(ctx)[1:] == [("a", 0, 5, None, 5), ("a", 0, 12, 3, 12)]


def test_an_eviction_emits_before_the_commit(tmp_path: Path) -> None:
    ctx, graph = _context(tmp_path, GAP10, 1)  # every write exceeds the budget
    ctx.process(graph, "in", "a", "v", 0)
    ctx.process(graph, "in", "b", "v", 0)
    assert _rows(ctx) == [("a", 0, 0, 1, 0), ("b", 0, 0, 1, 0)]


def test_a_sweep_of_expired_sessions_is_silent(tmp_path: Path) -> None:
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 0)
    ctx, graph = _context(tmp_path, windows, 1 << 20)
    ctx.process(graph, "in", "a", "v", 0)
    ctx.commit()
    ctx.process(graph, "in", "b", "v", 1000)  # a's session (0,0) is past the retention
    ctx.commit()
    assert _rows(ctx) == [("a", 0, 0, 1, 0), ("b", 1000, 1000, 1, 1000)]
    keys = [SESSION.deserialize(k).key for k, _v in ctx.stores["s"].all()]
    assert keys == ["b"]
    # The changelog still deletes it (compaction), though nothing goes downstream.
    assert (SESSION.serialize(Windowed("a", 0, 0)), None) in _changelog(ctx)


def _replay(
    rows: list[tuple[Any, int, int, Any, int]],
) -> dict[tuple[Any, int, int], Any]:
    table: dict[tuple[Any, int, int], Any] = {}
    for key, start, end, value, _ts in rows:
        if value is None:
            table.pop((key, start, end), None)
        else:
            table[(key, start, end)] = value
    return table


def _compacted(log: list[tuple[bytes, bytes | None]]) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for key, value in log:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from("ab"), st.integers(0, 120), st.booleans()),
        min_size=1,
        max_size=40,
    ),
    st.sampled_from([1 << 20, 300]),
)
def test_cached_output_reaches_the_uncached_final_state(
    records: list[tuple[str, int, bool]], cache: int
) -> None:
    """Whatever the commits and evictions, the table and changelog end where
    caching off ends them (grace small enough for late drops and sweeps)."""
    windows = SessionWindows.of_inactivity_gap_with_grace(10, 15)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for budget in (0, cache):
            ctx, graph = _context(Path(tmp) / str(budget), windows, budget)
            for key, ts, commit in records:
                ctx.process(graph, "in", key, "v", ts)
                if commit:
                    ctx.commit()
            ctx.commit()
            rows = _rows(ctx)
            assert all(ts == end for _k, _s, end, _v, ts in rows)  # stamped with the end
            store = dict(ctx.stores["s"].all())
            results.append((_replay(rows), _compacted(_changelog(ctx)), store))
    (table0, log0, store0), (table1, log1, store1) = results
    assert store1 == store0
    assert log1 == log0
    # The table keeps swept sessions (no tombstones for them, in both modes).
    assert table1 == table0
