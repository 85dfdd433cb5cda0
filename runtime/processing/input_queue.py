"""`InputQueue`: the bounded buffer of one input partition of a task.

The polling thread appends consumed messages (`InputBuffers.route`, a deque
append, safe against the one holder popping at the other end) and pauses the
partition when the buffer is full; the processing thread holding the task
pops them. The `max.task.idle.ms` fields are the polling thread's figures for
an empty queue, read by the holder (runtime.processing.partition_sync).
"""

from __future__ import annotations

from collections import deque

from confluent_kafka import Message


class InputQueue:
    """The bounded buffer of one input partition of a task.

    Written by the polling thread, read by the processing thread holding the
    task. The bound is enforced by the polling thread pausing the partition.
    """

    __slots__ = (
        "topic",
        "partition",
        "records",
        "paused",
        "synced",
        "fetched",
        "taken_to",
        "idle_deadline",
    )

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.records: deque[Message] = deque()
        self.paused = False  # polling thread only
        # `max.task.idle.ms` (runtime.processing.partition_sync): whether its
        # task waits for it while empty; the polling thread's figure for it
        # while empty, (consumer position, records beyond it) or None when
        # unknown; the offset of the last record taken when that emptied it;
        # when the wait for it ends (time.monotonic()).
        self.synced = False
        self.fetched: tuple[int, int] | None = None
        self.taken_to = -1
        self.idle_deadline: float | None = None

    def emptied_by(self, message: Message) -> None:
        """The holder took `message`, the last record buffered (partition_sync)."""
        self.taken_to = message.offset()  # type: ignore[assignment]  # consumed: never None
        self.idle_deadline = None

    def __len__(self) -> int:
        return len(self.records)

    def head_timestamp(self) -> int:
        try:
            return int(self.records[0].timestamp()[1])
        except IndexError:
            return -1
