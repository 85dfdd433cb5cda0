"""Failures of user functions run by a commit's cache flush, given to the handler.

A cached store (a table, an aggregation, a session store) hands its entries
downstream when it is flushed. During processing that happens inside a
record's processing (an eviction), and a failure there is that record's. At
a commit it happens on the polling thread (`StreamTask.prepare_commit`), with
no consumed record: a foreign-key join's extractor behind a cached table, a
table-table joiner, a `KTable.group_by` mapper or adder, a `map_values` after
an aggregation then ran outside every handler, and one poison value stopped
the polling thread whatever `processing.exception.handler` said.

Here such a failure goes to the handler like a record's, with the flushed
entry as the failed record (Kafka Streams' cache flush has no raw source
record either): its key and new value as the store holds them (serialized),
and origin headers naming the store's changelog topic (the store's name when
it has none), the task's partition and offset -1. `log_and_continue` and
`dead_letter_queue` skip the entry's downstream effect (the store keeps it);
`log_and_fail` raises TaskFailedError, which stops the app as any failure on
the polling thread does.

Called on the polling thread, the task locked for the commit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from runtime.topology.record import Headers


class Origin(Protocol):
    """What a failure report reads of the current record (`RecordContext`)."""

    topic: str
    offset: int


class FlushedEntry:
    """A flushed store entry shaped as the consumed record `_handle_error`
    dead-letters (key, value, headers, timestamp)."""

    __slots__ = ("_key", "_value", "_timestamp")

    def __init__(self, key: bytes, value: bytes | None, timestamp: int) -> None:
        self._key, self._value, self._timestamp = key, value, timestamp

    def key(self) -> bytes:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self) -> Headers | None:
        return None

    def timestamp(self) -> tuple[int, int]:
        return (0, self._timestamp)


def handle_flush_failure(
    record: Origin,
    origin: str,
    entry: FlushedEntry,
    exc: Exception,
    handle: Callable[[str, Exception, FlushedEntry], None],
) -> None:
    """Give `exc` to `handle` (the task's `_handle_error`) as a failure of
    `entry`, with `record` (the task's RecordContext) naming `origin` and
    offset -1 meanwhile."""
    saved = record.topic, record.offset
    record.topic, record.offset = origin, -1
    try:
        handle("processing", exc, entry)
    finally:
        record.topic, record.offset = saved
