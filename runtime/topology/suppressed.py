"""What to hold back from a table's update stream: `Suppressed`, `BufferConfig`, `EmitStrategy`.

Kafka Streams' configuration objects for `KTable.suppress` and for a windowed
aggregation's emit strategy (KIP-825), with Python names:

    table.suppress(Suppressed.until_window_closes(BufferConfig.unbounded()))
    table.suppress(Suppressed.until_time_limit(timedelta(seconds=5),
                                               BufferConfig.max_records(1000).emit_early_when_full()))
    grouped.windowed_by(windows).emit_strategy(EmitStrategy.on_window_close()).count()

The node that applies them is `runtime.topology.suppress`. Everything here is
immutable and safe to share between threads.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from runtime.topology.windows import Duration, non_negative_ms

_UNLIMITED = (1 << 63) - 1

FullStrategy = Literal["emit", "shut_down"]


@dataclass(frozen=True)
class BufferConfig:
    """How much a suppression may hold: records and bytes, and what to do when full.

    `"emit"` (emit early): the oldest entries are forwarded before their time
    to make room; `"shut_down"`: the task fails with an error that names the
    node (Kafka Streams' `StreamsException`). `until_window_closes` needs a
    strict config (`unbounded()` or `shut_down_when_full()`), since an early
    emission would not be final.
    """

    records_limit: int = _UNLIMITED
    bytes_limit: int = _UNLIMITED
    when_full: FullStrategy = "emit"

    def __post_init__(self) -> None:
        for what, value in (("records", self.records_limit), ("bytes", self.bytes_limit)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ValueError(f"BufferConfig {what} must be an int >= 0, got {value!r}")
        if self.when_full not in ("emit", "shut_down"):
            raise ValueError(
                f"BufferConfig when_full must be 'emit' or 'shut_down', got {self.when_full!r}"
            )

    @classmethod
    def unbounded(cls) -> BufferConfig:
        """No limit (the buffer grows as needed); strict."""
        return cls(when_full="shut_down")

    @classmethod
    def max_records(cls, records: int) -> BufferConfig:
        """At most `records` entries, emitting early when full (as Kafka's)."""
        return cls(records_limit=records)

    @classmethod
    def max_bytes(cls, size: int) -> BufferConfig:
        """At most `size` bytes of keys and values, emitting early when full."""
        return cls(bytes_limit=size)

    def with_max_records(self, records: int) -> BufferConfig:
        return replace(self, records_limit=records)

    def with_max_bytes(self, size: int) -> BufferConfig:
        return replace(self, bytes_limit=size)

    def emit_early_when_full(self) -> BufferConfig:
        return replace(self, when_full="emit")

    def shut_down_when_full(self) -> BufferConfig:
        return replace(self, when_full="shut_down")

    @property
    def strict(self) -> bool:
        return self.when_full == "shut_down"


@dataclass(frozen=True)
class Suppressed:
    """A suppression: hold each key's latest update until its window closes or a time limit.

    `until_window_closes`: only for windowed tables; a window's final result
    goes out once stream time passes its end + grace (sessions: end + gap +
    grace); tombstones are dropped. `until_time_limit(d)`: a key's update goes
    out once stream time is `d` past the first buffered update of that key.
    Stream time is the suppression's own: the largest timestamp it has seen.
    """

    kind: Literal["window_close", "time_limit"]
    time_limit_ms: int
    buffer: BufferConfig
    name: str | None = None

    @classmethod
    def until_window_closes(cls, buffer: BufferConfig) -> Suppressed:
        if not isinstance(buffer, BufferConfig) or not buffer.strict:
            raise ValueError(
                "until_window_closes() needs a strict BufferConfig: BufferConfig.unbounded() "
                "or a bounded one with .shut_down_when_full() (emitting early is not final)"
            )
        return cls("window_close", 0, buffer)

    @classmethod
    def until_time_limit(cls, time_limit: Duration, buffer: BufferConfig) -> Suppressed:
        limit = non_negative_ms(time_limit, "suppression time limit")
        if not isinstance(buffer, BufferConfig):
            raise TypeError(f"until_time_limit() expects a BufferConfig, got {buffer!r}")
        return cls("time_limit", limit, buffer)

    def with_name(self, name: str) -> Suppressed:
        return replace(self, name=name)


@dataclass(frozen=True)
class EmitStrategy:
    """When a windowed aggregation forwards: on every update, or once per closed window."""

    on_close: bool

    @classmethod
    def on_window_update(cls) -> EmitStrategy:
        return cls(False)

    @classmethod
    def on_window_close(cls) -> EmitStrategy:
        return cls(True)
