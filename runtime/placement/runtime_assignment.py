"""Runtime-owned task placement (`task.assignment=runtime`): the polling thread's part.

The protocol is in docs/architecture.md ("Runtime-owned task placement"); the
decision itself is `runtime.placement.placer` (pure). `RuntimeAssignment` is
the small coordinator the polling thread calls: it joins the group on the
one-partition status topic only (whoever owns its partition 0 is the placer),
and routes the polling thread's events to two roles:

- `PlanFollower` (`plan_follower`): every instance's side: follows the newest
  plan (release, acknowledge, take, learn), publishes the status, leaves,
  holds the identity its tasks were taken under;
- `PlacerRole` (`placer_role`): on the elected instance only: computes and
  publishes the next plan from the statuses and the group's membership.

What only the coordinator does: the rebalance callbacks (`on_assign`,
`on_revoke`, `on_lost`), the membership check that ties the two roles
together (a lost membership drops every task and steps the placer down;
`check_membership`, every loop turn, in the rebalance callbacks and before
every commit), the order of one loop turn (`tick`), and the figures other
threads read (`figures`: one immutable `PlacementFigures`, replaced whole).

Processing and state code do not know where an assignment came from: tasks
are created and closed through `ActiveTasks` as with the group's assignor.
Commits go through the polling thread's commit protocol (`TaskLifecycle`,
with the `Committer`'s task locks), so an aborted transaction rewinds every
task as for any other commit.

Polling thread only, except `request_leave` and `figures` (any thread).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import TopicPartition

from runtime.logging import get_logger
from runtime.placement.parts import Handovers, PollingSide, RuntimePlacementSettings
from runtime.placement.placer_role import PlacerRole
from runtime.placement.plan_follower import PlanFollower
from runtime.placement.records import PlacementPlan

log = get_logger("runtime.placement")


@dataclass(frozen=True)
class PlacementFigures:
    """What runtime-owned placement tells other threads (status, `admin
    tasks`), as of the end of a loop turn or rebalance callback."""

    placer: bool = False
    plan: PlacementPlan = field(default_factory=PlacementPlan)
    applied: int = 0
    leaving: bool = False
    handovers: int = 0
    last_handover_pause_s: float | None = None
    max_handover_pause_s: float = 0.0


class RuntimeAssignment:
    """Routes the polling thread's events to the plan follower and, when this
    instance owns the coordination partition, the placer. Polling thread only
    (see the module docstring)."""

    def __init__(
        self, settings: RuntimePlacementSettings, polling: PollingSide, handovers: Handovers
    ) -> None:
        self._polling = polling
        self._handovers = handovers
        self.coordination = TopicPartition(polling.standbys.status_topic, 0)
        self.follower = PlanFollower(
            settings.instance_id, polling, handovers, self.check_membership
        )
        self.placer = PlacerRole(settings, polling, handovers.status, self.coordination)
        # Set by the polling thread before it closes the consumer: the member
        # id then goes with the LeaveGroup, which is no lost membership (the
        # final commit is done, and the handle refuses calls meanwhile).
        self.closing = False
        self._figures = PlacementFigures()

    # --- what the polling thread and the tests ask of it -------------------------------

    @property
    def instance_id(self) -> str:
        """The identity tasks are held under (renewed after a lost membership)."""
        return self.follower.instance_id

    @property
    def plan(self) -> PlacementPlan:
        """The newest plan known here."""
        return self.follower.plan

    @property
    def is_placer(self) -> bool:
        return self.placer.is_placer

    def request_leave(self) -> None:
        """`admin prepare-leave`: hand every task over, then stop. Any thread."""
        self.follower.request_leave()

    def reconcile_copies(self) -> None:
        """The standbys kept here toward the plan's learners and moves."""
        self.follower.reconcile_copies()

    def stop_cleanly(self, commit_all: Callable[[str], bool], joined: bool) -> None:
        """A clean stop: the final commit, then the status tombstone."""
        self.follower.stop_cleanly(commit_all, joined)

    # --- rebalance callbacks (polling thread, inside consume) ------------------------

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        """The coordination partition: we are the placer (once we read the topic).

        Also where an identity learns its member id: after a successful
        join, `memberid()` is the group's id for this generation."""
        self.placer.membership_changed()
        self.check_membership()
        self.follower.adopt_member_id()
        self._polling.consumer.incremental_assign(partitions)
        if any(self._is_coordination(tp) for tp in partitions):
            self.placer.elected(self.follower.instance_id)
        self._publish()

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        """Losing the coordination partition: no more plans from here.

        librdkafka reports a lost membership (session timed out) as a plain
        revocation when the application called `incremental_(un)assign`
        between the loss and the callback, as the follower does for data
        partitions: the member id, reset by then, tells them apart."""
        self.placer.membership_changed()
        self.check_membership()
        if any(self._is_coordination(tp) for tp in partitions):
            self.placer.step_down("revoked")
        self._publish()

    def on_lost(self) -> None:
        """The group moved on without us: every task closed dirty, at once."""
        log.warning("group_membership_lost", tasks=sorted(self._polling.tasks.ids()))
        self.placer.membership_changed()
        self.placer.step_down("lost")
        self.follower.drop_all("membership lost")
        self.follower.mark_dirty()
        self._publish()

    def check_membership(self) -> bool:
        """Drop every task if the membership they were taken under is gone.

        A member id other than the identity's (empty once librdkafka saw the
        session time out, a new one after it rejoined) is a lost membership,
        whichever callback reported it, if any: the broker fences commits of
        the old member, but not those a rejoined member would make for tasks
        the placer has since given to others. Called every loop turn, from
        the rebalance callbacks and before every commit (polling thread).
        True if the tasks were dropped (the identity renewed).
        """
        if self.closing or not self.follower.membership_lost():
            return False
        self.placer.step_down("member id changed")
        self.follower.drop_all("member id changed")  # renews the identity
        return True

    # --- the loop turn ------------------------------------------------------------

    def tick(self) -> None:
        """Once per loop turn: membership check, the newest plan, status, placing."""
        self.check_membership()
        follower = self.follower
        follower.follow()
        now = time.monotonic()
        follower.maybe_publish_status(now)
        if self.placer.due(now):
            plan = self.placer.place(follower.local_view())
            if plan is not None:
                follower.published(plan)
        follower.maybe_leave()
        self._publish()

    def _is_coordination(self, tp: TopicPartition) -> bool:
        return tp.topic == self.coordination.topic and tp.partition == 0

    # --- figures ----------------------------------------------------------------------

    def _publish(self) -> None:
        follower = self.follower
        self._figures = PlacementFigures(
            self.placer.is_placer,
            follower.plan,
            follower.applied,
            follower.leaving,
            follower.handovers,
            follower.last_handover_pause_s,
            follower.max_handover_pause_s,
        )

    def figures(self) -> dict[str, Any]:
        """For status and `admin tasks` (any thread): the last published
        figures, with the learners' lags from the status topic's snapshot."""
        figures = self._figures
        plan = figures.plan
        statuses: Mapping[str, Any] = self._handovers.status.snapshot.statuses
        learners = {
            task: {
                "instance": owner,
                "lag": statuses[owner].lags.get(task) if owner in statuses else None,
            }
            for task, owner in plan.learners.items()
        }
        return {
            "mode": "runtime",
            "placer": figures.placer,
            "plan_version": plan.version,
            "applied": figures.applied,
            "leaving": figures.leaving,
            "owners": dict(plan.owners),
            "learners": learners,
            "moves": dict(plan.moves),
            "handovers": figures.handovers,
            "last_handover_pause_s": figures.last_handover_pause_s,
            "max_handover_pause_s": round(figures.max_handover_pause_s, 3),
        }
