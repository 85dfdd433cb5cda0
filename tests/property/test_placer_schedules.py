"""The placer (runtime.placement.placer) under random schedules.

A small simulation plays the protocol of docs/architecture.md ("Runtime-owned
task placement"): the placer computes plans from the statuses it has seen;
each instance applies the newest plan when it gets its turn (release what it
lost, acknowledge, take what it was given) and publishes its status later,
so the placer works on stale views; instances join, ask to leave, crash (out
of the group, their tasks left running: a zombie, which the broker fences),
and learners catch up. After every step, the issue's invariants hold.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.placement.placer import Member, PlacerSettings, next_plan, subtopology_of
from runtime.placement.records import PlacementPlan

TASKS = {**{f"0_{p}": False for p in range(4)}, **{f"1_{p}": True for p in range(6)}}
FAR = 10**9


@dataclass
class Instance:
    """One simulated instance: what it really runs, and what it published."""

    id: str
    capacity: int
    in_group: bool = True
    leaving: bool = False
    active: set[str] = field(default_factory=set)
    applied: int = 0
    copies: dict[str, int] = field(default_factory=dict)  # task -> lag
    published: Member | None = None

    def publish(self) -> None:
        self.published = Member(
            self.id,
            self.capacity,
            frozenset(self.active),
            dict(self.copies),
            self.applied,
            self.leaving,
        )

    def apply(self, plan: PlacementPlan) -> None:
        if plan.version <= self.applied:
            return
        mine = plan.tasks_of(self.id)
        self.active &= mine  # release (committed and closed) ...
        self.applied = plan.version  # ... acknowledge ...
        for task in mine - self.active:  # ... take
            self.active.add(task)
            self.copies.pop(task, None)
        learn = plan.copies_for(self.id)
        self.copies = {t: lag for t, lag in self.copies.items() if t in learn}
        for task in learn - set(self.copies) - self.active:
            self.copies[task] = FAR


class Cluster:
    def __init__(self, capacities: list[int], config: PlacerSettings) -> None:
        self.config = config
        self.instances = {f"i{n}": Instance(f"i{n}", c) for n, c in enumerate(capacities)}
        self.plan = PlacementPlan()
        self.next_id = len(capacities)
        for instance in self.instances.values():
            instance.publish()

    def members(self) -> dict[str, Member]:
        """The placer's view: published statuses, membership from the group."""
        return {
            i: replace(x.published, in_group=x.in_group)
            for i, x in self.instances.items()
            if x.published is not None
        }

    def place(self) -> None:
        previous, members = self.plan, self.members()
        plan = next_plan(previous, members, TASKS, self.config, "placer")
        self.check_plan(previous, plan, members)
        self.plan = plan

    def check_plan(
        self, previous: PlacementPlan, plan: PlacementPlan, members: dict[str, Member]
    ) -> None:
        assert len(plan.learners) <= self.config.max_warmups
        assert plan.version in (previous.version, previous.version + 1)
        for task, owner in previous.owners.items():
            if owner in members and members[owner].in_group:
                # An owner in the group is only ever withdrawn, never replaced.
                assert plan.owners.get(task) in (owner, None), (task, owner, plan)
                if plan.owners.get(task) is None and TASKS[task]:
                    target = plan.moves[task]
                    lag = members[target].lags.get(task, math.inf)
                    assert lag <= self.config.acceptable_lag, (task, target, lag)
        for task, owner in plan.owners.items():
            assert self.instances[owner].in_group or previous.owners.get(task) == owner

    def check_owners(self) -> None:
        """Never two instances of the group running one task."""
        for task in TASKS:
            holders = [x.id for x in self.instances.values() if x.in_group and task in x.active]
            assert len(holders) <= 1, (task, holders, self.plan)

    def step(self, action: tuple[str, int]) -> None:
        kind, n = action
        ids = sorted(self.instances)
        x = self.instances[ids[n % len(ids)]]
        if kind == "place":
            self.place()
        elif kind == "apply" and x.in_group:
            x.apply(self.plan)
        elif kind == "publish" and x.in_group:
            x.publish()
        elif kind == "catch_up" and x.copies:
            task = sorted(x.copies)[n % len(x.copies)]
            x.copies[task] = 0
        elif kind == "join" and len(self.instances) < 5:
            new = Instance(f"i{self.next_id}", 1 + n % 3)
            self.next_id += 1
            new.publish()
            self.instances[new.id] = new
        elif kind == "leave":
            x.leaving = True
        elif kind == "crash" and sum(i.in_group for i in self.instances.values()) > 1:
            x.in_group = False  # a zombie: still "runs" its tasks, fenced
        elif kind == "rejoin" and not x.in_group and len(self.instances) < 8:
            # Membership lost: every task closed dirty, and the process goes
            # on under a new instance id (PlanFollower.renew_identity);
            # the old id's last status stays behind, out of the group.
            x.active.clear()
            x.copies.clear()
            new = Instance(f"i{self.next_id}", x.capacity)
            self.next_id += 1
            new.publish()
            self.instances[new.id] = new
        self.check_owners()

    def settle(self, rounds: int = 40) -> None:
        """Everyone in the group applies, catches up and publishes until the plan stands."""
        for _ in range(rounds):
            before = self.plan.version
            all_acked = all(
                x.published is not None and x.published.acked == before
                for x in self.instances.values()
                if x.in_group
            )
            self.place()
            if all_acked and self.plan.version == before:
                return  # everyone applied the plan, and the placer has nothing to change
            for x in self.instances.values():
                if x.in_group:
                    x.apply(self.plan)
                    x.copies = dict.fromkeys(x.copies, 0)
                    x.publish()
                self.check_owners()
        raise AssertionError(f"no stable plan after {rounds} rounds: {self.plan}")

    def running(self) -> set[str]:
        return set().union(*(x.active for x in self.instances.values() if x.in_group))


