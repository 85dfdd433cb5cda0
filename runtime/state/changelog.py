"""The change-logging layer: every write of a store also goes to its changelog.

A put becomes a changelog record `(key, value)`, a delete a tombstone
`(key, None)`, on `<application.id>-<store>-changelog`, partition = the task's
partition. Records go to an injected sink with the signature of
`TaskContext.send`, so in the runtime they land in the task's output and reach
the producer through the record collector; this layer never touches a client.

Offsets: the runtime tells the layer, after the producer acknowledged a
commit's changelog records (or after restoration), the changelog position the
store now reflects (`update_changelog_offset`); `checkpoint_offsets` gives it
back for the task's checkpoint file. A position is a consumer position: the
offset of the next changelog record the store does not contain yet, so
restoration seeks straight to it.

Threads: as the wrapped store (see the package docstring).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Protocol

from runtime.state.store import KeyValue, KeyValueStore

if TYPE_CHECKING:  # a type name only: state sits below the DSL
    from runtime.topology.record import Headers


class ChangelogSink(Protocol):
    """Where changelog records go: `TaskContext.send` has exactly this signature."""

    def __call__(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None: ...


def changelog_topic_name(application_id: str, store_name: str) -> str:
    """Kafka Streams' changelog topic name: `<application.id>-<store>-changelog`."""
    return f"{application_id}-{store_name}-changelog"


def wall_clock_ms() -> int:
    return int(time.time() * 1000)


class ChangeLoggingKeyValueStore:
    """Writes through to `inner` and logs each write to the changelog sink.

    `clock` gives the timestamp of changelog records written by `put`/`delete`
    (in the runtime: the timestamp of the record being processed); the caching
    layer above passes each entry's own write timestamp through `put_at` /
    `delete_at` instead.
    """

    def __init__(
        self,
        inner: KeyValueStore,
        sink: ChangelogSink,
        topic: str,
        partition: int,
        clock: Callable[[], int] = wall_clock_ms,
    ) -> None:
        self.inner = inner
        self._sink = sink
        self.topic = topic
        self.partition = partition
        self._clock = clock
        self.changelog_offset: int | None = None  # see update_changelog_offset
        self.records_logged = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    def get(self, key: bytes) -> bytes | None:
        return self.inner.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.put_at(key, value, self._clock())

    def delete(self, key: bytes) -> None:
        self.delete_at(key, self._clock())

    def put_at(self, key: bytes, value: bytes, timestamp: int) -> None:
        self.inner.put(key, value)
        self._sink(self.topic, key, value, timestamp, None, self.partition)
        self.records_logged += 1

    def delete_at(self, key: bytes, timestamp: int) -> None:
        self.inner.delete(key)
        self._sink(self.topic, key, None, timestamp, None, self.partition)
        self.records_logged += 1

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        return self.inner.range(lo, hi)

    def all(self) -> Iterator[KeyValue]:
        return self.inner.all()

    def approximate_num_entries(self) -> int:
        return self.inner.approximate_num_entries()

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    # --- offsets (polling thread at commit; restoration thread) ---------------

    def update_changelog_offset(self, next_offset: int) -> None:
        """Record the changelog position the store now reflects (next offset to read)."""
        self.changelog_offset = next_offset

    def checkpoint_offsets(self) -> dict[tuple[str, int], int]:
        """`{(topic, partition): position}`, empty while the position is unknown."""
        if self.changelog_offset is None:
            return {}
        return {(self.topic, self.partition): self.changelog_offset}
