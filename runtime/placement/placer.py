"""The placer's decision: the next placement plan from what the instances publish.

Pure functions, no Kafka, no clock; any thread may call (the polling thread of
the instance that is the placer does). docs/architecture.md, "Runtime-owned
task placement", has the protocol; this module is the part that must never
be wrong, so the hand-over safety rule lives here and is hypothesis-tested
(tests/property/test_placer_schedules.py):

- A task changes owner only through a plan where it has no owner: the old
  owner is withdrawn first. A plan gives an ownerless task to an instance only
  when every other instance in the group acknowledged the previous plan (which
  had no owner for it) and lists it as not active, or the old holder is out of
  the group (the broker fences its commits).
- A stateful task is withdrawn from an owner in the group only when the target
  holds a copy within `acceptable_lag` of the changelog's end; until then the
  target learns it, at most `max_warmups` learners per plan. Between processes
  of one daemon (`Member.machine`) it is withdrawn at once: they share the
  state directory.
- Balanced per subtopology by task count, in proportion to capacity
  (processing threads); leaving instances get nothing; otherwise sticky.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field

from runtime.placement.records import PlacementPlan


@dataclass(frozen=True)
class Member:
    """What the placer knows of one instance (its last status, and the group)."""

    instance_id: str
    capacity: int = 1
    active: frozenset[str] = frozenset()
    lags: Mapping[str, int] = field(default_factory=dict)  # task -> lag of its copy here
    acked: int = 0  # the newest plan version it applied
    leaving: bool = False
    in_group: bool = True
    # The daemon it is a processing process of ("": an instance of its own).
    # Processes of one daemon share the state directory, so a task moving
    # between them needs no learner: the new owner opens the directory the
    # old one released and restores the tail; a learner there would wait for
    # the owner's directory lock instead (runtime.state.task_lock).
    machine: str = ""

    @property
    def host(self) -> str:
        return self.machine or self.instance_id


@dataclass(frozen=True)
class PlacerSettings:
    acceptable_lag: int = 10_000
    max_warmups: int = 2


def subtopology_of(task_id: str) -> str:
    return task_id.split("_", 1)[0]


def next_plan(
    previous: PlacementPlan,
    members: Mapping[str, Member],
    tasks: Mapping[str, bool],
    settings: PlacerSettings,
    placer: str,
) -> PlacementPlan:
    """The plan that follows `previous`, or `previous` itself when nothing changes.

    `tasks` maps every task id to whether it is stateful (changelogged
    persistent stores). `members` holds every instance with a status; those
    `in_group=False` are out of the group's current generation.
    """
    in_group = {i for i, m in members.items() if m.in_group}
    current = {t: o for t, o in previous.owners.items() if o in in_group and t in tasks}
    targets = balance(tasks, current, members, previous, settings.acceptable_lag)
    owners: dict[str, str] = {}
    moves: dict[str, str] = {}
    wanted_learners: list[tuple[int, str, str]] = []
    for task in sorted(tasks):
        target, owner = targets.get(task), current.get(task)
        if owner is not None:
            if target is None or target == owner:
                owners[task] = owner
            elif (
                not tasks[task]
                or _same_daemon(members, owner, target)
                or _caught_up(members[target], task, settings)
            ):
                moves[task] = target  # withdrawn: the owner releases it
            else:
                owners[task] = owner
                keep = 0 if previous.learners.get(task) == target else 1
                wanted_learners.append((keep, task, target))
        elif target is not None:
            if may_take(task, target, previous, members):
                owners[task] = target
            else:
                moves[task] = target
    learners = {task: target for _, task, target in sorted(wanted_learners)[: settings.max_warmups]}
    if (owners, learners, moves) == (previous.owners, previous.learners, previous.moves):
        return previous
    return PlacementPlan(
        previous.version + 1, placer, owners, learners, moves, previous.leave, previous.leave_ms
    )


def may_take(task: str, taker: str, previous: PlacementPlan, members: Mapping[str, Member]) -> bool:
    """The hand-over safety rule, for a task without an owner in the group.

    Every other instance in the group must have applied `previous` (where the
    task had no owner in the group, so they released it) and say it does not
    run it. Instances out of the group are fenced by the broker (rule (b)).
    """
    for instance_id, member in members.items():
        if instance_id == taker or not member.in_group:
            continue
        if member.acked < previous.version or task in member.active:
            return False
    return True


def _same_daemon(members: Mapping[str, Member], owner: str, target: str) -> bool:
    """Both processes of one daemon: the target takes the owner's directory."""
    mine, theirs = members.get(owner), members.get(target)
    return mine is not None and theirs is not None and mine.host == theirs.host


