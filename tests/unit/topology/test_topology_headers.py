"""Record headers through the DSL: set by a processor, carried by stateless
operators, written by sinks, and carried through state where Kafka Streams
carries them (aggregations with caching off, to_table, suppression,
stream-table joins, cogroups), on real stores."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runtime.topology import Processor, Record, StreamsBuilder, serdes
from runtime.topology.header_codec import decode_headers, encode_headers
from runtime.topology.processor import ProcessorContext
from runtime.topology.suppressed import BufferConfig, Suppressed
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.windows import TimeWindows

STR = serdes.STRING


class Tag(Processor):
    """Forwards each record with headers naming its value's letter (a new list:
    the input's headers are left alone)."""

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, record: Record) -> None:
        value = record.value
        letter = None if value is None else value[:1].encode()
        self.context.forward(record.with_headers([*(record.headers or []), ("letter", letter)]))


def _tagged(builder: StreamsBuilder) -> Any:
    return builder.stream("in", key_serde=STR, value_serde=STR).process(Tag)


def _run(tmp_path: Path, builder: StreamsBuilder, records: list[Any], cache: int = 0) -> Any:
    """Feed `records` to the first subtopology, and what each subtopology
    sends (repartition topics: `process` may change the key, as in Kafka
    Streams) to the next; returns the last context."""
    subtopologies = builder.build().subtopologies
    ctx = RecordingTaskContext(state_dir=tmp_path / "0", store_kind="memory")
    graph = ctx.instantiate(subtopologies[0])
    for key, value, ts, *headers in records:
        ctx.process(graph, "in", key, value, ts, headers[0] if headers else None)
    for i, sub in enumerate(subtopologies[1:], 1):
        upstream = ctx
        ctx = RecordingTaskContext(
            state_dir=tmp_path / str(i), store_kind="memory", cache_max_bytes=cache
        )
        ctx.pipe(ctx.instantiate(sub), upstream.sent)
    return ctx


def test_processor_headers_reach_the_sink_through_stateless_operators(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        _tagged(builder)
        .filter(lambda k, v: v != "drop")
        .map_values(str.upper)
        .to("out", key_serde=STR, value_serde=STR)
    )
    ctx = _run(tmp_path, builder, [("k", "a1", 1, [("in", b"x")]), ("k", "drop", 2), ("k", "b", 3)])
    assert [(s.value, s.headers) for s in ctx.output("out")] == [
        (b"A1", [("in", b"x"), ("letter", b"a")]),
        (b"B", [("letter", b"b")]),
    ]


