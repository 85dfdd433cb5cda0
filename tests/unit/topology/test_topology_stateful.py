"""The stateful DSL on real stores: grouping, count/reduce/aggregate, KTable, specs."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.state.builders import StoreSpec
from runtime.topology import (
    KTable,
    Processor,
    ProcessorContext,
    Record,
    StreamsBuilder,
    TopicSpec,
    Topology,
    TopologyError,
    serdes,
)
from runtime.topology.testing import RecordingTaskContext, Sent


def word_count() -> Topology:
    """ARCHITECTURE.md's example, exactly as written there."""
    builder = StreamsBuilder()
    (
        builder.stream("text-lines", key_serde=serdes.STRING, value_serde=serdes.STRING)
        .flat_map_values(lambda line: line.lower().split())
        .group_by(lambda key, word: word, key_serde=serdes.STRING)
        .count(store="word-counts")
        .to_stream()
        .to("word-counts", value_serde=serdes.INT64)
    )
    return builder.build()


def decoded(
    sent: list[Sent], key_serde: Any = serdes.STRING, value_serde: Any = serdes.INT64
) -> list[tuple[Any, Any]]:
    return [(key_serde.deserialize(s.key), value_serde.deserialize(s.value)) for s in sent]


def ctx_for(tmp_path: Path, **options: Any) -> RecordingTaskContext:
    options.setdefault("store_kind", "memory")
    return RecordingTaskContext(application_id="wordcount", state_dir=tmp_path, **options)


# -- word count ---------------------------------------------------------------


def test_word_count_through_the_repartition_topic(tmp_path: Path) -> None:
    topology = word_count()
    first, second = topology.subtopologies
    assert first.sinks == [TopicSpec("word-counts-repartition", internal=True)]
    assert second.sources == [TopicSpec("word-counts-repartition", internal=True)]
    assert first.store_specs == []
    assert second.store_specs == [StoreSpec("word-counts")]

    # Subtopology 0 with the configured default serdes (BYTES), as in the example.
    upstream = RecordingTaskContext(application_id="wordcount")
    graph0 = upstream.instantiate(first)
    upstream.process(graph0, "text-lines", None, "To be or not to be", 10)
    upstream.process(graph0, "text-lines", "k", "to BE", 11)
    repartitioned = upstream.output("wordcount-word-counts-repartition")
    assert [s.key for s in repartitioned] == [b"to", b"be", b"or", b"not", b"to", b"be"] + [
        b"to",
        b"be",
    ]
    assert {s.value for s in repartitioned} == {b""}  # count needs no values

    downstream = ctx_for(tmp_path)
    graph1 = downstream.instantiate(second)
    assert downstream.pipe(graph1, upstream.sent) == 8
    assert downstream.output("word-counts") == []  # cached until the commit
    downstream.commit()
    counts = decoded(downstream.output("word-counts"))
    assert counts == [("or", 1), ("not", 1), ("to", 3), ("be", 3)]  # order of last write
    assert [s.timestamp for s in downstream.output("word-counts")] == [10, 10, 11, 11]
    changelog = decoded(downstream.changelog("word-counts"))
    assert sorted(changelog) == sorted(counts)
    assert {s.partition for s in downstream.changelog("word-counts")} == {0}

    # The next commit sends only what changed, with the running counts.
    downstream.clear()
    upstream.clear()
    upstream.process(graph0, "text-lines", None, "be quick", 12)
    downstream.pipe(graph1, upstream.sent)
    downstream.commit()
    assert decoded(downstream.output("word-counts")) == [("be", 4), ("quick", 1)]
    downstream.close()


def test_word_count_on_rocksdb_survives_a_restart(tmp_path: Path) -> None:
    topology = word_count()
    sub = topology.subtopologies[1]
    for round_, expected in ((1, 2), (2, 4)):
        ctx = RecordingTaskContext(application_id="wordcount", state_dir=tmp_path)
        graph = ctx.instantiate(sub)
        assert type(ctx.layered["word-counts"].base).__name__ == "RocksDBKeyValueStore"
        for ts in range(2):
            ctx.process(graph, "word-counts-repartition", "hello", "x", round_ * 10 + ts)
        ctx.commit()
        assert decoded(ctx.output("word-counts")) == [("hello", expected)]
        graph.close()
        ctx.close()
    assert (tmp_path / "wordcount" / "0_0" / "rocksdb" / "word-counts").is_dir()


