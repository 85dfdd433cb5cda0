"""Session windows: the `SessionWindows` of `windowed_by`.

A session of a key is the span `[first, last]` of its records' timestamps in
which no two consecutive records are more than the inactivity gap apart
(both ends inclusive). A record within the gap of one or more sessions merges
them into one: Kafka Streams' `SessionWindows`.

    SessionWindows.of_inactivity_gap_with_grace(timedelta(minutes=5), timedelta(minutes=1))
    SessionWindows.of_inactivity_gap_with_no_grace(300_000)

The aggregation node and the session store's layout are in
`runtime.topology.session_store`, the DSL in `runtime.topology.session_dsl`.
Immutable and safe to share between threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from runtime.topology.windows import Duration, non_negative_ms, positive_ms

if TYPE_CHECKING:
    from runtime.topology.grouped import KGroupedStream


@dataclass(frozen=True, init=False)
class SessionWindows:
    """Sessions of records at most `gap_ms` apart, accepting late ones for `grace_ms`.

    Durations are int milliseconds or `timedelta`s. A session closes when
    stream time passes its end + gap + grace; a record that would only
    touch closed sessions is dropped (counted `late`).
    """

    gap_ms: int
    grace_ms: int

    def __init__(self, gap_ms: Duration, grace_ms: Duration = 0) -> None:
        gap = positive_ms(gap_ms, "session inactivity gap")
        grace = non_negative_ms(grace_ms, "session grace")
        object.__setattr__(self, "gap_ms", gap)
        object.__setattr__(self, "grace_ms", grace)

    @classmethod
    def of_inactivity_gap_with_grace(cls, gap: Duration, grace: Duration) -> SessionWindows:
        return cls(gap, grace)

    @classmethod
    def of_inactivity_gap_with_no_grace(cls, gap: Duration) -> SessionWindows:
        return cls(gap, 0)

    @property
    def retention_ms(self) -> int:
        """How long after its end a session stays visible: gap + grace (Kafka's default)."""
        return self.gap_ms + self.grace_ms

    @property
    def close_delay_ms(self) -> int:
        """How long after its end a session closes: gap + grace."""
        return self.gap_ms + self.grace_ms

    def table_type(self) -> Any:
        """The `KTable` class of a session aggregation (the session key layout);
        used by `runtime.topology.cogroup`."""
        from runtime.topology.session_dsl import SessionWindowedKTable

        return SessionWindowedKTable

    def windowed_stream(self, grouped: KGroupedStream) -> Any:
        """`grouped.windowed_by(self)` (called by `KGroupedStream.windowed_by`)."""
        from runtime.topology.session_dsl import SessionWindowedKStream

        return SessionWindowedKStream(grouped, self)
