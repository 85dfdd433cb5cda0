"""The bookkeeping of a key-parallel task: lanes per key, grabs, the watermark.

A key-parallel task (`num.threads.per.task` > 1, or a `processing.retry.*`
policy) lets several processing threads work on one task at once, on
different keys. This module is its bookkeeping, without Kafka or threads of
its own, so that hypothesis can drive it through any interleaving:

- dispatch: records leave the task's input queues in offset order (several
  input topics merged by head timestamp, as `StreamTask._next_queue`) into one
  lane per serialized key (a list of records); records without a key share
  one lane (they are processed one at a time, in offset order). Dispatched
  records are "in flight" until completed; at most `window` are in flight, so
  memory stays bounded (rule 5: the input buffer bound plus the window).
- grab: a processing thread takes whole lanes that are neither busy nor
  backing off (`take`); a lane is busy until its grab completes, so the
  records of one key are processed by one thread at a time, in offset order.
  While records are fast (CPU-bound: the GIL runs one thread anyway) and
  nothing else is in flight, a grab is a chunk straight from the input
  queue instead, with no lanes and no other grab beside it: the default
  mode's cost; a second thread is then of no use to the task, and takes no
  grab beside the one active. Whether records are fast is measured per grab
  (runtime.processing.record_cost); when the grabs sharing the task cannot
  tell, the next grab runs alone (a probe).
- complete: the thread reports how many records of each lane it finished
  (`complete`); unfinished ones go back to the head of their lane, a failed
  record to be retried puts its lane in backoff (`RetryPolicy`).
- watermark: the longest completed prefix of the dispatch order; per input
  topic, `done_offsets` names the offset of its last record there: the
  committable offset is one more, so a commit never passes a record not yet
  completed (rule 3). Stream time advances with the timestamps of that
  prefix, i.e. of records completed in offset order. No per-record object
  is made: a key's records complete in order, so a count of completions per
  key tells whether the head of the dispatch order is done.
- exclusive work (punctuations): `begin_exclusive` stops new grabs and
  succeeds once no grab is active; `hold_dispatch` (the exactly-once commit
  barrier) stops dispatch so the in-flight records drain to zero.

One cohesive thing, hence over 500 lines: dispatch, grabs, completion and
the watermark share one lock and one set of counters (a record moves
pending -> taken -> completed -> passed by the watermark, and each step
checks the others' invariants); split, they would trade their state across
modules under that lock. Its pure pieces are apart already (`RetryPolicy`,
`record_cost.py`).

Threads: every method takes the lanes' own lock; any processing thread holding
a share of the task calls `take`/`complete`, the committer calls
`hold_dispatch`/`resume_dispatch`, status readers read the counters racily.
"""

from __future__ import annotations

import heapq
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

from runtime.processing.record_cost import RecordCost

# Most records one grab takes: a grab's output is handed over and its keys
# released only when it completes, so small grabs keep per-key latency and
# the commit's wait for released tasks short; 64 records amortise the two
# lock round trips of a grab on CPU-bound work.
MAX_GRAB = 64
# A grab is sized to take about this long at the measured time per record:
# a slow record holds back the other lanes of its grab until it finishes, so
# where records are slow (I/O) a grab is one lane, and every key waits only
# for its own records; where they are fast, up to MAX_GRAB records share the
# grab's overhead (and a surprise slow record delays at most those).
GRAB_TARGET_S = 0.001
# A chunk takes about this much CPU time (at most MAX_CHUNK records): one
# thread works the task meanwhile, so chunks amortise their hand-over and
# locks as the default mode's batches do. CPU time, not wall time: under GIL
# contention the wall time per record grows with the thread count, and
# chunks sized by it would shrink to a few records.
CHUNK_TARGET_S = 0.01
MAX_CHUNK = 2048
# Most records one `take` moves from the input queues into lanes (bounds how
# long one thread holds the lanes' lock while dispatching).
MAX_DISPATCH = 512
# A grab of fast records that has run this long is stuck on a surprise slow
# record (a lane grab of fast records takes a few ms even when many threads
# contend for the GIL): other threads may then take the other keys again.
STALL_S = 0.05


@dataclass(frozen=True)
class RetryPolicy:
    """`processing.retry.*`: how often and how long to retry a failed record.

    `attempts` retries after the first failure (0: none, the handler decides at
    once); the n-th retry waits `backoff_ms * 2**(n-1)`, at most `max_backoff_ms`.
    """

    attempts: int = 0
    backoff_ms: int = 100
    max_backoff_ms: int = 10_000

    def delay_s(self, failures: int) -> float:
        """Seconds to wait before the retry that follows failure number `failures`."""
        delay = self.backoff_ms * (2 ** max(0, failures - 1))
        return min(delay, self.max_backoff_ms) / 1000.0


