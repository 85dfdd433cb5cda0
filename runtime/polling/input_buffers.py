"""Routing of consumed records into the bounded input queues of tasks.

Owned by the polling thread. It maps each assigned partition to its task's
input queue, appends records, and decides which partitions to pause (their
queue reached `buffered.records.per.partition`) and which to resume (their
queue drained below it). The consumer calls themselves stay in the polling
thread; this class only decides, which keeps it testable without Kafka.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from confluent_kafka import Message

from runtime.processing.input_queue import InputQueue

PartitionKey = tuple[str, int]


class InputBuffers:
    """Partition -> input queue, with the pause/resume bookkeeping (rule 5)."""

    def __init__(self, bound: int) -> None:
        self.bound = bound
        # Resume only once a paused queue is half empty: pausing makes
        # librdkafka drop its prefetch for the partition and resuming fetches
        # it again, so resuming at bound-1 would refetch for every record.
        # The polling thread raises it while queries of different priorities
        # run (`query_shares.input_refill`): smaller, more frequent refills.
        self.resume_below = max(1, bound // 2)
        self._queues: dict[PartitionKey, InputQueue] = {}
        self._paused: list[InputQueue] = []
        self._synced: list[InputQueue] | None = None  # cache of `synced()`

    def register(self, queue: InputQueue) -> None:
        self._queues[(queue.topic, queue.partition)] = queue
        self._synced = None

    def synced(self) -> list[InputQueue]:
        """Queues whose task waits for them while empty (`max.task.idle.ms`)."""
        if self._synced is None:
            self._synced = [q for q in self._queues.values() if q.synced]
        return self._synced

    def unregister(self, topic: str, partition: int) -> bool:
        """Forget a partition's queue; True if this class had paused it.

        The caller must then resume the partition in the consumer: librdkafka
        keeps an application pause across unassign and assign (measured on
        Kafka 4.4), so a queue forgotten while paused would leave its partition
        paused for good when it is assigned here again (issue 31: partitions
        frozen after a lost membership).
        """
        queue = self._queues.pop((topic, partition), None)
        self._synced = None
        if queue is not None and queue.paused:
            queue.paused = False
            self._paused = [q for q in self._paused if q is not queue]
            return True
        return False

    def clear(self) -> list[PartitionKey]:
        """Forget every queue; returns the partitions this class had paused
        (to resume in the consumer, see `unregister`)."""
        paused = self.paused()
        for queue in self._paused:
            queue.paused = False
        self._queues.clear()
        self._paused.clear()
        self._synced = None
        return paused

    def __contains__(self, key: PartitionKey) -> bool:
        return key in self._queues

    def partitions(self) -> list[PartitionKey]:
        return sorted(self._queues)

    def buffered(self, key: PartitionKey) -> int:
        """Records of one partition consumed and not yet taken by a processing thread."""
        queue = self._queues.get(key)
        return len(queue.records) if queue is not None else 0

    @property
    def any_paused(self) -> bool:
        return bool(self._paused)

    def is_paused(self, key: PartitionKey) -> bool:
        queue = self._queues.get(key)
        return queue is not None and queue.paused

    def paused(self) -> list[PartitionKey]:
        return [(q.topic, q.partition) for q in self._paused]

    def route(
        self, records: Iterable[Message], on_error: Callable[[Message], None]
    ) -> tuple[int, list[PartitionKey]]:
        """Append records to their queues; returns (routed, partitions to pause).

        Records of a partition no longer registered (revoked since they were
        fetched) are dropped: they are fetched again by the next owner.
        """
        queues = self._queues
        last_topic: str | None = None
        last_partition = -1
        queue: InputQueue | None = None
        touched: list[InputQueue] = []
        routed = 0
        for message in records:
            if message.error() is not None:
                on_error(message)
                continue
            # Consumed records always carry their topic and partition.
            topic: str = message.topic()  # type: ignore[assignment]
            partition: int = message.partition()  # type: ignore[assignment]
            # consume() returns runs of one partition: look the queue up per run.
            if partition != last_partition or topic != last_topic:
                last_topic, last_partition = topic, partition
                queue = queues.get((topic, partition))
                if queue is not None:
                    touched.append(queue)
            if queue is None:
                continue
            queue.records.append(message)
            routed += 1
        to_pause: list[PartitionKey] = []
        bound = self.bound
        for queue in touched:
            if not queue.paused and len(queue.records) >= bound:
                queue.paused = True
                self._paused.append(queue)
                to_pause.append((queue.topic, queue.partition))
        return routed, to_pause

    def to_resume(self) -> list[PartitionKey]:
        """Paused partitions whose queue drained to half the bound (now unpaused)."""
        bound = self.resume_below
        resumed: list[PartitionKey] = []
        still: list[InputQueue] = []
        for queue in self._paused:
            if len(queue.records) < bound:
                queue.paused = False
                resumed.append((queue.topic, queue.partition))
            else:
                still.append(queue)
        self._paused = still
        return resumed
