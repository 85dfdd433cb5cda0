"""Time windows for windowed aggregations, and the `Windowed` key they produce.

`TimeWindows` are Kafka Streams' fixed-size windows on event time (the record
timestamp): tumbling when the advance equals the size, hopping when it is
smaller. A window `[start, start + size)` includes its start and excludes its
end; starts are multiples of the advance, from 0.

    TimeWindows.of_size_with_no_grace(timedelta(minutes=5))          # tumbling
    TimeWindows.of_size_and_grace(300_000, 60_000).advance_by(60_000)  # hopping
    TimeWindows(300_000, advance_ms=60_000, grace_ms=0)              # the same, no grace

Grace: a window accepts records until stream time passes `end + grace`; a
record for a window that closed is dropped (counted as `late`).

Everything here is immutable and safe to share between threads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

Duration = int | timedelta


def to_ms(value: Any, what: str) -> int:
    """Milliseconds from an int (ms) or a `timedelta`; TypeError otherwise."""
    if isinstance(value, timedelta):
        return value // timedelta(milliseconds=1)
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    raise TypeError(f"{what} must be int milliseconds or a timedelta, got {value!r}")


def positive_ms(value: Any, what: str) -> int:
    """`to_ms`, refusing 0 and below (a window's size, a session's gap)."""
    ms = to_ms(value, what)
    if ms <= 0:
        raise ValueError(f"{what} must be > 0 ms, got {ms}")
    return ms


def non_negative_ms(value: Any, what: str) -> int:
    """`to_ms`, refusing negative values (a grace period, a time limit)."""
    ms = to_ms(value, what)
    if ms < 0:
        raise ValueError(f"{what} must be >= 0 ms, got {ms}")
    return ms


@dataclass(frozen=True, init=False)
class TimeWindows:
    """Fixed-size windows of `size_ms`, starting every `advance_ms`, with `grace_ms`.

    Arguments may be int milliseconds or `timedelta`s. `advance_ms=None` means
    tumbling (advance = size). Kafka Streams' factories are here too:
    `of_size_with_no_grace`, `of_size_and_grace`, `advance_by`.
    """

    size_ms: int
    advance_ms: int
    grace_ms: int

    def __init__(
        self, size_ms: Duration, advance_ms: Duration | None = None, grace_ms: Duration = 0
    ) -> None:
        size = positive_ms(size_ms, "window size")
        advance = size if advance_ms is None else to_ms(advance_ms, "window advance")
        if not 0 < advance <= size:
            raise ValueError(f"window advance must be in (0, size={size}] ms, got {advance}")
        grace = non_negative_ms(grace_ms, "window grace")
        object.__setattr__(self, "size_ms", size)
        object.__setattr__(self, "advance_ms", advance)
        object.__setattr__(self, "grace_ms", grace)

    @classmethod
    def of_size_with_no_grace(cls, size: Duration) -> TimeWindows:
        """Tumbling windows of `size` that close as soon as stream time passes their end."""
        return cls(size)

    @classmethod
    def of_size_and_grace(cls, size: Duration, grace: Duration) -> TimeWindows:
        """Tumbling windows of `size` that accept late records for `grace` after their end."""
        return cls(size, None, grace)

    def advance_by(self, advance: Duration) -> TimeWindows:
        """The same windows, hopping by `advance` (<= size) instead of tumbling."""
        return TimeWindows(self.size_ms, advance, self.grace_ms)

    @property
    def tumbling(self) -> bool:
        return self.advance_ms == self.size_ms

    @property
    def retention_ms(self) -> int:
        """How long the store keeps a window: size + grace (a closed window is final)."""
        return self.size_ms + self.grace_ms

    def window_starts(self, timestamp: int) -> range:
        """Starts of the windows containing `timestamp` (empty for negative timestamps).

        As Kafka's `TimeWindows.windowsFor`: the first start is
        `max(0, timestamp - size + advance)` rounded down to the advance.
        """
        advance = self.advance_ms
        first = max(0, timestamp - self.size_ms + advance) // advance * advance
        return range(first, timestamp + 1, advance)


@dataclass(frozen=True)
class Windowed:
    """The key of a windowed aggregation: the record key and its window `[start, end)`."""

    key: Any
    start: int
    end: int

    def __repr__(self) -> str:
        return f"Windowed({self.key!r}, [{self.start}, {self.end}))"


@dataclass(frozen=True, init=False)
class JoinWindows:
    """The time difference of a stream-stream join, and its grace.

    A left record at time `t` joins right records with timestamps in
    `[t - before_ms, t + after_ms]` (both ends included). A record arriving
    after stream time passed its window's end plus `grace_ms` no longer joins
    (late). Kafka Streams' factories: `of_time_difference_and_grace`,
    `of_time_difference_with_no_grace` (alias `of_time_difference`), then
    `before`/`after` to make the window asymmetric. Durations are int
    milliseconds or `timedelta`s.
    """

    before_ms: int
    after_ms: int
    grace_ms: int

    def __init__(self, before_ms: Duration, after_ms: Duration, grace_ms: Duration = 0) -> None:
        before = to_ms(before_ms, "join window before")
        after = to_ms(after_ms, "join window after")
        if before + after < 0:
            raise ValueError(
                f"join window size (before + after) must be >= 0 ms, got {before} + {after}"
            )
        grace = non_negative_ms(grace_ms, "join window grace")
        object.__setattr__(self, "before_ms", before)
        object.__setattr__(self, "after_ms", after)
        object.__setattr__(self, "grace_ms", grace)

    @classmethod
    def of_time_difference_and_grace(
        cls, time_difference: Duration, grace: Duration
    ) -> JoinWindows:
        """Records join when at most `time_difference` apart; late ones count for `grace`."""
        diff = non_negative_ms(time_difference, "join time difference")
        return cls(diff, diff, grace)

    @classmethod
    def of_time_difference_with_no_grace(cls, time_difference: Duration) -> JoinWindows:
        """Records join when at most `time_difference` apart; no grace for late ones."""
        return cls.of_time_difference_and_grace(time_difference, 0)

    of_time_difference = of_time_difference_with_no_grace

    def before(self, time_difference: Duration) -> JoinWindows:
        """The same windows, reaching `time_difference` back from a left record."""
        return JoinWindows(time_difference, self.after_ms, self.grace_ms)

    def after(self, time_difference: Duration) -> JoinWindows:
        """The same windows, reaching `time_difference` ahead of a left record."""
        return JoinWindows(self.before_ms, time_difference, self.grace_ms)

    @property
    def size_ms(self) -> int:
        return self.before_ms + self.after_ms

    @property
    def retention_ms(self) -> int:
        """How long the join's window stores keep a record: size + grace."""
        return self.size_ms + self.grace_ms