def _caught_up(member: Member, task: str, settings: PlacerSettings) -> bool:
    lag = member.lags.get(task)
    return lag is not None and lag <= settings.acceptable_lag


def balance(
    tasks: Mapping[str, bool],
    current: Mapping[str, str],
    members: Mapping[str, Member],
    previous: PlacementPlan,
    acceptable_lag: int,
) -> dict[str, str]:
    """Target owner per task: per subtopology, counts in proportion to capacity.

    Sticky: an owner keeps its tasks up to its quota; the tasks it keeps are
    those hardest to move (stateful without a copy elsewhere), so the ones
    another instance already learned, or stateless ones, move first.
    """
    eligible = sorted(
        i for i, m in members.items() if m.in_group and not m.leaving and m.capacity > 0
    )
    if not eligible:
        return {}
    capacity = {i: members[i].capacity for i in eligible}
    groups: dict[str, list[str]] = {}
    for task in sorted(tasks):
        groups.setdefault(subtopology_of(task), []).append(task)
    totals = dict.fromkeys(eligible, 0)
    targets: dict[str, str] = {}

    def ease(task: str) -> int:
        """How cheap moving `task` is: stateless 3, a caught-up copy 2, learning 1."""
        if not tasks[task]:
            return 3
        holders = [m for i, m in members.items() if i in capacity and i != current.get(task)]
        if any(m.lags.get(task, math.inf) <= acceptable_lag for m in holders):
            return 2
        return 1 if task in previous.learners or task in previous.moves else 0

    for group in groups.values():
        quota = _Quota(len(group), capacity)
        counts = quota.counts
        unplaced = []
        for task in sorted(group, key=lambda t: (ease(t), t)):
            owner = current.get(task)
            if owner in counts and quota.has_room(owner):
                targets[task] = owner
                quota.take(owner)
            else:
                unplaced.append(task)
        for task in sorted(unplaced, key=lambda t: (-ease(t), t)):
            # Members below their floor first: an extra never goes where a
            # floor would then stay unfilled.
            choice = min(
                quota.below_floor() or [i for i in eligible if quota.has_room(i)],
                key=lambda i: (
                    counts[i] / capacity[i],
                    members[i].lags.get(task, math.inf),
                    previous.moves.get(task) != i and previous.learners.get(task) != i,
                    totals[i] / capacity[i],
                    i,
                ),
            )
            targets[task] = choice
            quota.take(choice)
        for i in eligible:
            totals[i] += counts[i]
    return targets


class _Quota:
    """How many tasks of one subtopology each member may take.

    Each gets the whole part of its capacity's share (its floor) and some
    one task beyond it, as many as the floors leave over. Ceilings alone
    let 4 tasks sit 2:2:0 on three equal members (found by a prepare-leave
    test: the third member stayed idle).
    """

    def __init__(self, tasks: int, capacity: Mapping[str, int]) -> None:
        total = sum(capacity.values())
        share = {i: tasks * c / total for i, c in capacity.items()}
        self.floor = {i: math.floor(s) for i, s in share.items()}
        self._can_exceed = {i for i, s in share.items() if s > self.floor[i]}
        self._extras = tasks - sum(self.floor.values())
        self.counts = dict.fromkeys(capacity, 0)

    def has_room(self, member: str) -> bool:
        count, floor = self.counts[member], self.floor[member]
        return count < floor or (self._extras > 0 and count == floor and member in self._can_exceed)

    def below_floor(self) -> list[str]:
        """Members short of their floor: they come first, so an extra never
        goes where a floor would then stay unfilled."""
        return sorted(i for i, c in self.counts.items() if c < self.floor[i])

    def take(self, member: str) -> None:
        if self.counts[member] >= self.floor[member]:
            self._extras -= 1
        self.counts[member] += 1
