"""The Python twins of `peers.DifferentialTopologies` (the Kafka Streams side).

Each function builds, with this project's DSL, the topology its Java namesake
builds in `benchmarks/peers/kafka_streams/src/main/java/peers/DifferentialTopologies.java`:
same operators, same functions (written to give the same strings: Java's
`"a" + null` is `"a" + "null"`), same serdes (UTF-8 strings, 8-byte longs,
Kafka's time- and session-windowed key layouts), same windows. Change both sides together.

The input (`tests.differential.harness.generate`) is one topic of string keys
and values; a value's first letter says which side of a join it feeds ("L"/"R"
for stream-stream joins, "T"/"S" for the stream-table join).

Threads: pure builders, called by the test's thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime import Processor, Record, StreamsBuilder, serdes
from runtime.topology.kstream import KStream
from runtime.topology.processor import ProcessorContext
from runtime.topology.session_store import session_windowed
from runtime.topology.session_windows import SessionWindows
from runtime.topology.sliding_windows import SlidingWindows
from runtime.topology.suppressed import BufferConfig, EmitStrategy, Suppressed
from runtime.topology.topology import Topology
from runtime.topology.windows import JoinWindows, TimeWindows

WINDOW_MS = 10_000
HOP_MS = 5_000
GRACE_MS = 3_000
JOIN_DIFFERENCE_MS = 5_000
JOIN_GRACE_MS = 2_000

STR = serdes.STRING
LONG = serdes.INT64
WINDOWED = serdes.windowed(serdes.STRING, WINDOW_MS)


def java_str(value: Any) -> str:
    """How Java's string concatenation writes a value (null as "null")."""
    return "null" if value is None else str(value)


def joiner(left: Any, right: Any) -> str:
    return f"{java_str(left)}+{java_str(right)}"


def side(prefix: str) -> Callable[[Any, Any], bool]:
    return lambda key, value: value is not None and value.startswith(prefix)


def _source(builder: StreamsBuilder, topic: str) -> KStream:
    return builder.stream(topic, key_serde=STR, value_serde=STR)


def count(builder: StreamsBuilder, topic: str, out: str) -> None:
    _source(builder, topic).group_by_key().count().to_stream().to(out, value_serde=LONG)


def reduce(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .reduce(lambda agg, value: f"{agg}|{value}")
        .to_stream()
        .to(out, value_serde=STR)
    )


def aggregate(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .aggregate(lambda: 0, lambda key, value, agg: agg + len(value), value_serde=LONG)
        .to_stream()
        .to(out, value_serde=LONG)
    )


def tumbling_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS))
        .count()
        .to_stream()
        .to(out, key_serde=WINDOWED, value_serde=LONG)
    )


def hopping_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS).advance_by(HOP_MS))
        .count()
        .to_stream()
        .to(out, key_serde=WINDOWED, value_serde=LONG)
    )


def table_left_join(builder: StreamsBuilder, topic: str, out: str) -> None:
    source = _source(builder, topic)
    table = source.filter(side("T")).to_table()
    (
        source.filter(side("S"))
        .left_join(table, lambda s, t: f"{s}/{java_str(t)}")
        .to(out, value_serde=STR)
    )


def table_filter_map(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .to_table(store="tfm-store")
        .filter(lambda key, value: len(value) % 2 == 0)
        .map_values(str.upper)
        .to_stream()
        .to(out, value_serde=STR)
    )


def select_key_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .filter(lambda key, value: value is not None)
        .select_key(lambda key, value: value[:2])
        .group_by_key(key_serde=STR, name="by-prefix")
        .count()
        .to_stream()
        .to(out, key_serde=STR, value_serde=LONG)
    )


def to_table(builder: StreamsBuilder, topic: str, out: str) -> None:
    _source(builder, topic).to_table().to_stream().to(out, value_serde=STR)


