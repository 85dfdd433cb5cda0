"""A liveness watchdog for input partitions: assigned, not paused, and not moving.

A partition is *stalled* when it is the input of a task here, the runtime
did not pause it (its input queue is not full), records wait beyond the
consumer's position, and that position has not moved for `after_s`. Nothing
in the runtime's own bookkeeping explains such a partition: it should be
fetching. Issue 31 found one way to get there (librdkafka keeps a pause
across unassign and assign; `ActiveTasks` now resumes on every path), and
this watch is the net for the next one: it reports the partition (status,
`streams_stalled_partitions`, the `StreamsPartitionStalled` alert, one log
line) and resumes it in the consumer, which is harmless when it was not
paused.

One known way to look stalled without a fault: under read_committed, an
upstream producer's transaction left open longer than `after_s` holds the
position at its first record (the cached high watermark runs ahead of the
last stable offset). Kafka's default `transaction.timeout.ms` (60 s) aborts
such a transaction before the default `after_s` here runs out.

Pure bookkeeping with an injectable clock; the polling thread feeds it once
a second from `LagTracker.refresh` and reads its result. `stalled` is read
racily by status.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

PartitionKey = tuple[str, int]

STALL_AFTER_S = 60.0
"""How long a partition with fetchable records may keep its position."""


class StallWatch:
    """Positions seen per partition, and which of them stopped moving."""

    def __init__(
        self, after_s: float = STALL_AFTER_S, clock: Callable[[], float] = time.monotonic
    ) -> None:
        self.after_s = after_s
        self._clock = clock
        # key -> (position last seen, when it was first seen there)
        self._seen: dict[PartitionKey, tuple[int, float]] = {}
        # key -> monotonic time since when it is stalled; replaced whole.
        self.stalled: dict[PartitionKey, float] = {}
        self.stalls_total = 0

    def observe(
        self,
        positions: dict[PartitionKey, int],
        fetchable: dict[PartitionKey, int],
        paused: Iterable[PartitionKey],
    ) -> list[PartitionKey]:
        """Take this second's figures; returns partitions newly found stalled.

        `positions`: the consumer's position of every task input partition
        (negative when nothing was fetched yet); `fetchable`: records beyond
        that position (by the cached high watermark); `paused`: partitions
        the runtime paused on purpose (full queues).
        """
        now = self._clock()
        on_purpose = set(paused)
        seen: dict[PartitionKey, tuple[int, float]] = {}
        stalled: dict[PartitionKey, float] = {}
        new: list[PartitionKey] = []
        for key, position in positions.items():
            before = self._seen.get(key)
            if key in on_purpose or fetchable.get(key, 0) <= 0:
                continue  # forgotten: the clock starts again when it may fetch
            if before is None or before[0] != position:
                seen[key] = (position, now)
                continue
            seen[key] = before
            if now - before[1] >= self.after_s:
                stalled[key] = self.stalled.get(key, now)
                if key not in self.stalled:
                    new.append(key)
        self._seen = seen
        self.stalled = stalled
        self.stalls_total += len(new)
        return new
