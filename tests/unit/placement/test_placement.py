"""Standby placement by rendezvous hashing over the published instance status."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.placement.records import (
    InstanceStatus,
    live_instances,
    standby_owners,
    standbys_for,
)

TASKS = [f"{s}_{p}" for s in range(2) for p in range(6)]


def statuses(assignment: dict[str, list[str]], ts: int = 1000) -> dict[str, InstanceStatus]:
    return {i: InstanceStatus(i, frozenset(t), timestamp_ms=ts) for i, t in assignment.items()}


def test_status_round_trip_and_garbage() -> None:
    status = InstanceStatus("a", frozenset({"0_1"}), frozenset({"0_2"}), 42)
    assert InstanceStatus.decode("a", status.encode()) == status
    assert InstanceStatus.decode("a", b"not json") is None
    assert InstanceStatus.decode("a", b"{}") is None


def test_dead_instances_are_dropped() -> None:
    view = {
        "a": InstanceStatus("a", frozenset(), timestamp_ms=0),
        "b": InstanceStatus("b", frozenset(), timestamp_ms=9_000),
    }
    assert set(live_instances(view, now_ms=12_000, timeout_ms=5_000)) == {"b"}


def test_two_instances_each_keep_the_others_tasks() -> None:
    view = statuses({"a": TASKS[:6], "b": TASKS[6:]})
    assert standbys_for("a", TASKS, view, 1) == set(TASKS[6:])
    assert standbys_for("b", TASKS, view, 1) == set(TASKS[:6])


def test_no_standbys_when_disabled_or_alone() -> None:
    view = statuses({"a": TASKS})
    assert standbys_for("a", TASKS, view, 1) == set()
    assert standbys_for("a", TASKS, statuses({"a": [], "b": TASKS}), 0) == set()


@given(
    st.integers(2, 6),
    st.integers(1, 3),
    st.lists(st.integers(0, 5), min_size=len(TASKS), max_size=len(TASKS)),
)
def test_every_task_gets_its_replicas_never_on_its_owner(
    instances: int, replicas: int, owners: list[int]
) -> None:
    names = [f"i{n}" for n in range(instances)]
    assignment: dict[str, list[str]] = {n: [] for n in names}
    for task, owner in zip(TASKS, owners, strict=True):
        assignment[names[owner % instances]].append(task)
    view = statuses(assignment)
    chosen = {n: standbys_for(n, TASKS, view, replicas) for n in names}
    for task in TASKS:
        holders = [n for n in names if task in chosen[n]]
        owner = next(n for n in names if task in assignment[n])
        assert owner not in holders
        assert len(holders) == min(replicas, instances - 1)


def test_adding_an_instance_moves_few_standbys() -> None:
    before = standby_owners("0_3", "a", ["a", "b", "c"], 1)
    after = standby_owners("0_3", "a", ["a", "b", "c", "d"], 1)
    # Rendezvous hashing: the standby moves only if the newcomer ranks first.
    assert after == before or after == ["d"]
