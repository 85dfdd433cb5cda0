"""Runtime-owned task placement (`task.assignment=runtime`): the polling thread's part.

The protocol is in docs/architecture.md ("Runtime-owned task placement"); the
decision itself is `runtime.placement.placer` (pure). This class:

- joins the group on the one-partition status topic only; whoever owns its
  partition 0 is the placer (`on_assign`/`on_revoke`/`on_lost`, called from
  the polling thread's rebalance callbacks);
- applies the newest plan (`tick`, once per loop turn): releases the tasks
  the plan does not give this instance (committed and closed through
  `release`, then its data partitions unassigned), acknowledges the plan in
  its status, then takes the tasks it was given (data partitions assigned
  from their committed offsets, tasks created as for any assignment) and
  keeps the plan's learners as standbys;
- as the placer, computes and publishes the next plan from the statuses and
  the group's membership (DescribeConsumerGroups, never blocking the loop);
- stops the instance once it is leaving and owns nothing, and at a clean
  stop publishes its tombstone only after the final commit (`stop_cleanly`);
- checks the membership its tasks were taken under (`check_membership`,
  every loop turn, in the rebalance callbacks and before every commit) and
  drops every task, uncommitted, once it is lost (`drop_all`).

Processing and state code do not know where an assignment came from: tasks
are created and closed through `ActiveTasks` as with the group's assignor.
Commits go through the polling thread's commit protocol (`TaskLifecycle`,
with the `Committer`'s task locks), so an aborted transaction rewinds every
task as for any other commit.

Polling thread only, except `request_leave` (any thread) and the figures
(`figures`, read racily).
"""

from __future__ import annotations

import dataclasses
import math
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any, Protocol

from confluent_kafka import Consumer, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from runtime.collector.output import OutputChannel
from runtime.collector.transactions import TransactionFailed
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.placement.placer import Member, PlacerSettings, next_plan
from runtime.placement.records import PLAN_KEY, PlacementPlan
from runtime.placement.status_view import StatusTopicView
from runtime.polling.active_tasks import ActiveTasks
from runtime.polling.committer import Committer
from runtime.polling.status_and_standbys import TaskPlacement
from runtime.processing.task import task_id_of
from runtime.state.restoration import RestorationThread

log = get_logger("runtime.placement")

_STATUS_INTERVAL_S = 2.0
_LEARNING_STATUS_INTERVAL_S = 0.5
_PLACE_INTERVAL_S = 0.1
_MEMBERSHIP_INTERVAL_S = 2.0
# A placer places only from a group description requested this recently: one
# older may predate a stall of this process (SIGSTOP, a long GC pause), after
# which the group may have moved on without it (a zombie placer).
_MEMBERSHIP_MAX_AGE_S = 2 * _MEMBERSHIP_INTERVAL_S + 1.0


class TaskLifecycle(Protocol):
    """What the polling thread does for placement with its tasks (the
    `PollingThread`; its thread only)."""

    def commit_locked(self, reason: str) -> bool:
        """Commit every processing task (rule 4), every task locked by the
        caller; False if not committed (an aborted transaction: every task
        rewound)."""
        ...

    def close_without_commit(self, task_ids: list[str]) -> None:
        """Close tasks whose offsets can no longer be committed (a lost
        membership): output aborted and every task rewound under exactly-once."""
        ...

    def restart_commit_interval(self) -> None:
        """A commit just happened outside the commit interval's own."""
        ...

    def tasks_changed(self) -> None:
        """The tasks here changed (the figures other threads read)."""
        ...


