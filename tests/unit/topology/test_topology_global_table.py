"""Global tables in the DSL: `builder.global_table`, stream-global table joins
(Kafka Streams 4.3's rules), the topology description, and the refusals."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import GlobalKTable, StreamsBuilder, TopologyError, serdes
from runtime.state.global_store import global_directory, open_rocksdb_global_store
from runtime.topology.named_queries import QueryError, compose
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.topology import Topology

STR = serdes.STRING


def _mapper(key: Any, value: Any) -> Any:
    """`<letter><id>` -> the table key `t<id>`; id 0 maps to None."""
    if value is None:
        return None
    return None if value[1:] == "0" else f"t{value[1:]}"


def _topology(left: bool) -> tuple[Topology, GlobalKTable]:
    builder = StreamsBuilder()
    table = builder.global_table("tbl", key_serde=STR, value_serde=STR)
    stream = builder.stream("in", key_serde=STR, value_serde=STR)
    join = stream.left_join if left else stream.join
    join(table, _mapper, lambda v, t: f"{v}/{t}").to("out", value_serde=STR)
    return builder.build(), table


def _run(left: bool, records: list[tuple[Any, Any]]) -> list[tuple[bytes | None, bytes | None]]:
    topology, _ = _topology(left)
    ctx = RecordingTaskContext(default_key_serde=STR, default_value_serde=STR)
    ctx.load_global(topology, "tbl", "t1", "one")
    ctx.load_global(topology, "tbl", "t2", "two")
    ctx.load_global(topology, "tbl", "t2", None)  # a tombstone deletes
    graph = ctx.instantiate(topology.subtopologies[0])
    for key, value in records:
        ctx.process(graph, "in", key, value)
    return [(s.key, s.value) for s in ctx.output("out")]


RECORDS = [("a", "x1"), ("b", "x2"), ("c", "x0"), (None, "x1"), ("d", None)]


def test_inner_join_emits_only_hits_and_drops_null_mapped_keys_and_values() -> None:
    assert _run(False, RECORDS) == [(b"a", b"x1/one"), (None, b"x1/one")]


def test_left_join_emits_misses_and_null_mapped_keys_with_none() -> None:
    assert _run(True, RECORDS) == [
        (b"a", b"x1/one"),
        (b"b", b"x2/None"),
        (b"c", b"x0/None"),
        (None, b"x1/one"),
    ]


def test_a_later_table_update_is_seen_by_later_records() -> None:
    topology, _ = _topology(False)
    ctx = RecordingTaskContext(default_key_serde=STR, default_value_serde=STR)
    ctx.load_global(topology, "tbl", "t1", "one")
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", "a", "x1")
    ctx.load_global(topology, "tbl", "t1", "uno")
    ctx.process(graph, "in", "a", "x1")
    assert [s.value for s in ctx.output("out")] == [b"x1/one", b"x1/uno"]


def test_a_changed_key_needs_no_repartition_and_the_description_shows_the_global_store() -> None:
    builder = StreamsBuilder()
    table = builder.global_table("tbl")
    stream = builder.stream("in").map(lambda k, v: (v, k))
    stream.join(table, lambda k, v: k, lambda v, t: t, "enrich").to("out")
    topology = builder.build()
    assert topology.internal_topics() == []
    assert [g.store for g in topology.global_stores] == [table.store_name]
    assert table.store_name == "tbl-STATE-STORE-0000000000"
    text = topology.describe()
    assert "Sub-topology: 1 for global store (will not generate tasks)" in text
    assert "Source: KSTREAM-SOURCE-0000000001 (topics: [tbl])" in text
    assert "Processor: KTABLE-SOURCE-0000000002 (stores: [tbl-STATE-STORE-0000000000])" in text
    assert "Processor: enrich (stores: [])" in text


def test_refusals_name_the_mistake() -> None:
    builder = StreamsBuilder()
    table = builder.global_table("tbl", store="shared")
    with pytest.raises(TopologyError, match="already read"):
        builder.stream("tbl")
    with pytest.raises(TopologyError, match="state store named 'shared'"):
        builder.global_table("other", store="shared")
    stream = builder.stream("in")
    with pytest.raises(TopologyError, match="key_mapper"):
        stream.join(table, "not callable", lambda v, t: v)
    with pytest.raises(TopologyError, match="serdes, windows and stores are not used"):
        stream.left_join(table, lambda k, v: k, lambda v, t: v, None, STR)
    other = StreamsBuilder()
    with pytest.raises(TopologyError, match="one StreamsBuilder"):
        other.stream("x").join(table, lambda k, v: k, lambda v, t: v)
    stream.join(table, lambda k, v: k, lambda v, t: v).to("out")
    with pytest.raises(QueryError, match="global tables"):
        compose({"q": builder.build()})


def test_rocksdb_global_store_applies_batches_and_keeps_them(tmp_path: Path) -> None:
    directory = global_directory(tmp_path, "app", 0)
    assert global_directory(tmp_path, "app", 2).name == "global-p2"
    store = open_rocksdb_global_store("s", "tbl", directory, None)
    assert store.created
    assert store.apply([(b"a", b"1"), (b"b", b"2"), (b"a", None)]) == 3
    store.sync()
    store.close()
    again = open_rocksdb_global_store("s", "tbl", directory, None)
    assert not again.created
    assert list(again.all()) == [(b"b", b"2")]
    again.close()
