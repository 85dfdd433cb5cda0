"""Windowed stream-stream joins on real stores, through the test driver.

The left stream is the records whose value starts with "L", the right one
those starting with "R", both from topic "in" (one task, as the differential
tests run them): the order the join sees is the order given here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.topology import JoinWindows, StreamsBuilder, TopologyError, serdes
from runtime.topology.stream_joins import decode_values, encode_values, outer_key, split_outer_key
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.topology import Topology

WINDOWS = JoinWindows.of_time_difference_and_grace(10, 5)


def joiner(left: Any, right: Any) -> str:
    return f"{left}+{right}"


def topology(kind: str, windows: JoinWindows = WINDOWS) -> Topology:
    builder = StreamsBuilder()
    source = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    left = source.filter(lambda k, v: v is not None and v.startswith("L"))
    right = source.filter(lambda k, v: v is not None and v.startswith("R"))
    if kind == "join":
        joined = left.join(right, joiner, windows=windows)
    elif kind == "left":
        joined = left.left_join(right, joiner, windows=windows)
    else:
        joined = left.outer_join(right, joiner, windows)
    joined.to("out", value_serde=serdes.STRING)
    return builder.build()


def run(
    tmp_path: Path, kind: str, records: list[tuple[str | None, str, int]], **kw: Any
) -> tuple[RecordingTaskContext, list[tuple[str | None, str, int]]]:
    ctx = RecordingTaskContext(state_dir=tmp_path, cache_max_bytes=0)
    graph = ctx.instantiate(topology(kind, **kw).subtopologies[0])
    for key, value, ts in records:
        ctx.process(graph, "in", key, value, ts)
    out = [
        (
            None if s.key is None else s.key.decode(),
            serdes.STRING.deserialize(s.value),
            s.timestamp,
        )
        for s in ctx.output("out")
    ]
    return ctx, out


def test_inner_join_pairs_records_within_the_time_difference(tmp_path: Path) -> None:
    _, out = run(
        tmp_path,
        "join",
        [("a", "L1", 100), ("a", "R1", 105), ("a", "R2", 111), ("a", "L2", 95), ("b", "R3", 100)],
    )
    # R1 meets L1 (5 apart); R2 is 11 after L1 (too far); L2 meets R1 (10) but not R2 (16).
    assert out == [("a", "L1+R1", 105), ("a", "L2+R1", 105)]


def test_duplicates_at_one_timestamp_all_join(tmp_path: Path) -> None:
    _, out = run(tmp_path, "join", [("a", "L1", 100), ("a", "L2", 100), ("a", "R1", 100)])
    assert out == [("a", "L1+R1", 100), ("a", "L2+R1", 100)]


def test_left_join_holds_an_unmatched_record_until_its_window_closes(tmp_path: Path) -> None:
    records = [("a", "L1", 100), ("b", "L2", 100), ("b", "R1", 108), ("c", "R9", 115)]
    _, out = run(tmp_path, "left", records)
    # L2 found R1; L1 is pending: its window closes after 100 + 10 + 5 = 115.
    assert out == [("b", "L2+R1", 108)]
    _, out = run(tmp_path / "later", "left", [*records, ("c", "R9", 116)])
    assert out == [("b", "L2+R1", 108), ("a", "L1+None", 100)]


def test_left_join_emits_a_late_unmatched_record_at_once(tmp_path: Path) -> None:
    # Stream time 200: L1 at 100 reaches only to 110, so nothing can join it any more.
    _, out = run(tmp_path, "left", [("x", "R1", 200), ("a", "L1", 100)])
    assert out == [("a", "L1+None", 100)]


def test_outer_join_emits_both_sides_unmatched_in_timestamp_order(tmp_path: Path) -> None:
    records = [("a", "R1", 100), ("b", "L1", 101), ("z", "L9", 200), ("z", "R9", 200)]
    _, out = run(tmp_path, "outer", records)
    assert out == [("a", "None+R1", 100), ("b", "L1+None", 101), ("z", "L9+R9", 200)]


def test_a_right_record_is_not_emitted_by_a_left_join(tmp_path: Path) -> None:
    _, out = run(tmp_path, "left", [("a", "R1", 100), ("z", "L9", 300)])
    assert out == []  # L9 is pending until stream time passes 315


def test_null_keys_and_values(tmp_path: Path) -> None:
    ctx, out = run(tmp_path, "left", [(None, "L1", 100), ("a", "L2", 100), (None, "R1", 100)])
    # A left record without a key cannot join: emitted at once (KIP-962); a right one is dropped.
    assert out == [(None, "L1+None", 100)]
    assert ctx.dropped == {"null_key": 1}
    ctx, out = run(tmp_path / "inner", "join", [(None, "L1", 100)])
    assert out == [] and ctx.dropped == {"null_key": 1}


def test_records_beyond_retention_do_not_join(tmp_path: Path) -> None:
    # The right store keeps 10 + 10 + 5 = 25 ms behind its latest record.
    _, out = run(tmp_path, "join", [("a", "R1", 100), ("a", "R2", 130), ("a", "L1", 95)])
    assert out == []


def test_join_stores_are_change_logged_and_not_cached(tmp_path: Path) -> None:
    specs = {s.name: s for s in topology("outer").subtopologies[0].store_specs}
    assert sorted(specs) == [
        "KSTREAM-OUTEROTHER-0000000006-store",
        "KSTREAM-OUTERSHARED-0000000005-store",
        "KSTREAM-OUTERTHIS-0000000005-store",
    ]
    assert all(s.changelog and not s.caching for s in specs.values())
    assert specs["KSTREAM-OUTERTHIS-0000000005-store"].retention_ms == 25
    ctx, _ = run(tmp_path, "outer", [("a", "L1", 100)])
    ctx.commit()
    assert len(ctx.changelog("KSTREAM-OUTERTHIS-0000000005-store")) == 1
    assert len(ctx.changelog("KSTREAM-OUTERSHARED-0000000005-store")) == 1


def test_joins_opt_out_of_key_parallel_and_show_in_the_description() -> None:
    t = topology("left")
    assert not t.subtopologies[0].key_parallel
    text = t.describe()
    # A left join: the right side is the outer one (Kafka Streams names it so).
    for name in ("KSTREAM-WINDOWED-", "KSTREAM-JOINTHIS-", "KSTREAM-OUTEROTHER-", "KSTREAM-MERGE-"):
        assert name in text
    assert "KSTREAM-OUTERSHARED-" in text
    inner = topology("join")
    assert "OUTERSHARED" not in inner.describe()


def test_join_windows_factories_and_validation() -> None:
    w = JoinWindows.of_time_difference_with_no_grace(7)
    assert (w.before_ms, w.after_ms, w.grace_ms, w.size_ms) == (7, 7, 0, 14)
    assert JoinWindows.of_time_difference(7) == w
    assert w.before(2).after(3) == JoinWindows(2, 3, 0)
    with pytest.raises(ValueError, match="difference"):
        JoinWindows.of_time_difference_and_grace(-1, 0)
    with pytest.raises(ValueError, match="grace"):
        JoinWindows(1, 1, -1)


def test_join_of_two_streams_needs_windows() -> None:
    builder = StreamsBuilder()
    a, b = builder.stream("a"), builder.stream("b")
    with pytest.raises(TopologyError, match="JoinWindows"):
        a.join(b, joiner)
    with pytest.raises(TopologyError, match="stream-table"):
        a.join(builder.table("t"), joiner, windows=WINDOWS)


def test_value_and_key_encodings_round_trip() -> None:
    assert decode_values(encode_values([b"", b"ab", b"c"])) == [b"", b"ab", b"c"]
    assert split_outer_key(outer_key(5, True, b"k")) == (5, True, b"k")
    assert outer_key(5, False, b"k") < outer_key(5, True, b"a") < outer_key(6, False, b"a")
