"""The commit protocol (correctness rules 3 and 4), in one place.

A commit, in order:

0. barrier (exactly_once_v2, key-parallel tasks only): stop dispatching input
   into key lanes and wait until every record in flight has completed, so
   the transaction holds the output of exactly the records below the
   offsets it commits (`tasks_locked(barrier=...)`). If that cannot happen
   (a failed task, no thread left to finish them, too long for the
   transaction timeout) the commit aborts and the caller rewinds every task;
   under at_least_once there is no barrier: the offset committed is the
   watermark (`KeyParallelTask.processed_offsets`), never past a record not
   yet completed (rule 3);
1. lock: stop scheduling and wait until no processing thread holds a task
   (`tasks_locked`, the caller's `with` block);
2. prepare: each task hands over its output and emits its cached state
   (`StreamTask.prepare_commit` -> offsets to commit, output records);
3. drain: the collector's buffers go into the producer;
4. make durable: under exactly_once_v2 one transaction commits every task's
   output, changelog records and input offsets (sent with the consumer's
   group metadata, so a zombie of an older generation cannot commit); under
   at_least_once the producer is flushed until every record is acknowledged,
   then the input offsets are committed;
5. positions: one ListOffsets request (per leader) asks the broker for the
   end offsets of the changelog partitions this commit wrote
   (`CommitBatch.changelogs`). The output is acknowledged by now (step 4) and
   nothing is produced until the commit ends, so an end offset is never
   below the task's last changelog record; it is the record's offset + 1, or
   a transaction marker further (exactly_once_v2: the consumer reads the
   last stable offset, which may still lag behind the marker: lower, never
   higher). One request per commit replaces one success delivery report (a
   Python call on this thread) per output record. A failed lookup keeps the
   old positions (lower than the truth: restoration replays a little more);
6. post-commit: each task writes its store batches to disk and a checkpoint
   naming those changelog positions (`StreamTask.post_commit`); under
   `state.store.layout=consolidated` the tasks only stage them, and
   `write_state()` writes every task's as one synced batch; then
   `after_commit(tasks)`, if set (remote state takes its snapshots there:
   runtime.state.remote.capture).

On a failed transaction the committer returns the failure
(`CommitResult.aborted`) and does nothing else: the coordinator decides what
follows (rewind every task). A record the broker refused for good raises
`ProductionFailed` (from step 3 or 4): nothing is committed past it.

Used by the polling thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Protocol

from confluent_kafka import OFFSET_END, Consumer, KafkaException, TopicPartition

from runtime.collector.output import OutputChannel
from runtime.collector.transactions import TransactionFailed
from runtime.logging import get_logger
from runtime.processing.task import CommitBatch

log = get_logger("runtime.commit")

# How long the commit waits for processing threads to release their tasks
# before it logs that it is still waiting (it keeps waiting: a batch is
# bounded by task.timeslice.ms unless user code hangs).
_LOCK_WARN_AFTER_S = 5.0
# The exactly-once barrier gives up when no in-flight record completed for
# this long (and none waits for a retry): no processing thread is there to
# finish them (all stopped, or none configured).
_BARRIER_STALL_S = 2.0
# How long step 5 waits for the changelogs' end offsets (tasks are locked).
_POSITIONS_TIMEOUT_S = 5.0
# Commits that may leave a task's checkpoint file for later (see
# `StreamTask.post_commit`): the interval's, and those a processor asked for.
_DEFERRABLE_REASONS = frozenset({"interval", "requested"})


class CommittableTask(Protocol):
    """What the committer needs of a task (`StreamTask` implements it)."""

    @property
    def partition(self) -> int: ...

    def prepare_commit(self) -> CommitBatch: ...

    def post_commit(
        self,
        changelog_positions: dict[tuple[str, int], int],
        offsets_committed: bool,
        checkpoint_now: bool = True,
    ) -> None: ...


class TaskLocks(Protocol):
    """The task manager's side of the lock (step 1) and of the barrier's wait."""

    def lock_all_tasks(self) -> Any: ...

    def unlock_all_tasks(self) -> None: ...

    def wait_for_change(self, timeout: float) -> None: ...


class BarrierTask(Protocol):
    """What the barrier needs of a key-parallel task (`KeyParallelTask`):
    among a commit's tasks, those whose `key_parallel` kind is True."""

    @property
    def id(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def completed_total(self) -> int: ...

    @property
    def backing_off(self) -> bool: ...

    @property
    def active_grabs(self) -> int: ...

    @property
    def failed(self) -> bool: ...

    def hold_dispatch(self) -> None: ...

    def resume_dispatch(self) -> None: ...


@dataclass(frozen=True)
class CommitResult:
    """How a commit ended; `aborted` is set when its transaction failed."""

    committed: bool
    partitions: int = 0
    aborted: TransactionFailed | None = None


class Committer:
    """Runs the commit protocol for the polling thread. Polling thread only."""

    def __init__(
        self,
        locks: TaskLocks,
        output: OutputChannel,
        consumer: Consumer,
        abort_requested: Callable[[], bool],
    ) -> None:
        self._locks = locks
        self._output = output
        self._consumer = consumer
        self._abort_requested = abort_requested
        self.commits_total = 0
        self.failures_total = 0
        self.last_commit_wall_time: float | None = None
        self.last_commit_duration_s = 0.0
        self.barrier_aborts = 0
        self.position_lookup_failures = 0
        # Set by a barrier that was not reached: the commit in the same
        # `tasks_locked` block aborts instead (exactly_once_v2).
        self._barrier_broken: str | None = None
        # Called after every task's post_commit, tasks still locked; set once
        # before the polling thread starts. Must not raise.
        self.after_commit: Callable[[Sequence[CommittableTask]], None] | None = None
        # Called after every task's post_commit (consolidated layout: writes
        # the staged store batches and positions at once); set once before
        # the polling thread starts.
        self.write_state: Callable[[], object] | None = None

    @contextmanager
    def tasks_locked(self, barrier: Sequence[Any] = ()) -> Iterator[None]:
        """Steps 0 and 1: under exactly_once_v2, drain the in-flight records of
        the key-parallel tasks among `barrier` (a commit's tasks; pass none to
        abort or rewind); then stop scheduling and wait until no processing
        thread holds a task.

        Delivery reports are served meanwhile. Scheduling and dispatch resume on exit.
        """
        self._barrier_broken = None
        held: list[BarrierTask] = []
        if barrier and self._output.transactions is not None:
            held = [t for t in barrier if t.key_parallel]
        for task in held:
            task.hold_dispatch()
        try:
            if held:
                self._barrier_broken = self._await_barrier(held)
            with self._locked():
                yield
        finally:
            for task in held:
                task.resume_dispatch()

    def _await_barrier(self, tasks: list[BarrierTask]) -> str | None:
        """Wait until no record is in flight in `tasks`; why not, if it gives up.

        Gives up on a failed task with records in flight, after
        `_BARRIER_STALL_S` without a completed record while no thread works on
        them and none waits for a retry (no thread is left to finish them),
        and after half the transaction timeout in any case. Output made
        meanwhile is drained.
        """
        transactions = self._output.transactions
        limit = transactions.timeout_s / 2 if transactions is not None else _BARRIER_STALL_S
        started = last_progress = time.monotonic()
        progress = -1
        while True:
            waiting = [t for t in tasks if t.in_flight]
            if not waiting:
                return None
            if any(t.failed for t in waiting):
                return "a task with records in flight failed"
            now = time.monotonic()
            completed = sum(t.completed_total for t in tasks)
            if completed != progress:
                progress, last_progress = completed, now
            elif now - last_progress > _BARRIER_STALL_S and not any(
                t.backing_off or t.active_grabs for t in waiting
            ):
                return "records in flight made no progress (no processing thread?)"
            if now - started > limit:
                return "records in flight outlasted half the transaction timeout"
            self._output.drain()
            self._output.serve()
            self._locks.wait_for_change(0.005)

    @contextmanager
    def _locked(self) -> Iterator[None]:
        future = self._locks.lock_all_tasks()
        try:
            started = time.monotonic()
            while True:
                try:
                    future.result(timeout=0.05)
                    break
                except TimeoutError:
                    self._output.serve()
                    if time.monotonic() - started > _LOCK_WARN_AFTER_S:
                        log.warning("commit_waiting_for_processing_threads")
                        started = time.monotonic()
            yield
        finally:
            self._locks.unlock_all_tasks()

    def commit(self, tasks: Sequence[CommittableTask], reason: str) -> CommitResult:
        """Steps 2-6 for `tasks`; every task must be locked (`tasks_locked`)."""
        started = time.monotonic()
        transactions = self._output.transactions
        if self._barrier_broken is not None and transactions is not None:
            # Output of records above a key-parallel task's watermark is in
            # the transaction: committing would commit it without its offsets.
            log.warning("commit_barrier_not_reached", reason=self._barrier_broken)
            self._barrier_broken = None
            self.barrier_aborts += 1
            self.failures_total += 1
            return CommitResult(False, aborted=transactions.abort())
        batches = [task.prepare_commit() for task in tasks]
        offsets = [
            TopicPartition(topic, batch.task.partition, offset)
            for batch in batches
            for topic, offset in batch.offsets.items()
        ]
        for batch in batches:
            if batch.output:
                self._output.hand_over(batch.output)
        self._output.drain()
        if transactions is not None:
            try:
                transactions.commit(offsets, self._consumer.consumer_group_metadata())
            except TransactionFailed as failure:
                refused = self._output.errors.take_failure()
                if refused is not None:
                    # A record the broker refused for good: rewinding would
                    # only meet it again.
                    raise refused from failure
                self.failures_total += 1
                return CommitResult(False, aborted=failure)
            offsets_committed = True
        else:
            # Output acknowledged, then the offsets that produced it (rule 3).
            self._output.flush(self._abort_requested)
            refused = self._output.errors.take_failure()
            if refused is not None:
                raise refused
            offsets_committed = self._commit_offsets(offsets, reason)
        positions = self._changelog_positions(
            [changelog for batch in batches for changelog in batch.changelogs]
        )
        # The regular commits may defer a task's checkpoint file; every other
        # one precedes a task leaving or the app stopping, and writes it.
        checkpoint_now = reason not in _DEFERRABLE_REASONS
        for task in tasks:
            task.post_commit(positions, offsets_committed, checkpoint_now)
        if self.write_state is not None:
            self.write_state()
        if self.after_commit is not None and offsets_committed:
            self.after_commit(tasks)
        if offsets and offsets_committed:
            self.commits_total += 1
            self.last_commit_wall_time = time.time()
            self.last_commit_duration_s = time.monotonic() - started
            log.debug("committed", reason=reason, partitions=len(offsets))
        return CommitResult(offsets_committed, len(offsets))

    def _changelog_positions(self, changelogs: list[tuple[str, int]]) -> dict[tuple[str, int], int]:
        """Step 5: the end offset of each changelog partition (see the module
        docstring); the ones the broker did not give are left out."""
        if not changelogs:
            return {}
        try:
            # A timestamp of OFFSET_END (-1) asks ListOffsets for the latest
            # offset; librdkafka groups the partitions into one request per leader.
            ends = self._consumer.offsets_for_times(
                [TopicPartition(topic, partition, OFFSET_END) for topic, partition in changelogs],
                timeout=_POSITIONS_TIMEOUT_S,
            )
        except KafkaException as exc:
            self.position_lookup_failures += 1
            log.warning("changelog_positions_unknown", error=str(exc))
            return {}
        return {
            (tp.topic, tp.partition): tp.offset
            for tp in ends
            if tp.error is None and tp.offset >= 0
        }

    def _commit_offsets(self, offsets: list[TopicPartition], reason: str) -> bool:
        if not offsets:
            return True
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            # At-least-once: the offsets are committed with the next commit;
            # nothing is lost, at worst reprocessed.
            self.failures_total += 1
            log.warning("commit_failed", reason=reason, error=str(exc))
            return False
        return True
