"""Query priorities and weighted fair shares of processing time (named queries).

The task manager asks `QueryLedger.order` which query a free processing
thread should serve first: the highest `priority` among queries with work
wins outright; among equal priorities, the query with the least busy time per
unit of `weight` (its virtual time) goes first, so busy time (not records)
comes out in proportion to the weights while all of them have work. A query
that had no work and held no thread is lifted to the smallest virtual time of
the queries that stayed active, so an idle spell earns no credit to hog the
threads afterwards (the start-time fair queueing rule). `max_threads` caps how
many threads hold the query's tasks at once.

Inside the chosen query the task manager's own rules (starving first, then
most buffered) pick the task, so the time slice and starvation rules keep
working within a query.

Preemption by priority (`preemptions`): choosing at batch boundaries alone
left a high-priority record waiting for the rest of a lower-priority batch,
up to a time slice (more with CPU-heavy records: the clock is read every 32
records, so 0.5 ms records made 16 ms batches). When a task of a higher
priority gets input and no processing thread is free, the task manager asks
the holder of the lowest-priority task to end its batch after the current
record (`StreamTask.yield_requested`). Equal priorities never preempt each
other, so weights and the starvation rule share those as before.

`QueryLatency` keeps each query's recent batch latencies.

Not thread-safe: called under the task manager's lock only. No clock of its
own: the task manager passes busy time measured on its (injectable) clock.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class QueryShare:
    """How one named query is scheduled (`query.<name>.*` config keys)."""

    priority: int = 0
    weight: float = 1.0
    max_threads: int | None = None


DEFAULT_SHARE = QueryShare()


class QueryLedger:
    """Busy time and virtual time per query. Task manager lock only."""

    def __init__(self, shares: Mapping[str, QueryShare] | None = None) -> None:
        self._shares: dict[str, QueryShare] = dict(shares or {})
        self._top_priority = self._highest()
        self.busy_seconds: dict[str, float] = {}
        self._virtual: dict[str, float] = {}
        self._active: set[str] = set()

    def share(self, query: str) -> QueryShare:
        return self._shares.get(query, DEFAULT_SHARE)

    def set_share(self, query: str, share: QueryShare) -> None:
        self._shares[query] = share
        self._top_priority = self._highest()

    def below_top(self, query: str) -> bool:
        """Whether `query` has a lower priority than another query known now.
        Read without the lock by processing threads (one int comparison)."""
        return self.share(query).priority < self._top_priority

    def _highest(self) -> int:
        return max((s.priority for s in self._shares.values()), default=DEFAULT_SHARE.priority)

    def forget(self, query: str) -> None:
        """A removed query: its figures go."""
        self._shares.pop(query, None)
        self._top_priority = self._highest()
        self.busy_seconds.pop(query, None)
        self._virtual.pop(query, None)
        self._active.discard(query)

    def charge(self, query: str, seconds: float) -> None:
        """`seconds` of one thread's busy time went to `query`."""
        if seconds <= 0:
            return
        self.busy_seconds[query] = self.busy_seconds.get(query, 0.0) + seconds
        self._virtual[query] = self._virtual.get(query, 0.0) + seconds / self.share(query).weight

    def virtual_time(self, query: str) -> float:
        return self._virtual.get(query, 0.0)

    def order(self, with_work: Iterable[str], holding: Mapping[str, int]) -> list[str]:
        """Queries to try, best first: those with work, under their thread cap.

        `holding` counts the threads holding each query's tasks now. Queries
        that just became active (work, or a thread) are lifted first.
        """
        candidates = set(with_work)
        active = candidates | {q for q, n in holding.items() if n > 0}
        staying = self._active & active
        if staying:
            floor = min(self._virtual.get(q, 0.0) for q in staying)
            for q in active - self._active:
                if self._virtual.get(q, 0.0) < floor:
                    self._virtual[q] = floor
        self._active = active
        allowed = []
        for q in candidates:
            cap = self.share(q).max_threads
            if cap is None or holding.get(q, 0) < cap:
                allowed.append(q)
        return sorted(allowed, key=lambda q: (-self.share(q).priority, self.virtual_time(q), q))


def preemptions(
    waiting: Iterable[int], holders: Sequence[tuple[int, str, bool]], idle: int
) -> list[str]:
    """Which held tasks to ask to end their batch now, for higher priorities.

    `waiting`: the priority of each task with input that no thread holds (per
    query at most as many as its `max_threads` still allows); `holders`:
    (priority, task id, already asked) per task a processing thread holds
    alone; `idle`: threads waiting for work. Idle threads and holders already
    asked serve the best waiting tasks first; each waiting task left, best
    first, takes the lowest-priority holder not yet asked, if that one's
    priority is strictly lower. Pure; any thread.
    """
    best_first = sorted(waiting, reverse=True)
    freeing = idle + sum(1 for _, _, asked in holders if asked)
    candidates = sorted((p, task_id) for p, task_id, asked in holders if not asked)
    chosen: list[str] = []
    for wanted, (held, task_id) in zip(best_first[freeing:], candidates, strict=False):
        if held >= wanted:
            break
        chosen.append(task_id)
    return chosen


