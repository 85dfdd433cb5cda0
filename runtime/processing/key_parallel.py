"""A task several processing threads share, key by key (key-parallel mode).

With `num.threads.per.task` > 1 (or a `processing.retry.*` policy) a task is a
`KeyParallelTask`: up to `num.threads.per.task` processing threads hold it at
once (the task manager's shared hold), each working on a grab of whole key
lanes (`runtime.processing.key_lanes`), so records of one key are processed by
one thread at a time in offset order while other keys run beside them. What
changes against a `StreamTask`, and why:

- The record being processed and the output made since the last hand-over
  are per thread (`ThreadContexts`, runtime.processing.record_context): the
  graph's nodes are shared, so `send`, `record_timestamp` and the stores'
  clock read the calling thread's record. A record is processed by the same
  `_process_record` as in a one-thread task; only who runs it (the grab's
  thread) and when it counts as done (the lanes' watermark) differ.
- A grab's output is handed to the record collector before its keys are
  released, so the next record of a key (maybe on another thread) lands
  behind it: output keeps per-key order per output partition (rule 2).
- Stores: every call a processor makes goes through `_LockedStore`, under one
  re-entrant lock per task, so the cache, change-logging and inner layers
  see one caller at a time; a key's own reads and writes come from the one
  thread holding its lane. A store call that emitted output (a cache eviction
  flushes another key's update downstream) hands the calling thread's output
  over at once, under that lock, so emissions of one key reach the collector
  in the order they were made.
- Offsets: `processed_offsets` is the watermark (the completed prefix per
  input topic), so `prepare_commit` never commits past a record not yet
  completed (rule 3). Stream time advances with the records completed in
  offset order (the same prefix), never ahead of what a one-thread task
  would have seen, so a window is never closed earlier than there.
- Punctuations run with the task alone: the thread that finds one due stops
  new grabs and runs it once no grab is active (`KeyLanes.begin_exclusive`).
- Retries: a record whose processing raises is retried after a backoff
  (`processing.retry.*`) while other keys flow on; its key waits behind it.
  Output the failed attempt forwarded is dropped (changelog records stay,
  like the state writes they log); after the last attempt the processing
  exception handler decides.

One cohesive thing, the key-parallel task, hence a little over 500 lines:
its bookkeeping is in `key_lanes.py`, its record path shared with
`StreamTask` in `record_context.py`.

Threads: `process_shared` runs on every processing thread holding a share;
`hold_dispatch`/`resume_dispatch`/`in_flight` are for the committer (polling
thread); the rest as for `StreamTask`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, TypeGuard

from confluent_kafka import Message

from runtime.collector.collector import OutputRecord
from runtime.logging import get_logger
from runtime.processing.errors import TaskFailedError
from runtime.processing.key_lanes import Grab, KeyLanes
from runtime.processing.record_context import OutputSink, RecordContext
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.topology.context import PunctuationType
from runtime.topology.topology import Subtopology

log = get_logger("runtime.task")

# Store methods whose result is an iterator: materialized under the lock, so
# iterating never races a writer of another key.
_ITERATING = frozenset({"range", "all", "fetch", "fetch_all", "reverse_range", "reverse_all"})
# Parallelism used is measured over windows of about this many seconds.
_PARALLELISM_WINDOW_S = 1.0


class _LockedStore:
    """A store as the processors of a key-parallel task reach it.

    Every method call runs under the task's store lock; iterators are
    materialized under it. Output the call produced (evictions, pass-through
    writes) is handed over before the lock is released.
    """

    def __init__(self, store: Any, lock: threading.RLock, task: KeyParallelTask) -> None:
        self._store = store
        self._lock = lock
        self._task = task

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr
        wrapped = self._wrap(attr, name in _ITERATING)
        self.__dict__[name] = wrapped
        return wrapped

    def _wrap(self, fn: Callable[..., Any], materialize: bool) -> Callable[..., Any]:
        lock = self._lock
        task = self._task

        def call(*args: Any, **kwargs: Any) -> Any:
            with lock:
                record = task._contexts.record
                output = record.output
                before = len(output)
                result = fn(*args, **kwargs)
                if materialize:
                    result = iter(list(result))
                if record.output is not output or len(output) != before:
                    task._hand_over_now(record)
            return result

        return call


class KeyParallelTask(StreamTask):
    """A StreamTask that up to `threads_per_task` threads process at once, by key."""

    key_parallel = True

    def __init__(
        self,
        subtopology: Subtopology,
        partition: int,
        topics: list[str],
        settings: TaskSettings,
    ) -> None:
        kp = settings.key_parallel
        if kp is None:
            raise ValueError("KeyParallelTask needs TaskSettings.key_parallel")
        # Set before StreamTask.__init__: building the stores and the graph's
        # init reach the overrides below.
        self._store_lock = threading.RLock()
        self._locked: dict[str, _LockedStore] = {}
        self._wall_deadline = float("inf")
        self._failed = False
        self.threads_per_task = kp.threads_per_task
        self._lanes = KeyLanes(topics, kp.window, kp.threads_per_task)
        self.retried_count = 0
        self._busy_s = 0.0
        self._sample = (time.monotonic(), 0.0)
        self._parallelism = 0.0
        super().__init__(subtopology, partition, topics, settings, kp.retry)
        # The watermark is the offsets a commit takes (prepare_commit).
        self._lanes.done_offsets = self.processed_offsets
        self._changelog_topics = frozenset(
            s.changelog_topic for s in self.stores.values() if s.changelog_topic is not None
        )

    # --- figures (racy reads: status, scheduler) ----------------------------------

    @property
    def stream_time(self) -> int:
        """Largest timestamp of the records completed in offset order."""
        return self._lanes.stream_time

    @stream_time.setter
    def stream_time(self, value: int) -> None:
        self._lanes.stream_time = value

    @property
    def processed_count(self) -> int:
        return self._lanes.completed_total

    @processed_count.setter
    def processed_count(self, value: int) -> None:
        pass  # counted by the lanes

    @property
    def next_wall_punctuation(self) -> float:
        """When something is due with an empty buffer: a wall-clock punctuation
        or a retry (time.monotonic() seconds; the scheduler wakes for it).
        Not while exclusive work waits for grabs to end: their last runs it."""
        if self._lanes.exclusive_wanted:
            return float("inf")
        return min(self._wall_deadline, self._lanes.next_retry_at)

    @next_wall_punctuation.setter
    def next_wall_punctuation(self, value: float) -> None:
        self._wall_deadline = value

    @property
    def buffered(self) -> int:
        """Records a thread joining now could take (0: nothing for another thread)."""
        return self._lanes.available(self._undispatched(), time.monotonic())

    @property
    def input_buffered(self) -> int:
        """Records consumed and not yet dispatched to a key lane (status)."""
        return self._undispatched()

    @property
    def in_flight(self) -> int:
        """Records dispatched and not completed (being processed, waiting behind
        their key, or backing off before a retry)."""
        return self._lanes.in_flight

    @property
    def watermark_lag(self) -> int:
        """Records completed out of order, above the watermark: what a crash
        now would process again."""
        return self._lanes.completed_beyond

    @property
    def active_grabs(self) -> int:
        return self._lanes.active_grabs

    @property
    def completed_total(self) -> int:
        return self._lanes.completed_total

    @property
    def shareable(self) -> bool:
        """Whether one more thread could work on this task beside those holding
        it: not while its records are CPU-bound (`KeyLanes.fast`: under the GIL
        a second thread only contends) or a grab alone is wanted to tell
        (`KeyLanes.probe_wanted`), unless a grab is stuck on a slow record
        (`KeyLanes.stalled`). The scheduler's rule; a racy read."""
        lanes = self._lanes
        return not (lanes.fast or lanes.probe_wanted) or lanes.stalled

    def classification(self) -> dict[str, Any]:
        """Whether records count as CPU-bound (one thread) and the figures
        that say so (status; racy reads, any thread)."""
        cost = self._lanes.cost
        return {
            "cpu_bound": cost.fast,
            "record_cpu_us": round(cost.cpu_s * 1e6, 1),
            "record_wait_us": round(cost.wait_s * 1e6, 1),
            "probes": cost.probes,
        }

    @property
    def backing_off(self) -> bool:
        return self._lanes.next_retry_at != float("inf")

    def parallelism(self) -> float:
        """Threads busy on this task on average over the last second or so."""
        now = time.monotonic()
        since, busy_then = self._sample
        elapsed = now - since
        if elapsed >= _PARALLELISM_WINDOW_S:
            self._parallelism = (self._busy_s - busy_then) / elapsed
            self._sample = (now, self._busy_s)
        return round(self._parallelism, 2)

    # --- the commit barrier (committer, polling thread) ------------------------------

    def hold_dispatch(self) -> None:
        """Take no more input into lanes: in-flight records drain to zero."""
        self._lanes.hold_dispatch()

    def resume_dispatch(self) -> None:
        self._lanes.resume_dispatch()

    @property
    def failed(self) -> bool:
        return self._failed

    # --- TaskContext: what the threads share -------------------------------------------

    @property
    def last_record_timestamp(self) -> int:
        """-1: a key-parallel task gives no figure for a named query's latency
        (the task manager reads it at release; unchanged from before the record
        path was shared, when this read a field only one-thread tasks set)."""
        return -1

    def state_store(self, name: str) -> Any:
        locked = self._locked.get(name)
        if locked is None:
            locked = self._locked[name] = _LockedStore(
                super().state_store(name), self._store_lock, self
            )
        return locked

    def record_dropped(self, reason: str) -> None:
        with self._store_lock:
            super().record_dropped(reason)

    def _handle_error(self, stage: str, exc: Exception, message: Message | None) -> None:
        with self._store_lock:  # its counters are shared by the threads
            super()._handle_error(stage, exc, message)

    def _hand_over_now(self, record: RecordContext) -> None:
        sink = record.sink
        if sink is not None and record.output:
            output, record.output = record.output, []
            sink.hand_over(output)

    # --- processing (processing threads holding a share) -------------------------------

    def process(self, deadline: float) -> int:
        """One thread alone (no collector at hand): output stays for `take_output`."""
        return self.process_shared(deadline, None)

    def process_shared(
        self,
        deadline: float,
        sink: OutputSink | None,
        contenders: Callable[[], int] | None = None,
    ) -> int:
        """Take grabs of key lanes until the deadline or nothing is left for this thread.

        Each grab's output goes to `sink` before its keys are released.
        `contenders()`: threads competing for the GIL now (busy processing
        threads, this one included, and the polling thread; None: 1), read at
        each grab's start and end, to tell GIL waits from I/O waits
        (`KeyLanes.complete`).
        Raises TaskFailedError when a handler says fail (after completing what
        the grab finished; the failing record is not completed).
        """
        record = self._contexts.record
        record.sink = sink
        lanes = self._lanes
        total = 0
        try:
            while not self._failed and not self.closed:
                grab = lanes.take(self._pull, self._undispatched())
                if grab is None:
                    break
                total += self._run_grab(grab, record, deadline, contenders)
                if self._punctuations:
                    self._maybe_punctuate(record)
                if time.monotonic() >= deadline:
                    break
            if self._punctuations:
                self._maybe_punctuate(record)
        finally:
            self._hand_over_now(record)
            record.sink = None
        return total

    def _run_grab(
        self,
        grab: Grab,
        record: RecordContext,
        deadline: float,
        contenders: Callable[[], int] | None,
    ) -> int:
        done: list[int] = []
        to_retry: list[int] = []
        failure: TaskFailedError | None = None
        monotonic = time.monotonic
        contenders_then = contenders() if contenders is not None else 1
        cpu_started = time.thread_time()
        started = monotonic()
        lanes = self._lanes
        failures_of = lanes.failures
        process_record = self._process_record
        # One input topic: every record's topic and source node; several:
        # each record's own (`sources`).
        single = self._single_queue
        topic = single.topic if single is not None else ""
        source = self._single_source
        sources = self._sources if single is None else None
        try:
            if grab.chunk is not None:
                # Fast records, nothing else in flight: in offset order, one
                # thread. Only a task with one input topic takes chunks.
                assert source is not None
                count = 0
                for message in grab.chunk:
                    try:
                        ok = process_record(record, message, topic, source, 0)
                    except TaskFailedError as exc:
                        failure = exc
                        break
                    if not ok:
                        to_retry.append(0)
                        break
                    count += 1
                    if count & 15 == 0 and monotonic() >= deadline:
                        break
                done.append(count)
            for key, messages in grab.lanes:
                count = 0
                failures = failures_of.get(key, 0) if failures_of else 0
                for message in messages:
                    if sources is not None:
                        topic = message.topic()
                        source = sources[topic]
                    try:
                        # `source` is None only with several topics, set just above.
                        ok = process_record(record, message, topic, source, failures)  # type: ignore[arg-type]
                    except TaskFailedError as exc:
                        failure = exc
                        break
                    if not ok:
                        to_retry.append(len(done))
                        break
                    count += 1
                    failures = 0
                    if monotonic() >= deadline:
                        break  # the rest of the lane, and the lanes after it, go back
                done.append(count)
                if failure is not None or count < len(messages) or monotonic() >= deadline:
                    break
        finally:
            # The grab's output goes before its keys are released (rule 2).
            self._hand_over_now(record)
            elapsed = monotonic() - started
            cpu = time.thread_time() - cpu_started
            # The fewer of start and end: threads that left meanwhile (a
            # probe's start) competed for part of the grab at most.
            if contenders is not None:
                contenders_then = min(contenders_then, contenders())
            completed = lanes.complete(
                grab,
                done,
                self._retry,
                elapsed,
                to_retry,
                cpu,
                contenders_then,
                self._unpull,
            )
            self._busy_s += elapsed  # racy sum: a status figure only
        if failure is not None:
            self._failed = True
            raise failure
        return completed

    def _note_retry(
        self,
        exc: Exception,
        record: RecordContext,
        output: list[OutputRecord],
        mark: int,
        failures: int,
    ) -> None:
        """A failed attempt: drop what it forwarded (not its changelog records)."""
        if record.output is output and len(output) > mark:
            kept = [r for r in output[mark:] if r[0] in self._changelog_topics]
            del output[mark:]
            output.extend(kept)
        with self._store_lock:
            self.retried_count += 1
        log.warning(
            "processing_retry",
            task_id=self.id,
            topic=record.topic,
            partition=self.partition,
            offset=record.offset,
            attempt=failures,
            of=self._retry.attempts,
            backoff_ms=int(self._retry.delay_s(failures) * 1000),
            error=f"{type(exc).__name__}: {exc}",
        )

    def _maybe_punctuate(self, record: RecordContext) -> None:
        """Run due punctuations with the task alone (see KeyLanes.begin_exclusive)."""
        lanes = self._lanes
        if not (lanes.exclusive_wanted or self._punctuation_due()):
            return
        if not lanes.begin_exclusive():
            return  # the last grab to finish runs it
        try:
            self._punctuate()
        except TaskFailedError:
            self._failed = True
            raise
        finally:
            self._hand_over_now(record)
            lanes.end_exclusive()

    def _punctuation_due(self) -> bool:
        if self._wall_deadline <= time.monotonic():
            return True
        stream_time = self._lanes.stream_time
        if stream_time < 0:
            return False
        return any(
            p.type is PunctuationType.STREAM_TIME
            and not p.cancelled
            and (p.next_ms < 0 or stream_time >= p.next_ms)
            for p in self._punctuations
        )

    # --- dispatch (under the lanes' lock) ------------------------------------------------

    def _undispatched(self) -> int:
        single = self._single_queue
        if single is not None:
            return len(single.records)
        return sum(len(q.records) for q in self._queue_list)

    def _unpull(self, records: list[Message]) -> None:
        """Put a chunk's unfinished records back at the head of the input queue
        (chunks come from a single input queue only). The polling thread only
        appends at the tail meanwhile; deque ends are thread-safe."""
        single = self._single_queue
        assert single is not None, "a chunk from a task with several input topics"
        single.records.extendleft(reversed(records))

    def _pull(self, limit: int) -> list[Message]:
        """Up to `limit` records from the input queues, in the order one thread
        would process them (oldest head first across topics)."""
        single = self._single_queue
        if single is not None:
            records = single.records
            popleft = records.popleft
            return [popleft() for _ in range(min(limit, len(records)))]
        pulled: list[Message] = []
        while len(pulled) < limit:
            queue = self._next_queue()
            if queue is None:
                break
            pulled.append(queue.records.popleft())
        return pulled


