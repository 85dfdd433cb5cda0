"""The bookkeeping of a key-parallel task: lanes per key, grabs, the watermark.

A key-parallel task (`num.threads.per.task` > 1, or a `processing.retry.*`
policy) lets several processing threads work on one task at once, on
different keys. This module is its bookkeeping, without Kafka or threads of
its own, so that hypothesis can drive it through any interleaving:

- dispatch: records leave the task's input queues in offset order (several
  input topics merged by head timestamp, as `StreamTask._next_queue`) into one
  lane per serialized key; records without a key share one lane (they are
  processed one at a time, in offset order). Dispatched records are "in
  flight" until completed; at most `window` are in flight, so memory stays
  bounded (rule 5: the input buffer bound plus the window).
- grab: a processing thread takes whole lanes that are neither busy nor
  backing off (`take`); a lane is busy until its grab completes, so the
  records of one key are processed by one thread at a time, in offset order.
- complete: the thread reports how many records of each lane it finished
  (`complete`); unfinished ones go back to the head of their lane, a failed
  record to be retried puts its lane in backoff (`RetryPolicy`).
- watermark: per input topic, the offset of the last record of the longest
  completed prefix (`done_offsets`): the committable offset is one more, so
  a commit never passes a record not yet completed (rule 3). Stream time
  advances with the timestamps of that prefix, i.e. of records completed in
  offset order.
- exclusive work (punctuations): `begin_exclusive` stops new grabs and
  succeeds once no grab is active; `hold_dispatch` (the exactly-once commit
  barrier) stops dispatch so the in-flight records drain to zero.

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
from typing import Any

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
# Until measured, records are assumed this slow (one-lane grabs).
_INITIAL_RECORD_S = 0.001
# Most records one `take` moves from the input queues into lanes (bounds how
# long one thread holds the lanes' lock while dispatching).
MAX_DISPATCH = 512

_READY, _BUSY, _BACKOFF = 0, 1, 2


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


class Entry:
    """One dispatched record: the message plus what the bookkeeping needs."""

    __slots__ = ("message", "topic", "offset", "timestamp", "done")

    def __init__(self, message: Any, topic: str, offset: int, timestamp: int) -> None:
        self.message = message
        self.topic = topic
        self.offset = offset
        self.timestamp = timestamp
        self.done = False


class Lane:
    """The dispatched, not yet taken records of one key, in offset order."""

    __slots__ = ("key", "pending", "state", "failures", "retry_at")

    def __init__(self, key: bytes | None) -> None:
        self.key = key
        self.pending: deque[Entry] = deque()
        self.state = _READY
        self.failures = 0  # failed attempts of the head record so far
        self.retry_at = 0.0


class Grab:
    """What one `take` handed to one thread: lanes and the records taken from each."""

    __slots__ = ("lanes",)

    def __init__(self) -> None:
        self.lanes: list[tuple[Lane, list[Entry]]] = []

    @property
    def records(self) -> int:
        return sum(len(entries) for _lane, entries in self.lanes)


@dataclass
class LaneResult:
    """How a thread finished one lane of its grab: `done` records completed (in
    order, from the first); `retry` when the record after them failed and is to
    be retried after the backoff (its lane waits)."""

    done: int
    retry: bool = False


Pull = Callable[[int], Iterable[tuple[bytes | None, Entry]]]
"""`pull(limit)`: up to `limit` (key, entry) pairs from the input queues, in
dispatch order (called under the lanes' lock)."""


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
        self._lanes: dict[bytes | None, Lane] = {}
        self._ready: deque[Lane] = deque()
        self._backoff: list[tuple[float, int, Lane]] = []
        self._backoff_seq = 0
        self._order: dict[str, deque[Entry]] = {t: deque() for t in topics}
        # Figures (written under the lock, read racily by status and scheduler).
        self.ready_records = 0
        self.in_flight = 0
        self.completed_beyond = 0  # completed, above the watermark
        self.active_grabs = 0
        self.dispatched_total = 0
        self.completed_total = 0
        self.stream_time = -1
        self.done_offsets: dict[str, int] = {}
        self.dispatch_held = False
        self.exclusive_wanted = False
        self._exclusive_running = False
        # Moving average of the time per completed record (sizes grabs).
        self.record_s = _INITIAL_RECORD_S

    # --- the scheduler's view (racy reads) -------------------------------------

    def available(self, undispatched: int, now: float) -> int:
        """Records a new grab could take now (0: nothing; racy, for scheduling)."""
        if self.exclusive_wanted:
            return 1 if self.active_grabs == 0 and not self._exclusive_running else 0
        count = self.ready_records
        backoff = self._backoff
        if backoff and backoff[0][0] <= now:
            count += 1
        if undispatched and not self.dispatch_held:
            count += min(undispatched, max(0, self.window - self.in_flight))
        return count

    @property
    def next_retry_at(self) -> float:
        """When the earliest lane in backoff may be retried (inf: none)."""
        backoff = self._backoff
        return backoff[0][0] if backoff else float("inf")

    @property
    def lanes(self) -> int:
        return len(self._lanes)

    # --- processing threads --------------------------------------------------------

    def take(self, pull: Pull, undispatched: int) -> Grab | None:
        """Dispatch what the window allows, then take whole ready lanes.

        Returns None when nothing can be taken (all keys busy or backing off,
        nothing in the input queues, or exclusive work wanted).
        """
        with self._lock:
            if self.exclusive_wanted:
                return None
            now = self._clock()
            backoff = self._backoff
            while backoff and backoff[0][0] <= now:
                _due, _seq, lane = heapq.heappop(backoff)
                lane.state = _READY
                self._ready.append(lane)
                self.ready_records += len(lane.pending)
            if undispatched and not self.dispatch_held:
                room = self.window - self.in_flight
                if room > 0:
                    self._dispatch(pull, min(room, MAX_DISPATCH))
            ready = self._ready
            if not ready:
                return None
            fair_share = -(-self.ready_records // self.threads_per_task)
            budget = max(1, min(MAX_GRAB, fair_share, int(GRAB_TARGET_S / self.record_s)))
            grab = Grab()
            taken = 0
            while ready and taken < budget:
                lane = ready.popleft()
                entries = list(lane.pending)
                lane.pending.clear()
                lane.state = _BUSY
                grab.lanes.append((lane, entries))
                taken += len(entries)
            self.ready_records -= taken
            self.active_grabs += 1
            return grab

    def _dispatch(self, pull: Pull, limit: int) -> None:
        lanes = self._lanes
        ready = self._ready
        order = self._order
        count = 0
        ready_added = 0
        for key, entry in pull(limit):
            lane = lanes.get(key)
            if lane is None:
                lane = lanes[key] = Lane(key)
                ready.append(lane)
            if lane.state == _READY:
                ready_added += 1
            lane.pending.append(entry)
            order[entry.topic].append(entry)
            count += 1
        self.ready_records += ready_added
        self.in_flight += count
        self.dispatched_total += count

    def complete(
        self, grab: Grab, results: list[LaneResult], retry: RetryPolicy, busy_s: float = 0.0
    ) -> int:
        """Finish a grab: `results[i]` for `grab.lanes[i]` (missing: none done).

        Completed records count toward the watermark; the rest go back to the
        head of their lane. `busy_s` is how long the grab took (sizes later
        grabs). Returns how many records completed.
        """
        with self._lock:
            now = self._clock()
            completed = 0
            for index, (lane, entries) in enumerate(grab.lanes):
                result = results[index] if index < len(results) else None
                done = result.done if result is not None else 0
                for entry in entries[:done]:
                    entry.done = True
                completed += done
                if done:
                    lane.failures = 0
                rest = entries[done:]
                if rest:
                    lane.pending.extendleft(reversed(rest))
                if result is not None and result.retry and rest:
                    lane.failures += 1
                    lane.state = _BACKOFF
                    lane.retry_at = now + retry.delay_s(lane.failures)
                    self._backoff_seq += 1
                    heapq.heappush(self._backoff, (lane.retry_at, self._backoff_seq, lane))
                elif lane.pending:
                    lane.state = _READY
                    self._ready.append(lane)
                    self.ready_records += len(lane.pending)
                else:
                    lane.state = _READY
                    del self._lanes[lane.key]
            attempted = completed + sum(1 for r in results if r.retry)
            if attempted and busy_s > 0.0:
                self.record_s = 0.8 * self.record_s + 0.2 * max(busy_s / attempted, 1e-7)
            self.in_flight -= completed
            self.completed_total += completed
            self.completed_beyond += completed
            self._advance()
            self.active_grabs -= 1
            return completed

    def _advance(self) -> None:
        """Move the watermark over the completed prefix of each topic."""
        stream_time = self.stream_time
        done_offsets = self.done_offsets
        popped = 0
        for topic, order in self._order.items():
            if not order or not order[0].done:
                continue
            entry = order[0]
            while order and order[0].done:
                entry = order.popleft()
                popped += 1
                if entry.timestamp > stream_time:
                    stream_time = entry.timestamp
            done_offsets[topic] = entry.offset
        self.completed_beyond -= popped
        self.stream_time = stream_time

    def failures_of(self, lane: Lane) -> int:
        """Failed attempts of the lane's head record so far (the grabbing thread)."""
        return lane.failures

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

    def pending_keys(self) -> dict[bytes | None, list[int]]:
        """Offsets waiting in each lane (not taken), for tests and debugging."""
        with self._lock:
            return {key: [e.offset for e in lane.pending] for key, lane in self._lanes.items()}
