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
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, NamedTuple

from runtime.collector.collector import OutputRecord
from runtime.logging import get_logger
from runtime.processing.input_queue import InputQueue
from runtime.processing.key_lanes import RetryPolicy
from runtime.processing.partition_sync import PartitionSync
from runtime.processing.record_context import NO_RETRY, FlushListener, RecordPath
from runtime.processing.task_settings import TaskSettings, task_id_of
from runtime.state.builders import (
    LayeredStore,
    build_task_stores,
    task_checkpoint_offsets,
    task_directory,
)
from runtime.state.checkpoint import CommittedPositions, FileCheckpoint, TaskPositions
from runtime.state.consolidated import ConsolidatedPositions
from runtime.state.task_lock import TaskDirectoryLock
from runtime.topology.context import PunctuationType
from runtime.topology.topology import Subtopology, TaskGraph

log = get_logger("runtime.task")

# How many records between two looks at the clock in the processing loop.
_CLOCK_CHECK_EVERY = 32


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


class StreamTask(RecordPath):
    """One subtopology x partition number; implements the graph's TaskContext
    (the record-dependent half in `RecordPath`, runtime.processing.record_context).

    Processed by one thread at a time (rule 1); `KeyParallelTask`
    (runtime.processing.key_parallel) is the variant several threads share.
    """

    key_parallel: ClassVar[bool] = False
    """The task's kind, the one switch the task manager, the processing
    threads and the committer read (`runtime.processing.key_parallel.
    is_key_parallel`): False, one thread holds it at a time and runs `process`;
    True (`KeyParallelTask`), up to `threads_per_task` threads hold it shared,
    each running `process_shared`, and a commit drains its records in flight
    (`hold_dispatch`). Test fakes set it too."""
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
        retry: RetryPolicy = NO_RETRY,
    ) -> None:
        """`retry`: `processing.retry.*` (a key-parallel task's; one thread never retries)."""
        super().__init__(task_id_of(subtopology.task_name, partition), partition, settings, retry)
        self.subtopology = subtopology
        # The named query it belongs to (None: the app runs one topology);
        # the scheduler reads it for query priorities and shares.
        self.query = subtopology.query
        self.queues: dict[str, InputQueue] = {t: InputQueue(t, partition) for t in topics}
        self._queue_list = list(self.queues.values())
        # Offsets: last processed per input topic. The holding processing
        # thread writes; the committer reads while every task is locked; the
        # lag figures read it racily (a stale value only misstates lag).
        self.processed_offsets: dict[str, int] = {}
        self.committed_offsets: dict[str, int] = {}
        self.stream_time = -1
        self.commit_requested = False
        self._pending_offsets: dict[str, int] = {}
        self.closed = False
        # Counters, read racily by the status snapshot (more in RecordPath).
        self.processed_count = 0
        self._punctuations: list[_Punctuation] = []
        self.next_wall_punctuation = float("inf")  # time.monotonic() seconds
        self.restored_records = 0  # set by the restoration thread when done
        # State: stores are opened here (polling thread) and read their
        # checkpoint; the restoration thread brings them up to date before the
        # task is handed to the task manager.
        self.directory = task_directory(settings.state_dir, settings.application_id, self.id)
        # changelog records logged per store at the last prepare_commit
        # (polling thread, task locked): which changelogs a commit wrote.
        self._logged_at_commit: dict[str, int] = {}
        # One owner per directory (another process of this daemon may still
        # be closing the task): runtime.state.task_lock.
        self._directory_lock = TaskDirectoryLock(self.directory)
        if subtopology.store_specs:
            self._directory_lock.acquire(while_waiting=settings.while_directory_waits)
        try:
            self.stores: dict[str, LayeredStore] = build_task_stores(
                subtopology.store_specs,
                self.directory,
                subtopology.topic_prefix(settings.application_id),
                partition,
                settings.cache_budget,
                self.send,
                on_flush=self._flush_dispatcher,
                clock=self._store_clock(),
                rocksdb_memory=settings.rocksdb_memory,
                consolidated=settings.consolidated,
            )
        except BaseException:
            self._directory_lock.release()
            raise
        self._positions: TaskPositions = (
            ConsolidatedPositions(settings.consolidated, self.id)
            if settings.consolidated is not None
            else FileCheckpoint(self.directory)
        )
        checkpoint = self._positions.read() if self.stores else None
        self._committed_positions = CommittedPositions(
            self._positions, checkpoint, self._sync_stores
        )
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
        # Several input partitions: wait for an empty one (max.task.idle.ms).
        # Key-parallel tasks take records as buffered (docs/dsl.md says why).
        self._sync: PartitionSync | None = None
        if len(topics) > 1 and settings.max_task_idle_ms >= 0 and not self.key_parallel:
            self._sync = PartitionSync(settings.max_task_idle_ms)
            for queue in self._queue_list:
                queue.synced = True
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
        return self._contexts.record.timestamp

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

    def global_store(self, name: str) -> Any:
        """The process's global store `name` (reads are safe from any thread)."""
        try:
            return self._settings.global_stores[name]
        except KeyError:
            raise KeyError(f"the app has no global store {name!r}") from None

    def register_flush_listener(self, store: str, listener: FlushListener) -> None:
        if store not in self.stores:
            raise KeyError(f"task {self.id} has no state store {store!r}")
        self._flush_listeners[store] = listener

    # --- processing (processing thread holding the task) --------------------

    @property
    def buffered(self) -> int:
        """Records the task could process now (0 while it waits for an empty
        input partition, `max.task.idle.ms`): the scheduler's figure."""
        if self._single_queue is not None:
            return len(self._single_queue.records)
        count = sum(len(q.records) for q in self._queue_list)
        sync = self._sync
        if count and sync is not None and not sync.ready(self._queue_list, time.monotonic(), False):
            return 0
        return count

    @property
    def input_buffered(self) -> int:
        """Records in the input queues (status; `buffered` is the scheduler's figure)."""
        if self._single_queue is not None:
            return len(self._single_queue.records)
        return sum(len(q.records) for q in self._queue_list)

    @property
    def enforced_processing(self) -> int:
        """Records taken while an empty input partition was given up on
        (`max.task.idle.ms` ran out; Kafka Streams' enforced-processing-total)."""
        return self._sync.enforced_total if self._sync is not None else 0

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
        record = self._contexts.record
        process_record = self._process_record
        single = self._single_queue
        if single is not None:
            records = single.records
            source = self._single_source
            assert source is not None
            topic = single.topic
            while records:
                process_record(record, records.popleft(), topic, source, 0)
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
                topic = queue.topic
                message = queue.records.popleft()
                if not queue.records:
                    queue.emptied_by(message)
                process_record(record, message, topic, self._sources[topic], 0)
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
        """The non-empty queue whose head record is oldest (Kafka's PartitionGroup);
        None while an empty one is waited for (`max.task.idle.ms`)."""
        best: InputQueue | None = None
        best_ts = 0
        empty = False
        for queue in self._queue_list:
            if queue.records:
                ts = queue.head_timestamp()
                if best is None or ts < best_ts:
                    best, best_ts = queue, ts
            else:
                empty = True
        sync = self._sync
        if empty and best is not None and sync is not None:
            return best if sync.ready(self._queue_list, time.monotonic()) else None
        return best

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
            # The callback's writes carry its time (the calling thread's context).
            record = self._contexts.record
            record.timestamp = fire_at
            try:
                punctuation.callback(fire_at)
            except Exception as exc:
                record.topic, record.offset, record.timestamp = "<punctuation>", -1, fire_at
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
        # A user function the emission runs fails to the handler, not the
        # polling thread (runtime.processing.flush_errors).
        self.emitting_at_commit = True
        try:
            for store in self.stores.values():
                store.emit_cached()
        finally:
            self.emitting_at_commit = False
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
        self,
        changelog_positions: Mapping[tuple[str, int], int],
        offsets_committed: bool,
        checkpoint_now: bool = True,
    ) -> None:
        """Commit, second half, once the output is acknowledged (or its
        transaction committed): store batches go to RocksDB atomically, each
        changelog written since the last commit moves to the position the
        broker gave for it (its end offset, looked up after the output was
        acknowledged; a changelog missing from `changelog_positions` keeps its
        position, which can only be lower than the truth: restoration then
        replays a few records the store already holds), and, if the input
        offsets were committed, they count as committed. Polling thread, task
        locked.

        The checkpoint naming those positions is written when `checkpoint_now`
        (a commit before the task leaves or the app stops) or when it is due
        (`CommittedPositions`); the stores' write-ahead logs are synced
        first, so a checkpoint never names writes a power loss could take
        back. Between checkpoints the store may hold more than its checkpoint
        names, never less; replaying a changelog from an older position
        rewrites the same values, so that is safe.
        """
        offsets = self._pending_offsets
        self._pending_offsets = {}
        for store in self.stores.values():
            store.flush()
            changelog = store.changelog
            if changelog is None:
                continue
            position = changelog_positions.get((changelog.topic, changelog.partition))
            if position is not None:
                store.update_changelog_offset(position)
        self._committed_positions.commit(
            task_checkpoint_offsets(self.stores.values()), checkpoint_now
        )
        if offsets_committed:
            for topic, next_offset in offsets.items():
                self.committed_offsets[topic] = next_offset - 1

    def write_checkpoint(self) -> None:
        """Write the checkpoint now, with the positions of the last commit (a
        remote snapshot was taken of them). Polling thread, task locked, after
        `post_commit`. The consolidated layout wrote them with that commit."""
        self._committed_positions.write_now(task_checkpoint_offsets(self.stores.values()))

    def _sync_stores(self) -> None:
        for store in self.stores.values():
            store.sync()

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
            self._directory_lock.release()
            log.debug("task_closed", task_id=self.id)
