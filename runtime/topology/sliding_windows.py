"""Sliding windows: the `SlidingWindows` of `windowed_by`.

Kafka Streams' `SlidingWindows`: windows of a fixed time difference that
exist only where records are: each record defines the window ending at it
(`[t - difference, t]`) and the one starting right after it
(`[t + 1, t + 1 + difference]`, when a later record falls in it); both ends
inclusive. An aggregate per key and window, updated as records arrive.

    SlidingWindows.of_time_difference_and_grace(timedelta(seconds=10), timedelta(seconds=3))
    SlidingWindows.of_time_difference_with_no_grace(10_000)

The aggregation node is `runtime.topology.sliding_aggregate`, the DSL
`runtime.topology.sliding_dsl`. Immutable and safe to share between threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.topology.windows import Duration, non_negative_ms, positive_ms

if TYPE_CHECKING:
    from runtime.topology.grouped import KGroupedStream


@dataclass(frozen=True, init=False)
class SlidingWindows:
    """Windows of `difference_ms` around each record, accepting late ones for `grace_ms`."""

    difference_ms: int
    grace_ms: int

    def __init__(self, difference_ms: Duration, grace_ms: Duration = 0) -> None:
        difference = positive_ms(difference_ms, "sliding window time difference")
        grace = non_negative_ms(grace_ms, "sliding window grace")
        object.__setattr__(self, "difference_ms", difference)
        object.__setattr__(self, "grace_ms", grace)

    @classmethod
    def of_time_difference_and_grace(cls, difference: Duration, grace: Duration) -> SlidingWindows:
        return cls(difference, grace)

    @classmethod
    def of_time_difference_with_no_grace(cls, difference: Duration) -> SlidingWindows:
        return cls(difference, 0)

    @property
    def retention_ms(self) -> int:
        """How long the store keeps a window after its start: grace + 2 * difference."""
        return self.grace_ms + 2 * self.difference_ms

    @property
    def close_delay_ms(self) -> int:
        """How long after its end a window closes: the grace."""
        return self.grace_ms

    def windowed_stream(self, grouped: KGroupedStream) -> Any:
        """`grouped.windowed_by(self)` (called by `KGroupedStream.windowed_by`)."""
        from runtime.topology.sliding_dsl import SlidingWindowedKStream

        return SlidingWindowedKStream(grouped, self)