def make_task(
    subtopology: Subtopology, partition: int, topics: list[str], settings: TaskSettings
) -> StreamTask:
    """The task the polling thread creates for a partition: key-parallel when
    configured and the subtopology allows it, else today's StreamTask."""
    if settings.key_parallel is not None and subtopology.key_parallel:
        return KeyParallelTask(subtopology, partition, topics, settings)
    return StreamTask(subtopology, partition, topics, settings)


def is_key_parallel(task: StreamTask) -> TypeGuard[KeyParallelTask]:
    """Whether several threads share `task` by key: its `key_parallel` kind,
    so code that holds, runs or drains a task reaches the key-parallel members
    typed (a test's stand-in sets the attribute and is taken at its word)."""
    return task.key_parallel


def key_parallel_figures(task: StreamTask) -> dict[str, Any]:
    """A task's key-parallel status fields (runtime.status.TaskStatus); none
    for a one-thread task. Racy reads, any thread."""
    if not isinstance(task, KeyParallelTask):
        return {}
    return {
        "key_parallel": True,
        "threads_per_task": task.threads_per_task,
        "in_flight": task.in_flight,
        "watermark_lag": task.watermark_lag,
        "parallelism": task.parallelism(),
        "retried": task.retried_count,
        **task.classification(),
    }
