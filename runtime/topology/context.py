"""The seam between the processor graph (this package) and the task runtime.

`TaskContext` is implemented by `runtime.processing.task` and handed to every
node of one task's graph at `Node.init`. Everything here is called by the
processing thread that currently holds the task's lock, never by two threads at
once, so implementations need no locking of their own; in key-parallel mode
(`runtime.processing.key_parallel`) threads holding different keys call it at
once, and that implementation keeps the per-record state per thread.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any, Protocol

from runtime.topology.record import Headers


class PunctuationType(Enum):
    """What drives a punctuation: the task's stream time or the wall clock."""

    STREAM_TIME = "stream_time"
    WALL_CLOCK_TIME = "wall_clock_time"


class Cancellable(Protocol):
    def cancel(self) -> None: ...


class TaskContext(Protocol):
    """What a node of a task's graph may ask of the task that runs it.

    Optional member, read with getattr by sinks (contexts that never
    partition need not have it): `static_partitioner`, the app's
    `static.partitioner` or None; when set, sinks partition every keyed
    record with its `static_partition(topic, key, num_partitions)`.
    """

    @property
    def task_id(self) -> str: ...

    @property
    def application_id(self) -> str: ...

    @property
    def default_key_serde(self) -> Any:
        """The `default.key.serde` of the app's config, for nodes given none."""
        ...

    @property
    def default_value_serde(self) -> Any:
        """The `default.value.serde` of the app's config, for nodes given none."""
        ...

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        """Hand one serialized output record to the record collector.

        `topic` is the full topic name (internal topics already resolved with
        `resolve_topic`). `partition=None` means: partition by key (murmur2, as
        the Java client) or round-robin for a null key.
        """
        ...

    def partition_count(self, topic: str) -> int:
        """Partitions of an output topic (full name), known since start-up."""
        ...

    def resolve_topic(self, name: str, internal: bool) -> str:
        """Full topic name: internal names get the `<application.id>-` prefix."""
        ...

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, callback: Callable[[int], None]
    ) -> Cancellable:
        """Call `callback(timestamp)` every `interval_ms` of stream or wall-clock time."""
        ...

    def request_commit(self) -> None:
        """Ask for a commit soon (Processor API `context.commit()`)."""
        ...

    def state_store(self, name: str) -> Any:
        """The named store of this task: the outer layer of its LayeredStore
        (`runtime.state.builders`), a bytes-level key-value store or a
        WindowStore. Raises KeyError for a store the task does not have."""
        ...

    def register_flush_listener(
        self, store: str, listener: Callable[[bytes, bytes | None, bytes | None, int], None]
    ) -> None:
        """Receive the store's downstream updates: `listener(key, new, old, timestamp)`.

        Called when the store's cache emits a (folded) write: at commit, on
        cache eviction, or at once when caching is off. At commit this runs
        on the polling thread while every task is locked; otherwise on the
        processing thread holding the task. Register during `Node.init`.
        """
        ...

    @property
    def record_timestamp(self) -> int:
        """Timestamp of the record being processed (stream time in punctuations)."""
        ...

    @property
    def stream_time(self) -> int:
        """Largest record timestamp this task has seen (-1 before the first)."""
        ...

    def record_dropped(self, reason: str) -> None:
        """Count a record a node dropped on purpose (e.g. `late` beyond grace)."""
        ...
