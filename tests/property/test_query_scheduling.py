"""The scheduler with named queries, on a fake clock (no threads).

One Python thread plays several processing threads: each step either lets a
free virtual thread take a task (`acquire_next` without waiting) or lets a
holding one release its task after a random batch time, advancing the fake
clock. Checked at every step: no task is held by two threads, a query never
has more holders than `max_threads`, and a thread is never handed a task of a
lower priority than a query that had a free task with records. Separately:
with every query backlogged, busy-time shares converge to the weights.
"""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.processing.query_shares import QueryShare
from runtime.processing.task_manager import TaskManager
from tests.fakes.tasks import FakeTask


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class QueryTask(FakeTask):
    """A fake task of a named query with a settable backlog."""

    def __init__(self, task_id: str, query: str) -> None:
        super().__init__(task_id)
        self.query = query
        self.backlog = 0

    @property
    def buffered(self) -> int:
        return self.backlog


def never() -> bool:
    return False


query_specs = st.lists(
    st.tuples(
        st.integers(0, 2),  # priority
        st.integers(1, 4),  # weight
        st.integers(1, 3),  # tasks
        st.none() | st.integers(1, 3),  # max threads
    ),
    min_size=1,
    max_size=4,
)
steps = st.lists(
    st.one_of(
        st.tuples(st.just("turn"), st.integers(0, 3), st.floats(0.001, 0.2)),
        st.tuples(st.just("fill"), st.integers(0, 11), st.integers(1, 50)),
        st.tuples(st.just("drain"), st.integers(0, 11), st.just(0)),
    ),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(query_specs, st.integers(1, 4), steps)
def test_one_holder_per_task_caps_and_priorities_hold(
    specs: list[tuple[int, int, int, int | None]],
    thread_count: int,
    ops: list[tuple[str, int, float]],
) -> None:
    clock = FakeClock()
    shares = {
        f"q{i}": QueryShare(priority=p, weight=w, max_threads=m)
        for i, (p, w, _, m) in enumerate(specs)
    }
    manager = TaskManager(starvation_s=0.1, clock=clock, shares=shares)
    tasks: list[QueryTask] = []
    for i, (_, _, count, _) in enumerate(specs):
        for p in range(count):
            task = QueryTask(f"q{i}__0_{p}", f"q{i}")
            task.backlog = 5
            tasks.append(task)
            manager.add_task(task)  # type: ignore[arg-type]
    held: dict[int, QueryTask] = {}  # virtual thread -> task

    def free_with_records(query: str) -> bool:
        return any(t.query == query and t.backlog > 0 and t not in held.values() for t in tasks)

    for op, index, value in ops:
        if op == "fill":
            tasks[index % len(tasks)].backlog += int(value)
            continue
        if op == "drain":
            tasks[index % len(tasks)].backlog = 0
            continue
        thread = index % thread_count
        name = f"t{thread}"
        if thread in held:
            task = held.pop(thread)
            task.backlog = max(0, task.backlog - 1)
            clock.now += value
            manager.release(task, name, None)  # type: ignore[arg-type]
            continue
        holders = {q: sum(1 for t in held.values() if t.query == q) for q in shares}
        eligible = [
            q
            for q, share in shares.items()
            if free_with_records(q)
            and (share.max_threads is None or holders[q] < share.max_threads)
        ]
        got = manager.acquire_next(name, 0.0, never)
        if got is None:
            assert not eligible, f"{name} got nothing while {eligible} had free work"
            continue
        assert isinstance(got, QueryTask)
        assert got not in held.values(), f"{got.id} handed to a second thread"
        cap = shares[got.query].max_threads
        assert cap is None or holders[got.query] < cap, f"{got.query} above max_threads"
        best = max(shares[q].priority for q in eligible)
        assert shares[got.query].priority == best, (
            f"{got.query} (priority {shares[got.query].priority}) served while a query of "
            f"priority {best} had free work"
        )
        held[thread] = got


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.integers(1, 4), min_size=2, max_size=4),
    st.integers(1, 3),
    st.integers(0, 2**32),
)
def test_busy_time_shares_converge_to_the_weights(
    weights: list[int], thread_count: int, seed: int
) -> None:
    rng = random.Random(seed)  # batch lengths (hypothesis picks the seed)
    clock = FakeClock()
    shares = {f"q{i}": QueryShare(weight=w) for i, w in enumerate(weights)}
    manager = TaskManager(starvation_s=0.1, clock=clock, shares=shares)
    for i in range(len(weights)):
        # As many tasks as threads: parallelism never limits a query's share.
        for p in range(thread_count):
            task = QueryTask(f"q{i}__0_{p}", f"q{i}")
            task.backlog = 10**9
            manager.add_task(task)  # type: ignore[arg-type]
    # Threads run batches of random length; the one whose batch ends first
    # releases and takes the next task (a discrete-event simulation).
    running: dict[str, tuple[float, QueryTask]] = {}
    for t in range(thread_count):
        got = manager.acquire_next(f"t{t}", 0.0, never)
        assert isinstance(got, QueryTask)
        running[f"t{t}"] = (clock.now + rng.uniform(0.02, 0.1), got)
    for _ in range(3000):
        name, (ends, task) = min(running.items(), key=lambda item: item[1][0])
        clock.now = ends
        manager.release(task, name, None)  # type: ignore[arg-type]
        got = manager.acquire_next(name, 0.0, never)
        assert isinstance(got, QueryTask)
        running[name] = (clock.now + rng.uniform(0.02, 0.1), got)
    busy = manager.query_busy_seconds()
    total = sum(busy.values())
    for i, weight in enumerate(weights):
        wanted = weight / sum(weights)
        share = busy[f"q{i}"] / total
        assert abs(share - wanted) <= 0.1 * wanted, (
            f"q{i}: share {share:.3f}, weight says {wanted:.3f} (weights {weights})"
        )