# The GIL switch interval while named queries of different priorities run
# (`gil.switch.interval.us` 0, the default). See `switch_interval_s`.
PRIORITY_SWITCH_INTERVAL_S = 0.0001


def switch_interval_s(
    configured_us: int, priorities: Iterable[int], python_default_s: float
) -> float:
    """The interpreter's switch interval the app should run with.

    A thread waiting for the GIL that a CPU-bound processing thread holds
    waits up to the switch interval (CPython's 5 ms) before the holder is
    asked to drop it, and the polling thread waits so after every blocking
    client call: a high-priority record paid several such turns on its way
    in and out beside a CPU-bound query. Measured beside a heavy query's
    backlog (one processing thread, Apache Kafka, 2 cores): p99 7-9x of
    running alone at 5 ms; 2.2-2.4x at 0.5 ms; 1.45-1.9x at 0.1 ms (one run
    with a stall: 3.1x); 50 us no better (1.7x). The heavy query's
    throughput did not drop; with two CPU-bound threads handing the GIL to
    each other it rose (0.1 ms: 1,470 records/s each against 1,300 at 0.5
    ms), as the polling thread feeding them waited less. So:
    `configured_us` if above 0; else `PRIORITY_SWITCH_INTERVAL_S` (never
    above `python_default_s`) while queries of different priorities run,
    when latency matters by configuration; else `python_default_s`. Pure;
    any thread.
    """
    if configured_us > 0:
        return configured_us / 1_000_000
    if len(set(priorities)) > 1:
        return min(PRIORITY_SWITCH_INTERVAL_S, python_default_s)
    return python_default_s


# How the polling thread refills paused input buffers while named queries of
# different priorities run. See `input_refill`.
PRIORITY_REFILL_RECORDS = 500
PRIORITY_MAX_POLL_RECORDS = 200


@dataclass(frozen=True)
class InputRefill:
    """When a paused partition resumes and how many records one `consume()` takes."""

    resume_below: int
    max_poll_records: int


def input_refill(
    bound: int, max_poll_records: int, max_poll_records_set: bool, priorities: Iterable[int]
) -> InputRefill:
    """The polling thread's refill rule for the queries running now.

    A full input buffer pauses its partition and resumes once half of it was
    processed (`buffered.records.per.partition` 5000: 2,500 records), so a
    CPU-bound query's backlog comes back in bursts: librdkafka hands over a
    fetch of thousands of records and the polling thread routes them in
    batches of `max.poll.records` (1,000, some 10-20 ms each while a
    processing thread holds the GIL), and a higher-priority query's record
    waits behind all of them. Measured with stage stamps beside a heavy
    backlog (Apache Kafka, 2 cores): once per refill, about every 3 s, the
    light record was routed 40-90 ms after the broker appended it, behind
    3-5 batches of 1,000 heavy records; that one stall decided its p99.

    So while priorities differ: resume once `PRIORITY_REFILL_RECORDS` fit
    (refills are small and frequent, none of them long) and take at most
    `PRIORITY_MAX_POLL_RECORDS` per batch (the light record waits for one
    short batch) unless the user set `max.poll.records`. With equal
    priorities nothing waits for anybody: half the bound, and the user's
    batch, which refetch less. Pure; any thread.
    """
    half = max(1, bound // 2)
    if len(set(priorities)) <= 1:
        return InputRefill(half, max_poll_records)
    batch = (
        max_poll_records
        if max_poll_records_set
        else min(max_poll_records, PRIORITY_MAX_POLL_RECORDS)
    )
    return InputRefill(max(half, bound - PRIORITY_REFILL_RECORDS), batch)


# Latency samples kept per named query (one per batch).
LATENCY_SAMPLES = 2048


class QueryLatency:
    """Per named query: recent batch latencies, ms from the batch's last
    record's timestamp to the batch's end (`QueryStatus.latency_p99_ms`).
    Task manager lock only, like the ledger."""

    def __init__(self) -> None:
        self._samples: dict[str, deque[float]] = {}

    def add(self, query: str, ms: float) -> None:
        samples = self._samples.get(query)
        if samples is None:
            samples = self._samples[query] = deque(maxlen=LATENCY_SAMPLES)
        samples.append(ms)

    def forget(self, query: str) -> None:
        self._samples.pop(query, None)

    def sorted_samples(self) -> dict[str, list[float]]:
        """A copy per query with samples, sorted (taken under the lock; the
        percentile is read outside it, `p99`)."""
        return {q: sorted(samples) for q, samples in self._samples.items() if samples}

    @staticmethod
    def p99(recent: Mapping[str, list[float]]) -> dict[str, float]:
        return {q: s[min(len(s) - 1, int(len(s) * 0.99))] for q, s in recent.items()}
