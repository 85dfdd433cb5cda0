"""Table-table joins and table re-grouping on real stores, with the test driver.

Each expected output is what Kafka Streams' KTableKTable*Join / KTableAggregate
processors forward with caching off (the differential tests compare against
Kafka Streams itself; these pin the rules one update at a time).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.topology import StreamsBuilder, TopologyError, serdes
from runtime.topology.table_grouping import ChangeSerde
from runtime.topology.testing import RecordingTaskContext

S = serdes.STRING


def joiner(left: Any, right: Any) -> str:
    return f"{'null' if left is None else left}+{'null' if right is None else right}"


def _tables(builder: StreamsBuilder) -> tuple[Any, Any]:
    left = builder.table("left", key_serde=S, value_serde=S, store="left-store")
    right = builder.table("right", key_serde=S, value_serde=S, store="right-store")
    return left, right


def _run(tmp_path: Path, build: Any, steps: list[tuple[str, str, str | None]]) -> list[Any]:
    """Feed (topic, key, value) steps one at a time; the decoded output per step."""
    builder = StreamsBuilder()
    build(builder)
    topology = builder.build()
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graphs = [ctx.instantiate(sub) for sub in topology.subtopologies]
    out: list[Any] = []
    try:
        for i, (topic, key, value) in enumerate(steps):
            ctx.clear()
            ctx.process(graphs[0], topic, key, value, timestamp=i)
            for graph in graphs[1:]:
                ctx.pipe(graph, list(ctx.sent))
            out.append(
                [(S.deserialize(s.key), _decode(s.value)) for s in ctx.output("out")] or None
            )
    finally:
        ctx.close()
    return out


def _decode(value: bytes | None) -> Any:
    if value is None:
        return None
    if len(value) == 8 and value[:4] == b"\0\0\0\0":
        return serdes.INT64.deserialize(value)
    return S.deserialize(value)


def _join(kind: str) -> Any:
    def build(builder: StreamsBuilder) -> None:
        left, right = _tables(builder)
        getattr(left, kind)(right, joiner).to_stream().to("out", value_serde=S)

    return build


def test_inner_join_needs_both_rows_and_sends_tombstones_for_removed_ones(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        _join("join"),
        [
            ("left", "a", "1"),  # no right row: nothing
            ("right", "a", "x"),
            ("left", "a", "2"),
            ("right", "a", None),  # the right row goes: tombstone
            ("left", "a", None),  # no right row: nothing
        ],
    )
    assert out == [None, [("a", "1+x")], [("a", "2+x")], [("a", None)], None]


def test_left_join_keeps_left_rows_and_drops_tombstones_for_unknown_rows(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        _join("left_join"),
        [
            ("left", "a", "1"),
            ("right", "a", "x"),
            ("right", "a", None),  # joiner(left, None), not a tombstone
            ("left", "a", None),  # the left row existed: tombstone
            ("left", "a", None),  # it did not: nothing
            ("right", "b", "y"),  # no left row: nothing
        ],
    )
    assert out == [
        [("a", "1+null")],
        [("a", "1+x")],
        [("a", "1+null")],
        [("a", None)],
        None,
        None,
    ]


def test_outer_join_keeps_rows_of_either_side(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        _join("outer_join"),
        [
            ("right", "b", "y"),
            ("left", "b", "1"),
            ("right", "b", None),
            ("left", "b", None),
            ("right", "b", None),  # nothing was there: nothing
        ],
    )
    assert out == [[("b", "null+y")], [("b", "1+y")], [("b", "1+null")], [("b", None)], None]


def test_left_join_of_a_filtered_table_sends_no_tombstone_for_rows_that_never_passed(
    tmp_path: Path,
) -> None:
    def build(builder: StreamsBuilder) -> None:
        left, right = _tables(builder)
        left.filter(lambda k, v: v.startswith("y")).left_join(right, joiner).to_stream().to(
            "out", value_serde=S
        )

    out = _run(
        tmp_path,
        build,
        [("left", "a", "no"), ("left", "a", "yes"), ("left", "a", "no"), ("left", "a", "nope")],
    )
    assert out == [None, [("a", "yes+null")], [("a", None)], None]


def test_materialized_join_is_change_logged_and_can_be_joined_again(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    left, right = _tables(builder)
    third = builder.table("third", key_serde=S, value_serde=S, store="third-store")
    joined = left.join(right, joiner, store="joined", value_serde=S)
    joined.left_join(third, joiner).to_stream().to("out", value_serde=S)
    topology = builder.build()
    description = str(topology.describe())
    for name in ("KTABLE-JOINTHIS-", "KTABLE-JOINOTHER-", "KTABLE-MERGE-"):
        assert name in description
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    (graph,) = [ctx.instantiate(sub) for sub in topology.subtopologies]
    try:
        ctx.process(graph, "left", "a", "1", timestamp=1)
        ctx.process(graph, "right", "a", "x", timestamp=2)
        ctx.process(graph, "third", "a", "t", timestamp=3)
        assert [(S.deserialize(s.key), S.deserialize(s.value)) for s in ctx.output("out")] == [
            ("a", "1+x+null"),
            ("a", "1+x+t"),
        ]
        assert [S.deserialize(s.value) for s in ctx.changelog("joined")] == ["1+x"]
    finally:
        ctx.close()


def test_join_rejects_streams_and_windowed_tables() -> None:
    builder = StreamsBuilder()
    left, _right = _tables(builder)
    stream = builder.stream("s", key_serde=S, value_serde=S)
    with pytest.raises(TopologyError, match="joins two KTables"):
        left.join(stream, joiner)  # type: ignore[arg-type]
    windowed = stream.group_by_key().windowed_by(_windows()).count()
    with pytest.raises(TopologyError, match="windowed"):
        left.join(windowed, joiner)
    with pytest.raises(TopologyError, match="windowed"):
        windowed.group_by(lambda k, v: (k, v))


def _windows() -> Any:
    from runtime.topology.windows import TimeWindows

    return TimeWindows.of_size_with_no_grace(1000)


def _regroup_count(builder: StreamsBuilder) -> None:
    users = builder.table("left", key_serde=S, value_serde=S, store="users")
    (
        users.group_by(lambda user, region: (region, user), key_serde=S, value_serde=S)
        .count()
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )


def test_group_by_count_moves_rows_between_groups(tmp_path: Path) -> None:
    out = _run(
        tmp_path,
        _regroup_count,
        [
            ("left", "u1", "eu"),
            ("left", "u2", "eu"),
            ("left", "u1", "us"),  # leaves eu first, then joins us
            ("left", "u2", None),
            ("left", "u1", "us"),  # same group: one record with both (KIP-904)
            ("left", "u3", None),  # nothing there: nothing
        ],
    )
    assert out == [
        [("eu", 1)],
        [("eu", 2)],
        [("eu", 1), ("us", 1)],
        [("eu", 0)],
        [("us", 1)],
        None,
    ]


def test_group_by_reduce_and_aggregate(tmp_path: Path) -> None:
    def build(builder: StreamsBuilder) -> None:
        table = builder.table("left", key_serde=S, value_serde=S, store="t")
        grouped = table.group_by(lambda k, v: (v[0], v), key_serde=S, value_serde=S)
        (
            grouped.reduce(lambda agg, v: agg + "," + v, lambda agg, v: agg.replace(v, "-"))
            .to_stream()
            .to("out", value_serde=S)
        )

    out = _run(tmp_path, build, [("left", "k1", "a1"), ("left", "k2", "a2"), ("left", "k1", "b1")])
    assert out == [[("a", "a1")], [("a", "a1,a2")], [("a", "-,a2"), ("b", "b1")]]

    def build_sum(builder: StreamsBuilder) -> None:
        table = builder.table("left", key_serde=S, value_serde=S, store="t")
        (
            table.group_by(lambda k, v: ("all", v), key_serde=S, value_serde=S, name="sums")
            .aggregate(
                lambda: 0,
                lambda k, v, agg: agg + len(v),
                lambda k, v, agg: agg - len(v),
                value_serde=serdes.INT64,
            )
            .to_stream()
            .to("out", value_serde=serdes.INT64)
        )

    out = _run(tmp_path / "sum", build_sum, [("left", "k1", "abc"), ("left", "k1", "a")])
    assert out == [[("all", 3)], [("all", 1)]]


def test_group_by_topology_names_and_repartition_topic() -> None:
    builder = StreamsBuilder()
    _regroup_count(builder)
    topology = builder.build()
    description = str(topology.describe())
    assert "KTABLE-SELECT-" in description
    assert "KTABLE-AGGREGATE-" in description
    assert "KTABLE-AGGREGATE-STATE-STORE-0000000003-repartition" in description


def test_change_serde_round_trips_pairs() -> None:
    serde = ChangeSerde(S)
    for pair in [("new", "old"), ("new", None), (None, "old"), ("", "")]:
        assert serde.deserialize(serde.serialize(pair)) == pair
    assert serde.serialize(None) is None


# -- foreign-key joins ------------------------------------------------------------


def _fk_run(tmp_path: Path, left: bool, steps: list[tuple[str, str, str | None]]) -> list[Any]:
    """Orders ("customer/item") joined with customers by the order's customer."""
    builder = StreamsBuilder()
    orders = builder.table("orders", key_serde=S, value_serde=S, store="orders")
    customers = builder.table("customers", key_serde=S, value_serde=S, store="customers")
    join = orders.left_join if left else orders.join
    join(customers, lambda order: order.split("/")[0], joiner, value_serde=S).to_stream().to(
        "out", value_serde=S
    )
    topology = builder.build()
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graphs = [ctx.instantiate(sub) for sub in topology.subtopologies]
    out: list[Any] = []
    try:
        for i, (topic, key, value) in enumerate(steps):
            ctx.clear()
            (graph,) = [g for g in graphs if topic in g.sources]
            ctx.process(graph, topic, key, value, timestamp=i)
            done = 0
            while done < len(ctx.sent):  # carry the internal topics until quiet
                pending = ctx.sent[done:]
                done = len(ctx.sent)
                for g in graphs:
                    ctx.pipe(g, pending)
            out.append([(S.deserialize(s.key), _decode(s.value)) for s in ctx.output("out")])
    finally:
        ctx.close()
    return out


