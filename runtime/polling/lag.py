"""Consumer lag per assigned partition: records behind the end of the log.

"Done" is the next offset to process: after the last processed record when
the task processed any; else the consumer's position less what sits in the
input buffer; else the group's committed offset (asked of the broker once per
partition and assignment); else the log start. A task that has not processed
yet after a restart therefore shows the lag of its committed offset, not of
offset 0. Ends of partitions come from the consumer's cached watermarks (no
broker round trip).

Used by the polling thread only (it reads the consumer).
"""

from __future__ import annotations

from collections.abc import Callable

from confluent_kafka import Consumer, KafkaException, TopicPartition

from runtime.polling.input_buffers import InputBuffers

PartitionKey = tuple[str, int]


class LagTracker:
    """Recomputes `lag` on request. Polling thread only; `lag` is read racily."""

    def __init__(
        self,
        consumer: Consumer,
        buffers: InputBuffers,
        processed_offset: Callable[[str, int], int | None],
    ) -> None:
        self._consumer = consumer
        self._buffers = buffers
        self._processed_offset = processed_offset
        self._committed: dict[PartitionKey, int] = {}
        # Replaced whole on each refresh.
        self.lag: dict[PartitionKey, int] = {}
        # The consumer's position per partition (negative: nothing fetched
        # yet) and the records beyond it: what the stall watch reads.
        self.positions: dict[PartitionKey, int] = {}
        self.fetchable: dict[PartitionKey, int] = {}

    def committed(self, key: PartitionKey) -> int | None:
        """The group's committed offset learnt for a partition not yet
        consumed (-1: none; None: not asked yet)."""
        return self._committed.get(key)

    def forget_committed(self) -> None:
        """After a rebalance: committed offsets learnt before may be stale."""
        self._committed.clear()

    def refresh(self) -> None:
        keys = self._buffers.partitions()
        if not keys:
            self.lag, self.positions, self.fetchable = {}, {}, {}
            return
        try:
            positions = {
                (tp.topic, tp.partition): tp.offset
                for tp in self._consumer.position([TopicPartition(t, p) for t, p in keys])
            }
        except KafkaException:
            positions = {}
        done_at: dict[PartitionKey, int] = {}
        unknown: list[PartitionKey] = []
        for key in keys:
            processed = self._processed_offset(*key)
            position = positions.get(key, -1)
            if processed is not None:
                done_at[key] = processed + 1
            elif position >= 0:
                done_at[key] = position - self._buffers.buffered(key)
            elif key not in self._committed:
                unknown.append(key)
        if unknown:
            self._learn_committed(unknown)
        lag: dict[PartitionKey, int] = {}
        fetchable: dict[PartitionKey, int] = {}
        for key in keys:
            try:
                low, high = self._consumer.get_watermark_offsets(TopicPartition(*key), cached=True)
            except KafkaException:
                continue
            if high < 0:
                continue
            done = done_at.get(key, self._committed.get(key, -1))
            if done < 0:
                done = max(low, 0)
            lag[key] = max(0, high - done)
            position = positions.get(key, -1)
            # Nothing fetched yet: all of the lag waits to be fetched.
            fetchable[key] = max(0, high - position) if position >= 0 else lag[key]
        self.lag = lag
        self.positions = {key: positions.get(key, -1) for key in keys}
        self.fetchable = fetchable

    def _learn_committed(self, keys: list[PartitionKey]) -> None:
        try:
            committed = self._consumer.committed(
                [TopicPartition(t, p) for t, p in keys], timeout=2.0
            )
        except KafkaException:
            return
        for tp in committed:
            # -1 (nothing committed) is remembered too: ask once, not every second.
            self._committed[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else -1