# -- folding: caching on and off ---------------------------------------------------


def _aggregations() -> tuple[Topology, dict[str, str]]:
    builder = StreamsBuilder()
    stream = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.INT64)
    grouped = stream.group_by_key()
    grouped.count(store="counts").to_stream().to("count-out")
    grouped.reduce(lambda agg, v: agg + v, store="sums").to_stream().to("sum-out")
    grouped.aggregate(
        lambda: [],
        lambda key, value, agg: [*agg, value],
        store="lists",
        value_serde=serdes.JSON,
    ).to_stream().to("agg-out")
    return builder.build(), {"count-out": "counts", "sum-out": "sums", "agg-out": "lists"}


def test_caching_folds_updates_to_one_record_per_key_per_commit(tmp_path: Path) -> None:
    topology, _ = _aggregations()
    (sub,) = topology.subtopologies
    assert [s.name for s in sub.store_specs] == ["counts", "sums", "lists"]
    ctx = ctx_for(tmp_path)
    graph = ctx.instantiate(sub)
    for ts, (key, value) in enumerate([("a", 1), ("a", 2), ("b", 5), ("a", 3)]):
        ctx.process(graph, "in", key, value, ts)
    assert ctx.sent == []
    ctx.commit()
    assert decoded(ctx.output("count-out")) == [("b", 1), ("a", 3)]
    assert decoded(ctx.output("sum-out")) == [("b", 5), ("a", 6)]
    assert decoded(ctx.output("agg-out"), value_serde=serdes.JSON) == [("b", [5]), ("a", [1, 2, 3])]
    assert decoded(ctx.changelog("counts")) == [("b", 1), ("a", 3)]
    assert [s.timestamp for s in ctx.output("count-out")] == [2, 3]  # last write per key
    ctx.clear()
    ctx.commit()
    assert ctx.sent == []  # nothing changed, nothing sent


def test_without_caching_every_write_goes_downstream_at_once(tmp_path: Path) -> None:
    topology, _ = _aggregations()
    ctx = ctx_for(tmp_path, cache_max_bytes=0)
    graph = ctx.instantiate(topology.subtopologies[0])
    for ts, (key, value) in enumerate([("a", 1), ("a", 2), ("b", 5), ("a", 3)]):
        ctx.process(graph, "in", key, value, ts)
    assert decoded(ctx.output("count-out")) == [("a", 1), ("a", 2), ("b", 1), ("a", 3)]
    assert decoded(ctx.output("sum-out")) == [("a", 1), ("a", 3), ("b", 5), ("a", 6)]
    assert decoded(ctx.output("agg-out"), value_serde=serdes.JSON)[-1] == ("a", [1, 2, 3])
    assert len(ctx.changelog("counts")) == 4


def test_null_keys_and_values_are_dropped_and_counted(tmp_path: Path) -> None:
    topology, _ = _aggregations()
    ctx = ctx_for(tmp_path, cache_max_bytes=0)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", None, 1)
    ctx.process(graph, "in", "a", None)
    ctx.process(graph, "in", "a", 4)
    assert ctx.dropped == {"null_key": 3, "null_value": 3}  # once per aggregation
    assert decoded(ctx.output("count-out")) == [("a", 1)]


def test_group_by_drops_null_keys_before_the_repartition_topic(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("in", value_serde=serdes.STRING)
        .group_by(lambda k, v: v or None, key_serde=serdes.STRING, name="by-value")
        .count()
    )
    topology = builder.build()
    ctx = RecordingTaskContext()
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", b"k", "")
    ctx.process(graph, "in", b"k", "x")
    assert ctx.dropped == {"null_key": 1}
    assert [(s.topic, s.key) for s in ctx.sent] == [("app-by-value-repartition", b"x")]


