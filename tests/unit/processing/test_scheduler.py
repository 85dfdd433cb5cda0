"""The task manager's scheduling decisions and locks (no threads but the test's)."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest

from runtime.processing.errors import TaskFailedError
from runtime.processing.task_manager import TaskManager
from tests.fakes.tasks import FakeTask


def never() -> bool:
    return False


def manager_with(*tasks: FakeTask) -> TaskManager:
    manager = TaskManager()
    for task in tasks:
        manager.add_task(task)  # type: ignore[arg-type]
    return manager


def test_most_buffered_task_goes_first() -> None:
    a, b, c = FakeTask("0_0"), FakeTask("0_1"), FakeTask("0_2")
    for i in range(3):
        a.add(i)
    for i in range(7):
        b.add(i)
    c.add(0)
    manager = manager_with(a, b, c)
    assert manager.acquire_next("t1", 0.1, never) is b
    assert manager.acquire_next("t2", 0.1, never) is a
    assert manager.acquire_next("t3", 0.1, never) is c


def test_ties_go_to_the_oldest_head_record() -> None:
    a, b = FakeTask("0_0"), FakeTask("0_1")
    a.add(0, timestamp=500)
    b.add(0, timestamp=100)
    manager = manager_with(a, b)
    assert manager.acquire_next("t1", 0.1, never) is b


def test_a_held_task_is_not_handed_out_twice() -> None:
    a = FakeTask("0_0")
    a.add(0)
    manager = manager_with(a)
    assert manager.acquire_next("t1", 0.1, never) is a
    assert manager.acquire_next("t2", 0.05, never) is None
    manager.release(a, "t1", None)  # type: ignore[arg-type]
    # a is empty now only if processed; it still has its record, so t2 gets it
    assert manager.acquire_next("t2", 0.1, never) is a


def test_empty_tasks_are_not_scheduled_and_wait_times_out() -> None:
    manager = manager_with(FakeTask("0_0"))
    started = time.monotonic()
    assert manager.acquire_next("t1", 0.2, never) is None
    assert time.monotonic() - started >= 0.19


def test_waiting_thread_wakes_when_records_arrive() -> None:
    a = FakeTask("0_0")
    manager = manager_with(a)
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(manager.acquire_next("t1", 5.0, never)))
    waiter.start()
    time.sleep(0.05)  # let the waiter block; the assertion below does not depend on it
    a.add(1)
    manager.notify_work()
    waiter.join(2.0)
    assert got == [a]


def test_wall_clock_punctuation_makes_an_empty_task_eligible() -> None:
    a = FakeTask("0_0")
    a.next_wall_punctuation = time.monotonic() - 1
    manager = manager_with(a)
    assert manager.acquire_next("t1", 0.1, never) is a


def test_lock_all_waits_for_holders_and_blocks_scheduling() -> None:
    a, b = FakeTask("0_0"), FakeTask("0_1")
    a.add(0)
    b.add(0)
    manager = manager_with(a, b)
    held = manager.acquire_next("t1", 0.1, never)
    future = manager.lock_all_tasks()
    assert not future.done()
    assert manager.acquire_next("t2", 0.05, never) is None
    manager.release(held, "t1", None)  # type: ignore[arg-type]
    assert future.done()
    manager.unlock_all_tasks()
    assert manager.acquire_next("t2", 0.1, never) is not None


def test_lock_all_with_nothing_held_completes_at_once() -> None:
    manager = manager_with(FakeTask("0_0"))
    assert manager.lock_all_tasks().done()


def test_failed_task_is_parked_and_not_scheduled_again() -> None:
    a = FakeTask("0_0")
    a.add(0)
    a.add(1)
    manager = manager_with(a)
    task = manager.acquire_next("t1", 0.1, never)
    error = TaskFailedError("0_0", "processing", ValueError("boom"))
    manager.release(task, "t1", error)  # type: ignore[arg-type]
    assert manager.acquire_next("t1", 0.05, never) is None
    assert manager.drain_failures() == [error]
    assert manager.drain_failures() == []
    assert manager.failed_task_ids() == {"0_0"}


def test_paused_tasks_are_skipped_until_resumed() -> None:
    a = FakeTask("0_0")
    a.add(0)
    manager = manager_with(a)
    manager.pause("0_0")
    assert manager.acquire_next("t1", 0.05, never) is None
    manager.resume("0_0")
    assert manager.acquire_next("t1", 0.1, never) is a


def test_removing_a_held_task_is_refused() -> None:
    a = FakeTask("0_0")
    a.add(0)
    manager = manager_with(a)
    manager.acquire_next("t1", 0.1, never)
    with pytest.raises(RuntimeError, match="held by t1"):
        manager.remove_task("0_0")


def test_should_stop_returns_none_promptly() -> None:
    manager = manager_with(FakeTask("0_0"))
    assert manager.acquire_next("t1", 5.0, lambda: True) is None


def test_work_in_flight_while_a_task_is_held_or_has_processable_records() -> None:
    a, b = FakeTask("0_0"), FakeTask("0_1")
    manager = manager_with(a, b)
    assert not manager.has_work_in_flight()

    a.add(0)
    assert manager.has_work_in_flight()
    held = manager.acquire_next("t1", 0.1, never)
    assert held is a
    a.records.clear()  # processed, not yet released: output is still coming
    a.timestamps.clear()
    assert manager.has_work_in_flight()
    manager.release(a, "t1", None)  # type: ignore[arg-type]
    assert not manager.has_work_in_flight()

    # Records nobody may process now are not work in flight.
    b.add(0)
    manager.pause("0_1")
    assert not manager.has_work_in_flight()
    manager.resume("0_1")
    assert manager.has_work_in_flight()
    manager.pause()
    assert not manager.has_work_in_flight()


class ManualClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_a_task_with_few_records_is_not_starved_by_a_hot_task() -> None:
    clock = ManualClock()
    manager = TaskManager(starvation_s=0.1, clock=clock)
    hot, cold_a, cold_b = FakeTask("0_0"), FakeTask("0_1"), FakeTask("0_2")
    for i in range(1000):
        hot.add(i)
    cold_a.add(0)
    cold_b.add(0)
    for task in (hot, cold_a, cold_b):
        manager.add_task(task)  # type: ignore[arg-type]

    # Within the time slice, most buffered first.
    assert manager.acquire_next("t1", 0.1, never) is hot
    clock.now += 0.05
    manager.release(hot, "t1", None)  # type: ignore[arg-type]
    assert manager.acquire_next("t1", 0.1, never) is hot
    # The cold tasks have now waited longer than a time slice: they go first,
    # the longest-waiting first, although the hot task has far more records.
    clock.now += 0.2
    manager.release(hot, "t1", None)  # type: ignore[arg-type]
    clock.now += 0.001
    first = manager.acquire_next("t1", 0.1, never)
    assert first in (cold_a, cold_b)
    clock.now += 0.001
    manager.release(first, "t1", None)  # type: ignore[arg-type]
    second = manager.acquire_next("t1", 0.1, never)
    assert {first, second} == {cold_a, cold_b}
    manager.release(second, "t1", None)  # type: ignore[arg-type]
    # Everyone was served recently: back to most buffered first.
    assert manager.acquire_next("t1", 0.1, never) is hot


def test_the_longest_waiting_starving_task_goes_first() -> None:
    clock = ManualClock()
    manager = TaskManager(starvation_s=0.1, clock=clock)
    older, newer, hot = FakeTask("0_0"), FakeTask("0_1"), FakeTask("0_2")
    older.add(0)
    manager.add_task(older)  # type: ignore[arg-type]
    clock.now += 0.05
    newer.add(0)
    newer.add(1)
    manager.add_task(newer)  # type: ignore[arg-type]
    for i in range(50):
        hot.add(i)
    manager.add_task(hot)  # type: ignore[arg-type]
    clock.now += 0.5
    assert manager.acquire_next("t1", 0.1, never) is older
    assert manager.acquire_next("t2", 0.1, never) is newer
    assert manager.acquire_next("t3", 0.1, never) is hot


class FakeSharedTask(FakeTask):
    """A key-parallel task as the scheduler sees it: held shared, and
    `shareable` while its records are not CPU-bound."""

    key_parallel = True
    threads_per_task = 4

    def __init__(self, task_id: str, shareable: bool) -> None:
        super().__init__(task_id)
        self.shareable = shareable


@pytest.mark.parametrize("shareable", [True, False])
def test_a_second_thread_joins_a_held_key_parallel_task_only_while_shareable(
    shareable: bool,
) -> None:
    """Records that wait on I/O: a thread with nothing else to do joins the
    task. CPU-bound records (not shareable): it does not, as the GIL would run
    one of the two threads at a time anyway."""
    task = FakeSharedTask("0_0", shareable)
    for i in range(10):
        task.add(i)
    manager = manager_with(task)
    assert manager.acquire_next("t1", 0.1, never) is task
    joined = manager.acquire_next("t2", 0.05, never)
    assert (joined is task) == shareable
    assert manager.holders("0_0") == (2 if shareable else 1)


def test_busy_threads_counts_exclusive_and_shared_holders() -> None:
    plain, shared = FakeTask("0_0"), FakeSharedTask("0_1", shareable=True)
    plain.add(0)
    for i in range(5):
        shared.add(i)
    manager = manager_with(plain, shared)
    assert manager.busy_threads == 0
    first = manager.acquire_next("t1", 0.1, never)
    second = manager.acquire_next("t2", 0.1, never)
    third = manager.acquire_next("t3", 0.1, never)
    assert {id(first), id(second), id(third)} == {id(plain), id(shared)}
    assert manager.busy_threads == 3
    manager.release(shared, "t9", None)  # type: ignore[arg-type]  # not a holder: no change
    assert manager.busy_threads == 3
    for name, task in (("t1", first), ("t2", second), ("t3", third)):
        manager.release(task, name, None)  # type: ignore[arg-type]
    assert manager.busy_threads == 0
