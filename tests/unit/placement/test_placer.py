"""The placer's decisions in named situations (runtime.placement.placer), and the
records it exchanges (runtime.placement.records). Random schedules are in
tests/property/test_placer_schedules.py."""

from __future__ import annotations

import pytest

from runtime.config import ConfigError, StreamsConfig
from runtime.placement.placer import Member, PlacerSettings, may_take, next_plan
from runtime.placement.records import InstanceStatus, PlacementPlan

STATELESS = {"0_0": False, "0_1": False}
STATEFUL = {"1_0": True, "1_1": True}
CONFIG = PlacerSettings(acceptable_lag=100, max_warmups=1)


def test_first_plan_gives_every_task_to_the_only_instance() -> None:
    plan = next_plan(PlacementPlan(), {"a": Member("a")}, STATELESS | STATEFUL, CONFIG, "a")
    assert plan.version == 1
    assert plan.owners == dict.fromkeys(STATELESS | STATEFUL, "a")


def test_a_stateless_task_is_withdrawn_then_given_after_the_release_is_acknowledged() -> None:
    one = PlacementPlan(1, "a", {"0_0": "a", "0_1": "a"})
    members = {"a": Member("a", active=frozenset(one.owners), acked=1), "b": Member("b", acked=1)}
    two = next_plan(one, members, STATELESS, CONFIG, "a")
    moved = set(two.moves)
    assert len(moved) == 1 and set(two.owners) == set(STATELESS) - moved
    (task,) = moved
    # a has not acknowledged plan 2 yet: the task stays without owner.
    assert next_plan(two, members, STATELESS, CONFIG, "a") is two
    released = {"a": Member("a", active=frozenset(two.owners), acked=2), "b": Member("b", acked=2)}
    three = next_plan(two, released, STATELESS, CONFIG, "a")
    assert three.owners[task] == "b" and not three.moves


def test_a_stateful_task_is_learned_before_it_moves() -> None:
    one = PlacementPlan(1, "a", {"1_0": "a", "1_1": "a"})
    members = {"a": Member("a", active=frozenset(one.owners), acked=1), "b": Member("b", acked=1)}
    two = next_plan(one, members, STATEFUL, CONFIG, "a")
    assert two.owners == one.owners and len(two.learners) == 1  # max.warmup.replicas
    (task,) = two.learners
    behind = members | {"b": Member("b", lags={task: 101}, acked=2)}
    assert next_plan(two, behind, STATEFUL, CONFIG, "a") is two
    caught_up = members | {"b": Member("b", lags={task: 100}, acked=2)}
    three = next_plan(two, caught_up, STATEFUL, CONFIG, "a")
    assert three.moves == {task: "b"} and task not in three.owners


def test_a_stateful_task_moves_between_processes_of_one_daemon_without_a_learner() -> None:
    """They share the state directory: the new owner opens what the old one
    released (a learner would wait for the owner's directory lock); another
    daemon's instance still learns first."""
    one = PlacementPlan(1, "p0", {"1_0": "p0", "1_1": "p0"})
    members = {
        "p0": Member("p0", active=frozenset(one.owners), acked=1, machine="d"),
        "p1": Member("p1", acked=1, machine="d"),
    }
    two = next_plan(one, members, STATEFUL, CONFIG, "p0")
    assert not two.learners and len(two.moves) == 1 and set(two.moves.values()) == {"p1"}
    elsewhere = members | {"p1": Member("p1", acked=1, machine="other")}
    assert next_plan(one, elsewhere, STATEFUL, CONFIG, "p0").learners


def test_an_owner_out_of_the_group_is_fenced_so_its_task_moves_at_once() -> None:
    one = PlacementPlan(1, "a", {"1_0": "a", "1_1": "b"})
    members = {
        "a": Member("a", active=frozenset({"1_0"}), acked=1),
        "b": Member("b", active=frozenset({"1_1"}), acked=1, in_group=False),
    }
    two = next_plan(one, members, STATEFUL, CONFIG, "a")
    assert two.owners == {"1_0": "a", "1_1": "a"}


def test_may_take_waits_for_every_instance_in_the_group_to_acknowledge() -> None:
    plan = PlacementPlan(3, "a", {}, moves={"0_0": "b"})
    slow = {"a": Member("a", acked=2), "b": Member("b", acked=3)}
    assert not may_take("0_0", "b", plan, slow)
    assert may_take("0_0", "b", plan, slow | {"a": Member("a", acked=2, in_group=False)})
    holding = {"a": Member("a", acked=3, active=frozenset({"0_0"})), "b": Member("b")}
    assert not may_take("0_0", "b", plan, holding)


def test_leaving_instance_gets_nothing() -> None:
    one = PlacementPlan(1, "a", {"0_0": "a", "0_1": "b"})
    members = {
        "a": Member("a", active=frozenset({"0_0"}), acked=1, leaving=True),
        "b": Member("b", active=frozenset({"0_1"}), acked=1),
    }
    two = next_plan(one, members, STATELESS, CONFIG, "b")
    assert two.moves == {"0_0": "b"}


def test_records_round_trip_and_old_statuses_still_read() -> None:
    plan = PlacementPlan(7, "a", {"0_0": "a"}, {"1_0": "b"}, {"0_1": "b"}, frozenset({"c"}), 5)
    assert PlacementPlan.decode(plan.encode()) == plan
    assert PlacementPlan.decode(b"{") is None
    status = InstanceStatus("a", frozenset({"0_0"}), frozenset(), 1, "m-1", 4, {"1_0": 3}, 7, True)
    assert InstanceStatus.decode("a", status.encode()) == status
    old = InstanceStatus.decode("a", b'{"active":["0_0"],"standby":[],"ts":1}')
    assert old is not None and old.plan_version == 0 and old.capacity == 1


def test_config_keys() -> None:
    config = StreamsConfig.from_dict(
        {"application.id": "x", "bootstrap.servers": "h:9092", "task.assignment": "runtime"}
    )
    assert (config.task_assignment, config.acceptable_recovery_lag) == ("runtime", 10000)
    assert config.max_warmup_replicas == 2
    with pytest.raises(ConfigError, match="task.assignment"):
        StreamsConfig.from_dict(
            {"application.id": "x", "bootstrap.servers": "h:9092", "task.assignment": "sticky"}
        )
    with pytest.raises(ConfigError, match="classic group protocol"):
        StreamsConfig.from_dict(
            {
                "application.id": "x",
                "bootstrap.servers": "h:9092",
                "task.assignment": "runtime",
                "consumer.group.protocol": "consumer",
            }
        )
    with pytest.raises(ConfigError, match="max.warmup.replicas"):
        StreamsConfig.from_dict(
            {"application.id": "x", "bootstrap.servers": "h:9092", "max.warmup.replicas": 0}
        )


def test_scale_down_request_is_checked_before_anything_is_written() -> None:
    from runtime.commands.scale_down import ScaleDownError, request_scale_down

    base = {"application.id": "x", "bootstrap.servers": "h:9092"}
    runtime_placed = StreamsConfig.from_dict({**base, "task.assignment": "runtime"})
    for fraction in (0.0, 1.0, -0.5, 2.0):
        with pytest.raises(ScaleDownError, match="--fraction"):
            request_scale_down(runtime_placed, fraction)
    with pytest.raises(ScaleDownError, match="task.assignment=runtime"):
        request_scale_down(StreamsConfig.from_dict(base), 0.5)