def _sides(builder: StreamsBuilder, topic: str) -> tuple[KStream, KStream]:
    source = _source(builder, topic)
    return source.filter(side("L")), source.filter(side("R"))


def _stream_join(kind: str, windows: JoinWindows) -> Callable[[StreamsBuilder, str, str], None]:
    def build(builder: StreamsBuilder, topic: str, out: str) -> None:
        left, right = _sides(builder, topic)
        if kind == "join":
            joined = left.join(right, joiner, windows=windows)
        elif kind == "left":
            joined = left.left_join(right, joiner, windows=windows)
        else:
            joined = left.outer_join(right, joiner, windows)
        joined.to(out, value_serde=STR)

    return build


JOIN_WINDOWS = JoinWindows.of_time_difference_and_grace(JOIN_DIFFERENCE_MS, JOIN_GRACE_MS)


def ss_join_windowed_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    """An outer join counted per key in tumbling windows.

    No re-keying between the two: a repartition topic written by several
    upstream tasks interleaves their records as they happen to run, and with
    late records the windowed count then depends on that timing, in either
    implementation (docs/differential.md).
    """
    left, right = _sides(builder, topic)
    (
        left.outer_join(right, joiner, JOIN_WINDOWS)
        .group_by_key(key_serde=STR, value_serde=STR)
        .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS))
        .count()
        .to_stream()
        .to(out, key_serde=WINDOWED, value_serde=LONG)
    )


# -- session windows and suppression (issue 35, items 4-5) ---------------------------

SESSION_GAP_MS = 1_500
CLICK_GAP_MS = 2_000
CLICK_GRACE_MS = 1_000
SESSION = session_windowed(serdes.STRING)
SESSIONS = SessionWindows.of_inactivity_gap_with_grace(SESSION_GAP_MS, GRACE_MS)


def _non_null(builder: StreamsBuilder, topic: str) -> KStream:
    return _source(builder, topic).filter(lambda key, value: value is not None)


def session_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(SESSIONS)
        .count()
        .to_stream()
        .to(out, key_serde=SESSION, value_serde=LONG)
    )


def session_reduce(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _non_null(builder, topic)
        .group_by_key()
        .windowed_by(SESSIONS)
        .reduce(lambda agg, value: f"{agg}|{value}")
        .to_stream()
        .to(out, key_serde=SESSION, value_serde=STR)
    )


def session_aggregate(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _non_null(builder, topic)
        .group_by_key()
        .windowed_by(SESSIONS)
        .aggregate(
            lambda: 0,
            lambda key, value, agg: agg + len(value),
            lambda key, a, b: a + b,
            value_serde=LONG,
        )
        .to_stream()
        .to(out, key_serde=SESSION, value_serde=LONG)
    )


def session_count_on_close(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(SESSIONS)
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .to(out, key_serde=SESSION, value_serde=LONG)
    )


def tumbling_count_suppress(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS))
        .count()
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .to(out, key_serde=WINDOWED, value_serde=LONG)
    )


def table_suppress_time_limit(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .to_table()
        .suppress(Suppressed.until_time_limit(2_000, BufferConfig.max_records(3)).with_name("hold"))
        .to_stream()
        .to(out, value_serde=STR)
    )


def clickstream_sessions(builder: StreamsBuilder, topic: str, out: str) -> None:
    """Composed: click-stream sessionization with suppress. Each key's clicks
    (the values' first letters) per session, one final line per session."""
    (
        _non_null(builder, topic)
        .group_by_key()
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(CLICK_GAP_MS, CLICK_GRACE_MS))
        .aggregate(
            lambda: "",
            lambda key, value, agg: agg + value[0],
            lambda key, a, b: a + b,
            value_serde=STR,
        )
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .map(lambda wk, value: (wk.key, f"{wk.start}-{wk.end}:{value}"))
        .to(out, key_serde=STR, value_serde=STR)
    )


