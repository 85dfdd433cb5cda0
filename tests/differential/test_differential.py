"""The DSL's operators, output for output against Kafka Streams (4.3) itself.

One seeded input (out-of-order and late records, null keys, tombstones) goes
through each topology of `tests.differential.topologies` in this runtime and
through its twin in Kafka Streams (`peers.DifferentialTopologies`, built by
Maven into the peers' cache on first use), on the suite's broker, with caching
off on both sides. Per key, the output records (value and timestamp) must be
the same in the same order, and each key must land in the same partition.
`tests/differential/harness.py` says how; docs/differential.md lists what is
compared and the known differences.

Stream-stream joins: the input's "L" records are the left stream and "R"
records the right one (the "T"/"S" records feed the stream-table join). Both
sides read one topic, so the order in which a join sees left and right
records is the topic's, the same in both implementations. Kafka Streams runs
with the spurious-result emit interval at 0
(`__emit.interval.ms.kstreams.outer.join.spurious.results.fix__`), so
pending left/outer results are emitted as soon as stream time allows, as here.

The topologies run in one module fixture, in waves of ten (`harness.WAVE`):
per wave one JVM with one `KafkaStreams` per topology, and one in-process
App per topology. A wave that fails fails its own comparisons only. With
`-k`, only the selected twins run.
"""

from __future__ import annotations

import os

import pytest

from benchmarks.peers import build as peers_build
from tests.differential.harness import Run, compare, generate, run_pair

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

NAMES = [
    "count",
    "reduce",
    "aggregate",
    "tumbling_count",
    "hopping_count",
    "table_left_join",
    "table_filter_map",
    "select_key_count",
    "to_table",
    "ss_join",
    "ss_left_join",
    "ss_outer_join",
    "ss_outer_join_no_grace",
    "ss_join_windowed_count",
    "session_count",
    "session_aggregate",
    "session_count_on_close",
    "table_suppress_time_limit",
    "clickstream_sessions",
    "sliding_count",
    "sliding_count_suppress",
    "hopping_count_on_close",
    "tt_join",
    "tt_left_join",
    "tt_outer_join",
    "tt_outer_join_materialized",
    "table_group_count",
    "table_group_reduce",
    "table_group_aggregate",
    "tt_join_group_count",
    "fk_join",
    "fk_left_join",
    "enrichment",
    "global_join",
    "cogroup_aggregate",
    "cogroup_tumbling",
    "cogroup_session",
    "headers_process",
]
# Twins kept out of the suite's run to keep its time down (each topology costs
# an application per side); `DIFFERENTIAL_EXTRA=1` runs them too. They passed
# when added (issue 35).
EXTRA = ["session_reduce", "tumbling_count_suppress", "sliding_aggregate", "cogroup_repartition"]
if os.environ.get("DIFFERENTIAL_EXTRA") == "1":
    NAMES += EXTRA
# Aggregations: values compared, not timestamps (Kafka Streams stamps a result
# with the largest timestamp its aggregate has seen, this runtime with the
# updating record's; docs/differential.md, "Known differences").
VALUES_ONLY = {
    "count",
    "reduce",
    "aggregate",
    "tumbling_count",
    "hopping_count",
    "select_key_count",
    "ss_join_windowed_count",
    "hopping_count_on_close",
    "tumbling_count_suppress",
    # Table-table joins: Kafka Streams stamps a result with the larger of both
    # rows' timestamps, this runtime with the updating record's.
    "tt_join",
    "tt_left_join",
    "tt_outer_join",
    "tt_outer_join_materialized",
    # Cogroups: the aggregations' timestamps, as above.
    "cogroup_aggregate",
    "cogroup_tumbling",
}
# Table joins whose input deletes rows: the tombstone rules must be exercised.
TOMBSTONES = {"tt_join", "tt_left_join", "tt_outer_join", "tt_outer_join_materialized"}
# Table re-grouping: the repartition topic is written by both input partitions'
# tasks, so the order of a group's updates depends on how they interleave (in
# either implementation); the final table is compared.
FINAL_ONLY = {
    "table_group_count",
    "table_group_reduce",
    "table_group_aggregate",
    "tt_join_group_count",
    # Foreign-key joins: the answers come back through the response topic from
    # both foreign tasks, interleaved as those tasks run.
    "fk_join",
    "fk_left_join",
    "enrichment",
    # A cogroup input re-keyed through a repartition topic written by both tasks.
    "cogroup_repartition",
}


