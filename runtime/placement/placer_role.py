"""`PlacerRole`: placing, on the instance elected to (`task.assignment=runtime`).

The member that owns partition 0 of the coordination (status) topic in a
generation is the placer (`elected`, `step_down`, from the rebalance
callbacks). Before its first plan it reads the status topic up to where it
was at the election, and it places only from a recent description of the
group's membership that has its own member in it (DescribeConsumerGroups,
requested without blocking the loop; rule (b) of the hand-over: a member
that left the group releases its tasks, and a stalled, zombie placer must
not place from a stale view). Then, every `_PLACE_INTERVAL_S`, it computes
the next plan from every instance's status (`runtime.placement.placer`, pure)
and publishes it when it differs; a `scale-down --fraction` request becomes
the instances asked to leave.

What it reads: the status topic's `StatusSnapshot` (one per decision) and
this instance's `LocalView` from the plan follower; what it returns is the
plan it published, which the follower adopts.

Polling thread only.
"""

from __future__ import annotations

import dataclasses
import math
import time
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from runtime.logging import get_logger
from runtime.placement.parts import PollingSide, RuntimePlacementSettings
from runtime.placement.placer import Member, next_plan
from runtime.placement.plan_follower import LocalView
from runtime.placement.records import PLAN_KEY, PlacementPlan
from runtime.placement.status_view import StatusSnapshot, StatusTopicView

log = get_logger("runtime.placement")

_PLACE_INTERVAL_S = 0.1
# How long one lookup of the status topic's end offset may block the polling thread.
_STATUS_END_TIMEOUT_S = 2.0
_MEMBERSHIP_INTERVAL_S = 2.0
# A placer places only from a group description requested this recently: one
# older may predate a stall of this process (SIGSTOP, a long GC pause), after
# which the group may have moved on without it (a zombie placer).
_MEMBERSHIP_MAX_AGE_S = 2 * _MEMBERSHIP_INTERVAL_S + 1.0