def hopping_count_on_close(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS).advance_by(HOP_MS))
        .emit_strategy(EmitStrategy.on_window_close())
        .count()
        .to_stream()
        .to(out, key_serde=WINDOWED, value_serde=LONG)
    )


SLIDE_MS = 2_000
SLIDING = SlidingWindows.of_time_difference_and_grace(SLIDE_MS, GRACE_MS)
SLIDING_KEY = serdes.windowed(serdes.STRING, SLIDE_MS)


def sliding_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(SLIDING)
        .count()
        .to_stream()
        .to(out, key_serde=SLIDING_KEY, value_serde=LONG)
    )


def sliding_aggregate(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(SLIDING)
        .aggregate(lambda: "", lambda key, value, agg: agg + value[0], value_serde=STR)
        .to_stream()
        .to(out, key_serde=SLIDING_KEY, value_serde=STR)
    )


def sliding_count_suppress(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .group_by_key()
        .windowed_by(SLIDING)
        .count()
        .suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
        .to_stream()
        .to(out, key_serde=SLIDING_KEY, value_serde=LONG)
    )


TOPOLOGIES: dict[str, Callable[[StreamsBuilder, str, str], None]] = {
    "count": count,
    "reduce": reduce,
    "aggregate": aggregate,
    "tumbling_count": tumbling_count,
    "hopping_count": hopping_count,
    "table_left_join": table_left_join,
    "table_filter_map": table_filter_map,
    "select_key_count": select_key_count,
    "to_table": to_table,
    "ss_join": _stream_join("join", JOIN_WINDOWS),
    "ss_left_join": _stream_join("left", JOIN_WINDOWS),
    "ss_outer_join": _stream_join("outer", JOIN_WINDOWS),
    "ss_outer_join_no_grace": _stream_join(
        "outer", JoinWindows.of_time_difference_with_no_grace(JOIN_DIFFERENCE_MS)
    ),
    "ss_join_windowed_count": ss_join_windowed_count,
    "session_count": session_count,
    "session_reduce": session_reduce,
    "session_aggregate": session_aggregate,
    "session_count_on_close": session_count_on_close,
    "tumbling_count_suppress": tumbling_count_suppress,
    "table_suppress_time_limit": table_suppress_time_limit,
    "clickstream_sessions": clickstream_sessions,
    "sliding_count": sliding_count,
    "sliding_aggregate": sliding_aggregate,
    "sliding_count_suppress": sliding_count_suppress,
    "hopping_count_on_close": hopping_count_on_close,
}


# -- table-table joins and table re-grouping (issue 35, items 2-3) -------------


def table_side(prefix: str) -> Callable[[Any, Any], bool]:
    """A table's records: values of one letter, and every tombstone (a null
    value deletes the key from both tables)."""
    return lambda key, value: value is None or value.startswith(prefix)


def _table_sides(builder: StreamsBuilder, topic: str) -> tuple[Any, Any]:
    source = _source(builder, topic)
    return source.filter(table_side("L")).to_table(), source.filter(table_side("R")).to_table()


def _table_join(kind: str, store: str | None = None) -> Callable[[StreamsBuilder, str, str], None]:
    def build(builder: StreamsBuilder, topic: str, out: str) -> None:
        left, right = _table_sides(builder, topic)
        extra: dict[str, Any] = {} if store is None else {"store": store, "value_serde": STR}
        getattr(left, kind)(right, joiner, **extra).to_stream().to(out, value_serde=STR)

    return build


def _regrouped(builder: StreamsBuilder, topic: str) -> Any:
    return _source(builder, topic).to_table()


def table_group_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _regrouped(builder, topic)
        .group_by(lambda key, value: (value[0], value), key_serde=STR, value_serde=STR)
        .count()
        .to_stream()
        .to(out, key_serde=STR, value_serde=LONG)
    )


def table_group_reduce(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _regrouped(builder, topic)
        .group_by(lambda key, value: (value[0], int(value[1:])), key_serde=STR, value_serde=LONG)
        .reduce(lambda agg, value: agg + value, lambda agg, value: agg - value)
        .to_stream()
        .to(out, key_serde=STR, value_serde=LONG)
    )


