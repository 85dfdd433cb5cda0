"""The per-record path every task shares: the record being processed, its output, its errors.

Both task kinds process a consumed record the same way, in
`RecordPath._process_record`: make it the current record, deserialize it,
run the graph from its source node, and give a failure to the configured
handler (and the dead-letter topic), or back to its key lane for a retry. What
a processor reads of that record (`record_timestamp`, the stores' clock),
where its `send` goes (the output collected since the last hand-over) and what
a failure report names all come from one `RecordContext`.

The kinds differ only where they must:

- whose context: a task one thread holds at a time (`StreamTask`) has one
  (`OneContext`); a key-parallel task (`KeyParallelTask`), whose threads run
  different keys of it at once, one per thread (`ThreadContexts`, a
  `threading.local`). Every reader goes through `self._contexts.record`,
  so the code is the same for both.
- when a record counts as done: a one-thread task processes in offset order,
  so it completes each record here (stream time advances to it before it is
  processed, its offset counts as processed after); a key-parallel task
  completes records in its lanes, by the watermark (`KeyLanes.complete`), so
  a commit never passes a record another thread has not finished.
- retries (`processing.retry.*`): only a key-parallel task retries a
  failed record, its key waiting while other keys flow on; a one-thread task
  gives every failure to the handler at once.

Hot path: a record costs the one call to `_process_record` and the graph's
own calls, no more; `send` makes no call beyond the partitioner, and a
one-thread task's stores read its clock without a Python frame. Keep it so
(issue 37 measures it).

Threads: the processing thread(s) holding the task call everything here;
`take_output` also the polling thread while the task is locked for a commit
or after it was closed (a key-parallel task: the calling thread's output).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from runtime.collector.collector import OutputRecord
from runtime.logging import get_logger
from runtime.partitioning.default import default_partition
from runtime.processing.errors import (
    DEAD_LETTER_QUEUE,
    LOG_AND_CONTINUE,
    TaskFailedError,
    dead_letter_headers,
)
from runtime.processing.flush_errors import FlushedEntry, handle_flush_failure
from runtime.processing.key_lanes import RetryPolicy
from runtime.topology.record import Headers

if TYPE_CHECKING:
    from confluent_kafka import Message

    from runtime.processing.task_settings import TaskSettings
    from runtime.topology.nodes import SourceNode

FlushListener = Callable[[bytes, bytes | None, bytes | None, int], None]

log = get_logger("runtime.task")

NO_RETRY = RetryPolicy()
"""A one-thread task's retry policy: no attempts, the handler decides at once."""


class OutputSink(Protocol):
    """Where output goes: the record collector (a processing thread's batch,
    a key-parallel grab's output)."""

    def hand_over(self, batch: Any) -> None: ...


class RecordContext:
    """One thread's record in one task: what is being processed, and the
    output made since the last hand-over.

    `topic`/`offset`/`timestamp` name the record (a punctuation sets
    `<punctuation>`, -1 and its time); `send` tags output with them.
    `sink`: where a key-parallel grab hands its output (None otherwise).
    """

    __slots__ = ("topic", "offset", "timestamp", "output", "sink")

    def __init__(self) -> None:
        self.topic = ""
        self.offset = -1
        self.timestamp = -1
        self.output: list[OutputRecord] = []
        self.sink: OutputSink | None = None


class OneContext:
    """The record context of a task one thread holds at a time: the same
    `.record` as `ThreadContexts`, without a thread-local lookup."""

    __slots__ = ("record",)

    def __init__(self) -> None:
        self.record = RecordContext()


class ThreadContexts(threading.local):
    """The record contexts of a key-parallel task, one per thread (each
    thread's `.record` is made on its first access)."""

    def __init__(self) -> None:
        self.record = RecordContext()