def test_aggregation_update_carries_the_headers_of_its_record(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    _tagged(builder).group_by_key(key_serde=STR, value_serde=STR).count().to_stream().to(
        "out", key_serde=STR, value_serde=serdes.INT64
    )
    ctx = _run(tmp_path, builder, [("k", "a", 1), ("j", "b", 2), ("k", "c", 3)])
    assert [h for s in ctx.output("out") for h in s.headers] == [
        ("letter", b"a"),
        ("letter", b"b"),
        ("letter", b"c"),
    ]


def test_cached_update_carries_headers_only_when_known(tmp_path: Path) -> None:
    """With caching on, a key flushed at commit carries its last record's
    headers when that was the node's last write; otherwise none (Kafka
    Streams keeps them per cache entry: a documented difference)."""
    builder = StreamsBuilder()
    _tagged(builder).group_by_key(key_serde=STR, value_serde=STR).count().to_stream().to(
        "out", key_serde=STR, value_serde=serdes.INT64
    )
    ctx = _run(tmp_path, builder, [("k", "a", 1), ("j", "b", 2)], cache=1 << 20)
    ctx.commit()
    assert {s.key: s.headers for s in ctx.output("out")} == {
        b"k": None,
        b"j": [("letter", b"b")],
    }


def test_windowed_aggregation_and_cogroup_carry_headers(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    tagged = _tagged(builder)
    other = builder.stream("in2", key_serde=STR, value_serde=STR)
    (
        tagged.group_by_key(key_serde=STR, value_serde=STR)
        .cogroup(lambda k, v, agg: agg + v)
        .cogroup(other.group_by_key(), lambda k, v, agg: agg + v.upper())
        .windowed_by(TimeWindows.of_size_and_grace(10, 5))
        .aggregate(lambda: "", value_serde=STR)
        .to_stream()
        .to("out", key_serde=serdes.windowed(STR, 10), value_serde=STR)
    )
    up, down = builder.build().subtopologies  # the tagged stream is repartitioned
    ctx = RecordingTaskContext(state_dir=tmp_path / "up", store_kind="memory")
    ctx.process(ctx.instantiate(up), "in", "k", "a", 1)
    repartitioned = ctx.sent
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(down)
    ctx.pipe(graph, repartitioned)
    ctx.process(graph, "in2", "k", "b", 2, [("h", b"2")])
    ctx.process(graph, "in2", "k", "c", 3)
    assert [(s.value, s.headers) for s in ctx.output("out")] == [
        (b"a", [("letter", b"a")]),
        (b"aB", [("h", b"2")]),
        (b"aBC", None),
    ]


def test_to_table_and_suppression_keep_the_buffered_update_headers(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    (
        _tagged(builder)
        .to_table(key_serde=STR, value_serde=STR)
        .suppress(Suppressed.until_time_limit(10, BufferConfig.max_records(5)))
        .to_stream()
        .to("out", key_serde=STR, value_serde=STR)
    )
    ctx = _run(tmp_path, builder, [("k", "a", 1), ("k", "b", 2), ("j", None, 3), ("x", "z", 30)])
    assert [(s.key, s.value, s.headers) for s in ctx.output("out")] == [
        (b"k", b"b", [("letter", b"b")]),
        (b"j", None, [("letter", None)]),
    ]


def test_stream_table_join_carries_the_stream_records_headers(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    source = builder.stream("in", key_serde=STR, value_serde=STR)
    table = source.filter(lambda k, v: v.startswith("T")).to_table()
    (
        source.filter(lambda k, v: v.startswith("S"))
        .process(Tag)
        .left_join(table, lambda s, t: f"{s}/{t}", key_serde=STR, value_serde=STR)
        .to("out", key_serde=STR, value_serde=STR)
    )
    topology = builder.build()
    assert len(topology.subtopologies) == 1  # the table's store holds both sources together
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(topology.subtopologies[0])
    ctx.process(graph, "in", "k", "T1", 1, [("t", b"1")])
    ctx.process(graph, "in", "k", "S2", 2)
    ctx.pipe(graph, list(ctx.sent))  # the tagged stream, back from its repartition topic
    assert [(s.value, s.headers) for s in ctx.output("out")] == [(b"S2/T1", [("letter", b"S")])]


headers_strategy = st.lists(
    st.tuples(st.text(max_size=8), st.one_of(st.none(), st.binary(max_size=16))), max_size=5
)


@given(headers_strategy, st.binary(max_size=8))
def test_header_codec_round_trips(headers: list[tuple[str, bytes | None]], tail: bytes) -> None:
    data = encode_headers(headers) + tail
    decoded, end = decode_headers(data)
    assert decoded == headers and data[end:] == tail


def test_session_updates_carry_no_headers_and_closing_results_the_closers(
    tmp_path: Path,
) -> None:
    """As Kafka Streams 4.3 (differential tests): session updates and
    retractions are made afresh, on-close results take the headers of the
    record that closed the window (time and session windows)."""
    from runtime.topology.session_windows import SessionWindows
    from runtime.topology.suppressed import EmitStrategy

    def run(windows: Any, final: bool) -> list[Any]:
        builder = StreamsBuilder()
        grouped = builder.stream("in", key_serde=STR, value_serde=STR).group_by_key()
        windowed = grouped.windowed_by(windows)
        if final:
            windowed = windowed.emit_strategy(EmitStrategy.on_window_close())
        windowed.count().to_stream().to("out", value_serde=serdes.INT64)
        ctx = RecordingTaskContext(
            state_dir=tmp_path / str(id(windows)), store_kind="memory", cache_max_bytes=0
        )
        graph = ctx.instantiate(builder.build().subtopologies[0])
        for value, ts in (("a", 1), ("b", 5), ("c", 100)):
            ctx.process(graph, "in", "k", value, ts, [("v", value.encode())])
        return [s.headers for s in ctx.output("out")]

    sessions = SessionWindows.of_inactivity_gap_with_grace(10, 0)
    assert run(sessions, False) == [None, None, None, None]  # a, (a retracted) a+b, c
    assert run(sessions, True) == [[("v", b"c")]]
    assert run(TimeWindows.of_size_and_grace(10, 0), True) == [[("v", b"c")]]