def table_group_aggregate(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _regrouped(builder, topic)
        .group_by(lambda key, value: (value[0], value), key_serde=STR, value_serde=STR)
        .aggregate(
            lambda: 0,
            lambda key, value, agg: agg + int(value[1:]),
            lambda key, value, agg: agg - int(value[1:]),
            value_serde=LONG,
        )
        .to_stream()
        .to(out, key_serde=STR, value_serde=LONG)
    )


def tt_join_group_count(builder: StreamsBuilder, topic: str, out: str) -> None:
    """Composed: a table-table left join regrouped by whether a right row matched."""
    left, right = _table_sides(builder, topic)
    (
        left.left_join(right, joiner)
        .group_by(
            lambda key, value: ("alone" if value.endswith("+null") else "paired", value),
            key_serde=STR,
            value_serde=STR,
        )
        .count()
        .to_stream()
        .to(out, key_serde=STR, value_serde=LONG)
    )


def foreign_key(value: str) -> str:
    """An "L<n>" row's foreign key: the key `k<n mod 5>` of a right row."""
    return f"k{int(value[1:]) % 5}"


def _fk_join(left: bool) -> Callable[[StreamsBuilder, str, str], None]:
    def build(builder: StreamsBuilder, topic: str, out: str) -> None:
        orders, customers = _table_sides(builder, topic)
        join = orders.left_join if left else orders.join
        join(customers, foreign_key, joiner, value_serde=STR).to_stream().to(out, value_serde=STR)

    return build


def enrichment(builder: StreamsBuilder, topic: str, out: str) -> None:
    """Composed: orders ("L") joined by foreign key with customers ("R"), then
    left-joined (same key) with the orders' extras ("S")."""
    source = _source(builder, topic)
    orders = source.filter(table_side("L")).to_table()
    customers = source.filter(table_side("R")).to_table()
    extras = source.filter(table_side("S")).to_table()
    (
        orders.join(customers, foreign_key, joiner, value_serde=STR)
        .left_join(extras, joiner)
        .to_stream()
        .to(out, value_serde=STR)
    )


TOPOLOGIES.update(
    {
        "fk_join": _fk_join(False),
        "fk_left_join": _fk_join(True),
        "enrichment": enrichment,
        "tt_join": _table_join("join"),
        "tt_left_join": _table_join("left_join"),
        "tt_outer_join": _table_join("outer_join"),
        "tt_outer_join_materialized": _table_join("outer_join", store="tt-outer-store"),
        "table_group_count": table_group_count,
        "table_group_reduce": table_group_reduce,
        "table_group_aggregate": table_group_aggregate,
        "tt_join_group_count": tt_join_group_count,
    }
)


# Global table (issue 35 item 6): the table's topic is `<input>-global`,
# written whole before the apps start (harness.run_pair), so both sides load
# all of it before their first stream record: with updates arriving while
# the app runs, which stream records see them depends on timing, in Kafka
# Streams as here (docs/differential.md).
GLOBAL_SUFFIX = "-global"


def global_table_records(records: list[tuple[Any, Any, int]]) -> list[tuple[Any, Any, int]]:
    """The global table's topic: the input's keyed "T" records and tombstones."""
    return [r for r in records if r[0] is not None and (r[1] is None or r[1].startswith("T"))]


def global_key(key: Any, value: Any) -> Any:
    """An "S<n>" record looks up `k<n mod 5>`; None for n divisible by 7 (and a null value)."""
    if value is None:
        return None
    n = int(value[1:])
    return None if n % 7 == 0 else f"k{n % 5}"


