"""The active task lifecycle: real tasks (real RocksDB stores), fake clients."""

from __future__ import annotations

from concurrent.futures import Future
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, KafkaError, KafkaException, TopicPartition

from runtime import StreamsBuilder, serdes
from runtime.kafka.topics import TopicLayout
from runtime.polling.active_tasks import ActiveTasks
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.errors import ErrorPolicy
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.state.cache_budget import CacheBudget
from runtime.state.checkpoint import checkpoint_path, read_checkpoint

APP = "lifecycle"


def topology() -> Any:
    """Subtopology 0: words -> copy (stateless); subtopology 1: counts (stateful)."""
    builder = StreamsBuilder()
    builder.stream("words", key_serde=serdes.STRING, value_serde=serdes.STRING).to("copy")
    builder.stream(
        "clicks", key_serde=serdes.STRING, value_serde=serdes.STRING
    ).group_by_key().count(store="clicks").to_stream().to("click-counts", value_serde=serdes.INT64)
    return builder.build()


class FakeRunner:
    def __init__(self) -> None:
        self.tasks: dict[str, StreamTask] = {}

    def add_task(self, task: StreamTask) -> None:
        self.tasks[task.id] = task

    def remove_task(self, task_id: str) -> StreamTask | None:
        return self.tasks.pop(task_id, None)


class FakeRestorer:
    def __init__(self) -> None:
        self.restoring: dict[str, StreamTask] = {}
        self.done: list[StreamTask] = []

    def add_task(self, task: StreamTask) -> None:
        self.restoring[task.id] = task

    def remove_task(self, task_id: str) -> Future[bool]:
        future: Future[bool] = Future()
        future.set_result(self.restoring.pop(task_id, None) is not None)
        return future

    def finish(self, task_id: str) -> None:
        self.done.append(self.restoring.pop(task_id))

    def drain_restored(self) -> list[StreamTask]:
        done, self.done = self.done, []
        return done


class FakeOutput:
    def __init__(self) -> None:
        self.handed: list[Any] = []

    def hand_over(self, batch: list[Any]) -> None:
        self.handed.extend(batch)


