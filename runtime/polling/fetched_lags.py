"""What the consumer knows of the partitions a task waits for (`max.task.idle.ms`).

A task with several input partitions waits while one of them is empty and
records are known to be there beyond what was fetched
(`runtime.processing.partition_sync`). This module tells it, on the polling
thread (the only user of the consumer), once a loop turn: for each empty
input queue of such a task, the consumer's position (the next offset it
will hand over) and the records between it and the end of the partition as
the last fetch response gave it (librdkafka's cached high watermark: the
last stable offset under read_committed). It writes that pair to the queue
(`InputQueue.fetched`); the task reads it there.

A partition the consumer has handed nothing of since it was assigned (or
since it was resumed with a seek) has no position in librdkafka; if its queue
was emptied by a record, the position is the one after that record; else
it starts at the group's committed offset (learnt by `LagTracker`, once per
assignment) or, with none, at the log's start (the runtime's consumers reset
to earliest). Until the committed offset is known,
or before the first fetch response gave a high watermark, the figure is
unknown and the task waits, as Kafka Streams waits while the lag is unknown.

Cost: nothing without a task that synchronizes partitions; else one
`position()` call for the empty queues and one cached watermark lookup each,
per loop turn. Polling thread only.
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from runtime.polling.input_buffers import InputBuffers

PartitionKey = tuple[str, int]


class FetchedLags:
    """Writes `InputQueue.fetched` for the empty synchronized queues. Polling thread only."""

    def __init__(
        self,
        consumer: Consumer,
        buffers: InputBuffers,
        committed: Callable[[PartitionKey], int | None],
    ) -> None:
        self._consumer = consumer
        self._buffers = buffers
        self._committed = committed

    def refresh(self) -> bool:
        """Update the figures; True if one now says an empty partition holds
        nothing more (a waiting task may be ready: wake the processing threads)."""
        queues = self._buffers.synced()
        if not queues:
            return False
        empty = [q for q in queues if not q.records]
        if not empty:
            return False
        try:
            positions = self._consumer.position(
                [TopicPartition(q.topic, q.partition) for q in empty]
            )
        except (KafkaException, RuntimeError):  # a closed consumer: nothing to learn
            return False
        caught_up = False
        for queue, tp in zip(empty, positions, strict=True):
            position = tp.offset
            if position < 0 and queue.taken_to >= 0:
                # librdkafka forgets the position of a partition resumed with a
                # seek (`fetch_resumed_now`) until it hands over a record; an
                # empty queue was emptied by its last record, so what the
                # consumer handed over ends there. (With the committed offset
                # instead, a drained partition looked behind for good: a join
                # task waited forever on records it had already taken.)
                position = queue.taken_to + 1
            figure = self._figure(queue.topic, queue.partition, position)
            if figure is not None and figure[1] == 0 and queue.fetched != figure:
                caught_up = True
            queue.fetched = figure
        return caught_up

    def _figure(self, topic: str, partition: int, position: int) -> tuple[int, int] | None:
        try:
            low, high = self._consumer.get_watermark_offsets(
                TopicPartition(topic, partition), cached=True
            )
        except KafkaException:
            return None
        if high < 0:
            return None  # no fetch response yet
        if position < 0:
            committed = self._committed((topic, partition))
            if committed is None:
                return None
            position = committed if committed >= 0 else max(low, 0)
        return position, max(0, high - position)