def global_join(builder: StreamsBuilder, topic: str, out: str) -> None:
    """A stream enriched by a global table: inner and left join into one output."""
    table = builder.global_table(topic + GLOBAL_SUFFIX, key_serde=STR, value_serde=STR)
    stream = _source(builder, topic).filter(lambda k, v: v is None or v.startswith("S"))
    stream.join(table, global_key, lambda s, t: f"J:{s}/{java_str(t)}").to(out, value_serde=STR)
    stream.left_join(table, global_key, lambda s, t: f"L:{s}/{java_str(t)}").to(
        out, value_serde=STR
    )


TOPOLOGIES["global_join"] = global_join

# -- cogroup and headers (issue 35, items 7 and 8) -------------------------------


def _cogrouped(builder: StreamsBuilder, topic: str) -> Any:
    """ "L<n>" records add n, "R" records subtract 1, into one long per key."""
    source = _source(builder, topic)
    left = source.filter(side("L")).group_by_key()
    right = source.filter(side("R")).group_by_key()
    return left.cogroup(lambda key, value, agg: agg + int(value[1:])).cogroup(
        right, lambda key, value, agg: agg - 1
    )


def cogroup_aggregate(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _cogrouped(builder, topic)
        .aggregate(lambda: 0, value_serde=LONG)
        .to_stream()
        .to(out, value_serde=LONG)
    )


def cogroup_tumbling(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _cogrouped(builder, topic)
        .windowed_by(TimeWindows.of_size_and_grace(WINDOW_MS, GRACE_MS))
        .aggregate(lambda: 0, value_serde=LONG)
        .to_stream()
        .to(out, key_serde=WINDOWED, value_serde=LONG)
    )


def cogroup_session(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _cogrouped(builder, topic)
        .windowed_by(SessionWindows.of_inactivity_gap_with_grace(SESSION_GAP_MS, GRACE_MS))
        .aggregate(lambda: 0, lambda key, a, b: a + b, value_serde=LONG)
        .to_stream()
        .to(out, key_serde=session_windowed(STR), value_serde=LONG)
    )


def cogroup_repartition(builder: StreamsBuilder, topic: str, out: str) -> None:
    """The "L" side re-keyed by its foreign key (through a repartition topic)."""
    source = _source(builder, topic)
    right = source.filter(side("R")).group_by_key()
    (
        source.filter(side("L"))
        .select_key(lambda key, value: foreign_key(value))
        .group_by_key(key_serde=STR)
        .cogroup(lambda key, value, agg: agg + int(value[1:]))
        .cogroup(right, lambda key, value, agg: agg - 1)
        .aggregate(lambda: 0, value_serde=LONG)
        .to_stream()
        .to(out, key_serde=STR, value_serde=LONG)
    )


class Relabel(Processor):
    """Each record with its "letter" header lower-cased ("none" without one,
    "null" for a null one) and a "length" header added: new headers."""

    def init(self, context: ProcessorContext) -> None:
        self.context = context

    def process(self, record: Record) -> None:
        headers = []
        letter = "none"
        for name, value in record.headers or []:
            if name == "letter":
                letter = "null" if value is None else value.decode().lower()
            else:
                headers.append((name, value))
        headers.append(("letter", letter.encode()))
        value = record.value
        headers.append(("length", None if value is None else str(len(value)).encode()))
        self.context.forward(record.with_headers(headers))


def headers_process(builder: StreamsBuilder, topic: str, out: str) -> None:
    (
        _source(builder, topic)
        .process(Relabel)
        .map_values(lambda value: None if value is None else value.upper())
        .to(out, key_serde=STR, value_serde=STR)
    )


TOPOLOGIES.update(
    {
        "cogroup_aggregate": cogroup_aggregate,
        "cogroup_tumbling": cogroup_tumbling,
        "cogroup_session": cogroup_session,
        "cogroup_repartition": cogroup_repartition,
        "headers_process": headers_process,
    }
)


def build(name: str, topic: str, out: str) -> Topology:
    builder = StreamsBuilder()
    TOPOLOGIES[name](builder, topic, out)
    return builder.build()
