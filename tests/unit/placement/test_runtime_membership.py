"""A lost membership under runtime-owned placement, however librdkafka reports it.

A session that timed out (the process was stopped past session.timeout.ms)
reaches the application as `on_lost`, or as a plain `on_revoke` when the
application called `incremental_(un)assign` in between (seen on Kafka: the
zombie placer then kept its identity, published a plan from its stale view of
the group, and could have committed for tasks given to others once it
rejoined). What tells it is the member id: reset by librdkafka, then a new
one. RuntimeAssignment (with its plan follower and placer role) with fakes
for everything but its own logic.
"""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from confluent_kafka import TopicPartition

from runtime.placement import placer_role
from runtime.placement.parts import Handovers, PollingSide, RuntimePlacementSettings
from runtime.placement.records import PlacementPlan
from runtime.placement.runtime_assignment import RuntimeAssignment
from runtime.placement.status_view import StatusTopicView

STATUS = "app-status"


class FakeConsumer:
    def __init__(self) -> None:
        self.member_id = "m1"
        self.assigned: list[TopicPartition] = []

    def memberid(self) -> str:
        return self.member_id

    def incremental_assign(self, partitions: list[TopicPartition]) -> None:
        self.assigned += partitions

    def incremental_unassign(self, partitions: list[TopicPartition]) -> None:
        gone = {(tp.topic, tp.partition) for tp in partitions}
        self.assigned = [tp for tp in self.assigned if (tp.topic, tp.partition) not in gone]

    def assignment(self) -> list[TopicPartition]:
        return list(self.assigned)

    def pause(self, partitions: list[TopicPartition]) -> None:
        pass

    def get_watermark_offsets(self, tp: TopicPartition, timeout: float) -> tuple[int, int]:
        return 0, 0


class FakeTasks:
    def __init__(self) -> None:
        self.held: set[str] = set()

    def ids(self) -> frozenset[str]:
        return frozenset(self.held)

    def __bool__(self) -> bool:
        return bool(self.held)


class FakePlacement:
    status_topic = STATUS
    stateful_tasks: frozenset[str] = frozenset()

    def __init__(self) -> None:
        self.instance_id = "i"
        self.published: list[dict[str, Any]] = []

    def publish_status(self, gone: bool = False, **fields: Any) -> None:
        self.published.append({"instance_id": self.instance_id, "gone": gone, **fields})

    def reconcile_standbys(self, learners: frozenset[str] = frozenset()) -> None:
        pass


class FakeLifecycle:
    """The polling thread's side: `dropped` lists the task sets closed
    without a commit."""

    def __init__(self, tasks: FakeTasks, dropped: list[list[str]]) -> None:
        self.tasks, self.dropped = tasks, dropped

    def commit_locked(self, reason: str) -> bool:
        return True

    def close_without_commit(self, task_ids: list[str]) -> None:
        self.dropped.append(task_ids)
        self.tasks.held -= set(task_ids)

    def restart_commit_interval(self) -> None:
        pass

    def tasks_changed(self) -> None:
        pass


def placement_of(runtime: RuntimeAssignment) -> FakePlacement:
    return runtime._polling.standbys  # type: ignore[return-value]


def make() -> tuple[RuntimeAssignment, FakeConsumer, FakeTasks, list[list[str]]]:
    consumer, tasks, dropped = FakeConsumer(), FakeTasks(), []
    status_view = StatusTopicView()
    status_view.advance(0)
    layout = SimpleNamespace(sources={0: ["in"]}, partitions={"in": 2})
    layout.task_partitions = lambda sub: 2
    placement = FakePlacement()
    runtime = RuntimeAssignment(
        RuntimePlacementSettings("i", "app", {}),
        PollingSide(
            consumer,  # type: ignore[arg-type]
            layout,  # type: ignore[arg-type]
            tasks,  # type: ignore[arg-type]
            placement,  # type: ignore[arg-type]
            SimpleNamespace(),  # type: ignore[arg-type]  # the committer: no release here
            SimpleNamespace(transactions=None, producer=SimpleNamespace(flush=lambda t: 0)),  # type: ignore[arg-type]
            lifecycle=FakeLifecycle(tasks, dropped),
            request_commit=lambda: None,
            on_left=lambda: None,
        ),
        Handovers(status_view, standby_lags=lambda: {}, capacity=lambda: 1),
    )
    runtime.on_assign([TopicPartition(STATUS, 0)])  # joined as m1, the placer
    tasks.held = {"0_0", "0_1"}
    return runtime, consumer, tasks, dropped


