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


def daemon_statuses(
    daemons: dict[str, str], active: dict[str, list[str]]
) -> dict[str, InstanceStatus]:
    """instance -> daemon ("" for a plain instance), instance -> its active tasks."""
    return {
        i: InstanceStatus(i, frozenset(active.get(i, [])), timestamp_ms=1000, daemon=d)
        for i, d in daemons.items()
    }


def test_status_round_trip_keeps_the_daemon_and_reads_old_records() -> None:
    status = InstanceStatus("a-p0-x", frozenset({"0_1"}), timestamp_ms=42, daemon="a-y")
    assert InstanceStatus.decode("a-p0-x", status.encode()) == status
    assert status.machine == "a-y"
    old = InstanceStatus.decode("b", b'{"active":["0_1"],"ts":1}')
    assert old is not None and old.daemon == "" and old.machine == "b"


def test_no_standby_on_the_actives_daemon_and_one_per_other_daemon() -> None:
    # Daemon A runs p0 and p1; b is a plain instance, c another one.
    daemons = {"a0": "A", "a1": "A", "b": "", "c": ""}
    view = daemon_statuses(daemons, {"a0": ["0_0", "0_1"], "a1": ["0_2"], "b": ["0_3"]})
    for replicas in (1, 2, 3):
        chosen = {i: standbys_for(i, ["0_0", "0_1", "0_2", "0_3"], view, replicas) for i in daemons}
        for task in ("0_0", "0_1", "0_2"):  # active on A: never a standby in a0 or a1
            holders = [i for i in daemons if task in chosen[i]]
            assert not {"a0", "a1"} & set(holders)
            assert len(holders) == min(replicas, 2)  # b and c
        holders = [i for i in daemons if "0_3" in chosen[i]]
        # Active on b: at most one of A's two processes keeps it.
        assert len({"a0", "a1"} & set(holders)) == 1
        assert len(holders) == min(replicas, 2)


@given(
    st.dictionaries(
        st.sampled_from([f"i{n}" for n in range(8)]), st.sampled_from(["", "D1", "D2"]), min_size=1
    ),
    st.integers(1, 3),
    st.data(),
)
def test_standbys_land_on_distinct_daemons_other_than_the_actives(
    daemons: dict[str, str], replicas: int, data: st.DataObject
) -> None:
    names = sorted(daemons)
    owners = {t: data.draw(st.sampled_from(names)) for t in TASKS}
    view = daemon_statuses(daemons, {i: [t for t, o in owners.items() if o == i] for i in names})
    chosen = {i: standbys_for(i, TASKS, view, replicas) for i in names}
    for task, owner in owners.items():
        holders = [i for i in names if task in chosen[i]]
        held_on = [view[i].machine for i in holders]
        assert view[owner].machine not in held_on
        assert len(set(held_on)) == len(held_on)  # one copy a daemon
        others = {view[i].machine for i in names} - {view[owner].machine}
        assert len(holders) == min(replicas, len(others))


@given(
    st.lists(st.sampled_from([f"i{n}" for n in range(8)]), min_size=1, unique=True),
    st.integers(0, 4),
)
def test_without_shared_daemons_placement_is_plain_rendezvous(
    names: list[str], replicas: int
) -> None:
    for task in TASKS:
        assert standby_owners(task, names[0], names, replicas, {n: n for n in names}) == (
            standby_owners(task, names[0], names, replicas)
        )