class FakeConsumer:
    def __init__(self, committed: dict[tuple[str, int], int]) -> None:
        self._committed = committed
        self.seeks: list[tuple[str, int, int]] = []
        self.resumed: list[tuple[str, int]] = []
        self.paused: list[tuple[str, int]] = []
        self.assigned: set[tuple[str, int]] = set()
        self.failed_lookups = 0  # lookups still to fail
        self.lookup_error = KafkaError._TIMED_OUT  # with this code

    def assignment(self) -> list[TopicPartition]:
        return [TopicPartition(t, p) for t, p in sorted(self.assigned)]

    def pause(self, partitions: list[TopicPartition]) -> None:
        self.paused += [(tp.topic, tp.partition) for tp in partitions]

    def committed(self, partitions: list[TopicPartition], timeout: float) -> list[TopicPartition]:
        if self.failed_lookups:
            self.failed_lookups -= 1
            raise KafkaException(KafkaError(self.lookup_error, "Failed to get committed offsets"))
        return [
            TopicPartition(
                tp.topic, tp.partition, self._committed.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]

    def seek(self, tp: TopicPartition) -> None:
        self.seeks.append((tp.topic, tp.partition, tp.offset))

    def resume(self, partitions: list[TopicPartition]) -> None:
        self.resumed += [(tp.topic, tp.partition) for tp in partitions]


@pytest.fixture
def parts(tmp_path: Path) -> dict[str, Any]:
    topo = topology()
    counts_changelog = f"{APP}-clicks-changelog"
    layout = TopicLayout(
        sources={0: ["words"], 1: ["clicks"]},
        partitions={"words": 2, "copy": 2, "clicks": 2, "click-counts": 2, counts_changelog: 2},
        subtopology_of={"words": 0, "clicks": 1},
        changelogs={counts_changelog: 1},
    )
    settings = TaskSettings(
        application_id=APP,
        default_key_serde=serdes.BYTES,
        default_value_serde=serdes.BYTES,
        error_policy=ErrorPolicy("log_and_fail", "log_and_fail", None),
        partition_counts=layout.partitions,
        state_dir=str(tmp_path),
        cache_budget=CacheBudget(1 << 20),
    )
    runner, restorer, output = FakeRunner(), FakeRestorer(), FakeOutput()
    consumer = FakeConsumer({("words", 0): 41})
    buffers = InputBuffers(100)
    released: list[str] = []
    tasks = ActiveTasks(
        topo,
        layout,
        settings,
        buffers,
        runner,
        restorer,
        output,  # type: ignore[arg-type]
        consumer,  # type: ignore[arg-type]
        release_standby=released.append,
    )
    yield {
        "tasks": tasks,
        "runner": runner,
        "restorer": restorer,
        "output": output,
        "consumer": consumer,
        "buffers": buffers,
        "released": released,
        "layout": layout,
    }
    tasks.close_all_dirty()


def tps(*pairs: tuple[str, int]) -> list[TopicPartition]:
    return [TopicPartition(t, p) for t, p in pairs]


def test_stateless_tasks_run_at_once_stateful_ones_restore_first(parts: dict[str, Any]) -> None:
    tasks: ActiveTasks = parts["tasks"]
    created = tasks.create(tps(("words", 0), ("clicks", 1), ("unknown", 0)))
    assert created == 2
    assert set(parts["runner"].tasks) == {"0_0"}
    assert set(parts["restorer"].restoring) == {"1_1"}
    assert tasks.any_restoring and [t.id for t in tasks.restoring()] == ["1_1"]
    assert [t.id for t in tasks.processable()] == ["0_0"]
    assert parts["released"] == ["0_0", "1_1"], "a standby of a new task goes first"
    assert parts["buffers"].partitions() == [("clicks", 1), ("words", 0)]
    # Assigning the same partition again creates nothing new.
    assert tasks.create(tps(("words", 0))) == 0

    parts["restorer"].finish("1_1")
    tasks.take_restored()
    assert set(parts["runner"].tasks) == {"0_0", "1_1"}
    assert not tasks.any_restoring


def test_close_hands_output_over_unless_it_belongs_to_an_aborted_transaction(
    parts: dict[str, Any],
) -> None:
    tasks: ActiveTasks = parts["tasks"]
    tasks.create(tps(("words", 0), ("words", 1)))
    for task_id in ("0_0", "0_1"):
        task = tasks.get(task_id)
        assert task is not None
        task.send("copy", b"k", b"v", 1, None, 0)
    tasks.close(["0_0"])
    assert len(parts["output"].handed) == 1
    tasks.close(["0_1"], discard_output=True)
    assert len(parts["output"].handed) == 1
    assert parts["runner"].tasks == {} and parts["buffers"].partitions() == []
    assert tasks.ids() == frozenset()


def test_closing_a_restoring_task_takes_it_from_the_restorer(parts: dict[str, Any]) -> None:
    tasks: ActiveTasks = parts["tasks"]
    tasks.create(tps(("clicks", 0)))
    tasks.close(["1_0"])
    assert parts["restorer"].restoring == {}
    assert not tasks.any_restoring


def test_rewind_seeks_to_the_committed_offset_and_recreates_the_task(
    parts: dict[str, Any],
) -> None:
    tasks: ActiveTasks = parts["tasks"]
    tasks.create(tps(("words", 0), ("words", 1)))
    parts["consumer"].assigned = {("words", 0), ("words", 1)}
    before = tasks.get("0_0")
    parts["consumer"].resumed.clear()
    assert tasks.rewind("0_0")
    after = tasks.get("0_0")
    assert after is not None and after is not before and before is not None and before.closed
    assert parts["consumer"].seeks == [("words", 0, 41)]
    assert set(parts["consumer"].resumed) == {("words", 0)}
    assert tasks.rewind("9_9") is False


def test_rewind_all_starts_uncommitted_partitions_from_the_reset_policy(
    parts: dict[str, Any],
) -> None:
    tasks: ActiveTasks = parts["tasks"]
    tasks.create(tps(("words", 0), ("words", 1)))
    tasks.get("0_1").send("copy", b"k", b"v", 1, None, 0)  # type: ignore[union-attr]
    parts["consumer"].assigned = {("words", 0), ("words", 1)}
    rewound = tasks.rewind_all()
    assert sorted(rewound) == ["0_0", "0_1"]
    assert sorted(parts["consumer"].seeks) == [("words", 0, 41), ("words", 1, OFFSET_BEGINNING)]
    assert parts["output"].handed == [], "aborted work's output is dropped"
    assert sorted(parts["runner"].tasks) == ["0_0", "0_1"]


def test_a_rewind_checkpoints_the_last_commit_before_it_closes_the_task(
    parts: dict[str, Any],
) -> None:
    """The task made again restores only past its last commit, not from an
    older checkpoint (they are written every 10,000 records otherwise)."""
    tasks: ActiveTasks = parts["tasks"]
    tasks.create(tps(("clicks", 0)))
    parts["consumer"].assigned = {("clicks", 0)}
    parts["restorer"].finish("1_0")
    tasks.take_restored()
    task = tasks.get("1_0")
    assert task is not None
    changelog = (f"{APP}-clicks-changelog", 0)
    for position in (77, 120):  # the first is written (a new changelog), the second deferred
        task.prepare_commit()
        task.post_commit({changelog: position}, offsets_committed=True, checkpoint_now=False)
    assert read_checkpoint(checkpoint_path(task.directory)) == {changelog: 77}
    tasks.rewind_all()
    assert read_checkpoint(checkpoint_path(task.directory)) == {changelog: 120}
    again = tasks.get("1_0")
    assert again is not None and again is not task
    assert again.restore_from == {changelog: 120}


def test_a_rewind_whose_offsets_cannot_be_read_waits_paused_for_a_later_turn(
    parts: dict[str, Any],
) -> None:
    """After a broker outage the lookup can time out until the loop serves the
    group: the partitions stay paused, without tasks, and the next turn's
    attempt seeks and recreates them; nothing past the commit is fetched."""
    tasks: ActiveTasks = parts["tasks"]
    consumer = parts["consumer"]
    tasks.create(tps(("words", 0), ("words", 1)))
    consumer.assigned = {("words", 0), ("words", 1)}
    consumer.failed_lookups = 2
    consumer.resumed.clear()
    tasks.rewind_all()
    assert tasks.get("0_0") is None and tasks.get("0_1") is None
    assert {("words", 0), ("words", 1)} <= set(consumer.paused)
    assert consumer.seeks == [] and consumer.resumed == []
    assert tasks.seek_unsought() is False  # the second timeout
    assert tasks.seek_unsought() is True
    assert sorted(consumer.seeks) == [("words", 0, 41), ("words", 1, OFFSET_BEGINNING)]
    assert set(consumer.resumed) == {("words", 0), ("words", 1)}
    assert tasks.get("0_0") is not None and tasks.get("0_1") is not None
    assert tasks.unsought == []


@pytest.mark.parametrize(
    "code",
    [
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    ],
)
def test_a_rewind_asks_again_when_the_coordinator_moved_or_loads(
    parts: dict[str, Any], code: int
) -> None:
    """A broker back from a pause answered the rewind's lookup NOT_COORDINATOR
    (not flagged retriable by librdkafka) and the app stopped in ERROR
    (test_eos's broker-pause test): the coordinator's answers mean "ask again"."""
    tasks: ActiveTasks = parts["tasks"]
    consumer = parts["consumer"]
    tasks.create(tps(("words", 0)))
    consumer.assigned = {("words", 0)}
    consumer.failed_lookups = 1
    consumer.lookup_error = code
    tasks.rewind_all()
    assert tasks.get("0_0") is None
    assert tasks.seek_unsought() is True
    assert consumer.seeks == [("words", 0, 41)] and tasks.get("0_0") is not None


def test_a_rewind_fails_on_an_error_that_asking_again_cannot_mend(parts: dict[str, Any]) -> None:
    tasks: ActiveTasks = parts["tasks"]
    consumer = parts["consumer"]
    tasks.create(tps(("words", 0)))
    consumer.assigned = {("words", 0)}
    consumer.failed_lookups = 1
    consumer.lookup_error = KafkaError.GROUP_AUTHORIZATION_FAILED
    with pytest.raises(KafkaException):
        tasks.rewind_all()  # its first lookup is the one refused


def test_a_waiting_rewind_forgets_partitions_lost_or_assigned_anew(
    parts: dict[str, Any],
) -> None:
    tasks: ActiveTasks = parts["tasks"]
    consumer = parts["consumer"]
    tasks.create(tps(("words", 0), ("words", 1)))
    consumer.assigned = {("words", 0), ("words", 1)}
    consumer.failed_lookups = 1
    tasks.rewind_all()
    consumer.assigned = {("words", 1)}  # words-0 lost
    tasks.create(tps(("words", 1)))  # words-1 assigned anew: from its commit
    assert [(tp.topic, tp.partition) for tp in tasks.unsought] == [("words", 0)]
    assert tasks.seek_unsought() is True
    assert consumer.seeks == [] and tasks.unsought == []
    assert tasks.get("0_0") is None and tasks.get("0_1") is not None


def test_closed_tasks_keep_their_counts(parts: dict[str, Any]) -> None:
    tasks: ActiveTasks = parts["tasks"]
    tasks.create(tps(("words", 0)))
    task = tasks.get("0_0")
    assert task is not None
    task.processed_count = 12
    task.skipped_count = 2
    tasks.close_all_dirty()
    assert tasks.closed_totals == {"processed": 12, "skipped": 2, "dead_lettered": 0}


def assign(parts: dict[str, Any], *pairs: tuple[str, int]) -> int:
    """As the rebalance callback does: create, then the consumer has them."""
    created = parts["tasks"].create(tps(*pairs))
    parts["consumer"].assigned |= set(pairs)
    return int(created)


def test_partitions_beyond_the_accepted_count_are_held_until_it_grows(
    parts: dict[str, Any],
) -> None:
    tasks: ActiveTasks = parts["tasks"]
    assert assign(parts, ("words", 0), ("words", 1), ("words", 2), ("words", 3)) == 2
    assert tasks.ids() == {"0_0", "0_1"}
    assert tasks.held == {("words", 2), ("words", 3)}
    assert ("words", 2) not in parts["buffers"], "a held partition's records are dropped"
    tasks.pause_held()
    assert parts["consumer"].paused == [("words", 2), ("words", 3)]
    assert tasks.release_held() == 0, "nothing changed yet"

    parts["consumer"].assigned.discard(("words", 3))  # revoked meanwhile
    tasks.release_held()
    assert tasks.held == {("words", 2)}

    parts["layout"].partitions["words"] = 4  # the expansion is accepted
    assert tasks.release_held() == 1
    assert tasks.ids() == {"0_0", "0_1", "0_2"} and not tasks.held
    assert parts["consumer"].seeks == [("words", 2, OFFSET_BEGINNING)], "from the commit"
    assert ("words", 2) in parts["consumer"].resumed
    assert tasks.created_by_expansion == 1


def test_close_all_dirty_forgets_held_partitions(parts: dict[str, Any]) -> None:
    tasks: ActiveTasks = parts["tasks"]
    assign(parts, ("words", 5))
    assert tasks.held == {("words", 5)}
    tasks.close_all_dirty()
    assert not tasks.held


def test_a_join_task_waits_until_its_co_partitioned_partitions_are_both_here(
    tmp_path: Path,
) -> None:
    builder = StreamsBuilder()
    table = builder.table("t", key_serde=serdes.STRING, value_serde=serdes.STRING)
    builder.stream("s", key_serde=serdes.STRING, value_serde=serdes.STRING).join(
        table, lambda v, w: v
    ).to("out")
    topo = builder.build()
    (sub,) = topo.subtopologies
    layout = TopicLayout(
        sources={0: [s.name for s in sub.sources]},
        partitions={"s": 2, "t": 2, "out": 2}
        | {f"{APP}-{store.name}-changelog": 2 for store in sub.store_specs},
        subtopology_of={"s": 0, "t": 0},
        changelogs={f"{APP}-{store.name}-changelog": 0 for store in sub.store_specs},
    )
    settings = TaskSettings(
        APP, serdes.BYTES, serdes.BYTES, ErrorPolicy("log_and_fail", "log_and_fail", None),
        layout.partitions, str(tmp_path), CacheBudget(1 << 20),
    )  # fmt: skip
    consumer = FakeConsumer({})
    tasks = ActiveTasks(
        topo, layout, settings, InputBuffers(100), FakeRunner(), FakeRestorer(),
        FakeOutput(), consumer, release_standby=lambda task_id: None,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        # An assignor that splits the join's partitions (counts differed for a while).
        tasks.create(tps(("s", 0), ("t", 0), ("s", 1)))
        consumer.assigned |= {("s", 0), ("t", 0), ("s", 1)}
        assert tasks.ids() == {"0_0"} and tasks.held == {("s", 1)}
        tasks.create(tps(("t", 1)))  # a later, incremental assignment brings its sibling
        consumer.assigned.add(("t", 1))
        assert tasks.release_held() == 0  # 0_1 exists already (made for t-1)
        assert tasks.ids() == {"0_0", "0_1"} and not tasks.held
        task = tasks.get("0_1")
        assert task is not None and set(task.queues) == {"s", "t"}
    finally:
        tasks.close_all_dirty()


def _fill(buffers: InputBuffers, topic: str, partition: int, count: int) -> list[Any]:
    """Route `count` fake records into a partition's queue; returns partitions to pause."""

    class Msg:
        def error(self) -> None:
            return None

        def topic(self) -> str:
            return topic

        def partition(self) -> int:
            return partition

    _, to_pause = buffers.route([Msg() for _ in range(count)], lambda m: None)
    return to_pause


def test_a_task_let_go_while_its_queue_is_full_resumes_its_partition(
    parts: dict[str, Any],
) -> None:
    """Issue 31: librdkafka keeps a pause across unassign/assign, so a queue
    forgotten while paused must resume its partition in the consumer."""
    tasks: ActiveTasks = parts["tasks"]
    buffers: InputBuffers = parts["buffers"]
    consumer = parts["consumer"]
    tasks.create(tps(("words", 0), ("words", 1)))
    assert _fill(buffers, "words", 0, 100) == [("words", 0)]
    consumer.resumed.clear()
    tasks.close(["0_0"])  # revoked or lost while paused
    assert consumer.resumed == [("words", 0)]
    assert buffers.paused() == []


def test_every_created_task_resumes_its_partitions(parts: dict[str, Any]) -> None:
    """A partition assigned again after a lost membership may still be paused
    in librdkafka from before: creating its task resumes it."""
    tasks: ActiveTasks = parts["tasks"]
    consumer = parts["consumer"]
    consumer.resumed.clear()
    tasks.create(tps(("words", 0), ("clicks", 1)))
    assert set(consumer.resumed) == {("words", 0), ("clicks", 1)}


def test_close_all_dirty_resumes_what_the_buffers_paused(parts: dict[str, Any]) -> None:
    tasks: ActiveTasks = parts["tasks"]
    buffers: InputBuffers = parts["buffers"]
    consumer = parts["consumer"]
    tasks.create(tps(("words", 1)))
    _fill(buffers, "words", 1, 150)
    consumer.resumed.clear()
    tasks.close_all_dirty()
    assert consumer.resumed == [("words", 1)]