class PlacerRole:
    """The placer's state and decisions. See the module docstring."""

    def __init__(
        self,
        settings: RuntimePlacementSettings,
        polling: PollingSide,
        status: StatusTopicView,
        coordination: TopicPartition,
    ) -> None:
        self._settings = settings
        self._polling = polling
        self._status = status
        self._coordination = coordination
        self.is_placer = False
        self._ready_at: int | None = None  # status-topic offset to read first
        self._status_end_error = ""  # why `_ready_at` is not known yet
        self._last_place = 0.0
        # The group's membership, described for rule (b).
        self._admin: AdminClient | None = None
        self._in_group: frozenset[str] | None = None  # member ids; None: not known
        self._membership: Future[Any] | None = None
        self._membership_stale = True
        self._last_membership = 0.0
        self._membership_sent_at = 0.0  # when the pending description was requested
        self._in_group_at = 0.0  # when the description in `_in_group` was requested
        self._waiting: str | None = None  # why the last `place` made no plan (logged once)
        self._members_seen: tuple[tuple[str, bool, int], ...] = ()  # logged when it changes

    def membership_changed(self) -> None:
        """A rebalance callback ran: describe the group again before placing."""
        self._membership_stale = True

    def elected(self, instance_id: str) -> None:
        """This member was assigned the coordination partition: the placer,
        once it read the status topic up to where it is now (the partition
        is paused: plans come from the restoration thread's reading)."""
        consumer = self._polling.consumer
        consumer.pause([self._coordination])
        self.is_placer = True
        self._ready_at = None
        high = self._status_end()
        log.info("placer_elected", instance_id=instance_id, read_status_up_to=high)

    def _status_end(self) -> int | None:
        """Where the status topic ends, which the placer reads up to before its
        first plan; None while the broker cannot say (a leader being elected,
        a broker away: seen as NOT_LEADER_FOR_PARTITION on a topic created a
        moment ago). Asked again at the next `place` then: an error here, in
        the rebalance callback, must not fail the app."""
        if self._ready_at is None:
            try:
                _low, high = self._polling.consumer.get_watermark_offsets(
                    self._coordination, timeout=_STATUS_END_TIMEOUT_S
                )
            except KafkaException as exc:
                self._status_end_error = str(exc)
                return None
            self._ready_at = int(high)
        return self._ready_at

    def step_down(self, reason: str) -> None:
        """No more plans from here; the ones produced are flushed before the
        next placer is assigned."""
        if self.is_placer:
            self.is_placer = False
            self._ready_at = None
            self._polling.output.producer.flush(10)
            log.info("placer_stepped_down", reason=reason)

    def due(self, now: float) -> bool:
        """Whether to place at this loop turn."""
        if not self.is_placer or now - self._last_place < _PLACE_INTERVAL_S:
            return False
        self._last_place = now
        return True

    def place(self, local: LocalView) -> PlacementPlan | None:
        """Publish the next plan if it differs; the plan published, if any."""
        snapshot = self._status.snapshot
        waiting = self._not_ready_because(local.member_id, snapshot)
        if waiting is not None:
            self._note_waiting(waiting)
            return None
        in_group = self._in_group
        assert in_group is not None
        members: dict[str, Member] = {
            instance_id: Member(
                instance_id,
                status.capacity,
                status.active_tasks,
                status.lags,
                status.plan_version,
                status.leaving,
                in_group=status.member_id in in_group,
                machine=status.machine,
            )
            for instance_id, status in snapshot.statuses.items()
        }
        # This instance's own view is fresher than its status read back.
        members[local.instance_id] = local.member
        seen = tuple(sorted((i, m.in_group, m.acked) for i, m in members.items()))
        if seen != self._members_seen:
            # Once per change: which instances the plans are made for.
            self._members_seen = seen
            log.info(
                "placement_members",
                members={i: {"in_group": g, "applied_plan": a} for i, g, a in seen},
                group_size=len(in_group),
            )
        previous = local.plan
        newest_ack = max((m.acked for m in members.values()), default=0)
        if newest_ack > previous.version:
            # A plan we have not read yet exists: wait for it.
            self._note_waiting(
                f"an instance applied plan {newest_ack}, this placer read up to {previous.version}"
            )
            return None
        self._note_waiting(None)
        previous = self._with_scale_down(previous, members, snapshot)
        for instance_id in previous.leave & set(members):  # asked to leave: gets nothing
            members[instance_id] = dataclasses.replace(members[instance_id], leaving=True)
        plan = next_plan(
            previous, members, local.all_tasks, self._settings.placer, local.instance_id
        )
        if plan is local.plan:
            return None
        output = self._polling.output
        output.produce_one(self._coordination.topic, PLAN_KEY, plan.encode())
        if output.transactions is not None:
            self._polling.request_commit()
        log.info(
            "plan_published",
            version=plan.version,
            owners=len(plan.owners),
            learners=dict(plan.learners),
            moves=dict(plan.moves),
        )
        return plan

    def _not_ready_because(self, member_id: str, snapshot: StatusSnapshot) -> str | None:
        """Why no plan can be made now (None: ready): the status topic must be
        read up to where it was at election, and the membership known."""
        if not self.is_placer:
            return "not elected"
        if self._status_end() is None:
            return f"the status topic's end offset (asked again; {self._status_end_error})"
        assert self._ready_at is not None
        if snapshot.position < self._ready_at:
            return (
                f"reading the status topic up to offset {self._ready_at} (where it was at election)"
            )
        self._refresh_membership()
        if self._in_group is None or self._membership_stale:
            return "describing the group"
        # Not a zombie placer: our own member is in a recent description of
        # the group (a stalled placer's plans would be built on a stale view
        # and could collide in version with the new placer's).
        if time.monotonic() - self._in_group_at > _MEMBERSHIP_MAX_AGE_S:
            return "the group's description is stale"
        if not member_id or member_id not in self._in_group:
            return "this member is not in the group's description"
        return None

    def _note_waiting(self, reason: str | None) -> None:
        """Log why placing waits, once per reason (a placer that never plans
        is otherwise silent), and when it goes on again."""
        if reason == self._waiting:
            return
        if reason is not None:
            log.info("placement_waiting", reason=reason)
        elif self._waiting is not None:
            log.info("placement_resumed", waited_for=self._waiting)
        self._waiting = reason

    def _refresh_membership(self) -> None:
        """DescribeConsumerGroups without blocking: the member ids of the
        group's current generation (rule (b) of the hand-over)."""
        if self._admin is not None:
            self._admin.poll(0)  # its log lines
        future = self._membership
        if future is not None:
            if not future.done():
                return
            self._membership = None
            try:
                description = future.result()
                self._in_group = frozenset(m.member_id for m in description.members)
                self._in_group_at = self._membership_sent_at
            except KafkaException as exc:
                log.warning("describe_group_failed", error=str(exc))
                self._in_group = None
            return
        now = time.monotonic()
        if self._membership_stale or now - self._last_membership >= _MEMBERSHIP_INTERVAL_S:
            if self._admin is None:
                self._admin = AdminClient(self._settings.admin_settings)
            self._last_membership = now
            self._membership_sent_at = now
            self._membership_stale = False
            group_id = self._settings.group_id
            self._membership = self._admin.describe_consumer_groups([group_id])[group_id]

    def _with_scale_down(
        self, previous: PlacementPlan, members: dict[str, Member], snapshot: StatusSnapshot
    ) -> PlacementPlan:
        """A `scale-down --fraction` request names no instance: the placer
        picks that fraction of the instances in the group (the last by id),
        once per request (the plan keeps the request's time)."""
        request = snapshot.scale_down_request
        if request is None:
            return previous
        try:
            fraction = float(request["fraction"])
            requested_ms = int(request["ts"])
        except (KeyError, TypeError, ValueError):
            return previous
        if requested_ms <= previous.leave_ms:
            return previous
        candidates = sorted(i for i, m in members.items() if m.in_group and not m.leaving)
        count = min(len(candidates) - 1, math.ceil(len(candidates) * fraction))
        leave = frozenset(candidates[-count:]) if count > 0 else frozenset()
        log.info("scale_down_planned", fraction=fraction, leave=sorted(leave))
        return dataclasses.replace(
            previous,
            version=previous.version + 1,
            leave=previous.leave | leave,
            leave_ms=requested_ms,
        )