FK_STEPS: list[tuple[str, str, str | None]] = [
    ("orders", "o1", "c1/apple"),  # no customer c1 yet
    ("customers", "c1", "Ann"),
    ("orders", "o1", "c1/pear"),
    ("orders", "o1", "c2/pear"),  # moves to a missing customer: retracted
    ("customers", "c2", "Bob"),
    ("customers", "c1", "Anna"),  # o1 no longer subscribes to c1
    ("customers", "c2", None),
    ("orders", "o1", None),
]


def test_foreign_key_inner_join(tmp_path: Path) -> None:
    assert _fk_run(tmp_path, False, FK_STEPS) == [
        [],
        [("o1", "c1/apple+Ann")],
        [("o1", "c1/pear+Ann")],
        [("o1", None)],
        [("o1", "c2/pear+Bob")],
        [],
        [("o1", None)],
        [("o1", None)],
    ]


def test_foreign_key_left_join(tmp_path: Path) -> None:
    assert _fk_run(tmp_path, True, FK_STEPS) == [
        [("o1", "c1/apple+null")],
        [("o1", "c1/apple+Ann")],
        [("o1", "c1/pear+Ann")],
        # The unsubscription from c1 is silent: only c2 answers.
        [("o1", "c2/pear+null")],
        [("o1", "c2/pear+Bob")],
        [],
        [("o1", "c2/pear+null")],
        # Deleted: one tombstone, the unsubscription's answer.
        [("o1", None)],
    ]


def test_foreign_key_join_topology_names() -> None:
    builder = StreamsBuilder()
    orders = builder.table("orders", key_serde=S, value_serde=S)
    customers = builder.table("customers", key_serde=S, value_serde=S)
    orders.join(customers, lambda order: order, joiner)
    description = str(builder.build().describe())
    for name in (
        "KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-",
        "KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-",
        "KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-RESOLVER-PROCESSOR-",
        "KTABLE-FK-JOIN-OUTPUT-",
        "-topic",
    ):
        assert name in description
