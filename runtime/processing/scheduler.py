"""The scheduling policy: which task a free processing thread takes next.

Pure: it reads the tasks and a view of who holds what (`Holdings`), decides,
and changes nothing; `TaskManager` owns the locks and calls it under its
condition variable. The rules (the task manager's docstring tells why):

1. Named queries first: `QueryLedger.order` ranks the queries with work
   (priority, then least busy time per weight, within `max_threads`).
2. Inside a query (or a plain topology): a task with records that has not
   been served for `starvation_s` goes first, longest-waiting first; else
   the task with the most buffered records, ties to the oldest head record.
3. A task with a wall-clock punctuation due is eligible with no records, last.
4. A key-parallel task other threads hold is joined only when no free task
   has work, and only while its records are not CPU-bound (`shareable`).

Returns the task (or None) and when the next punctuation falls due, so an
idle thread knows how long it may sleep.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Protocol, TypeVar

from runtime.processing.query_shares import QueryLedger


class SchedulableTask(Protocol):
    """What the policy reads of a task (`StreamTask` and `KeyParallelTask` are ones)."""

    @property
    def buffered(self) -> int: ...

    @property
    def next_wall_punctuation(self) -> float: ...

    @property
    def shareable(self) -> bool: ...

    def head_timestamp(self) -> int: ...


T = TypeVar("T", bound=SchedulableTask)


class Holdings(Protocol):
    """Who holds what, as the task manager knows it (read under its lock)."""

    def schedulable(self, task_id: str) -> bool:
        """Not failed, not paused, and free (or a key-parallel task below its cap)."""
        ...

    def shared(self, task_id: str) -> bool:
        """Held by at least one thread as a key-parallel share."""
        ...


class SchedulingPolicy:
    """The rules above; `starvation_s` is the time slice. Pure, no state."""

    def __init__(self, starvation_s: float) -> None:
        self.starvation_s = starvation_s

    def pick(
        self,
        tasks: Mapping[str, T],
        query_of: Mapping[str, str],
        ledger: QueryLedger,
        holding: Mapping[str, int],
        holdings: Holdings,
        last_served: Mapping[str, float],
        now: float,
    ) -> tuple[T | None, float]:
        """The query first (named queries), then the task (rules 1-4).

        `holding`: threads holding each query's tasks now; `now`: the
        scheduler's clock (punctuations are due and tasks age against it).
        """
        if not query_of:
            return self.pick_task(tasks.items(), holdings, last_served, now)
        by_query: dict[str | None, list[tuple[str, T]]] = {}
        for item in tasks.items():
            by_query.setdefault(query_of.get(item[0]), []).append(item)
        with_work = [
            q
            for q, items in by_query.items()
            if q is not None and any(self.has_work(t_id, t, holdings, now) for t_id, t in items)
        ]
        next_due = float("inf")
        for q in [*ledger.order(with_work, holding), None]:
            task, due = self.pick_task(by_query.get(q, ()), holdings, last_served, now)
            if task is not None:
                return task, due
            next_due = min(next_due, due)
        # Queries without work (or at their thread cap) may have punctuations due later.
        for q, items in by_query.items():
            if q is not None and q not in with_work:
                next_due = min(next_due, self.pick_task(items, holdings, last_served, now)[1])
        return None, next_due

    @staticmethod
    def has_work(task_id: str, task: SchedulableTask, holdings: Holdings, now: float) -> bool:
        """Schedulable with records (or a due punctuation)."""
        if not holdings.schedulable(task_id):
            return False
        return task.buffered > 0 or task.next_wall_punctuation <= now

    def pick_task(
        self,
        items: Iterable[tuple[str, T]],
        holdings: Holdings,
        last_served: Mapping[str, float],
        now: float,
    ) -> tuple[T | None, float]:
        """Starving first, then most buffered, then oldest head, among `items`."""
        best: T | None = None
        best_buffered = 0
        best_head = 0
        next_due = float("inf")
        starving: T | None = None
        starving_served = 0.0
        threshold = now - self.starvation_s
        # A key-parallel task other threads hold is joined only when no task
        # is free, and never while its records are CPU-bound: sharing pays
        # where records wait on I/O, and costs where they are CPU-bound.
        shared: T | None = None
        shared_buffered = 0
        for task_id, task in items:
            if not holdings.schedulable(task_id):
                continue
            if holdings.shared(task_id):
                if not task.shareable:
                    continue
                buffered = task.buffered
                if buffered > shared_buffered:
                    shared, shared_buffered = task, buffered
                continue
            buffered = task.buffered
            if buffered == 0:
                due = task.next_wall_punctuation
                if due <= now:
                    buffered = 0  # eligible, lowest priority
                else:
                    next_due = min(next_due, due)
                    continue
            else:
                served = last_served.get(task_id, now)
                if served <= threshold and (starving is None or served < starving_served):
                    starving, starving_served = task, served
            if starving is not None:
                continue  # only starving tasks compete now
            if best is None or buffered > best_buffered:
                best, best_buffered, best_head = task, buffered, -2
            elif buffered == best_buffered:
                if best_head == -2:
                    best_head = best.head_timestamp()
                head = task.head_timestamp()
                if head < best_head:
                    best, best_head = task, head
        if starving is not None:
            return starving, next_due
        if best is None:
            return shared, next_due
        return best, next_due
