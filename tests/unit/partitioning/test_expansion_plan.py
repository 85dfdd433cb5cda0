"""The expansion plan: which topics grow to what, downstream first (no broker)."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from runtime import StreamsBuilder, serdes
from runtime.partitioning.expansion_plan import downstream_user_topics, plan_expansion

APP = "app"
S, J = serdes.STRING, serdes.JSON


def counting() -> Any:
    """in -> group_by (repartition 'by') -> count (changelog) -> out; and in -> copy."""
    builder = StreamsBuilder()
    stream = builder.stream("in", key_serde=S, value_serde=S)
    stream.to("copy")
    stream.group_by(lambda k, v: v, key_serde=S, name="by").count(store="c").to_stream().to(
        "out", value_serde=serdes.INT64
    )
    return builder.build()


def chained() -> Any:
    """in -> repartition 'r1' -> map -> repartition 'r2' (fixed 3) -> count -> out."""
    builder = StreamsBuilder()
    (
        builder.stream("in", key_serde=S, value_serde=S)
        .repartition(name="r1")
        .map_values(str.upper)
        .repartition(name="r2", partitions=3)
        .group_by_key()
        .count(store="c2")
        .to_stream()
        .to("out", value_serde=serdes.INT64)
    )
    return builder.build()


def joined() -> Any:
    builder = StreamsBuilder()
    table = builder.table("tab", key_serde=S, value_serde=S)
    builder.stream("in", key_serde=S, value_serde=S).join(table, lambda v, t: v).to("out")
    return builder.build()


def settled(topology: Any, count: int) -> dict[str, int]:
    """Counts as the runtime creates them at start-up with `count` partitions."""
    return plan_expansion(topology, APP, {"in": count, "copy": count, "out": count}).counts


def test_internal_topics_follow_a_grown_input_changelog_before_repartition() -> None:
    topology = counting()
    current = settled(topology, 4)
    assert current[f"{APP}-by-repartition"] == 4 and current[f"{APP}-c-changelog"] == 4
    plan = plan_expansion(topology, APP, {**current, "in": 8})
    assert plan.levels == [[(f"{APP}-c-changelog", 8)], [(f"{APP}-by-repartition", 8)]]
    assert plan.mismatches == []
    # Once done, nothing is left to grow.
    assert plan_expansion(topology, APP, plan.counts).empty


def test_the_command_grows_outputs_first_and_the_input_last() -> None:
    topology = counting()
    current = settled(topology, 4)
    downstream, partners = downstream_user_topics(topology, "in")
    assert downstream == ["copy", "out"] and partners == []
    wanted = dict.fromkeys(["in", *downstream], 8)
    levels = [
        [t for t, _ in level] for level in plan_expansion(topology, APP, current, wanted).levels
    ]
    assert levels == [["copy", "out"], [f"{APP}-c-changelog"], [f"{APP}-by-repartition"], ["in"]]


def test_a_fixed_repartition_count_stays_and_bounds_what_follows() -> None:
    topology = chained()
    current = settled(topology, 4)
    assert current[f"{APP}-r2-repartition"] == 3 and current[f"{APP}-c2-changelog"] == 3
    plan = plan_expansion(topology, APP, {**current, "in": 8})
    assert plan.growing() == {f"{APP}-r1-repartition": 8}


def test_joined_topics_with_different_counts_are_reported() -> None:
    topology = joined()
    current = settled(topology, 2) | {"tab": 2}
    plan = plan_expansion(topology, APP, {**current, "in": 4})
    assert len(plan.mismatches) == 1
    assert "in=4" in plan.mismatches[0] and "tab=2" in plan.mismatches[0]
    assert downstream_user_topics(topology, "in") == (["out"], ["tab"])
    assert plan_expansion(topology, APP, {**current, "in": 4, "tab": 4}).mismatches == []


@given(start=st.integers(1, 16), grow_by=st.integers(0, 16), fixed_seed=st.booleans())
def test_a_plan_is_complete_ordered_and_never_shrinks(
    start: int, grow_by: int, fixed_seed: bool
) -> None:
    topology = chained() if fixed_seed else counting()
    current = settled(topology, start)
    plan = plan_expansion(topology, APP, current, {"in": start + grow_by, "out": start + grow_by})
    position = {t: i for i, level in enumerate(plan.levels) for t, _ in level}
    assert sum(len(level) for level in plan.levels) == len(position), "each topic once"
    assert all(plan.counts[t] >= n for t, n in current.items())
    assert plan_expansion(topology, APP, plan.counts).empty
    for sub in topology.subtopologies:
        sources = [f"{APP}-{s.name}" if s.internal else s.name for s in sub.sources]
        for store in sub.store_specs:
            changelog = f"{APP}-{store.name}-changelog"
            for source in sources:
                if changelog in position and source in position:
                    assert position[changelog] < position[source], (changelog, source)
    if "in" in position:
        assert position["in"] == len(plan.levels) - 1, "the input grows last"
