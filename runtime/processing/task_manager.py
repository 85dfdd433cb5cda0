"""Task manager and scheduler: who may process which task, and when.

Holds the processable tasks and an exclusive lock per task. Processing threads
call `acquire_next` / `release`; the polling thread adds and removes tasks,
locks every task for a commit (`lock_all_tasks` returns a future that
completes once no thread holds a task) and collects errors parked by
processing threads (`drain_failures`). One condition variable guards it all;
a processing thread takes it once per batch, never per record.

Scheduling: the unlocked task with the most buffered records goes first; ties
go to the task whose head record is oldest. Most-buffered-first alone starves:
with one hot partition the hot task always has the most records, and a task
with a few records waited for the hot one's whole backlog (measured on the
skew benchmark: the cold partitions' output came 3.7x later than in the
thread-per-client model). So a task with records that has not been served for
`starvation_s` (the time slice) goes first, longest-waiting first: every task
with input gets a turn within about (tasks / threads) time slices. A task with
a wall-clock punctuation due is eligible with an empty buffer. A failed or
paused task is never handed out.

Key-parallel tasks (`task.key_parallel`, runtime.processing.key_parallel) are
held shared: up to `task.threads_per_task` threads at once, each working on
other keys (rule 1 relaxed per key, never within a key). Such a task is handed
to one more thread only when no unheld task has work, while it has records
that thread could take (`task.buffered`), and while its records are not
CPU-bound (`task.shareable`: under the GIL a second thread on CPU-bound
records only contends, and turns the task's cheap chunks into key lanes).
Commits and interactive queries still need it alone: they wait until no
thread holds a share, and a waiting query stops new shares.

Named queries (`task.query`, runtime.topology.named_queries): the query goes
first, then the rules above inside it. `QueryLedger` (runtime.processing.
query_shares) orders the queries with work: higher `priority` first, then the
least busy time per `weight`; `max_threads` caps a query's holders. A paused
query's tasks are never handed out (a failed query is paused). Tasks without
a query (one plain topology) skip all of it. Preemption by priority: when
routed input (`notify_work`) or a resumed query gives a higher-priority task
work and no thread is idle, the holder of a lower-priority task is asked to
end its batch after the current record (`_preempt_for_priority`, the rule in
query_shares.preemptions); key-parallel tasks are not asked.

What is not lock bookkeeping lives beside it: the policy (`scheduler.py`,
pure), query shares and latency figures (`query_shares.py`), parked failures
(`errors.ParkedFailures`). What stays is one thing, the table of who holds
which task and everything that must change with it under the one condition
variable (hand-out, release, pauses, the commit's lock, a query's exclusive
hold, preemption), hence a little over 500 lines.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import TypeVar

from runtime.logging import get_logger
from runtime.processing.errors import ParkedFailures, TaskFailedError
from runtime.processing.key_parallel import is_key_parallel
from runtime.processing.query_shares import QueryLatency, QueryLedger, QueryShare, preemptions
from runtime.processing.scheduler import SchedulingPolicy
from runtime.processing.task import StreamTask

T = TypeVar("T")

log = get_logger("runtime.processing")

# Longest a waiting processing thread sleeps before looking again; wake-ups
# normally come from notify_work, this only bounds punctuation lateness.
_MAX_IDLE_WAIT = 0.1


class TaskManager:
    """Processable tasks and their locks. Thread-safe; see each method for callers."""

    def __init__(
        self,
        starvation_s: float = 0.1,
        clock: Callable[[], float] = time.monotonic,
        shares: dict[str, QueryShare] | None = None,
        plain_query: str | None = None,
    ) -> None:
        """`plain_query`: the name a plain topology's tasks' busy time and
        latency are counted under, for the child process of a process-isolated
        query (runtime.isolation); their scheduling stays a plain topology's.
        None: only named queries' tasks are counted."""
        self._cond = threading.Condition(threading.Lock())
        self._plain_query = plain_query
        self._policy = SchedulingPolicy(starvation_s)
        self._clock = clock
        self._tasks: dict[str, StreamTask] = {}
        # When each task was last released (or added): the scheduler's aging.
        self._last_served: dict[str, float] = {}
        self._owners: dict[str, str] = {}  # task id -> thread name holding it
        # Key-parallel tasks: task id -> names of the threads holding a share.
        self._sharers: dict[str, list[str]] = {}
        # Key-parallel tasks a query waits for: no new shares meanwhile.
        self._exclusive_waiting: set[str] = set()
        # Processing threads holding a task now (written under the lock, read
        # racily: how many threads compete for the GIL, see `busy_threads`).
        self._busy = 0
        self._failed = ParkedFailures()
        self._paused: set[str] = set()
        self._pause_all = False
        self._lock_all_future: Future[None] | None = None
        # Named queries: task id -> query, busy time per query, paused queries,
        # and when each holder took its task (busy time is charged at release).
        self._query_of: dict[str, str] = {}
        self._ledger = QueryLedger(shares)
        self._paused_queries: set[str] = set()
        self._taken_at: dict[tuple[str, str], float] = {}
        self._latency = QueryLatency()
        # Processing threads waiting in acquire_next, and batches asked to
        # end early for a higher priority (preemption, named queries).
        self._idle = 0
        self.preemptions = 0

    # --- polling thread -------------------------------------------------------

    def add_task(self, task: StreamTask) -> None:
        with self._cond:
            self._tasks[task.id] = task
            self._last_served[task.id] = self._clock()
            query = task.query
            if query is not None:
                self._query_of[task.id] = query
            self._failed.clear(task.id)
            self._cond.notify_all()

    def remove_task(self, task_id: str) -> StreamTask | None:
        """Remove a task; it must not be held (call while all tasks are locked)."""
        with self._cond:
            if task_id in self._owners:
                raise RuntimeError(f"task {task_id} is held by {self._owners[task_id]}")
            if self._sharers.get(task_id):
                raise RuntimeError(f"task {task_id} is held by {self._sharers[task_id]}")
            self._sharers.pop(task_id, None)
            self._failed.clear(task_id)
            self._paused.discard(task_id)
            self._last_served.pop(task_id, None)
            self._query_of.pop(task_id, None)
            return self._tasks.pop(task_id, None)

    def tasks(self) -> list[StreamTask]:
        with self._cond:
            return list(self._tasks.values())

    def get(self, task_id: str) -> StreamTask | None:
        with self._cond:
            return self._tasks.get(task_id)

    def owners(self) -> dict[str, str]:
        """Task id -> the thread holding it (threads sharing one, comma-separated)."""
        with self._cond:
            owners = dict(self._owners)
            for task_id, names in self._sharers.items():
                if names:
                    owners[task_id] = ",".join(names)
            return owners

    def holders(self, task_id: str) -> int:
        """How many threads hold `task_id` now (a key-parallel task: its sharers)."""
        with self._cond:
            return len(self._sharers.get(task_id, ())) or int(task_id in self._owners)

    def idle_threads(self) -> int:
        """Processing threads waiting for work now (read for tests and status)."""
        with self._cond:
            return self._idle

    @property
    def busy_threads(self) -> int:
        """Processing threads holding a task now (a racy read, any thread): a
        key-parallel task tells waits for the GIL from waits on I/O with it."""
        return self._busy

    def wait_for_change(self, timeout: float) -> None:
        """Block until a task is released or work is notified, at most `timeout`
        seconds (the committer's barrier waits with it instead of sleeping)."""
        with self._cond:
            self._cond.wait(timeout)

    def lock_all_tasks(self) -> Future[None]:
        """Stop handing out tasks; the future completes when none is held.

        The caller waits on the future with its own deadline, then must call
        `unlock_all_tasks`.
        """
        with self._cond:
            future: Future[None] = Future()
            self._lock_all_future = future
            if not self._held():
                future.set_result(None)
            return future

    def unlock_all_tasks(self) -> None:
        with self._cond:
            self._lock_all_future = None
            self._cond.notify_all()

    def finish_in_flight(self, timeout: float) -> bool:
        """Before the processing threads stop (a graceful close): key-parallel
        tasks take no more input, and this waits up to `timeout` s until their
        in-flight records completed (failed or paused tasks aside). True when
        none is left. Any thread but a processing thread."""
        with self._cond:
            tasks = [t for t in self._tasks.values() if is_key_parallel(t)]
        if not tasks:
            return True
        for task in tasks:
            task.hold_dispatch()
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                waiting = [
                    t
                    for t in tasks
                    if t.in_flight
                    and t.id in self._tasks
                    and t.id not in self._failed
                    and t.id not in self._paused
                    and self._query_of.get(t.id) not in self._paused_queries
                    and not self._pause_all
                ]
                if not waiting:
                    return True
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    log.warning("in_flight_records_left", tasks=[t.id for t in waiting])
                    return False
                self._cond.wait(min(remaining, _MAX_IDLE_WAIT))

    def notify_work(self) -> None:
        """Wake idle processing threads: new records were routed."""
        with self._cond:
            self._preempt_for_priority()
            self._cond.notify_all()

    def has_work_in_flight(self) -> bool:
        """True while a task is held or a processable task has buffered records.

        The polling thread asks this (once per loop) to decide how long it may
        block waiting for input: output is on its way while this holds.
        """
        with self._cond:
            if self._held():
                return True
            if self._scheduling_stopped():
                return False
            return any(
                task.buffered for task_id, task in self._tasks.items() if self._schedulable(task_id)
            )

    def drain_failures(self) -> list[TaskFailedError]:
        """Failures parked since the last call; the tasks stay unscheduled."""
        with self._cond:
            return self._failed.drain()

    def clear_failure(self, task_id: str) -> None:
        """Make a failed task schedulable again (after the polling thread rewound it)."""
        with self._cond:
            self._failed.clear(task_id)
            self._cond.notify_all()

    def failed_task_ids(self) -> set[str]:
        with self._cond:
            return self._failed.task_ids()

    def pause(self, task_id: str | None = None) -> None:
        """Stop scheduling one task (or all when None) until resumed."""
        with self._cond:
            if task_id is None:
                self._pause_all = True
            else:
                self._paused.add(task_id)

    def is_paused(self, task_id: str) -> bool:
        """Paused alone, with all, or with its named query."""
        with self._cond:
            return (
                self._pause_all
                or task_id in self._paused
                or self._query_of.get(task_id) in self._paused_queries
            )

    def resume(self, task_id: str | None = None) -> None:
        with self._cond:
            if task_id is None:
                self._pause_all = False
                self._paused.clear()
            else:
                self._paused.discard(task_id)
            self._cond.notify_all()

    # --- named queries (any thread) ------------------------------------------------

    def set_query_share(self, query: str, share: QueryShare) -> None:
        """Priority, weight and thread cap of `query` (before or while it runs)."""
        with self._cond:
            self._ledger.set_share(query, share)
            self._cond.notify_all()

    def forget_query(self, query: str) -> None:
        """`query` was removed: drop its figures (its tasks are gone already)."""
        with self._cond:
            self._ledger.forget(query)
            self._paused_queries.discard(query)
            self._latency.forget(query)

    def pause_query(self, query: str) -> None:
        """Hand out none of `query`'s tasks until `resume_query`; the tasks
        stay (input buffers up to their bound, then the partitions pause)."""
        with self._cond:
            self._paused_queries.add(query)

    def resume_query(self, query: str) -> None:
        with self._cond:
            self._paused_queries.discard(query)
            self._preempt_for_priority()
            self._cond.notify_all()

    def paused_queries(self) -> set[str]:
        with self._cond:
            return set(self._paused_queries)

    def query_busy_seconds(self) -> dict[str, float]:
        """Busy time charged to each query so far (threads' seconds)."""
        with self._cond:
            return dict(self._ledger.busy_seconds)

    def query_latency_p99_ms(self) -> dict[str, float]:
        """p99 of each query's recent batch latencies (see `QueryStatus`)."""
        with self._cond:
            recent = self._latency.sorted_samples()
        return QueryLatency.p99(recent)

    def query_of(self, task_id: str) -> str | None:
        with self._cond:
            return self._query_of.get(task_id)

    def below_top_priority(self, task_id: str) -> bool:
        """Whether the task's named query has a lower priority than another
        query's (see `runtime.processing.os_scheduling`). Read without the
        lock: a processing thread asks once per task it takes."""
        query = self._query_of.get(task_id)
        return query is not None and self._ledger.below_top(query)

    # --- interactive queries (any thread but a processing thread) ---------------

    def run_exclusive(self, task_id: str, fn: Callable[[], T], timeout: float) -> T:
        """Run `fn` while holding task `task_id` as a processing thread would.

        Queries go first: they wait for the current batch only, not for the
        scheduler. Raises TimeoutError if the task stays held past `timeout`
        and KeyError if the task is not here (any more).
        """
        holder = f"query-{threading.get_ident()}"
        deadline = time.monotonic() + timeout
        with self._cond:
            try:
                while True:
                    if task_id not in self._tasks:
                        raise KeyError(f"task {task_id} is not processable here")
                    if task_id not in self._owners and not self._sharers.get(task_id):
                        self._owners[task_id] = holder
                        break
                    self._exclusive_waiting.add(task_id)
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise TimeoutError(f"task {task_id} stayed busy for {timeout} s")
                    self._cond.wait(min(remaining, _MAX_IDLE_WAIT))
            finally:
                self._exclusive_waiting.discard(task_id)
        try:
            return fn()
        finally:
            with self._cond:
                self._owners.pop(task_id, None)
                future = self._lock_all_future
                if future is not None and not self._held() and not future.done():
                    future.set_result(None)
                self._cond.notify_all()

    # --- processing threads ---------------------------------------------------

    def acquire_next(
        self, thread_name: str, timeout: float, should_stop: Callable[[], bool]
    ) -> StreamTask | None:
        """Lock and return the next task to process, or None after `timeout`
        (or as soon as `should_stop()` is true when woken)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                if should_stop():
                    return None
                now = time.monotonic()
                clock_now = self._clock()
                task, next_due = self._pick(clock_now)
                if task is not None:
                    if self._plain_query is not None or task.id in self._query_of:
                        self._taken_at[(task.id, thread_name)] = clock_now
                    if is_key_parallel(task):
                        self._sharers.setdefault(task.id, []).append(thread_name)
                    else:
                        self._owners[task.id] = thread_name
                        task.yield_requested = False
                    self._busy += 1
                    return task
                remaining = deadline - now
                if remaining <= 0:
                    return None
                self._idle += 1
                try:
                    self._cond.wait(min(remaining, _MAX_IDLE_WAIT, max(0.0, next_due - now)))
                finally:
                    self._idle -= 1

    def release(self, task: StreamTask, thread_name: str, error: TaskFailedError | None) -> None:
        """Unlock a task after a batch; park `error` if the batch failed.

        The releasing processing thread has handed the batch's output to the
        record collector already.
        """
        with self._cond:
            if self._owners.get(task.id) == thread_name:
                del self._owners[task.id]
                task.yield_requested = False
                self._busy -= 1
            sharers = self._sharers.get(task.id)
            if sharers and thread_name in sharers:
                sharers.remove(thread_name)
                self._busy -= 1
            now = self._clock()
            if task.id in self._tasks:
                self._last_served[task.id] = now
            taken = self._taken_at.pop((task.id, thread_name), None)
            query = self._query_of.get(task.id, self._plain_query)
            if taken is not None and query is not None:
                self._ledger.charge(query, now - taken)
                stamp = task.last_record_timestamp
                if stamp >= 0:
                    self._latency.add(query, time.time() * 1000.0 - stamp)
            if error is not None:
                self._failed.park(task.id, error, thread_name)
            future = self._lock_all_future
            if future is not None and not self._held() and not future.done():
                future.set_result(None)
            self._cond.notify_all()

    def _preempt_for_priority(self) -> None:
        """Ask lower-priority batches to yield to waiting higher-priority work.

        Only named queries of different priorities; a task counts as waiting
        when it has buffered input, is schedulable and free, within its
        query's `max_threads`. Holders are the tasks processing threads hold
        alone. Costs one pass over the tasks; called under the lock by
        `notify_work` (the polling thread, after routing) and `resume_query`.
        """
        if not self._query_of or self._scheduling_stopped():
            return
        ledger = self._ledger
        priority = {q: ledger.share(q).priority for q in set(self._query_of.values())}
        if len(set(priority.values())) < 2:
            return
        room: dict[str, float] = {}
        for q in priority:
            cap = ledger.share(q).max_threads
            room[q] = float("inf") if cap is None else cap
        for task_id, holder_query in self._query_of.items():
            held = len(self._sharers.get(task_id, ())) or int(task_id in self._owners)
            room[holder_query] -= held
        waiting: list[int] = []
        for task_id, task in self._tasks.items():
            query = self._query_of.get(task_id)
            if query is None or room[query] <= 0 or self._sharers.get(task_id):
                continue
            if task.buffered and self._schedulable(task_id):
                room[query] -= 1
                waiting.append(priority[query])
        if not waiting:
            return
        holders = [
            (priority[owner_query], task_id, self._tasks[task_id].yield_requested)
            for task_id, thread in self._taken_at
            if self._owners.get(task_id) == thread
            and task_id in self._tasks
            and (owner_query := self._query_of.get(task_id)) is not None
        ]
        for task_id in preemptions(waiting, holders, self._idle):
            self._tasks[task_id].yield_requested = True
            self.preemptions += 1

    def _held(self) -> bool:
        """Any task held by any thread (call under the lock)."""
        return bool(self._owners) or any(self._sharers.values())

    def _scheduling_stopped(self) -> bool:
        """All tasks locked for a commit, or all paused (call under the lock)."""
        return self._lock_all_future is not None or self._pause_all

    def _schedulable(self, task_id: str) -> bool:
        """Not held (a key-parallel task: below its thread cap, no query
        waiting), not failed, not paused (call under the lock)."""
        if task_id in self._owners or task_id in self._failed or task_id in self._paused:
            return False
        if self._paused_queries and self._query_of.get(task_id) in self._paused_queries:
            return False
        sharers = self._sharers.get(task_id)
        if sharers:
            return (
                len(sharers) < self._tasks[task_id].threads_per_task
                and task_id not in self._exclusive_waiting
            )
        return True

    def _pick(self, now: float) -> tuple[StreamTask | None, float]:
        """Choose under the lock (runtime.processing.scheduler); `now` is the
        scheduler's clock (monotonic unless a test injects one)."""
        if self._scheduling_stopped():
            return None, float("inf")
        holding: dict[str, int] = {}
        if self._query_of:
            for task_id in self._owners:
                q = self._query_of.get(task_id)
                if q is not None:
                    holding[q] = holding.get(q, 0) + 1
            for task_id, names in self._sharers.items():
                q = self._query_of.get(task_id)
                if q is not None and names:
                    holding[q] = holding.get(q, 0) + len(names)
        return self._policy.pick(
            self._tasks, self._query_of, self._ledger, holding, self, self._last_served, now
        )

    # --- Holdings (runtime.processing.scheduler), under the lock ------------------

    def schedulable(self, task_id: str) -> bool:
        return self._schedulable(task_id)

    def shared(self, task_id: str) -> bool:
        return bool(self._sharers.get(task_id))
