"""Invariants of the scheduler under random operations, with real threads.

Random sequences of: records arriving on tasks, tasks added and removed (the
removal locks all tasks first, as the polling thread does), processing threads
added and removed. Afterwards every record has been processed exactly once, in
offset order per task, and no task was ever entered by two threads at once.
"""

from __future__ import annotations

import time

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.processing.task_manager import TaskManager
from runtime.processing.threads import ProcessingThreadPool
from tests.fakes.tasks import FakeTask

TASK_IDS = [f"0_{p}" for p in range(4)]

operations = st.lists(
    st.one_of(
        st.tuples(st.just("records"), st.sampled_from(TASK_IDS), st.integers(1, 30)),
        st.tuples(st.just("add_task"), st.sampled_from(TASK_IDS), st.just(0)),
        st.tuples(st.just("remove_task"), st.sampled_from(TASK_IDS), st.just(0)),
        st.tuples(st.just("add_thread"), st.just(""), st.just(0)),
        st.tuples(st.just("remove_thread"), st.just(""), st.just(0)),
    ),
    max_size=25,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations, st.integers(1, 3))
def test_no_task_shared_and_every_record_processed_once_in_order(
    ops: list[tuple[str, str, int]], initial_threads: int
) -> None:
    manager = TaskManager()
    pool = ProcessingThreadPool("prop", manager, timeslice_ms=1)
    tasks = {task_id: FakeTask(task_id, per_batch=4, work_s=0.0001) for task_id in TASK_IDS}
    live: set[str] = set()
    next_offset = dict.fromkeys(TASK_IDS, 0)
    try:
        for _ in range(initial_threads):
            pool.add()
        for op, task_id, count in ops:
            if op == "records":
                for _ in range(count):
                    tasks[task_id].add(next_offset[task_id])
                    next_offset[task_id] += 1
                manager.notify_work()
            elif op == "add_task" and task_id not in live:
                manager.add_task(tasks[task_id])  # type: ignore[arg-type]
                live.add(task_id)
            elif op == "remove_task" and task_id in live:
                manager.lock_all_tasks().result(timeout=5)
                try:
                    manager.remove_task(task_id)
                finally:
                    manager.unlock_all_tasks()
                live.discard(task_id)
            elif op == "add_thread":
                pool.add()
            elif op == "remove_thread":
                pool.remove(timeout=5)
        # Make sure everything can drain: all tasks live, at least one thread.
        for task_id in TASK_IDS:
            if task_id not in live:
                manager.add_task(tasks[task_id])  # type: ignore[arg-type]
        if not pool.names():
            pool.add()
        manager.notify_work()
        deadline = time.monotonic() + 10
        while any(t.records for t in tasks.values()) or manager.owners():
            assert time.monotonic() < deadline, "records were not drained within 10 s"
            time.sleep(0.002)
    finally:
        pool.stop_all(timeout=5)
    for task_id, task in tasks.items():
        assert task.violations == [], task.violations
        assert task.processed == list(range(next_offset[task_id])), task_id
