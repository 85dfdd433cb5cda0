"""`KTable.filter` with and without old values, as Kafka Streams' `KTableFilter`.

A filter asks its table for old values when the table has them without a
store added for it (`enableSendingOldValues(false)`): a source whose store
the user named, an aggregation, a filter or `map_values` of such a table.
Then a rejected update of a row that did not pass before forwards nothing;
otherwise every rejected update is a tombstone. Caching is off here, so each
write is an update (the differential twin `table_filter_map` checks the same
against Kafka Streams).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.topology import StreamsBuilder, serdes
from runtime.topology.ktable import KTable
from runtime.topology.testing import RecordingTaskContext

# (key, value) updates of one row: rejected while never passed, passes, still
# passes, rejected (the row goes), rejected again, deleted, rejected.
UPDATES: list[tuple[str, Any]] = [
    ("a", 1),
    ("a", 3),
    ("a", 12),
    ("a", 14),
    ("a", 5),
    ("a", 7),
    ("a", None),
    ("a", 9),
]
WITH_OLD = [("a", 12), ("a", 14), ("a", None)]
WITHOUT_OLD = [("a", None)] * 2 + [("a", 12), ("a", 14)] + [("a", None)] * 4


def _run(tmp_path: Path, table_of: Any, updates: list[tuple[str, Any]]) -> list[tuple[Any, Any]]:
    builder = StreamsBuilder()
    table: KTable = table_of(builder)
    table.filter(lambda k, v: v >= 10).to_stream().to("out", value_serde=serdes.INT64)
    (sub,) = builder.build().subtopologies
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(sub)
    for offset, (key, value) in enumerate(updates):
        ctx.process(graph, "in", key, value, timestamp=offset)
    ctx.commit()
    return [
        (s.key.decode(), None if s.value is None else serdes.INT64.deserialize(s.value))
        for s in ctx.output("out")
    ]


def _source(builder: StreamsBuilder, store: str | None) -> KTable:
    return builder.table("in", key_serde=serdes.STRING, value_serde=serdes.INT64, store=store)


def _stream(builder: StreamsBuilder) -> Any:
    return builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.INT64)


NO_DELETES = [u for u in UPDATES if u[1] is not None]  # an aggregation drops null values


@pytest.mark.parametrize(
    ("table_of", "updates", "expected"),
    [
        pytest.param(lambda b: _source(b, "named"), UPDATES, WITH_OLD, id="table-named-store"),
        pytest.param(lambda b: _source(b, None), UPDATES, WITHOUT_OLD, id="table-internal-store"),
        pytest.param(
            lambda b: _stream(b).to_table(store="t"), UPDATES, WITH_OLD, id="to_table-named"
        ),
        pytest.param(lambda b: _stream(b).to_table(), UPDATES, WITHOUT_OLD, id="to_table-unnamed"),
        pytest.param(
            lambda b: _source(b, "named").map_values(lambda v: v),
            UPDATES,
            WITH_OLD,
            id="mapped-named",
        ),
        pytest.param(
            lambda b: _source(b, None).filter(lambda k, v: True),
            UPDATES,
            WITHOUT_OLD,
            id="filtered-unnamed",
        ),
        pytest.param(
            lambda b: _stream(b).group_by_key().reduce(lambda old, new: new),
            NO_DELETES,
            WITH_OLD,
            id="aggregation",
        ),
    ],
)
def test_filter_forwards_a_tombstone_only_for_rows_downstream_saw(
    tmp_path: Path,
    table_of: Any,
    updates: list[tuple[str, Any]],
    expected: list[tuple[Any, Any]],
) -> None:
    assert _run(tmp_path, table_of, updates) == expected


def test_filter_not_with_old_values(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    table = _source(builder, "named")
    table.filter_not(lambda k, v: v >= 10).to_stream().to("out", value_serde=serdes.INT64)
    (sub,) = builder.build().subtopologies
    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory", cache_max_bytes=0)
    graph = ctx.instantiate(sub)
    for offset, (key, value) in enumerate(UPDATES):
        ctx.process(graph, "in", key, value, timestamp=offset)
    out = [(s.key, s.value) for s in ctx.output("out")]
    enc = serdes.INT64.serialize
    # 1, 3 pass; 12 removes the row; 14 nothing; 5, 7 pass; the delete
    # removes it; 9 passes.
    assert out == [
        (b"a", enc(1)),
        (b"a", enc(3)),
        (b"a", None),
        (b"a", enc(5)),
        (b"a", enc(7)),
        (b"a", None),
        (b"a", enc(9)),
    ]


def test_a_filtered_named_table_reads_old_values_from_its_store() -> None:
    builder = StreamsBuilder()
    _source(builder, "named").filter(lambda k, v: True)
    builder.table("in2", store=None).filter(lambda k, v: True)
    specs = {s.name: s for sub in builder.build().subtopologies for s in sub.store_specs}
    assert specs["named"].send_old_values
    (internal,) = (s for name, s in specs.items() if name != "named")
    assert not internal.send_old_values
