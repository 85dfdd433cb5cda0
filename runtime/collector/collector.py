"""The record collector: output buffered per outgoing partition.

Processing threads never touch the producer. A task accumulates its output in
a task-local list while a processing thread holds it (no lock per record);
when the thread releases the task it hands the whole batch over here, taking
this collector's lock once per batch. The polling thread drains all buffers
into the one shared producer. Because a task's batches are handed over in the
order they were processed and each batch keeps its order, output of one task
keeps its order per output partition (correctness rule 2).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

from runtime.topology.record import Headers

OutputRecord = tuple[str, int, bytes | None, bytes | None, int, Headers | None, str, int, int]
"""(topic, partition, key, value, timestamp, headers, source topic, source
partition, source offset): a plain tuple, since one is built per output record
on the hot path and a NamedTuple costs more. The source fields name the input
record being processed when the output was made (empty topic and -1 when
none), so that a record the broker refuses can be traced to its input."""


TopicPartitionKey = tuple[str, int]


class RecordCollector:
    """Per-partition output buffers between processing threads and the producer.

    `hand_over` is called by processing threads (once per processed batch);
    `take_all` and the counters by the polling thread. Thread-safe.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._buffers: dict[TopicPartitionKey, list[OutputRecord]] = {}
        self._buffered = 0

    def hand_over(self, batch: Iterable[OutputRecord]) -> None:
        """Append a task's output batch, in order, to the partition buffers."""
        with self._lock:
            buffers = self._buffers
            count = 0
            for record in batch:
                key = (record[0], record[1])
                buffer = buffers.get(key)
                if buffer is None:
                    buffers[key] = [record]
                else:
                    buffer.append(record)
                count += 1
            self._buffered += count

    def take_all(self) -> dict[TopicPartitionKey, list[OutputRecord]]:
        """Swap out every buffer and return them (polling thread only)."""
        with self._lock:
            if not self._buffered:
                return {}
            buffers, self._buffers = self._buffers, {}
            self._buffered = 0
            return buffers

    @property
    def buffered(self) -> int:
        """Records waiting to be drained (a racy read is fine: used for pacing)."""
        return self._buffered