@dataclass(frozen=True)
class KeyParallelSettings:
    """`num.threads.per.task`, `processing.retry.*` and the dispatch window,
    resolved once at start-up (read-only, shared by every task)."""

    threads_per_task: int
    retry: RetryPolicy
    window: int


def key_parallel_settings(config: Any) -> KeyParallelSettings | None:
    """From a StreamsConfig: None unless key-parallel mode is on.

    The dispatch window is `buffered.records.per.partition`: a task holds at
    most that many records in flight besides its input buffer."""
    if not config.key_parallel:
        return None
    return KeyParallelSettings(
        threads_per_task=config.num_threads_per_task,
        retry=RetryPolicy(
            attempts=config.processing_retry_attempts,
            backoff_ms=config.processing_retry_backoff_ms,
            max_backoff_ms=config.processing_retry_backoff_max_ms,
        ),
        window=config.buffered_records_per_partition,
    )


class Message(Protocol):
    """What the bookkeeping reads of a record (a consumed confluent_kafka.Message)."""

    def key(self) -> bytes | None: ...

    def offset(self) -> int | None: ...

    def timestamp(self) -> tuple[int, int]: ...

    def topic(self) -> str | None: ...


Key = bytes | None


class Grab:
    """What one `take` handed to one thread: whole lanes, each (key, its records
    in offset order); or a `chunk`: records straight from the input queue, in
    offset order, whatever their keys (see `KeyLanes.take`)."""

    __slots__ = ("lanes", "chunk", "alone_since")

    def __init__(self, chunk: list[Any] | None = None) -> None:
        self.lanes: list[tuple[Key, list[Any]]] = []
        self.chunk = chunk
        # The lanes' overlap count when this grab started with no other grab
        # active (-1: it did not): unchanged at its end means it ran alone.
        self.alone_since = -1

    @property
    def records(self) -> int:
        if self.chunk is not None:
            return len(self.chunk)
        return sum(len(records) for _key, records in self.lanes)


Pull = Callable[[int], list[Any]]
"""`pull(limit)`: up to `limit` records from the input queues, in dispatch
order (called under the lanes' lock)."""

Unpull = Callable[[list[Any]], None]
"""`unpull(records)`: put records a chunk pulled and did not complete back at
the head of the input queue, in their order (called under the lanes' lock)."""

_BUSY, _BACKOFF = 1, 2


