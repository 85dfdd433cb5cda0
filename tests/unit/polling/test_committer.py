"""The commit protocol's order and failure handling, with fake clients (pure logic)."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.collector.production_errors import ProductionFailed
from runtime.collector.transactions import TransactionFailed
from runtime.polling.committer import Committer
from runtime.processing.task import CommitBatch


class Log(list[str]):
    pass


class FakeTask:
    """Processes numbered records; each record makes one output record and one
    changelog record (`("cl-<partition>", n)`, changelog partition ("cl", p))."""

    def __init__(self, name: str, partition: int, log: Log) -> None:
        self.id = name
        self.partition = partition
        self._log = log
        self.processed = -1  # last processed offset
        self.committed = -1
        self.pending_output: list[Any] = []
        self.post_commits: list[tuple[dict, bool]] = []
        self._pending = -1
        self.logged = 0
        self._logged_at_commit = 0

    def process(self, count: int) -> None:
        for _ in range(count):
            self.processed += 1
            self.pending_output.append((self.id, self.processed))
            self.pending_output.append((f"cl-{self.partition}", self.logged))
            self.logged += 1

    def prepare_commit(self) -> CommitBatch:
        self._log.append(f"prepare {self.id}")
        offsets = {"in": self.processed + 1} if self.processed != self.committed else {}
        self._pending = self.processed
        output, self.pending_output = self.pending_output, []
        written = (("cl", self.partition),) if self.logged != self._logged_at_commit else ()
        self._logged_at_commit = self.logged
        return CommitBatch(self, offsets, output, written)  # type: ignore[arg-type]

    def post_commit(
        self, positions: dict, offsets_committed: bool, checkpoint_now: bool = True
    ) -> None:
        self._log.append(f"post_commit {self.id} {offsets_committed}")
        self.post_commits.append((positions, offsets_committed))
        if offsets_committed:
            self.committed = self._pending


class FakeErrors:
    def __init__(self) -> None:
        self.failure: ProductionFailed | None = None

    def take_failure(self) -> ProductionFailed | None:
        failure, self.failure = self.failure, None
        return failure


class FakeTransactions:
    timeout_s = 10.0

    def __init__(self, log: Log) -> None:
        self._log = log
        self.open = False
        self.fail_with: TransactionFailed | None = None
        self.committed_offsets: list[TopicPartition] = []

    def commit(self, offsets: list[TopicPartition], metadata: Any) -> None:
        self._log.append(f"txn_commit {len(offsets)} {metadata}")
        if self.fail_with is not None:
            raise self.fail_with
        self.committed_offsets = offsets


class FakeOutput:
    """Records handed over are 'in flight' until a flush acknowledges them."""

    def __init__(self, log: Log, transactions: FakeTransactions | None = None) -> None:
        self._log = log
        self.transactions = transactions
        self.errors = FakeErrors()
        self.queued: list[Any] = []
        self.in_flight: list[Any] = []
        self.acknowledged: list[Any] = []
        self.refuse_on_flush = False
        self.served = 0

    def hand_over(self, batch: list[Any]) -> None:
        self.queued.extend(batch)

    def drain(self) -> int:
        self._log.append(f"drain {len(self.queued)}")
        self.in_flight += self.queued
        drained, self.queued = len(self.queued), []
        return drained

    def flush(self, abort_requested: Any) -> None:
        self._log.append("flush")
        if self.refuse_on_flush:
            self.errors.failure = ProductionFailed("refused")
            self.in_flight = []
            return
        self.acknowledged += self.in_flight
        self.in_flight = []

    def serve(self) -> None:
        self.served += 1


class FakeConsumer:
    """Commits offsets; end offsets of changelog ("cl", p) come from what
    `output` acknowledged (one offset per acknowledged changelog record)."""

    def __init__(self, log: Log, output: FakeOutput) -> None:
        self._log = log
        self._output = output
        self.fail = False
        self.fail_lookup = False
        self.committed: dict[tuple[str, int], int] = {}

    def offsets_for_times(self, partitions: list[TopicPartition], timeout: float) -> list:
        self._log.append(f"end_offsets {len(partitions)}")
        if self.fail_lookup:
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT))
        assert all(tp.offset == -1 for tp in partitions), "OFFSET_END: the latest offset"
        return [
            TopicPartition(
                tp.topic,
                tp.partition,
                sum(1 for name, _ in self._output.acknowledged if name == f"cl-{tp.partition}"),
            )
            for tp in partitions
        ]

    def commit(self, offsets: list[TopicPartition], asynchronous: bool) -> None:
        self._log.append(f"consumer_commit {len(offsets)}")
        if self.fail:
            raise KafkaException(KafkaError(KafkaError.REBALANCE_IN_PROGRESS))
        for tp in offsets:
            self.committed[(tp.topic, tp.partition)] = tp.offset

    def consumer_group_metadata(self) -> str:
        return "gen-3"


class FakeLocks:
    def __init__(self, future: Future[None] | None = None) -> None:
        self.future = future or done()
        self.locked = 0
        self.unlocked = 0

    def lock_all_tasks(self) -> Future[None]:
        self.locked += 1
        return self.future

    def unlock_all_tasks(self) -> None:
        self.unlocked += 1

    def wait_for_change(self, timeout: float) -> None:
        pass


def done() -> Future[None]:
    future: Future[None] = Future()
    future.set_result(None)
    return future


def committer(
    eos: bool = False,
) -> tuple[Committer, Log, FakeOutput, FakeConsumer, FakeLocks]:
    log = Log()
    output = FakeOutput(log, FakeTransactions(log) if eos else None)
    consumer = FakeConsumer(log, output)
    locks = FakeLocks()
    return Committer(locks, output, consumer, lambda: False), log, output, consumer, locks  # type: ignore[arg-type]


def test_at_least_once_order_prepare_drain_flush_offsets_then_state() -> None:
    c, log, output, consumer, _ = committer()
    a, b = FakeTask("0_0", 0, log), FakeTask("0_1", 1, log)
    a.process(3)
    b.process(2)
    result = c.commit([a, b], "interval")
    assert log == [
        "prepare 0_0",
        "prepare 0_1",
        "drain 10",
        "flush",
        "consumer_commit 2",
        "end_offsets 2",
        "post_commit 0_0 True",
        "post_commit 0_1 True",
    ]
    assert result.committed and result.partitions == 2
    assert consumer.committed == {("in", 0): 3, ("in", 1): 2}
    positions = {("cl", 0): 3, ("cl", 1): 2}
    assert a.post_commits[0][0] == positions, "changelog positions asked of the broker"
    assert c.commits_total == 1


def test_refused_output_raises_before_any_offset_or_state_is_committed() -> None:
    c, log, output, consumer, _ = committer()
    task = FakeTask("0_0", 0, log)
    task.process(4)
    output.refuse_on_flush = True
    with pytest.raises(ProductionFailed):
        c.commit([task], "interval")
    assert consumer.committed == {}
    assert task.post_commits == []


def test_a_failed_offset_commit_still_writes_state_but_keeps_offsets_uncommitted() -> None:
    c, log, _, consumer, _ = committer()
    task = FakeTask("0_0", 0, log)
    task.process(1)
    consumer.fail = True
    result = c.commit([task], "interval")
    assert not result.committed
    assert task.post_commits == [({("cl", 0): 1}, False)]
    assert task.committed == -1 and c.failures_total == 1
    consumer.fail = False
    assert c.commit([task], "interval").committed
    assert consumer.committed == {("in", 0): 1}


def test_exactly_once_commits_every_offset_in_the_transaction() -> None:
    c, log, output, consumer, _ = committer(eos=True)
    a, b = FakeTask("0_0", 0, log), FakeTask("1_0", 0, log)
    a.process(2)
    b.process(5)
    assert c.commit([a, b], "interval").committed
    assert log[-4:] == [
        "txn_commit 2 gen-3",
        "end_offsets 2",
        "post_commit 0_0 True",
        "post_commit 1_0 True",
    ]
    assert "consumer_commit" not in " ".join(log)
    assert output.transactions is not None
    assert sorted(tp.offset for tp in output.transactions.committed_offsets) == [2, 5]


def test_a_failed_transaction_is_returned_for_the_coordinator_to_decide() -> None:
    c, log, output, _, _ = committer(eos=True)
    task = FakeTask("0_0", 0, log)
    task.process(2)
    assert output.transactions is not None
    failure = TransactionFailed(KafkaError(KafkaError._TIMED_OUT), recreated_producer=False)
    output.transactions.fail_with = failure
    result = c.commit([task], "interval")
    assert result.aborted is failure and not result.committed
    assert task.post_commits == [], "no state is written for an aborted transaction"


def test_a_refusal_inside_a_failed_transaction_stops_instead_of_rewinding() -> None:
    c, log, output, _, _ = committer(eos=True)
    task = FakeTask("0_0", 0, log)
    task.process(1)
    assert output.transactions is not None
    output.transactions.fail_with = TransactionFailed(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), recreated_producer=False
    )
    output.errors.failure = ProductionFailed("too large")
    with pytest.raises(ProductionFailed):
        c.commit([task], "interval")


def test_tasks_locked_waits_for_the_lock_serving_the_producer_and_unlocks() -> None:
    log = Log()
    output = FakeOutput(log)
    pending: Future[None] = Future()
    locks = FakeLocks(pending)
    c = Committer(locks, output, FakeConsumer(log, output), lambda: False)  # type: ignore[arg-type]
    served_before = output.served

    import threading

    threading.Timer(0.2, lambda: pending.set_result(None)).start()
    with c.tasks_locked():
        assert pending.done()
        assert locks.unlocked == 0
    assert locks.unlocked == 1
    assert output.served > served_before, "delivery reports served while waiting"


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("process"), st.integers(0, 1), st.integers(1, 20)),
            st.tuples(st.just("commit"), st.booleans(), st.booleans()),
        ),
        max_size=40,
    )
)
def test_offsets_are_never_committed_past_acknowledged_output(ops: list[tuple]) -> None:
    """Whatever fails when: a committed offset n means outputs 0..n-1 were acknowledged."""
    c, log, output, consumer, _ = committer()
    tasks = [FakeTask("0_0", 0, log), FakeTask("0_1", 1, log)]
    for op in ops:
        if op[0] == "process":
            tasks[op[1]].process(op[2])
            continue
        _, refuse, offsets_fail = op
        output.refuse_on_flush = refuse
        consumer.fail = offsets_fail
        try:
            c.commit(tasks, "interval")
        except ProductionFailed:
            # The app stops here: nothing more is committed; the rest is
            # reprocessed after a restart.
            break
        for task in tasks:
            done_upto = consumer.committed.get(("in", task.partition), 0)
            acked = {n for name, n in output.acknowledged if name == task.id}
            assert set(range(done_upto)) <= acked
            # The checkpoint's changelog position never names a changelog
            # record the broker has not acknowledged.
            logged = {n for name, n in output.acknowledged if name == f"cl-{task.partition}"}
            for positions, _ in task.post_commits:
                position = positions.get(("cl", task.partition))
                assert position is None or set(range(position)) <= logged


def test_a_commit_asks_only_for_the_changelogs_it_wrote() -> None:
    c, log, _output, _consumer, _ = committer()
    a, b = FakeTask("0_0", 0, log), FakeTask("0_1", 1, log)
    a.process(2)
    c.commit([a, b], "interval")
    assert "end_offsets 1" in log
    assert b.post_commits[0][0] == {("cl", 0): 2}, "b wrote nothing: no position for it"
    log.clear()
    c.commit([a, b], "interval")
    assert not any(entry.startswith("end_offsets") for entry in log), "nothing written"


def test_an_unanswered_position_lookup_keeps_the_old_positions_and_commits() -> None:
    c, log, _output, consumer, _ = committer()
    task = FakeTask("0_0", 0, log)
    task.process(3)
    consumer.fail_lookup = True
    result = c.commit([task], "interval")
    assert result.committed and consumer.committed == {("in", 0): 3}
    assert task.post_commits == [({}, True)], "no position is better than a wrong one"
    assert c.position_lookup_failures == 1


class FakeKeyParallelTask(FakeTask):
    """A key-parallel task whose in-flight records complete one per wait."""

    key_parallel = True

    def __init__(self, name: str, partition: int, log: Log, in_flight: int) -> None:
        super().__init__(name, partition, log)
        self.in_flight = in_flight
        self.completed_total = 0
        self.backing_off = False
        self.active_grabs = 0
        self.failed = False
        self.held = False
        self.stalled = False

    def hold_dispatch(self) -> None:
        self._log.append(f"hold {self.id}")
        self.held = True

    def resume_dispatch(self) -> None:
        self._log.append(f"resume {self.id}")
        self.held = False

    def step(self) -> None:
        if self.in_flight and not self.stalled:
            self.in_flight -= 1
            self.completed_total += 1
            self.process(1)


class SteppingLocks(FakeLocks):
    """The barrier's wait lets the processing threads (the tasks' `step`) move on."""

    def __init__(self, tasks: list[FakeKeyParallelTask]) -> None:
        super().__init__()
        self.tasks = tasks

    def wait_for_change(self, timeout: float) -> None:
        for task in self.tasks:
            task.step()


def test_the_exactly_once_barrier_drains_in_flight_records_before_the_lock() -> None:
    c, log, output, consumer, _ = committer(eos=True)
    task = FakeKeyParallelTask("0_0", 0, log, in_flight=5)
    c._locks = SteppingLocks([task])
    with c.tasks_locked(barrier=[task]):
        assert task.in_flight == 0 and task.held
        result = c.commit([task], "interval")  # type: ignore[list-item]
    assert result.committed and result.aborted is None
    assert not task.held
    assert log.index("hold 0_0") < log.index("prepare 0_0") < log.index("resume 0_0")
    assert output.transactions is not None
    assert [tp.offset for tp in output.transactions.committed_offsets] == [5]


def test_an_unreachable_barrier_aborts_the_transaction(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("runtime.polling.committer._BARRIER_STALL_S", 0.05)
    c, log, output, _consumer, _ = committer(eos=True)
    transactions = output.transactions
    assert transactions is not None
    aborted = TransactionFailed(KafkaError(KafkaError._STATE, "aborted"), False)
    transactions.abort = lambda: aborted  # type: ignore[attr-defined]
    task = FakeKeyParallelTask("0_0", 0, log, in_flight=3)
    task.stalled = True  # no processing thread left to finish them
    c._locks = SteppingLocks([task])
    with c.tasks_locked(barrier=[task]):
        result = c.commit([task], "shutdown")  # type: ignore[list-item]
    assert result.aborted is aborted and not result.committed
    assert "prepare 0_0" not in log and c.barrier_aborts == 1


def test_at_least_once_has_no_barrier() -> None:
    c, log, _output, _consumer, _ = committer()
    task = FakeKeyParallelTask("0_0", 0, log, in_flight=3)
    with c.tasks_locked(barrier=[task]):
        result = c.commit([task], "interval")  # type: ignore[list-item]
    assert result.committed and task.in_flight == 3 and "hold 0_0" not in log
