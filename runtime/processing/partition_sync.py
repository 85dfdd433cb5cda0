"""Timestamp synchronization across a task's input partitions (`max.task.idle.ms`).

A task with several input partitions (a join, a merge, a stream-table join)
takes the record with the oldest head timestamp among its input queues. That
order only means something while every queue holds a record: with one queue
empty, the next record of that partition may be older than every buffered
one. Kafka Streams (KIP-353, KIP-695; `PartitionGroup.readyToProcess`)
decides per record, and so does `PartitionSync.ready` here:

- a queue holds records: ready as far as it is concerned;
- a queue is empty and its partition's lag behind the consumer is unknown,
  or records wait beyond what was buffered: not ready (they are being
  fetched; with `max.task.idle.ms` 0 the task waits only for these);
- a queue is empty and the partition is known to hold nothing more: the task
  waits until `max.task.idle.ms` after it first saw that, then takes records
  of the others anyway (*enforced processing*, counted).

`max.task.idle.ms` -1 turns it off: no `PartitionSync`, records are taken from
what is buffered, oldest head first (the runtime's behaviour before it).

The lag comes from the polling thread (`runtime.polling.fetched_lags`), which
writes `InputQueue.fetched` for the empty queues of synchronized tasks: the
consumer's position it was computed at and the records beyond it. It is
fresh only if it was computed after the last record taken from that queue
(`InputQueue.taken_to`): otherwise it may describe a moment before records
that were consumed since, and the task waits for the next figure.

Called by the processing thread holding the task (`StreamTask._next_queue`)
and by the scheduler reading `StreamTask.buffered` under the task manager's
lock (without counting); both may set a queue's idle deadline, to nearly the
same value, and a lost write only restarts a wait of at most
`max.task.idle.ms`.
"""

from __future__ import annotations

from collections.abc import Sequence, Sized
from typing import Protocol


class SyncedQueue(Protocol):
    """What the decision reads and writes of an input queue (`InputQueue` is one)."""

    @property
    def records(self) -> Sized: ...

    fetched: tuple[int, int] | None
    taken_to: int
    idle_deadline: float | None


class PartitionSync:
    """One task's readiness rule (module docstring). `idle_s` >= 0."""

    __slots__ = ("idle_s", "enforced_total")

    def __init__(self, max_task_idle_ms: int) -> None:
        if max_task_idle_ms < 0:
            raise ValueError("a task that does not wait has no PartitionSync")
        self.idle_s = max_task_idle_ms / 1000.0
        # Records taken while some partition was given up on (Kafka Streams'
        # enforced-processing-total). Written by the holder, read racily.
        self.enforced_total = 0

    def ready(self, queues: Sequence[SyncedQueue], now: float, count: bool = True) -> bool:
        """Whether the task may take its next record now (`now`: time.monotonic()).

        `count`: a record will be taken if True is returned (the processing
        thread), so an enforced decision is counted; the scheduler's look
        does not count.
        """
        queued = False
        enforced = False
        for queue in queues:
            if queue.records:
                queued = True
                queue.idle_deadline = None
                continue
            fetched = queue.fetched
            if fetched is None or fetched[0] <= queue.taken_to or fetched[1] > 0:
                # Unknown, stale, or records to fetch: wait for them.
                queue.idle_deadline = None
                return False
            deadline = queue.idle_deadline
            if deadline is None:
                deadline = queue.idle_deadline = now + self.idle_s
            if now < deadline:
                return False
            enforced = True
        if not enforced:
            return True
        if not queued:
            return False
        if count:
            self.enforced_total += 1
        return True