def test_aggregate_returning_none_deletes_the_key(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.INT64)
        .group_by_key()
        .reduce(lambda agg, v: None if v == 0 else agg + v, store="sums")
        .to_stream()
        .to("out")
    )
    ctx = ctx_for(tmp_path)
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "in", "a", 1)
    ctx.process(graph, "in", "a", 0)
    ctx.commit()
    assert decoded(ctx.output("out")) == [("a", None)]
    assert ctx.stores["sums"].get(b"a") is None


# -- repartitioning rules -------------------------------------------------------


def test_group_by_key_repartitions_only_after_a_key_change() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    s.group_by_key().count(store="direct")
    s.map(lambda k, v: (v, k)).group_by_key(key_serde=serdes.STRING).count(store="mapped")
    topology = builder.build()
    assert topology.internal_topics() == [TopicSpec("mapped-repartition", True)]
    assert topology.store_subtopology("direct").id == 0
    assert [s.name for s in topology.store_subtopology("mapped").sources] == ["mapped-repartition"]


def test_select_key_keeps_the_value_and_repartitions_a_later_grouping(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    rekeyed = s.select_key(lambda k, v: v.split(":")[0], name="by-prefix")
    assert rekeyed.value_serde is serdes.STRING and rekeyed.key_serde is None
    rekeyed.to("out", key_serde=serdes.STRING)
    rekeyed.group_by_key(key_serde=serdes.STRING).count(store="per-prefix")
    topology = builder.build()
    assert topology.internal_topics() == [TopicSpec("per-prefix-repartition", True)]
    assert "by-prefix" in topology.subtopologies[0].node_names
    ctx = ctx_for(tmp_path)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", "k1", "a:1")
    ctx.process(graph, "in", "k2", "b:2")
    assert decoded(ctx.output("out"), value_serde=serdes.STRING) == [("a", "a:1"), ("b", "b:2")]


def test_to_table_forwards_every_update_at_once_unless_materialized(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    s.to_table().to_stream().to("every")
    s.to_table(store="latest").to_stream().to("folded")
    topology = builder.build()
    assert topology.internal_topics() == []  # the key did not change: no repartition
    ctx = ctx_for(tmp_path)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", "a", "1")
    ctx.process(graph, "in", "a", "2")
    ctx.process(graph, "in", None, "dropped")
    ctx.process(graph, "in", "b", "3")
    ctx.process(graph, "in", "b", None)  # a tombstone deletes b
    every = [("a", "1"), ("a", "2"), ("b", "3"), ("b", None)]
    assert decoded(ctx.output("every"), value_serde=serdes.STRING) == every
    assert ctx.output("folded") == []
    ctx.commit()
    assert decoded(ctx.output("folded"), value_serde=serdes.STRING) == [("a", "2"), ("b", None)]
    assert ctx.stores["latest"].get(b"a") == b"2" and ctx.stores["latest"].get(b"b") is None


def test_to_table_after_a_key_change_repartitions_first() -> None:
    builder = StreamsBuilder()
    s = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    s.select_key(lambda k, v: v).to_table(store="by-value", key_serde=serdes.STRING, name="rekeyed")
    topology = builder.build()
    assert topology.internal_topics() == [TopicSpec("rekeyed-repartition", True)]
    assert [t.name for t in topology.store_subtopology("by-value").sources] == [
        "rekeyed-repartition"
    ]


def test_select_key_needs_a_function() -> None:
    with pytest.raises(TopologyError, match="select_key"):
        StreamsBuilder().stream("in").select_key("not a function")  # type: ignore[arg-type]


def test_generated_store_and_repartition_names_follow_kafka_streams() -> None:
    builder = StreamsBuilder()
    table = builder.stream("in").group_by(lambda k, v: v).count()
    topology = builder.build()
    # 0 source, 1 key select, 2 store name, 3 aggregate node
    assert table.store_name == "KSTREAM-AGGREGATE-STATE-STORE-0000000002"
    assert table.name == "KSTREAM-AGGREGATE-0000000003"
    assert topology.internal_topics() == [
        TopicSpec("KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition", True)
    ]
    assert topology.subtopologies[0].node_names == [
        "KSTREAM-SOURCE-0000000000",
        "KSTREAM-KEY-SELECT-0000000001",
        "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition-filter",
        "KSTREAM-AGGREGATE-STATE-STORE-0000000002-repartition-sink",
    ]


def test_a_named_grouping_shares_its_repartition_topic() -> None:
    builder = StreamsBuilder()
    grouped = builder.stream("in", value_serde=serdes.INT64).group_by(
        lambda k, v: v, key_serde=serdes.INT64, name="by-v"
    )
    grouped.reduce(lambda a, b: a + b, store="sum")
    grouped.aggregate(lambda: 0, lambda k, v, a: a + v, store="agg")
    topology = builder.build()
    assert topology.internal_topics() == [TopicSpec("by-v-repartition", True)]
    assert [s.store_specs for s in topology.subtopologies][1] == [
        StoreSpec("sum"),
        StoreSpec("agg"),
    ]


def test_store_name_errors() -> None:
    builder = StreamsBuilder()
    grouped = builder.stream("in").group_by_key()
    grouped.count(store="c")
    with pytest.raises(TopologyError, match="already has a state store named 'c'"):
        grouped.count(store="c")
    with pytest.raises(TopologyError, match="illegal state store name"):
        grouped.count(store="a/b")
    with pytest.raises(TopologyError, match="windowed_by\\(\\) expects TimeWindows"):
        grouped.windowed_by(10)  # type: ignore[arg-type]
    with pytest.raises(TopologyError, match="callable"):
        grouped.reduce(42)  # type: ignore[arg-type]


# -- store specs and serdes for the runtime and interactive queries ------------


def test_store_specs_and_serdes_per_store() -> None:
    from runtime.topology import TimeWindows

    builder = StreamsBuilder()
    users = builder.table("users", key_serde=serdes.STRING, value_serde=serdes.JSON)
    stream = builder.stream("clicks", key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.join(users, lambda click, user: [click, user]).to("enriched")
    stream.group_by_key().windowed_by(TimeWindows.of_size_and_grace(60_000, 5_000)).count(
        store="per-minute"
    )
    builder.stream("other").group_by_key().aggregate(
        lambda: 0, lambda k, v, a: a + 1, store="agg", value_serde=serdes.INT64
    )
    topology = builder.build()
    first, second = topology.subtopologies
    assert first.store_specs == [
        StoreSpec("users-STATE-STORE-0000000000"),
        StoreSpec("per-minute", kind="window", window_size_ms=60_000, retention_ms=65_000),
    ]
    assert second.store_specs == [StoreSpec("agg")]
    assert all(spec.changelog and spec.caching for spec in topology.store_specs())
    assert topology.store_names() == ["users-STATE-STORE-0000000000", "per-minute", "agg"]
    assert topology.store_serdes("users-STATE-STORE-0000000000") == (serdes.STRING, serdes.JSON)
    assert topology.store_serdes("per-minute") == (serdes.STRING, serdes.INT64)
    assert topology.store_def("per-minute").windowed
    assert topology.store_serdes("agg") == (None, serdes.INT64)  # None: the default
    assert topology.store_subtopology("agg") is second
    with pytest.raises(KeyError, match="no state store 'nope'"):
        topology.store_serdes("nope")
    assert "(stores: [per-minute])" in topology.describe()


def test_processor_api_stores_are_registered_with_add_state_store(tmp_path: Path) -> None:
    class Remember(Processor):
        def init(self, context: ProcessorContext) -> None:
            self.context = context
            self.store = context.state_store("seen")

        def process(self, record: Record) -> None:
            self.store.put(record.key, record.value)

    builder = StreamsBuilder()
    builder.add_state_store(StoreSpec("seen", kind="memory", caching=False), serdes.BYTES)
    builder.stream("in").process(Remember, "seen")
    topology = builder.build()
    assert topology.subtopologies[0].store_specs == [
        StoreSpec("seen", kind="memory", caching=False)
    ]
    ctx = RecordingTaskContext(state_dir=tmp_path)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", b"k", b"v", 3)
    assert ctx.stores["seen"].get(b"k") == b"v"
    assert [(s.topic, s.key, s.value, s.timestamp) for s in ctx.changelog("seen")] == [
        ("app-seen-changelog", b"k", b"v", 3)
    ]


# -- KTable -----------------------------------------------------------------------


def _table_topology() -> tuple[Topology, KTable]:
    builder = StreamsBuilder()
    table = builder.table(
        "prices", key_serde=serdes.STRING, value_serde=serdes.INT64, store="prices-store"
    )
    table.to_stream().to("all")
    table.filter(lambda k, v: v >= 10).to_stream().to("expensive")
    cents = table.filter_not(lambda k, v: v >= 10).map_values(lambda v: v * 100)
    cents.to_stream().to("cheap-cents", value_serde=serdes.INT64)  # map_values: serde unknown
    return builder.build(), table


def test_table_updates_filter_and_map_values(tmp_path: Path) -> None:
    topology, table = _table_topology()
    assert table.store_name == "prices-store"
    (sub,) = topology.subtopologies
    # The store is named, so the filters ask it for old values (Kafka Streams'
    # KTableFilter): a rejected row that did not pass before sends nothing
    # (tests/unit/topology/test_table_filter_old_values.py has the other cases).
    assert sub.store_specs == [StoreSpec("prices-store", send_old_values=True)]
    ctx = ctx_for(tmp_path)
    graph = ctx.instantiate(sub)
    for key, value in [("a", 5), ("b", 20), ("a", 12), ("c", 1), (None, 3)]:
        ctx.process(graph, "prices", key, value)
    ctx.commit()
    assert decoded(ctx.output("all")) == [("b", 20), ("a", 12), ("c", 1)]
    assert decoded(ctx.output("expensive")) == [("b", 20), ("a", 12)]
    assert decoded(ctx.output("cheap-cents")) == [("c", 100)]
    assert ctx.dropped == {"null_key": 1}
    assert sorted(decoded(ctx.changelog("prices-store"))) == [("a", 12), ("b", 20), ("c", 1)]

    ctx.clear()
    ctx.process(graph, "prices", "b", None)  # a tombstone deletes the row
    ctx.commit()
    assert decoded(ctx.output("all")) == [("b", None)]
    assert decoded(ctx.output("expensive")) == [("b", None)]
    assert decoded(ctx.output("cheap-cents")) == []  # b never was cheap
    assert ctx.stores["prices-store"].get(b"b") is None


def test_aggregated_table_to_stream_keeps_serdes() -> None:
    builder = StreamsBuilder()
    table = builder.stream("in", key_serde=serdes.STRING).group_by_key().count()
    stream = table.to_stream()
    assert (stream.key_serde, stream.value_serde) == (serdes.STRING, serdes.INT64)
    assert not stream.repartition_required
    mapped = table.map_values(str)
    assert mapped.value_serde is None and mapped.store_name is None


def test_commit_flushes_upstream_stores_first_so_cascades_finish(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    table = builder.table("in", key_serde=serdes.STRING, value_serde=serdes.STRING, store="t")
    counts = table.to_stream().group_by_key().count(store="updates")
    counts.to_stream().to("out")
    (sub,) = builder.build().subtopologies
    assert [spec.name for spec in sub.store_specs] == ["t", "updates"]
    ctx = ctx_for(tmp_path)
    graph = ctx.instantiate(sub)
    ctx.process(graph, "in", "a", "x", 1)
    ctx.process(graph, "in", "a", "y", 2)
    ctx.process(graph, "in", "b", "z", 3)
    ctx.commit()  # "t" emits one update per key into "updates", which then emits
    assert decoded(ctx.output("out")) == [("a", 1), ("b", 1)]
    assert [s.timestamp for s in ctx.output("out")] == [2, 3]