class RuntimeAssignment:
    """Plans in, task events out; the placer when this instance owns the
    coordination partition. Polling thread only (see the module docstring)."""

    def __init__(
        self,
        instance_id: str,
        group_id: str,
        layout: TopicLayout,
        consumer: Consumer,
        tasks: ActiveTasks,
        placement: TaskPlacement,
        restoration: RestorationThread,
        output: OutputChannel,
        admin_settings: dict[str, Any],
        settings: PlacerSettings,
        committer: Committer,
        lifecycle: TaskLifecycle,
        capacity: Callable[[], int],
        on_left: Callable[[], None],
        request_commit: Callable[[], None],
        status_view: StatusTopicView | None = None,
    ) -> None:
        self.instance_id = instance_id
        self._group_id = group_id
        self._layout = layout
        self._consumer = consumer
        self._tasks = tasks
        self._placement = placement
        self._restoration = restoration
        # The status topic as the restoration thread read it: one snapshot a decision.
        self._status_view = status_view or StatusTopicView()
        self._output = output
        self._admin_settings = admin_settings
        self._admin: AdminClient | None = None
        self._settings = settings
        self._committer = committer
        self._lifecycle = lifecycle
        self._capacity = capacity
        self._on_left = on_left
        self._request_commit = request_commit
        self.coordination = TopicPartition(placement.status_topic, 0)
        # Every task to place (id -> stateful), from the partition counts in
        # force here (`_follow_partition_counts`).
        self.all_tasks: dict[str, bool] = {}
        self._counts_seen: dict[str, int] = {}
        self._follow_partition_counts()
        # Tasks the applied plan gives this instance whose partitions are
        # beyond the counts in force here: the placer followed a partition
        # expansion before this instance did. Taken once it has.
        self._not_in_force: set[str] = set()
        self.plan = PlacementPlan()  # the newest plan known here
        self.applied = 0  # the newest plan version applied here
        self._applied_plan = PlacementPlan()
        self._leave_requested = threading.Event()
        self.leaving = False
        self.left = False
        # The group member id under which this identity holds its tasks: set
        # at the first assignment after a start or a renewal; any other id
        # seen later (librdkafka resets it to "" when the session timed out,
        # then rejoins under a new one) means the membership was lost.
        self._member_id = ""
        self._generation = 0  # identities renewed after lost memberships
        # Set by the polling thread before it closes the consumer: the member
        # id then goes with the LeaveGroup, which is no lost membership (the
        # final commit is done, and the handle refuses calls meanwhile).
        self.closing = False
        self._status_dirty = True
        self._last_status = 0.0
        # The placer's side.
        self.is_placer = False
        self._placer_ready_at: int | None = None  # status-topic offset to read first
        self._last_place = 0.0
        self._in_group: frozenset[str] | None = None  # member ids; None: not known
        self._membership: Future[Any] | None = None
        self._membership_stale = True
        self._last_membership = 0.0
        self._membership_sent_at = 0.0  # when the pending description was requested
        self._in_group_at = 0.0  # when the description in `_in_group` was requested
        # Figures (read racily): hand-overs taken here and their pauses.
        self._withdrawn_at: dict[str, float] = {}
        self.handovers = 0
        self.last_handover_pause_s: float | None = None
        self.max_handover_pause_s = 0.0

    # --- requests from other threads --------------------------------------------

    def request_leave(self) -> None:
        """`admin prepare-leave`: hand every task over, then stop. Any thread."""
        self._leave_requested.set()

    # --- rebalance callbacks (polling thread, inside consume) ------------------------

    def on_assign(self, partitions: list[TopicPartition]) -> None:
        """The coordination partition: we are the placer (once we read the topic).

        Also where an identity learns its member id: after a successful
        join, `memberid()` is the group's id for this generation."""
        self._membership_stale = True
        self.check_membership()
        if not self._member_id:
            self._member_id = self._consumer.memberid() or ""
            self._status_dirty = True
        self._consumer.incremental_assign(partitions)
        if any(self._is_coordination(tp) for tp in partitions):
            self._consumer.pause([self.coordination])
            _low, high = self._consumer.get_watermark_offsets(self.coordination, timeout=10)
            self.is_placer = True
            self._placer_ready_at = high
            log.info("placer_elected", instance_id=self.instance_id, read_status_up_to=high)

    def on_revoke(self, partitions: list[TopicPartition]) -> None:
        """Losing the coordination partition: no more plans from here; the
        ones produced are flushed before the next placer is assigned.

        librdkafka reports a lost membership (session timed out) as a plain
        revocation when the application called `incremental_(un)assign`
        between the loss and the callback, as `apply` does for data
        partitions: the member id, reset by then, tells them apart."""
        self._membership_stale = True
        self.check_membership()
        if any(self._is_coordination(tp) for tp in partitions):
            self._stop_placing("revoked")

    def on_lost(self) -> None:
        """The group moved on without us: every task closed dirty, at once."""
        log.warning("group_membership_lost", tasks=sorted(self._tasks.ids()))
        self._membership_stale = True
        self._stop_placing("lost")
        self.drop_all("membership lost")
        self._status_dirty = True

    def drop_all(self, reason: str) -> None:
        """Membership lost: close every task without committing, unassign its
        partitions (a new owner may run them already; rule (b) of the
        hand-over), and go on under a new identity."""
        log.warning("tasks_dropped", reason=reason, tasks=sorted(self._tasks.ids()))
        self._lifecycle.close_without_commit(sorted(self._tasks.ids()))
        data = self.data_partitions()
        if data:
            self._consumer.incremental_unassign(data)
        self.renew_identity()
        self._lifecycle.tasks_changed()

    def renew_identity(self) -> None:
        """After a lost membership (every task dropped): go on under a new
        instance id, as a new process would. Plans naming the old id may
        still give it tasks the placer has since handed to others (it saw the
        old member leave the group); the new id owns nothing until a plan
        gives it something. The old id's status is deleted."""
        self._placement.publish_status(gone=True)
        self._member_id = ""  # the next assignment's member id (on_assign)
        self._generation += 1
        base = self.instance_id.rsplit("~", 1)[0]
        self.instance_id = f"{base}~{self._generation}"
        self._placement.instance_id = self.instance_id
        self.applied = 0
        self._applied_plan = PlacementPlan()
        # A plan this instance published as a (zombie) placer may be in a
        # transaction that was just aborted: only plans read back count.
        self.plan = PlacementPlan()
        self._withdrawn_at.clear()
        self._not_in_force.clear()
        self._status_dirty = True
        log.warning("instance_id_renewed", instance_id=self.instance_id)

    def _stop_placing(self, reason: str) -> None:
        if self.is_placer:
            self.is_placer = False
            self._placer_ready_at = None
            self._output.producer.flush(10)
            log.info("placer_stepped_down", reason=reason)

    def _is_coordination(self, tp: TopicPartition) -> bool:
        return tp.topic == self.coordination.topic and tp.partition == 0

    # --- the loop turn ------------------------------------------------------------

    def tick(self) -> None:
        """Once per loop turn: membership check, the newest plan, status, placing."""
        self.check_membership()
        if self._follow_partition_counts() and self._not_in_force:
            self._take_in_force()
        if self._leave_requested.is_set() and not self.leaving:
            self.leaving = True
            self._status_dirty = True
            log.info("instance_leaving", instance_id=self.instance_id)
        newest = self._status_view.snapshot.plan
        if newest.version > self.plan.version:
            self.plan = newest
        if self.instance_id in self.plan.leave and not self.leaving:
            self.leaving = True
            self._status_dirty = True
            log.info("instance_leaving", instance_id=self.instance_id, reason="scale-down")
        if self.plan.version > self.applied:
            self.apply(self.plan)
        now = time.monotonic()
        # Learning here: the placer hears of the lag sooner, to hand over sooner.
        interval = _LEARNING_STATUS_INTERVAL_S if self._learning() else _STATUS_INTERVAL_S
        if self._status_dirty or now - self._last_status >= interval:
            self.publish_status()
        if self.is_placer and now - self._last_place >= _PLACE_INTERVAL_S:
            self._last_place = now
            self.place()
        if self.leaving and not self.left and self._owns_nothing():
            self.left = True
            log.info("instance_left", instance_id=self.instance_id, plan=self.applied)
            self._on_left()

    def _follow_partition_counts(self) -> bool:
        """`all_tasks` from the partition counts in force; True if they grew.

        A partition expansion accepted here (`PartitionExpansion._accept`
        grows `TopicLayout.partitions` in place) adds tasks: the placer
        places them, an instance takes those it was given."""
        counts = dict(self._layout.partitions)
        if counts == self._counts_seen:
            return False
        self._counts_seen = counts
        stateful = self._placement.stateful_tasks
        self.all_tasks = {
            task_id_of(sub, p): task_id_of(sub, p) in stateful
            for sub in sorted(self._layout.sources)
            for p in range(self._layout.task_partitions(sub))
        }
        return True

    def _learning(self) -> bool:
        return bool(self.plan.copies_for(self.instance_id))

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
        if self.closing:
            return False
        member_id = self._consumer.memberid() or ""
        if not self._member_id or member_id == self._member_id:
            return False
        log.warning("member_id_changed", old=self._member_id, new=member_id)
        self._stop_placing("member id changed")
        self.drop_all("member id changed")  # renews the identity
        return True

    def _owns_nothing(self) -> bool:
        return (
            not self._tasks
            and not self.plan.tasks_of(self.instance_id)
            and self.applied == self.plan.version
        )

    # --- applying a plan --------------------------------------------------------------

    def apply(self, plan: PlacementPlan) -> None:
        """Release, acknowledge, take, learn (module docstring)."""
        mine = plan.tasks_of(self.instance_id)
        held = self._tasks.ids()
        released = sorted(held - mine)
        if released:
            if not self.release(released):
                log.warning("tasks_release_postponed", tasks=released, reason="commit failed")
                return  # tried again at the next loop turn
            partitions = [tp for t in released for tp in self.partitions_of(t)]
            self._unassign(partitions)
            log.info("tasks_released", tasks=released, plan=plan.version)
        now = time.monotonic()
        for task in plan.moves:
            if plan.moves[task] == self.instance_id:
                self._withdrawn_at.setdefault(task, now)
        before = self._applied_plan
        self._applied_plan = plan
        self.applied = plan.version
        self.publish_status()  # the acknowledgement, after the release's commit
        given = mine - self._tasks.ids()
        self._not_in_force = {t for t in given if t not in self.all_tasks}
        self._take(sorted(given - self._not_in_force), before, now)
        if self._not_in_force:
            log.info("tasks_given_beyond_partition_counts", tasks=sorted(self._not_in_force))
        self._placement.reconcile_standbys(plan.copies_for(self.instance_id))

    def release(self, task_ids: list[str]) -> bool:
        """Hand tasks over: commit (rule 4, all tasks), then close these.

        False, with every task kept, when the commit failed (a commit refused
        during a rebalance, an aborted transaction): the new owner would
        start before offsets this instance processed, so the release waits
        for the next loop turn. Restoring tasks have nothing to commit.
        False too when the membership was lost meanwhile (every task dropped,
        nothing committed).
        """
        if self.check_membership():
            return False
        tasks = self._tasks
        with self._committer.tasks_locked(barrier=tasks.processable()):  # key-parallel
            if not self._lifecycle.commit_locked("hand-over"):
                return False
            tasks.close([t for t in task_ids if tasks.get(t) is not None])
        self._lifecycle.restart_commit_interval()
        self._lifecycle.tasks_changed()
        return True

    def _take(self, taken: list[str], before: PlacementPlan, now: float) -> None:
        """Create the tasks and assign their partitions from the committed
        offsets; count the hand-overs among them (`before`: the plan applied
        until now)."""
        if not taken:
            return
        partitions = [tp for t in taken for tp in self.partitions_of(t)]
        # The learners' stores close together, not one task after another.
        self._placement.release_standbys(taken)
        self._tasks.create(partitions)
        self._consumer.incremental_assign(partitions)
        for task in taken:
            since = self._withdrawn_at.pop(task, now)
            if task in before.moves or before.owners.get(task, self.instance_id) != (
                self.instance_id
            ):  # a hand-over, not a first placement
                pause = now - since
                self.handovers += 1
                self.last_handover_pause_s = round(pause, 3)
                self.max_handover_pause_s = max(self.max_handover_pause_s, pause)
        log.info("tasks_taken", tasks=taken, plan=self.applied)
        self._status_dirty = True

    def _take_in_force(self) -> None:
        """Take the tasks given before this instance followed their partition
        expansion, now that it has (and still given: not in a newer plan yet)."""
        given = self._applied_plan.tasks_of(self.instance_id) - self._tasks.ids()
        self._not_in_force &= given
        ready = sorted(t for t in self._not_in_force if t in self.all_tasks)
        self._not_in_force -= set(ready)
        self._take(ready, self._applied_plan, time.monotonic())

    def partitions_of(self, task_id: str) -> list[TopicPartition]:
        sub_text, partition_text = task_id.split("_", 1)
        sub, partition = int(sub_text), int(partition_text)
        return [
            TopicPartition(topic, partition)
            for topic in self._layout.sources[sub]
            if partition < self._layout.partitions[topic]
        ]

    def _unassign(self, partitions: list[TopicPartition]) -> None:
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        gone = [tp for tp in partitions if (tp.topic, tp.partition) in assigned]
        if gone:
            self._consumer.incremental_unassign(gone)

    def data_partitions(self) -> list[TopicPartition]:
        """Assigned partitions other than the coordination one."""
        return [tp for tp in self._consumer.assignment() if not self._is_coordination(tp)]

    def reconcile_copies(self) -> None:
        """The standbys kept here toward the plan's learners and moves."""
        self._placement.reconcile_standbys(self.plan.copies_for(self._placement.instance_id))

    # --- status -------------------------------------------------------------------

    def publish_status(self, gone: bool = False) -> None:
        self._status_dirty = False
        self._last_status = time.monotonic()
        if gone:
            self._placement.publish_status(gone=True)
        else:
            self._placement.publish_status(
                member_id=self._member_id,
                capacity=max(0, self._capacity()),
                lags=dict(self._restoration.standby_lags),
                plan_version=self.applied,
                leaving=self.leaving,
            )
        if self._output.transactions is not None:
            self._request_commit()  # under exactly-once: visible at the commit

    def stop_cleanly(self, commit_all: Callable[[str], bool], joined: bool) -> None:
        """A clean stop: the final commit, then this instance's status tombstone.

        Committed first: the tombstone tells the placer the tasks are
        released (the hand-over rule), so nothing may follow it. Without a
        good commit there is no tombstone: the tasks move once this member
        left the group (rule (b)). Before joining, nothing was published."""
        if not commit_all("shutdown") or not joined:
            return
        self.publish_status(gone=True)
        transactions = self._output.transactions
        if transactions is not None:
            try:
                transactions.commit([], None)  # the tombstone alone
            except TransactionFailed as exc:  # rule (b) then moves the tasks
                log.warning("status_tombstone_not_committed", error=str(exc))
        else:
            self._output.producer.flush(10)

    # --- the placer ---------------------------------------------------------------------

    def place(self) -> None:
        """Publish the next plan if it differs (placer only)."""
        if not self._ready_to_place():
            return
        statuses = dict(self._status_view.snapshot.statuses)
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
            )
            for instance_id, status in statuses.items()
        }
        # This instance's own view is fresher than its status read back.
        members[self.instance_id] = Member(
            self.instance_id,
            max(0, self._capacity()),
            self._tasks.ids(),
            dict(self._restoration.standby_lags),
            self.applied,
            self.leaving,
        )
        previous = self.plan
        newest_ack = max((m.acked for m in members.values()), default=0)
        if newest_ack > previous.version:
            return  # a plan we have not read yet exists: wait for it
        previous = self._with_scale_down(previous, members)
        for instance_id in previous.leave & set(members):  # asked to leave: gets nothing
            members[instance_id] = dataclasses.replace(members[instance_id], leaving=True)
        plan = next_plan(previous, members, self.all_tasks, self._settings, self.instance_id)
        if plan is self.plan:
            return
        self._output.produce_one(self.coordination.topic, PLAN_KEY, plan.encode())
        if self._output.transactions is not None:
            self._request_commit()
        self.plan = plan
        log.info(
            "plan_published",
            version=plan.version,
            owners=len(plan.owners),
            learners=dict(plan.learners),
            moves=dict(plan.moves),
        )

    def _ready_to_place(self) -> bool:
        """Read the status topic up to where it was at election; membership known."""
        if self._placer_ready_at is None:
            return False
        if self._status_view.snapshot.position < self._placer_ready_at:
            return False
        self._refresh_membership()
        if self._in_group is None or self._membership_stale:
            return False
        # Not a zombie placer: our own member is in a recent description of
        # the group (a stalled placer's plans would be built on a stale view
        # and could collide in version with the new placer's).
        fresh = time.monotonic() - self._in_group_at <= _MEMBERSHIP_MAX_AGE_S
        return fresh and bool(self._member_id) and self._member_id in self._in_group

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
                self._admin = AdminClient(self._admin_settings)
            self._last_membership = now
            self._membership_sent_at = now
            self._membership_stale = False
            self._membership = self._admin.describe_consumer_groups([self._group_id])[
                self._group_id
            ]

    def _with_scale_down(
        self, previous: PlacementPlan, members: dict[str, Member]
    ) -> PlacementPlan:
        """A `scale-down --fraction` request names no instance: the placer
        picks that fraction of the instances in the group (the last by id),
        once per request (the plan keeps the request's time)."""
        request = self._status_view.snapshot.scale_down_request
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

    # --- figures ----------------------------------------------------------------------

    def figures(self) -> dict[str, Any]:
        """For status and `admin tasks` (any thread, racy)."""
        plan = self.plan
        lags = self._status_view.snapshot.statuses
        learner_lags = {
            task: lags[owner].lags.get(task) if owner in lags else None
            for task, owner in plan.learners.items()
        }
        return {
            "mode": "runtime",
            "placer": self.is_placer,
            "plan_version": plan.version,
            "applied": self.applied,
            "leaving": self.leaving,
            "owners": dict(plan.owners),
            "learners": {
                t: {"instance": o, "lag": learner_lags[t]} for t, o in plan.learners.items()
            },
            "moves": dict(plan.moves),
            "handovers": self.handovers,
            "last_handover_pause_s": self.last_handover_pause_s,
            "max_handover_pause_s": round(self.max_handover_pause_s, 3),
        }