class KeyLanes:
    """Lanes, grabs and the watermark of one key-parallel task (see module doc)."""

    def __init__(
        self,
        topics: Iterable[str],
        window: int,
        threads_per_task: int,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._lock = threading.Lock()
        self._clock = clock
        self.window = max(1, window)
        self.threads_per_task = max(1, threads_per_task)
        topic_list = list(topics)
        self._single_topic = topic_list[0] if len(topic_list) == 1 else None
        # Lanes: key -> records dispatched and not taken, in offset order. A
        # key is ready when it has records and is not blocked (busy in a grab
        # or backing off before a retry); ready keys wait in `_ready`.
        self._pending: dict[Key, list[Any]] = {}
        self._blocked: dict[Key, int] = {}
        self._ready: deque[Key] = deque()
        # Failed attempts of a key's head record (read by the grabbing thread).
        self.failures: dict[Key, int] = {}
        self._backoff: list[tuple[float, int, Key]] = []
        self._backoff_seq = 0
        # The dispatch order, and per key completions not yet passed by the
        # watermark (a key's records complete in order: see _advance).
        self._order: deque[Any] = deque()
        self._unadvanced: dict[Key, int] = {}
        # Figures (written under the lock, read racily by status and scheduler).
        self.ready_records = 0
        self.in_flight = 0
        self.completed_beyond = 0  # completed, above the watermark
        self.active_grabs = 0
        # When each active grab started (by id), and the oldest of them
        # (inf: none; read racily by `stalled`).
        self._grab_starts: dict[int, float] = {}
        self._oldest_grab_at = float("inf")
        self.dispatched_total = 0
        self.completed_total = 0
        self.stream_time = -1
        self.done_offsets: dict[str, int] = {}
        self.dispatch_held = False
        self.exclusive_wanted = False
        self._exclusive_running = False
        self._chunk_active = False
        # What records cost (CPU-bound or waiting), and how many grabs have
        # started beside an active one (a grab ran alone if none did meanwhile).
        self.cost = RecordCost()
        self._overlaps = 0

    # --- the scheduler's view (racy reads) -------------------------------------

    def available(self, undispatched: int, now: float) -> int:
        """Records a new grab could take now (0: nothing; racy, for scheduling)."""
        if self.exclusive_wanted:
            return 1 if self.active_grabs == 0 and not self._exclusive_running else 0
        count = self.ready_records
        backoff = self._backoff
        if backoff and backoff[0][0] <= now:
            count += 1
        if undispatched and not self.dispatch_held and not self._chunk_active:
            count += min(undispatched, max(0, self.window - self.in_flight))
        return count

    @property
    def next_retry_at(self) -> float:
        """When the earliest lane in backoff may be retried (inf: none)."""
        backoff = self._backoff
        return backoff[0][0] if backoff else float("inf")

    @property
    def fast(self) -> bool:
        """Records are CPU-bound (`RecordCost.fast`): another thread on this
        task cannot run beside this one under the GIL, so chunks, and no
        second thread (racy read)."""
        return self.cost.fast

    @property
    def probe_wanted(self) -> bool:
        """The next grab should run alone to tell whether records are fast
        (`RecordCost.probe_wanted`), so no thread joins meanwhile; never for
        several input topics (they never take chunks). Racy read."""
        if self._single_topic is None or self.dispatch_held:
            return False
        return self.cost.probe_wanted(self._clock())

    @property
    def stalled(self) -> bool:
        """A grab has been active for more than STALL_S (a racy read): a slow
        record, so other keys need other threads even if records are fast."""
        return self._clock() - self._oldest_grab_at > STALL_S

    @property
    def lanes(self) -> int:
        """Keys with records dispatched and not taken."""
        return len(self._pending)

    def failures_of(self, key: Key) -> int:
        """Failed attempts of the key's head record so far (the grabbing thread)."""
        return self.failures.get(key, 0)

    # --- processing threads --------------------------------------------------------

    def take(self, pull: Pull, undispatched: int) -> Grab | None:
        """Dispatch what the window allows, then take whole ready lanes.

        Returns None when nothing can be taken (all keys busy or backing off,
        nothing in the input queues, or exclusive work wanted).
        """
        with self._lock:
            if self.exclusive_wanted:
                return None
            backoff = self._backoff
            if backoff and backoff[0][0] <= self._clock():
                self._end_backoffs()
            if self._chunk_active:
                return None  # the chunk's keys are unknown: nothing else runs beside it
            fast = self.fast and self._single_topic is not None and not self.dispatch_held
            probe = not fast and self.probe_wanted
            if fast or probe:
                if self.active_grabs and not self.stalled:
                    # CPU-bound records: a second thread would only contend
                    # for the GIL and turn chunks into lanes; the active
                    # grab's thread goes on alone (unless it is stuck). A
                    # probe waits for the active grabs to end.
                    return None
                if fast and undispatched and not self.in_flight:
                    return self._take_chunk(pull)
            # Fast records: let the lanes drain (chunks follow) unless nothing
            # in them is ready (keys backing off).
            if undispatched and not self.dispatch_held and not (fast and self._ready):
                room = self.window - self.in_flight
                if room > 0:
                    self._dispatch(pull(min(room, MAX_DISPATCH)))
            ready = self._ready
            if not ready:
                return None
            if probe:
                # About GRAB_TARGET_S of records, alone: enough to measure.
                budget = max(1, min(MAX_GRAB, int(GRAB_TARGET_S / self.cost.record_s)))
                self.cost.probes += 1
            elif fast and not self.active_grabs:
                # One thread drains the lanes alone (see above): no sharing,
                # and the wall time per record is mostly GIL contention.
                budget = MAX_GRAB
            else:
                # Share the ready records with the threads taking grabs now.
                fair_share = -(-self.ready_records // (self.active_grabs + 1))
                budget = max(1, min(MAX_GRAB, fair_share, int(GRAB_TARGET_S / self.cost.record_s)))
            pending = self._pending
            blocked = self._blocked
            grab = Grab()
            lanes = grab.lanes
            taken = 0
            while ready and taken < budget:
                key = ready.popleft()
                records = pending.pop(key)
                blocked[key] = _BUSY
                lanes.append((key, records))
                taken += len(records)
            self.ready_records -= taken
            self._started(grab)
            return grab

    def _take_chunk(self, pull: Pull) -> Grab | None:
        """Nothing in flight and records are fast: the next records straight
        from the input queue, in offset order, as one grab (under the lock)."""
        size = max(1, int(CHUNK_TARGET_S / self.cost.cpu_s))
        records = pull(min(MAX_CHUNK, self.window, size))
        if not records:
            return None
        count = len(records)
        self.in_flight += count
        self.dispatched_total += count
        self._chunk_active = True
        grab = Grab(records)
        self._started(grab)
        return grab

    def _started(self, grab: Grab) -> None:
        """Count `grab` as active from now (under the lock)."""
        now = self._clock()
        self._grab_starts[id(grab)] = now
        if self._oldest_grab_at == float("inf"):
            self._oldest_grab_at = now
        if self.active_grabs:
            self._overlaps += 1
        else:
            grab.alone_since = self._overlaps
        self.active_grabs += 1

    def _ended(self, grab: Grab) -> None:
        """`grab` is no longer active (under the lock)."""
        starts = self._grab_starts
        started = starts.pop(id(grab), None)
        if started is not None and started <= self._oldest_grab_at:
            self._oldest_grab_at = min(starts.values(), default=float("inf"))
        self.active_grabs -= 1

    def _complete_chunk(
        self,
        chunk: list[Any],
        done: int,
        retry: RetryPolicy,
        retrying: bool,
        unpull: Unpull | None,
    ) -> int:
        """A chunk is the whole in-flight set: its done prefix is the watermark's
        next step; the rest goes back to the head of the input queue (`unpull`:
        as if never pulled, so the next grab is a chunk again), or into lanes
        when the first record's key is to be retried (into backoff) or there is
        no `unpull`. Under the lock."""
        self._chunk_active = False
        if done:
            stream_time = self.stream_time
            for record in chunk[:done]:
                timestamp = record.timestamp()[1]
                if timestamp > stream_time:
                    stream_time = timestamp
            self.stream_time = stream_time
            assert self._single_topic is not None
            self.done_offsets[self._single_topic] = chunk[done - 1].offset()
            self.failures.clear()
        rest = chunk[done:]
        if rest:
            self.in_flight -= len(rest)
            self.dispatched_total -= len(rest)
            if unpull is not None and not retrying:
                unpull(rest)
                return done
            if retrying:
                key = rest[0].key()
                self.failures[key] = attempt = self.failures.get(key, 0) + 1
                self._blocked[key] = _BACKOFF
                self._backoff_seq += 1
                due = self._clock() + retry.delay_s(attempt)
                heapq.heappush(self._backoff, (due, self._backoff_seq, key))
            self._dispatch(rest)
        return done

    def _end_backoffs(self) -> None:
        now = self._clock()
        backoff = self._backoff
        while backoff and backoff[0][0] <= now:
            _due, _seq, key = heapq.heappop(backoff)
            del self._blocked[key]
            records = self._pending.get(key)
            if records:
                self._ready.append(key)
                self.ready_records += len(records)

    def _dispatch(self, records: list[Any]) -> None:
        pending = self._pending
        blocked = self._blocked
        ready = self._ready
        ready_added = 0
        for record in records:
            key = record.key()
            lane = pending.get(key)
            if lane is None:
                pending[key] = [record]
                if key not in blocked:
                    ready.append(key)
                    ready_added += 1
            else:
                lane.append(record)
                if key not in blocked:
                    ready_added += 1
        self._order.extend(records)
        count = len(records)
        self.ready_records += ready_added
        self.in_flight += count
        self.dispatched_total += count

    def complete(
        self,
        grab: Grab,
        done: list[int],
        retry: RetryPolicy,
        busy_s: float = 0.0,
        to_retry: Iterable[int] = (),
        cpu_s: float | None = None,
        contenders: int = 1,
        unpull: Unpull | None = None,
    ) -> int:
        """Finish a grab: `done[i]` records of `grab.lanes[i]` completed, in
        order from the first (missing: none); the lanes at the indexes in
        `to_retry` failed on the record after those and wait for a retry.

        Completed records count toward the watermark; the rest go back to the
        head of their lane (a chunk's: to the input queue through `unpull`).
        `busy_s` is how long the grab took, `cpu_s` the CPU time the thread
        spent on it (None: not measured, all of `busy_s` counts as waiting)
        and `contenders` how many threads were competing for the GIL
        meanwhile (busy processing threads and the polling thread): they size
        later grabs and tell whether records are fast. Returns how many
        records completed.
        """
        with self._lock:
            retrying = set(to_retry)
            if grab.chunk is not None:
                count = done[0] if done else 0
                completed = self._complete_chunk(grab.chunk, count, retry, 0 in retrying, unpull)
                self._note_time(busy_s, completed + len(retrying), cpu_s, contenders, grab)
                self.in_flight -= completed
                self.completed_total += completed
                self._ended(grab)
                return completed
            pending = self._pending
            blocked = self._blocked
            unadvanced = self._unadvanced
            failures = self.failures
            ready = self._ready
            ready_added = 0
            completed = 0
            lanes = grab.lanes
            for index, (key, records) in enumerate(lanes):
                count = done[index] if index < len(done) else 0
                if count == len(records) and not failures:
                    # The common case: the whole lane done, no retry anywhere.
                    completed += count
                    unadvanced[key] = unadvanced.get(key, 0) + count
                    del blocked[key]
                    waiting = pending.get(key)
                    if waiting:
                        ready.append(key)
                        ready_added += len(waiting)
                    continue
                if count:
                    completed += count
                    unadvanced[key] = unadvanced.get(key, 0) + count
                    failures.pop(key, None)
                if count < len(records):
                    rest = records[count:]
                    later = pending.get(key)
                    pending[key] = rest + later if later else rest
                if index in retrying and count < len(records):
                    failures[key] = attempt = failures.get(key, 0) + 1
                    blocked[key] = _BACKOFF
                    self._backoff_seq += 1
                    due = self._clock() + retry.delay_s(attempt)
                    heapq.heappush(self._backoff, (due, self._backoff_seq, key))
                    continue
                del blocked[key]
                waiting = pending.get(key)
                if waiting:
                    ready.append(key)
                    ready_added += len(waiting)
            self.ready_records += ready_added
            self._note_time(busy_s, completed + len(retrying), cpu_s, contenders, grab)
            self.in_flight -= completed
            self.completed_total += completed
            self.completed_beyond += completed
            if completed:
                self._advance()
            self._ended(grab)
            return completed

    def _note_time(
        self, busy_s: float, attempted: int, cpu_s: float | None, contenders: int, grab: Grab
    ) -> None:
        """Fold one grab's times into what records cost (under the lock)."""
        alone = grab.alone_since == self._overlaps
        self.cost.note(busy_s, attempted, cpu_s, contenders, alone, self._clock())

    def _advance(self) -> None:
        """Move the watermark over the completed head of the dispatch order.

        The head record's key has a completion not yet passed iff the head is
        done: completions of one key come in its offset order, and the head is
        the key's earliest record the watermark has not passed.
        """
        order = self._order
        unadvanced = self._unadvanced
        stream_time = self.stream_time
        single = self._single_topic
        done_offsets = self.done_offsets
        popped = 0
        last = None
        while order:
            record = order[0]
            key = record.key()
            count = unadvanced.get(key)
            if not count:
                break
            if count == 1:
                del unadvanced[key]
            else:
                unadvanced[key] = count - 1
            order.popleft()
            popped += 1
            timestamp = record.timestamp()[1]
            if timestamp > stream_time:
                stream_time = timestamp
            if single is None:
                done_offsets[record.topic()] = record.offset()
            last = record
        if last is not None and single is not None:
            done_offsets[single] = last.offset()
        self.completed_beyond -= popped
        self.stream_time = stream_time

    # --- exclusive work (punctuation) ----------------------------------------------

    def begin_exclusive(self) -> bool:
        """Ask for the task alone: new grabs stop; True once none is active
        (the caller then runs its exclusive work and calls `end_exclusive`)."""
        with self._lock:
            self.exclusive_wanted = True
            if self.active_grabs == 0 and not self._exclusive_running:
                self._exclusive_running = True
                return True
            return False

    def end_exclusive(self) -> None:
        with self._lock:
            self._exclusive_running = False
            self.exclusive_wanted = False

    # --- the commit barrier (committer, polling thread) ----------------------------

    def hold_dispatch(self) -> None:
        """Dispatch no more records: the in-flight ones drain to zero."""
        with self._lock:
            self.dispatch_held = True

    def resume_dispatch(self) -> None:
        with self._lock:
            self.dispatch_held = False

    # --- inspection (tests, status) --------------------------------------------------

    def pending_keys(self) -> dict[Key, list[int | None]]:
        """Offsets waiting in each lane (not taken), for tests and debugging."""
        with self._lock:
            return {key: [r.offset() for r in records] for key, records in self._pending.items()}
