"""A stream task: one subtopology instantiated for one partition number.

The polling thread appends consumed messages to the task's input queues
(`InputQueue.records.append` in `InputBuffers.route`, a deque append, safe
against the one holder popping at the other end). Everything else runs
on the one processing thread that holds the task's lock in the task manager:
deserialization, the processor graph, punctuation, output accumulation. The
polling thread prepares and finishes commits (`prepare_commit`,
`post_commit`) only while every task is locked for a commit, and takes output
after the task was closed; the restoration thread writes the stores only
before the task is processable. See docs/architecture.md.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

from confluent_kafka import Message

from runtime.collector.collector import OutputRecord
from runtime.logging import get_logger
from runtime.partitioning.default import default_partition
from runtime.processing.errors import (
    DEAD_LETTER_QUEUE,
    LOG_AND_CONTINUE,
    ErrorPolicy,
    TaskFailedError,
    dead_letter_headers,
)
from runtime.processing.key_lanes import KeyParallelSettings
from runtime.state.builders import LayeredStore, build_task_stores, task_directory
from runtime.state.cache import CacheBudget
from runtime.state.checkpoint import checkpoint_path, read_checkpoint, write_checkpoint
from runtime.topology.context import PunctuationType
from runtime.topology.nodes import SourceNode
from runtime.topology.record import Headers
from runtime.topology.topology import Subtopology, TaskGraph

FlushListener = Callable[[bytes, bytes | None, bytes | None, int], None]

log = get_logger("runtime.task")

# How many records between two looks at the clock in the processing loop.
_CLOCK_CHECK_EVERY = 32


def task_id_of(subtopology_id: int | str, partition: int) -> str:
    """Kafka Streams' task id: `<subtopology>_<partition>` (a named query's
    subtopology is `<query>__<n>`, `Subtopology.task_name`)."""
    return f"{subtopology_id}_{partition}"


class InputQueue:
    """The bounded buffer of one input partition of a task.

    Written by the polling thread, read by the processing thread holding the
    task. The bound is enforced by the polling thread pausing the partition.
    """

    __slots__ = ("topic", "partition", "records", "paused")

    def __init__(self, topic: str, partition: int) -> None:
        self.topic = topic
        self.partition = partition
        self.records: deque[Message] = deque()
        self.paused = False  # polling thread only

    def __len__(self) -> int:
        return len(self.records)

    def head_timestamp(self) -> int:
        try:
            return int(self.records[0].timestamp()[1])
        except IndexError:
            return -1


class _Punctuation:
    __slots__ = ("interval_ms", "type", "callback", "next_ms", "cancelled")

    def __init__(
        self,
        interval_ms: int,
        ptype: PunctuationType,
        callback: Callable[[int], None],
        next_ms: int,
    ) -> None:
        self.interval_ms = interval_ms
        self.type = ptype
        self.callback = callback
        self.next_ms = next_ms
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class CommitBatch(NamedTuple):
    """What one task gives one commit (see `StreamTask.prepare_commit`)."""

    task: StreamTask
    offsets: dict[str, int]
    """Next offset to commit per input topic, only for topics that moved."""
    output: list[OutputRecord]
    """Output since the last hand-over, cached state writes included, in order."""
    changelogs: tuple[tuple[str, int], ...] = ()
    """Changelog partitions written since the last commit: the committer asks
    the broker for their positions once this output is acknowledged."""


class TaskSettings:
    """What every task of one app shares (resolved once at start-up, read-only)."""

    def __init__(
        self,
        application_id: str,
        default_key_serde: Any,
        default_value_serde: Any,
        error_policy: ErrorPolicy,
        partition_counts: dict[str, int],
        state_dir: str,
        cache_budget: CacheBudget | None,
        static_partitioner: Any = None,
        key_parallel: KeyParallelSettings | None = None,
    ) -> None:
        self.application_id = application_id
        self.default_key_serde = default_key_serde
        self.default_value_serde = default_value_serde
        self.error_policy = error_policy
        self.partition_counts = partition_counts
        self.state_dir = state_dir
        self.cache_budget = cache_budget
        # `static.partitioner` (partition expansion): sinks use it when set.
        self.static_partitioner = static_partitioner
        # None: every task is a plain StreamTask (today's path, exactly).
        self.key_parallel = key_parallel


class StreamTask:
    """One subtopology x partition number; implements the graph's TaskContext.

    Processed by one thread at a time (rule 1); `KeyParallelTask`
    (runtime.processing.key_parallel) is the variant several threads share.
    """

    key_parallel = False
    """Several threads may hold this task at once (the task manager asks)."""
    threads_per_task = 1
    yield_requested = False
    """Set by the task manager (under its lock) while a processing thread holds
    the task: a task of a higher-priority named query has input and no thread
    is free, so `process` ends its batch after the current record (preemption
    by priority, runtime.processing.query_shares). Cleared when the task is
    handed out and released. Read racily by the holder, once per record."""

    def __init__(
        self,
        subtopology: Subtopology,
        partition: int,
        topics: list[str],
        settings: TaskSettings,
    ) -> None:
        self.id = task_id_of(subtopology.task_name, partition)
        self.subtopology = subtopology
        # The named query it belongs to (None: the app runs one topology);
        # the scheduler reads it for query priorities and shares.
        self.query = subtopology.query
        self.partition = partition
        self._settings = settings
        self.queues: dict[str, InputQueue] = {t: InputQueue(t, partition) for t in topics}
        self._queue_list = list(self.queues.values())
        # Offsets: last processed per input topic. The holding processing
        # thread writes; the committer reads while every task is locked; the
        # lag figures read it racily (a stale value only misstates lag).
        self.processed_offsets: dict[str, int] = {}
        self.committed_offsets: dict[str, int] = {}
        self.stream_time = -1
        self.output: list[OutputRecord] = []
        self.commit_requested = False
        self._pending_offsets: dict[str, int] = {}
        self.closed = False
        # Counters, read racily by the status snapshot.
        self.processed_count = 0
        self.skipped_count = 0
        self.dead_lettered_count = 0
        self._punctuations: list[_Punctuation] = []
        self.next_wall_punctuation = float("inf")  # time.monotonic() seconds
        self._round_robin = partition
        self._record_topic = ""
        self._record_offset = -1
        self._record_timestamp = -1
        self.dropped: dict[str, int] = {}
        self.restored_records = 0  # set by the restoration thread when done
        # State: stores are opened here (polling thread) and read their
        # checkpoint; the restoration thread brings them up to date before the
        # task is handed to the task manager.
        self.directory = task_directory(settings.state_dir, settings.application_id, self.id)
        self._flush_listeners: dict[str, FlushListener] = {}
        # changelog records logged per store at the last prepare_commit
        # (polling thread, task locked): which changelogs a commit wrote.
        self._logged_at_commit: dict[str, int] = {}
        self.stores: dict[str, LayeredStore] = build_task_stores(
            subtopology.store_specs,
            self.directory,
            subtopology.topic_prefix(settings.application_id),
            partition,
            settings.cache_budget,
            self.send,
            on_flush=self._flush_dispatcher,
            clock=self._current_timestamp,
        )
        checkpoint = read_checkpoint(checkpoint_path(self.directory)) if self.stores else None
        # changelog (topic, partition) -> offset to restore from (None: beginning)
        self.restore_from: dict[tuple[str, int], int | None] = {}
        for store in self.stores.values():
            start = store.apply_checkpoint(checkpoint)
            if store.changelog_topic is not None:
                self.restore_from[(store.changelog_topic, partition)] = start
        self.graph: TaskGraph = subtopology.instantiate()
        self._sources = {
            self.resolve_topic(name, source.internal): source
            for name, source in self.graph.sources.items()
        }
        self._single_queue = self._queue_list[0] if len(self._queue_list) == 1 else None
        self._single_source = self._sources[topics[0]] if len(topics) == 1 else None
        self.graph.init(self)
        log.debug("task_created", task_id=self.id, topics=topics)

    # --- TaskContext (processing thread holding the task) -------------------

    @property
    def task_id(self) -> str:
        return self.id

    @property
    def shareable(self) -> bool:
        """Whether one more thread could join its holders: key-parallel tasks
        decide per moment; a one-thread task is never held shared."""
        return True

    @property
    def last_record_timestamp(self) -> int:
        """Timestamp (ms) of the record processed last; -1 before any. Read
        by the task manager at release, for a named query's latency figure."""
        return self._record_timestamp

    @property
    def application_id(self) -> str:
        return self._settings.application_id

    @property
    def default_key_serde(self) -> Any:
        return self._settings.default_key_serde

    @property
    def default_value_serde(self) -> Any:
        return self._settings.default_value_serde

    @property
    def static_partitioner(self) -> Any:
        return self._settings.static_partitioner

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
        self.output.append(
            (
                topic,
                partition,
                key,
                value,
                timestamp,
                headers,
                self._record_topic,
                self.partition,
                self._record_offset,
            )
        )

    def _default_partition(self, topic: str, key: bytes | None) -> int:
        """Kafka's default partitioner: murmur2 of the key; round robin without one."""
        count = self._settings.partition_counts[topic]
        if key is not None:
            return default_partition(key, count)
        self._round_robin += 1
        return self._round_robin % count

    def partition_count(self, topic: str) -> int:
        try:
            return self._settings.partition_counts[topic]
        except KeyError:
            raise KeyError(f"topic {topic!r} is not an output topic of this topology") from None

    def resolve_topic(self, name: str, internal: bool) -> str:
        return f"{self._settings.application_id}-{name}" if internal else name

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, callback: Callable[[int], None]
    ) -> _Punctuation:
        if interval_ms < 1:
            raise ValueError("punctuation interval must be at least 1 ms")
        if punctuation_type is PunctuationType.WALL_CLOCK_TIME:
            next_ms = int(time.time() * 1000) + interval_ms
        else:
            next_ms = (self.stream_time + interval_ms) if self.stream_time >= 0 else -1
        punctuation = _Punctuation(interval_ms, punctuation_type, callback, next_ms)
        self._punctuations.append(punctuation)
        self._update_wall_deadline()
        return punctuation

    def request_commit(self) -> None:
        self.commit_requested = True

    def state_store(self, name: str) -> Any:
        try:
            return self.stores[name].store
        except KeyError:
            raise KeyError(f"task {self.id} has no state store {name!r}") from None

    def register_flush_listener(self, store: str, listener: FlushListener) -> None:
        if store not in self.stores:
            raise KeyError(f"task {self.id} has no state store {store!r}")
        self._flush_listeners[store] = listener

    @property
    def record_timestamp(self) -> int:
        return self._record_timestamp

    def record_dropped(self, reason: str) -> None:
        self.dropped[reason] = self.dropped.get(reason, 0) + 1

    def _current_timestamp(self) -> int:
        return self._record_timestamp

    def _flush_dispatcher(self, store: str) -> FlushListener:
        """The cache's listener for `store`: forwards to what a node registered."""

        def dispatch(key: bytes, value: bytes | None, old: bytes | None, timestamp: int) -> None:
            listener = self._flush_listeners.get(store)
            if listener is not None:
                # Writes the listener makes downstream carry the entry's time.
                saved, self._record_timestamp = self._record_timestamp, timestamp
                try:
                    listener(key, value, old, timestamp)
                finally:
                    self._record_timestamp = saved

        return dispatch

    # --- processing (processing thread holding the task) --------------------

    @property
    def buffered(self) -> int:
        if self._single_queue is not None:
            return len(self._single_queue.records)
        return sum(len(q.records) for q in self._queue_list)

    @property
    def input_buffered(self) -> int:
        """Records in the input queues (status; `buffered` is the scheduler's figure)."""
        return self.buffered

    def head_timestamp(self) -> int:
        """Oldest head record's timestamp across the queues (-1 when empty)."""
        heads = [q.head_timestamp() for q in self._queue_list if q.records]
        return min(heads) if heads else -1

    def punctuation_due(self, now: float) -> bool:
        return now >= self.next_wall_punctuation

    def process(self, deadline: float) -> int:
        """Process buffered records until the deadline, the buffers are empty
        or the task manager asks the batch to yield (`yield_requested`).

        Returns the number of records taken from the buffers. Raises
        TaskFailedError when a handler says fail; the offset of the failing
        record is then not marked processed.
        """
        count = 0
        single = self._single_queue
        if single is not None:
            records = single.records
            source = self._single_source
            assert source is not None
            topic = single.topic
            while records:
                message = records.popleft()
                self._process_message(message, topic, source)
                count += 1
                if self.yield_requested or (
                    count % _CLOCK_CHECK_EVERY == 0 and time.monotonic() >= deadline
                ):
                    break
        else:
            while True:
                queue = self._next_queue()
                if queue is None:
                    break
                message = queue.records.popleft()
                self._process_message(message, queue.topic, self._sources[queue.topic])
                count += 1
                if self.yield_requested or (
                    count % _CLOCK_CHECK_EVERY == 0 and time.monotonic() >= deadline
                ):
                    break
        self.processed_count += count
        if self._punctuations:
            self._punctuate()
        return count

    def _next_queue(self) -> InputQueue | None:
        """The non-empty queue whose head record is oldest (Kafka's PartitionGroup)."""
        best: InputQueue | None = None
        best_ts = 0
        for queue in self._queue_list:
            if queue.records:
                ts = queue.head_timestamp()
                if best is None or ts < best_ts:
                    best, best_ts = queue, ts
        return best

    def _process_message(self, message: Message, topic: str, source: SourceNode) -> None:
        offset: int = message.offset()  # type: ignore[assignment]  # never None for consumed records
        timestamp: int = message.timestamp()[1]
        self._record_topic = topic
        self._record_offset = offset
        self._record_timestamp = timestamp
        try:
            record = source.deserialize(
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
            if timestamp > self.stream_time:
                self.stream_time = timestamp
            try:
                source.process(record)
            except Exception as exc:
                self._handle_error("processing", exc, message)
        self.processed_offsets[topic] = offset

    def _record_origin(self) -> tuple[str, int]:
        """(topic, offset) of the record being processed (error reports)."""
        return self._record_topic, self._record_offset

    def _set_record(self, topic: str, offset: int, timestamp: int) -> None:
        """Make (topic, offset, timestamp) the current record (punctuations)."""
        self._record_topic, self._record_offset = topic, offset
        self._record_timestamp = timestamp

    def _set_record_timestamp(self, timestamp: int) -> None:
        self._record_timestamp = timestamp

    def _handle_error(self, stage: str, exc: Exception, message: Message | None) -> None:
        policy = self._settings.error_policy
        handler = policy.handler_for(stage)
        topic, offset = self._record_origin()
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

    def _punctuate(self) -> None:
        now_ms = int(time.time() * 1000)
        for punctuation in list(self._punctuations):
            if punctuation.cancelled:
                self._punctuations.remove(punctuation)
                continue
            if punctuation.type is PunctuationType.STREAM_TIME:
                if self.stream_time < 0:
                    continue
                if punctuation.next_ms < 0:
                    punctuation.next_ms = self.stream_time + punctuation.interval_ms
                    continue
                if self.stream_time < punctuation.next_ms:
                    continue
                fire_at = self.stream_time
            else:
                if now_ms < punctuation.next_ms:
                    continue
                fire_at = now_ms
            punctuation.next_ms = fire_at + punctuation.interval_ms
            self._set_record_timestamp(fire_at)
            try:
                punctuation.callback(fire_at)
            except Exception as exc:
                self._set_record("<punctuation>", -1, fire_at)
                self._handle_error("processing", exc, None)
        self._update_wall_deadline()

    def _update_wall_deadline(self) -> None:
        wall = [
            p.next_ms
            for p in self._punctuations
            if p.type is PunctuationType.WALL_CLOCK_TIME and not p.cancelled
        ]
        if not wall:
            self.next_wall_punctuation = float("inf")
        else:
            delay_s = (min(wall) - time.time() * 1000) / 1000.0
            self.next_wall_punctuation = time.monotonic() + max(0.0, delay_s)

    def take_output(self) -> list[OutputRecord]:
        """Swap out the output accumulated since the last hand-over."""
        output, self.output = self.output, []
        return output

    # --- the commit (polling thread, task locked) ----------------------------

    def prepare_commit(self) -> CommitBatch:
        """Commit, first half: what this commit takes from the task.

        Emits the stores' cached writes (changelog records and downstream
        updates, in topology order: an upstream store's emission may write a
        downstream one) and returns them with the rest of the output, and the
        next input offsets to commit for the topics that moved since the last
        commit. Called by the committer on the polling thread, task locked.
        """
        self.commit_requested = False
        offsets = {
            topic: offset + 1
            for topic, offset in self.processed_offsets.items()
            if self.committed_offsets.get(topic) != offset
        }
        for store in self.stores.values():
            store.emit_cached()
        # After every emission: one store's emission may write another's.
        written: list[tuple[str, int]] = []
        logged_at_commit = self._logged_at_commit
        for name, store in self.stores.items():
            changelog = store.changelog
            if changelog is not None and changelog.records_logged != logged_at_commit.get(name, 0):
                logged_at_commit[name] = changelog.records_logged
                written.append((changelog.topic, changelog.partition))
        self._pending_offsets = offsets
        return CommitBatch(self, offsets, self.take_output(), tuple(written))

    def post_commit(
        self, changelog_positions: Mapping[tuple[str, int], int], offsets_committed: bool
    ) -> None:
        """Commit, second half, once the output is acknowledged (or its
        transaction committed): store batches go to disk atomically, each
        changelog written since the last commit moves to the position the
        broker gave for it (its end offset, looked up after the output was
        acknowledged; a changelog missing from `changelog_positions` keeps its
        position, which can only be lower than the truth: restoration then
        replays a few records the store already holds), the checkpoint names
        those positions, and, if the input offsets were committed, they count
        as committed. Polling thread, task locked.
        """
        offsets = self._pending_offsets
        self._pending_offsets = {}
        checkpoint: dict[tuple[str, int], int] = {}
        for store in self.stores.values():
            store.flush()
            changelog = store.changelog
            if changelog is None:
                continue
            position = changelog_positions.get((changelog.topic, changelog.partition))
            if position is not None:
                store.update_changelog_offset(position)
            checkpoint.update(store.checkpoint_offsets())
        if checkpoint:
            write_checkpoint(checkpoint_path(self.directory), checkpoint)
        if offsets_committed:
            for topic, next_offset in offsets.items():
                self.committed_offsets[topic] = next_offset - 1

    @property
    def changelog_partitions(self) -> list[tuple[str, int]]:
        return list(self.restore_from)

    def close(self) -> None:
        """Close the processor graph and stores; drop buffered input (it is
        re-fetched). Stores are not flushed here: a clean close commits first."""
        if self.closed:
            return
        self.closed = True
        for queue in self._queue_list:
            queue.records.clear()
        try:
            self.graph.close()
        finally:
            for store in self.stores.values():
                try:
                    store.close()
                except Exception as exc:
                    log.warning(
                        "store_close_failed", task_id=self.id, store=store.name, error=str(exc)
                    )
            log.debug("task_closed", task_id=self.id)