def test_the_first_assignment_names_the_member_and_a_plain_revoke_keeps_the_tasks() -> None:
    runtime, consumer, tasks, dropped = make()
    assert runtime.is_placer
    runtime.on_revoke([TopicPartition(STATUS, 0)])  # still m1: the placer role moved
    assert not runtime.is_placer
    assert tasks.ids() == {"0_0", "0_1"} and not dropped
    assert not runtime.check_membership()


def test_a_timed_out_session_reported_as_a_revoke_drops_the_tasks_and_renews() -> None:
    runtime, consumer, tasks, dropped = make()
    runtime.follower.plan = PlacementPlan(7, "i", {"0_0": "i", "0_1": "i"})  # maybe never committed
    consumer.member_id = ""  # librdkafka: session timed out, member id reset
    runtime.on_revoke([TopicPartition(STATUS, 0)])
    assert dropped and not tasks.ids() and not runtime.is_placer
    assert runtime.instance_id == "i~1"
    assert runtime.plan.version == 0  # only plans read back from the topic count
    # Rejoined under a new member id: adopted at the assignment, no second drop.
    consumer.member_id = "m2"
    assert not runtime.check_membership()
    runtime.on_assign([])
    assert not runtime.check_membership() and len(dropped) == 1
    runtime.follower.publish_status()
    assert placement_of(runtime).published[-1]["member_id"] == "m2"


def test_a_member_id_changed_behind_our_back_is_caught_before_a_commit() -> None:
    """No callback at all (nothing was assigned): the check that runs
    before every commit drops the tasks, so a rejoined member commits nothing."""
    runtime, consumer, tasks, dropped = make()
    consumer.member_id = "m2"
    assert runtime.check_membership()
    assert not tasks.ids() and dropped == [["0_0", "0_1"]]
    assert runtime.instance_id == "i~1"


def test_a_stalled_placer_does_not_place_from_a_stale_view_of_the_group(
    monkeypatch: Any,
) -> None:
    runtime, consumer, tasks, dropped = make()
    placer = runtime.placer
    placer._membership_stale = False
    placer._in_group = frozenset({"m1", "m2"})
    placer._in_group_at = time.monotonic()
    monkeypatch.setattr(placer, "_refresh_membership", lambda: None)
    snapshot = runtime._handovers.status.snapshot
    assert placer._not_ready_because("m1", snapshot) is None
    # Described before a stall longer than the session timeout: not fresh.
    placer._in_group_at = time.monotonic() - placer_role._MEMBERSHIP_MAX_AGE_S - 1
    assert placer._not_ready_because("m1", snapshot) is not None
    # Fresh, but the group went on without this member.
    placer._in_group_at = time.monotonic()
    placer._in_group = frozenset({"m2"})
    assert placer._not_ready_because("m1", snapshot) is not None


def test_closing_the_consumer_is_no_lost_membership() -> None:
    """`close()` leaves the group (the member id goes) and may run a callback
    on a handle that refuses calls: nothing is dropped, nothing is asked."""
    runtime, consumer, tasks, dropped = make()
    runtime.closing = True
    consumer.member_id = ""
    runtime.on_assign([TopicPartition(STATUS, 0)])
    assert not runtime.check_membership()
    assert not dropped and tasks.ids() == {"0_0", "0_1"} and runtime.instance_id == "i"


def test_an_election_while_the_status_topic_has_no_leader_waits_instead_of_failing(
    monkeypatch: Any,
) -> None:
    """Seen on Kafka: the coordination partition of a topic created a moment
    ago answered NOT_LEADER_FOR_PARTITION to the end-offset lookup inside the
    assignment callback, and the instance failed. Now the placer is elected,
    waits, and asks again at the next `place`."""
    from confluent_kafka import KafkaError, KafkaException

    answers: list[Any] = [KafkaException(KafkaError(KafkaError.NOT_LEADER_FOR_PARTITION)), (0, 3)]

    def watermarks(tp: TopicPartition, timeout: float) -> tuple[int, int]:
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    runtime, consumer, _, _ = make()
    placer = runtime.placer
    placer.step_down("test")
    monkeypatch.setattr(consumer, "get_watermark_offsets", watermarks)
    placer.elected("i")  # no exception out of the callback
    assert placer.is_placer
    snapshot = runtime._handovers.status.snapshot
    waiting = placer._not_ready_because("m1", snapshot)
    assert waiting is not None and "reading the status topic up to offset 3" in waiting
    assert not answers  # asked once more, and known from then on