# Headers compared too: the input's "letter" header (`harness.input_headers`)
# and what `headers_process` makes of it, through stateless operators, a
# processor, sinks, state (aggregations with caching off, to_table, suppress,
# windows, cogroups) and joins. Not where the final table is compared: which
# record updated a row last depends on the interleaving there.
HEADERS = set(NAMES) - {
    "table_filter_map",
    "table_group_count",
    "table_group_reduce",
    "table_group_aggregate",
    "tt_join_group_count",
    "fk_join",
    "fk_left_join",
    "enrichment",
    "global_join",
}


def _selected_names(request: pytest.FixtureRequest) -> list[str]:
    """The twins whose comparisons this session runs (`-k table_filter_map`
    runs that twin only), or all of them when a cross-twin check is selected."""
    wanted: set[str] = set()
    for item in request.session.items:
        if getattr(item, "module", None) is not request.module:
            continue
        callspec = getattr(item, "callspec", None)
        if callspec is None or "name" not in callspec.params:
            return NAMES
        wanted.add(callspec.params["name"])
    return [n for n in NAMES if n in wanted]


@pytest.fixture(scope="module")
def runs(
    bootstrap: str, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> dict[str, Run]:
    missing = peers_build.java_missing()
    if missing:
        pytest.skip(missing)
    records = generate(seed=35, count=500, keys=5, late_share=0.15)
    names = _selected_names(request)
    return run_pair(bootstrap, names, records, tmp_path_factory.mktemp("diff-dsl"), "dsl")


# Differences found and not fixed yet (docs/differential.md, "Known differences"):
# name -> reason, each run as xfail(strict=True) so that a fix makes it say so.
KNOWN: dict[str, str] = {}


@pytest.mark.parametrize(
    "name",
    [
        pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n], strict=True)) if n in KNOWN else n
        for n in NAMES
    ],
)
def test_same_output_as_kafka_streams(runs: dict[str, Run], name: str) -> None:
    run = runs[name]
    assert run.error is None, f"{name}: its wave did not run to the end: {run.error}"
    assert run.ks_records, f"{name}: Kafka Streams wrote nothing (the comparison would be empty)"
    if name in TOMBSTONES:
        assert any(m.value is None for m in run.ks_records), f"{name}: no tombstone to compare"
    problems = compare(
        run,
        timestamps=name not in VALUES_ONLY,
        final_only=name in FINAL_ONLY,
        headers=name in HEADERS,
    )
    if problems and run.py_rebalances:
        problems.append(
            f"(the runtime's app rebalanced {run.py_rebalances} time(s) after it first ran: "
            "under at_least_once it processed records after its last commit again)"
        )
    assert not problems, f"{name} differs from Kafka Streams:\n" + "\n".join(problems)


def _ran(runs: dict[str, Run], *names: str) -> None:
    """The cross-twin checks below read these twins' outputs: each must have run."""
    for name in names:
        assert runs[name].error is None, (
            f"{name}: its wave did not run to the end: {runs[name].error}"
        )


def test_the_input_exercises_session_merges_and_final_results(runs: dict[str, Run]) -> None:
    """The comparisons above mean something: in Kafka Streams' own output,
    sessions merged (retractions), and the final-result topologies held
    updates back (fewer records, no retractions)."""
    _ran(runs, "session_count", "session_count_on_close", "clickstream_sessions")
    _ran(runs, "table_suppress_time_limit", "to_table", "sliding_count_suppress", "sliding_count")
    _ran(runs, "hopping_count_on_close", "hopping_count")

    def ks(name: str) -> list[bytes | None]:
        return [m.value for m in runs[name].ks_records]

    assert ks("session_count").count(None) >= 5, "no session merges in the input"
    assert len(ks("session_count_on_close")) < len(ks("session_count")) / 2
    assert None not in ks("session_count_on_close") + ks("clickstream_sessions")
    assert 0 < len(ks("table_suppress_time_limit")) < len(ks("to_table"))
    assert 0 < len(ks("sliding_count_suppress")) < len(ks("sliding_count"))
    assert 0 < len(ks("hopping_count_on_close")) < len(ks("hopping_count")) / 2


def test_the_header_comparisons_compare_headers(runs: dict[str, Run]) -> None:
    """Kafka Streams' own output has the headers the comparisons check: the
    input's letter through an aggregation and suppression, the processor's
    rewrite, and none on session updates."""
    _ran(runs, "count", "table_suppress_time_limit", "headers_process", "session_count")

    def headers(name: str) -> set[tuple[tuple[str, bytes | None], ...]]:
        return {tuple(m.headers) for m in runs[name].ks_records}

    assert (("letter", b"L"),) in headers("count")
    assert (("letter", b"T"),) in headers("table_suppress_time_limit")
    assert any(
        len(h) == 2 and h[0] == ("letter", b"l") and h[1][0] == "length"
        for h in headers("headers_process")
    )
    assert headers("session_count") == {()}