ACTIONS = st.tuples(
    st.sampled_from(
        [
            "place",
            "place",
            "apply",
            "apply",
            "publish",
            "publish",
            "catch_up",
            "join",
            "leave",
            "crash",
            "rejoin",
        ]
    ),
    st.integers(0, 20),
)
CONFIG = st.builds(
    PlacerSettings, acceptable_lag=st.sampled_from([0, 100]), max_warmups=st.integers(1, 3)
)


@settings(max_examples=300, deadline=None)
@given(
    capacities=st.lists(st.integers(1, 4), min_size=1, max_size=3),
    actions=st.lists(ACTIONS, max_size=80),
    config=CONFIG,
)
def test_never_two_owners_and_moves_only_to_caught_up_copies(
    capacities: list[int], actions: list[tuple[str, int]], config: PlacerSettings
) -> None:
    cluster = Cluster(capacities, config)
    for action in actions:
        cluster.step(action)
    # And whatever happened, the group converges to a placement of every task.
    if any(x.in_group and not x.leaving for x in cluster.instances.values()):
        cluster.settle()
        assert set(cluster.plan.owners) == set(TASKS), cluster.plan
        assert cluster.running() == set(TASKS), cluster.plan


@settings(max_examples=200, deadline=None)
@given(capacities=st.lists(st.integers(1, 4), min_size=1, max_size=4), config=CONFIG)
def test_stable_placement_is_balanced_by_capacity(
    capacities: list[int], config: PlacerSettings
) -> None:
    cluster = Cluster(capacities[:1], config)
    cluster.settle()
    for capacity in capacities[1:]:  # scale out one by one, as in production
        cluster.step(("join", capacity - 1))
        cluster.settle()
    total = sum(x.capacity for x in cluster.instances.values())
    for group in {subtopology_of(t) for t in TASKS}:
        size = sum(1 for t in TASKS if subtopology_of(t) == group)
        for x in cluster.instances.values():
            count = sum(1 for t in x.active if subtopology_of(t) == group)
            share = size * x.capacity / total
            # Never idle while its share is a whole task or more: with 4 tasks
            # and 3 equal members, 2:2:0 keeps every count under the ceiling
            # and left the third member idle (found by a prepare-leave test).
            assert math.floor(share) <= count <= math.ceil(share), (group, x.id, count)
    assert cluster.running() == set(TASKS)


def test_leaving_instance_ends_with_nothing_after_its_tasks_were_learned() -> None:
    cluster = Cluster([2, 2], PlacerSettings(acceptable_lag=0, max_warmups=2))
    cluster.settle()
    leaver = cluster.instances["i0"]
    assert leaver.active
    leaver.leaving = True
    leaver.publish()
    cluster.place()
    # Stateful tasks are learned first: still owned by the leaver.
    stateful = {t for t in leaver.active if TASKS[t]}
    assert stateful and stateful <= {t for t, o in cluster.plan.owners.items() if o == "i0"}
    assert cluster.plan.learners
    cluster.settle()
    assert not leaver.active
    assert cluster.instances["i1"].active == set(TASKS)