class RecordPath:
    """The record half of a task (base of `StreamTask`): the record-dependent
    members of the graph's `TaskContext` and the processing of one record.

    Reads what the task sets up: `stream_time`, `processed_offsets` (a
    one-thread task), `stores`, `_settings`; `key_parallel` says which kind it is.
    """

    key_parallel: ClassVar[bool]
    stream_time: int
    processed_offsets: dict[str, int]
    stores: dict[str, Any]  # name -> LayeredStore

    def __init__(self, task_id: str, partition: int, settings: TaskSettings, retry: RetryPolicy):
        self.id = task_id
        self.partition = partition
        self._settings = settings
        self._contexts: OneContext | ThreadContexts = (
            ThreadContexts() if self.key_parallel else OneContext()
        )
        # A one-thread task processes in offset order: it completes each
        # record as it goes and never retries one (a retry holds a key back
        # while other keys flow on, which takes key lanes). See the module doc.
        self._in_order = not self.key_parallel
        self._retry = retry
        self._round_robin = partition
        self._flush_listeners: dict[str, FlushListener] = {}
        # Counters, read racily by the status snapshot.
        self.skipped_count = 0
        self.dead_lettered_count = 0
        # Set while a commit emits the stores' caches (runtime.processing.flush_errors).
        self.emitting_at_commit = False
        self.dropped: dict[str, int] = {}

    # --- TaskContext: the record being processed --------------------------------

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        if partition is None:
            partition = self._default_partition(topic, key)
        record = self._contexts.record
        record.output.append(
            (
                topic,
                partition,
                key,
                value,
                timestamp,
                headers,
                record.topic,
                self.partition,
                record.offset,
            )
        )

    def _default_partition(self, topic: str, key: bytes | None) -> int:
        """Kafka's default partitioner: murmur2 of the key; round robin without one."""
        count = self._settings.partition_counts[topic]
        if key is not None:
            return default_partition(key, count)
        self._round_robin += 1
        return self._round_robin % count

    @property
    def record_timestamp(self) -> int:
        return self._contexts.record.timestamp

    def record_dropped(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _current_timestamp(self) -> int:
        """The timestamp of the calling thread's record."""
        return self._contexts.record.timestamp

    def _store_clock(self) -> Callable[[], int]:
        """The stores' clock (`_current_timestamp`). A task with one context
        gets a call that runs no Python frame: stores read it on every write."""
        contexts = self._contexts
        if isinstance(contexts, OneContext):
            return functools.partial(getattr, contexts.record, "timestamp")
        return self._current_timestamp

    def _flush_origin(self, store: str) -> str:
        """What a failed commit-time flush names as its topic: the store's
        changelog topic, else the store's name (runtime.processing.flush_errors)."""
        changelog = self.stores[store].changelog
        return changelog.topic if changelog is not None else store

    def _flush_dispatcher(self, store: str) -> FlushListener:
        """The cache's listener for `store`: forwards to what a node registered."""

        def dispatch(key: bytes, value: bytes | None, old: bytes | None, timestamp: int) -> None:
            listener = self._flush_listeners.get(store)
            if listener is not None:
                # Writes the listener makes downstream carry the entry's time.
                record = self._contexts.record
                saved, record.timestamp = record.timestamp, timestamp
                try:
                    listener(key, value, old, timestamp)
                except Exception as exc:
                    if not self.emitting_at_commit:
                        raise  # inside a record's processing: that record's failure
                    origin = self._flush_origin(store)
                    entry = FlushedEntry(key, value, timestamp)
                    handle_flush_failure(record, origin, entry, exc, self._handle_error)  # type: ignore[arg-type]
                finally:
                    record.timestamp = saved

        return dispatch

    def take_output(self) -> list[OutputRecord]:
        """Swap out the output accumulated since the last hand-over (a
        key-parallel task: the calling thread's)."""
        record = self._contexts.record
        output, record.output = record.output, []
        return output

    # --- one record -----------------------------------------------------------------

    def _process_record(
        self,
        record: RecordContext,
        message: Message,
        topic: str,
        source: SourceNode,
        failures: int,
    ) -> bool:
        """Process one consumed record of `topic` as `record`'s thread.

        `failures`: failed attempts of it so far (retries). Returns False when
        processing failed and the record is to be retried after a backoff
        (its attempt's forwarded output dropped, `_note_retry`), True when it
        is done: processed, or skipped by its error handler. Raises
        TaskFailedError when the handler says fail; a one-thread task then
        does not count its offset as processed.

        `message` and `source` keep these names: a failure's report reads
        them in this frame (`runtime.processing.errors.FailedRecord.of`).
        """
        offset: int = message.offset()  # type: ignore[assignment]  # never None when consumed
        timestamp: int = message.timestamp()[1]
        record.topic = topic
        record.offset = offset
        record.timestamp = timestamp
        in_order = self._in_order
        try:
            value = source.deserialize(
                message.key(),
                message.value(),
                timestamp,
                message.headers(),  # type: ignore[arg-type]  # consumed: a list of pairs
                topic,
                self.partition,
                offset,
            )
        except Exception as exc:
            self._handle_error("deserialization", exc, message)
        else:
            if in_order:
                if timestamp > self.stream_time:
                    self.stream_time = timestamp
                try:
                    source.process(value)
                except Exception as exc:
                    self._handle_error("processing", exc, message)
            else:
                output = record.output
                mark = len(output)
                try:
                    source.process(value)
                except Exception as exc:
                    if failures < self._retry.attempts:
                        self._note_retry(exc, record, output, mark, failures + 1)
                        return False
                    self._handle_error("processing", exc, message)
        if in_order:
            self.processed_offsets[topic] = offset
        return True

    def _note_retry(
        self,
        exc: Exception,
        record: RecordContext,
        output: list[OutputRecord],
        mark: int,
        failures: int,
    ) -> None:
        """A failed attempt to retry: drop what it forwarded (`output[mark:]`).
        Only a key-parallel task retries (`KeyParallelTask._note_retry`)."""
        raise NotImplementedError("a one-thread task has no retry policy")

    def _handle_error(self, stage: str, exc: Exception, message: Message | None) -> None:
        """Give a failed record (or punctuation: `message` None) to its handler.

        Logs it; with a dead-letter topic, sends the original record there
        (its headers plus the error's); counts it. Returns when the handler
        skips it, raises TaskFailedError when the handler says fail.
        """
        policy = self._settings.error_policy
        handler = policy.handler_for(stage)
        record = self._contexts.record
        topic, offset = record.topic, record.offset
        log.warning(
            f"{stage}_error",
            task_id=self.id,
            topic=topic,
            partition=self.partition,
            offset=offset,
            handler=handler,
            error=f"{type(exc).__name__}: {exc}",
        )
        if policy.dead_letter_topic is not None and message is not None:
            headers = dead_letter_headers(exc, stage, topic, self.partition, offset)
            original = message.headers()
            if original:
                headers = list(original) + headers  # type: ignore[assignment]
            self.send(
                policy.dead_letter_topic,
                message.key(),
                message.value(),
                message.timestamp()[1],
                headers,
                None,
            )
            self.dead_lettered_count += 1
        if handler in (LOG_AND_CONTINUE, DEAD_LETTER_QUEUE):
            self.skipped_count += 1
            return
        raise TaskFailedError(self.id, stage, exc) from exc
