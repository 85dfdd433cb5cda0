"""`PlanFollower`: this instance's side of runtime-owned placement.

Every instance runs one, the placer included (`task.assignment=runtime`; the
protocol is in docs/architecture.md, "Runtime-owned task placement"). It:

- follows the newest plan (`follow`, once per loop turn): releases the tasks
  the plan no longer gives this instance (committed, then closed, then their
  data partitions unassigned), acknowledges the plan in its status, then
  takes the tasks it was given (partitions assigned from their committed
  offsets, tasks created as for any assignment) and keeps the plan's
  learners as standbys; tasks given beyond the partition counts in force
  here are taken once this instance followed that expansion;
- publishes this instance's status (tasks, capacity, learners' lags, the
  plan applied, leaving), at once after a change and every few seconds;
- leaves when asked (`request_leave`, a scale-down plan): once it owns
  nothing, it stops (`PollingSide.on_left`); at a clean stop its tombstone
  goes out only after the final commit (`stop_cleanly`);
- holds the identity its tasks were taken under (instance id, member id):
  a lost membership drops every task uncommitted and renews the identity
  (`membership_lost`, `drop_all`).

What it knows of itself for the placer is `local_view` (an immutable
`LocalView`); the placer's newest plan comes back through `published`.
Processing and state code do not know where an assignment came from: tasks
are created and closed through `ActiveTasks` as with the group's assignor,
and commits go through the polling thread's commit protocol.

Polling thread only, except `request_leave` (any thread).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from confluent_kafka import TopicPartition

from runtime.collector.transactions import TransactionFailed
from runtime.logging import get_logger
from runtime.placement.parts import Handovers, PollingSide
from runtime.placement.placer import Member
from runtime.placement.records import PlacementPlan
from runtime.processing.task_settings import task_id_of

log = get_logger("runtime.placement")

_STATUS_INTERVAL_S = 2.0
_LEARNING_STATUS_INTERVAL_S = 0.5


@dataclass(frozen=True)
class LocalView:
    """What the placer needs of this instance, as of one decision."""

    instance_id: str
    member_id: str  # "" until the first assignment after a start or a renewal
    member: Member  # this instance as a member: fresher than its status read back
    plan: PlacementPlan  # the newest plan known here
    all_tasks: Mapping[str, bool]  # every task to place (id -> stateful)


class PlanFollower:
    """Plans in, task events out. Polling thread only (see the module docstring)."""

    def __init__(
        self,
        instance_id: str,
        polling: PollingSide,
        handovers: Handovers,
        check_membership: Callable[[], bool],
    ) -> None:
        """`check_membership`: the coordinator's check, run before a
        hand-over's commit (True: the membership was lost, every task dropped)."""
        self.instance_id = instance_id
        self._polling = polling
        self._handovers = handovers
        self._check_membership = check_membership
        self._coordination_topic = polling.standbys.status_topic
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
        self.member_id = ""
        self._generation = 0  # identities renewed after lost memberships
        self._status_dirty = True
        self._last_status = 0.0
        # Hand-overs taken here and their pauses (published by the coordinator).
        self._withdrawn_at: dict[str, float] = {}
        self.handovers = 0
        self.last_handover_pause_s: float | None = None
        self.max_handover_pause_s = 0.0

    # --- requests from other threads --------------------------------------------

    def request_leave(self) -> None:
        """`admin prepare-leave`: hand every task over, then stop. Any thread."""
        self._leave_requested.set()

    # --- identity and membership ------------------------------------------------------

    def adopt_member_id(self) -> None:
        """At an assignment: after a successful join, `memberid()` is the
        group's id for this generation; the first one an identity sees is
        the one its tasks are held under."""
        if not self.member_id:
            self.member_id = self._polling.consumer.memberid() or ""
            self._status_dirty = True

    def membership_lost(self) -> bool:
        """Whether the consumer's member id is another than the one the tasks
        were taken under (empty once librdkafka saw the session time out, a
        new one after it rejoined)."""
        member_id = self._polling.consumer.memberid() or ""
        if not self.member_id or member_id == self.member_id:
            return False
        log.warning("member_id_changed", old=self.member_id, new=member_id)
        return True

    def mark_dirty(self) -> None:
        """Publish the status at the next loop turn."""
        self._status_dirty = True

    def drop_all(self, reason: str) -> None:
        """Membership lost: close every task without committing, unassign its
        partitions (a new owner may run them already; rule (b) of the
        hand-over), and go on under a new identity."""
        tasks, lifecycle = self._polling.tasks, self._polling.lifecycle
        log.warning("tasks_dropped", reason=reason, tasks=sorted(tasks.ids()))
        lifecycle.close_without_commit(sorted(tasks.ids()))
        data = self.data_partitions()
        if data:
            self._polling.consumer.incremental_unassign(data)
        self.renew_identity()
        lifecycle.tasks_changed()

    def renew_identity(self) -> None:
        """After a lost membership (every task dropped): go on under a new
        instance id, as a new process would. Plans naming the old id may
        still give it tasks the placer has since handed to others (it saw the
        old member leave the group); the new id owns nothing until a plan
        gives it something. The old id's status is deleted."""
        standbys = self._polling.standbys
        standbys.publish_status(gone=True)
        self.member_id = ""  # the next assignment's member id (adopt_member_id)
        self._generation += 1
        base = self.instance_id.rsplit("~", 1)[0]
        self.instance_id = f"{base}~{self._generation}"
        standbys.instance_id = self.instance_id
        self.applied = 0
        self._applied_plan = PlacementPlan()
        # A plan this instance published as a (zombie) placer may be in a
        # transaction that was just aborted: only plans read back count.
        self.plan = PlacementPlan()
        self._withdrawn_at.clear()
        self._not_in_force.clear()
        self._status_dirty = True
        log.warning("instance_id_renewed", instance_id=self.instance_id)

    # --- the loop turn ------------------------------------------------------------

    def follow(self) -> None:
        """Once per loop turn: new partition counts, leaving, the newest plan."""
        if self._follow_partition_counts() and self._not_in_force:
            self._take_in_force()
        if self._leave_requested.is_set() and not self.leaving:
            self.leaving = True
            self._status_dirty = True
            log.info("instance_leaving", instance_id=self.instance_id)
        newest = self._handovers.status.snapshot.plan
        if newest.version > self.plan.version:
            self.plan = newest
        if self.instance_id in self.plan.leave and not self.leaving:
            self.leaving = True
            self._status_dirty = True
            log.info("instance_leaving", instance_id=self.instance_id, reason="scale-down")
        if self.plan.version > self.applied:
            self.apply(self.plan)

    def maybe_publish_status(self, now: float) -> None:
        """The status, when changed or due (sooner while learning: the placer
        hears of the lag sooner, to hand over sooner)."""
        learning = bool(self.plan.copies_for(self.instance_id))
        interval = _LEARNING_STATUS_INTERVAL_S if learning else _STATUS_INTERVAL_S
        if self._status_dirty or now - self._last_status >= interval:
            self.publish_status()

    def maybe_leave(self) -> None:
        """Stop once leaving and owning nothing (no task, none planned here)."""
        if not self.leaving or self.left:
            return
        if (
            not self._polling.tasks
            and not self.plan.tasks_of(self.instance_id)
            and self.applied == self.plan.version
        ):
            self.left = True
            log.info("instance_left", instance_id=self.instance_id, plan=self.applied)
            self._polling.on_left()

    def local_view(self) -> LocalView:
        """This instance for the placer (its own view is fresher than its
        status read back)."""
        member = Member(
            self.instance_id,
            max(0, self._handovers.capacity()),
            self._polling.tasks.ids(),
            dict(self._handovers.standby_lags()),
            self.applied,
            self.leaving,
            machine=self._polling.standbys.machine,
        )
        return LocalView(self.instance_id, self.member_id, member, self.plan, self.all_tasks)

    def published(self, plan: PlacementPlan) -> None:
        """The placer here published `plan`: the newest known here."""
        self.plan = plan

    def _follow_partition_counts(self) -> bool:
        """`all_tasks` from the partition counts in force; True if they grew.

        A partition expansion accepted here (`PartitionExpansion._accept`
        grows `TopicLayout.partitions` in place) adds tasks: the placer
        places them, an instance takes those it was given."""
        layout = self._polling.layout
        counts = dict(layout.partitions)
        if counts == self._counts_seen:
            return False
        self._counts_seen = counts
        stateful = self._polling.standbys.stateful_tasks
        self.all_tasks = {
            task_id_of(sub, p): task_id_of(sub, p) in stateful
            for sub in sorted(layout.sources)
            for p in range(layout.task_partitions(sub))
        }
        return True

    # --- applying a plan --------------------------------------------------------------

    def apply(self, plan: PlacementPlan) -> None:
        """Release, acknowledge, take, learn (module docstring)."""
        mine = plan.tasks_of(self.instance_id)
        held = self._polling.tasks.ids()
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
        given = mine - self._polling.tasks.ids()
        self._not_in_force = {t for t in given if t not in self.all_tasks}
        self._take(sorted(given - self._not_in_force), before, now)
        if self._not_in_force:
            log.info("tasks_given_beyond_partition_counts", tasks=sorted(self._not_in_force))
        self._polling.standbys.reconcile_standbys(plan.copies_for(self.instance_id))

    def release(self, task_ids: list[str]) -> bool:
        """Hand tasks over: commit (rule 4, all tasks), then close these.

        False, with every task kept, when the commit failed (a commit refused
        during a rebalance, an aborted transaction): the new owner would
        start before offsets this instance processed, so the release waits
        for the next loop turn. Restoring tasks have nothing to commit.
        False too when the membership was lost meanwhile (every task dropped,
        nothing committed).
        """
        if self._check_membership():
            return False
        tasks, lifecycle = self._polling.tasks, self._polling.lifecycle
        with self._polling.committer.tasks_locked(barrier=tasks.processable()):  # key-parallel
            if not lifecycle.commit_locked("hand-over"):
                return False
            tasks.close([t for t in task_ids if tasks.get(t) is not None])
        lifecycle.restart_commit_interval()
        lifecycle.tasks_changed()
        return True

    def _take(self, taken: list[str], before: PlacementPlan, now: float) -> None:
        """Create the tasks and assign their partitions from the committed
        offsets; count the hand-overs among them (`before`: the plan applied
        until now)."""
        if not taken:
            return
        partitions = [tp for t in taken for tp in self.partitions_of(t)]
        # The learners' stores close together, not one task after another.
        self._polling.standbys.release_standbys(taken)
        self._polling.tasks.create(partitions)
        self._polling.consumer.incremental_assign(partitions)
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
        given = self._applied_plan.tasks_of(self.instance_id) - self._polling.tasks.ids()
        self._not_in_force &= given
        ready = sorted(t for t in self._not_in_force if t in self.all_tasks)
        self._not_in_force -= set(ready)
        self._take(ready, self._applied_plan, time.monotonic())

    def partitions_of(self, task_id: str) -> list[TopicPartition]:
        layout = self._polling.layout
        sub_text, partition_text = task_id.split("_", 1)
        sub, partition = int(sub_text), int(partition_text)
        return [
            TopicPartition(topic, partition)
            for topic in layout.sources[sub]
            if partition < layout.partitions[topic]
        ]

    def _unassign(self, partitions: list[TopicPartition]) -> None:
        consumer = self._polling.consumer
        assigned = {(tp.topic, tp.partition) for tp in consumer.assignment()}
        gone = [tp for tp in partitions if (tp.topic, tp.partition) in assigned]
        if gone:
            consumer.incremental_unassign(gone)

    def data_partitions(self) -> list[TopicPartition]:
        """Assigned partitions other than the coordination one."""
        return [
            tp
            for tp in self._polling.consumer.assignment()
            if not (tp.topic == self._coordination_topic and tp.partition == 0)
        ]

    def reconcile_copies(self) -> None:
        """The standbys kept here toward the plan's learners and moves."""
        standbys = self._polling.standbys
        standbys.reconcile_standbys(self.plan.copies_for(standbys.instance_id))

    # --- status -------------------------------------------------------------------

    def publish_status(self, gone: bool = False) -> None:
        self._status_dirty = False
        self._last_status = time.monotonic()
        standbys = self._polling.standbys
        if gone:
            standbys.publish_status(gone=True)
        else:
            standbys.publish_status(
                member_id=self.member_id,
                capacity=max(0, self._handovers.capacity()),
                lags=dict(self._handovers.standby_lags()),
                plan_version=self.applied,
                leaving=self.leaving,
            )
        if self._polling.output.transactions is not None:
            self._polling.request_commit()  # under exactly-once: visible at the commit

    def stop_cleanly(self, commit_all: Callable[[str], bool], joined: bool) -> None:
        """A clean stop: the final commit, then this instance's status tombstone.

        Committed first: the tombstone tells the placer the tasks are
        released (the hand-over rule), so nothing may follow it. Without a
        good commit there is no tombstone: the tasks move once this member
        left the group (rule (b)). Before joining, nothing was published."""
        if not commit_all("shutdown") or not joined:
            return
        self.publish_status(gone=True)
        output = self._polling.output
        transactions = output.transactions
        if transactions is not None:
            try:
                transactions.commit([], None)  # the tombstone alone
            except TransactionFailed as exc:  # rule (b) then moves the tasks
                log.warning("status_tombstone_not_committed", error=str(exc))
        else:
            output.producer.flush(10)
