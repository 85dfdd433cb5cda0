"""Processing threads run a lower-priority named query's task in SCHED_IDLE and
a higher one's in the normal class (runtime.processing.os_scheduling): the
ledger's rule (pure), and a real processing thread over fake tasks, reading
the class the kernel reports for the thread while each task runs."""

from __future__ import annotations

import os
import threading

import pytest

from runtime.app_status import thread_statuses
from runtime.processing.os_scheduling import ThreadSchedClass, idle_class_unavailable
from runtime.processing.query_shares import QueryLedger, QueryShare
from runtime.processing.task_manager import TaskManager
from runtime.processing.threads import ProcessingThreadPool
from tests.fakes.tasks import FakeTask
from tests.kafka_helpers import wait_until


def test_below_top_follows_the_priorities_known_now() -> None:
    ledger = QueryLedger({"light": QueryShare(priority=10), "heavy": QueryShare()})
    assert ledger.below_top("heavy") and not ledger.below_top("light")
    ledger.set_share("heavy", QueryShare(priority=10))
    assert not ledger.below_top("heavy"), "equal priorities: nobody is below"
    ledger.set_share("heavy", QueryShare(priority=-1))
    ledger.forget("light")
    assert not ledger.below_top("heavy"), "alone: nothing above it"
    assert not QueryLedger().below_top("any")


def test_a_plain_topology_task_is_never_below_the_top() -> None:
    manager = TaskManager(shares={"light": QueryShare(priority=10), "heavy": QueryShare()})
    assert not manager.below_top_priority("0_0"), "a task of no named query"


needs_idle_class = pytest.mark.skipif(
    idle_class_unavailable() is not None, reason=str(idle_class_unavailable())
)


@needs_idle_class
def test_the_calling_thread_enters_and_leaves_sched_idle() -> None:
    seen: list[int] = []

    def switch() -> None:
        sched = ThreadSchedClass()
        sched.set_idle(True)
        seen.append(os.sched_getscheduler(0))
        sched.set_idle(False)
        seen.append(os.sched_getscheduler(0))

    thread = threading.Thread(target=switch)
    thread.start()
    thread.join()
    assert seen == [os.SCHED_IDLE, os.SCHED_OTHER]
    assert os.sched_getscheduler(0) == os.SCHED_OTHER, "the test's own thread is untouched"


class ClassRecordingTask(FakeTask):
    """Notes the kernel's scheduling class of the thread processing it."""

    def __init__(self, task_id: str, query: str) -> None:
        super().__init__(task_id)
        self.query = query
        self.classes: list[int] = []

    def process(self, deadline: float) -> int:
        self.classes.append(os.sched_getscheduler(0))
        return super().process(deadline)


@needs_idle_class
@pytest.mark.parametrize("sched_idle", [True, False])
def test_a_processing_thread_runs_the_lower_query_in_sched_idle(sched_idle: bool) -> None:
    heavy = ClassRecordingTask("heavy__0_0", "heavy")
    light = ClassRecordingTask("light__0_0", "light")
    manager = TaskManager(shares={"light": QueryShare(priority=10), "heavy": QueryShare()})
    for task in (heavy, light):
        manager.add_task(task)  # type: ignore[arg-type]
    pool = ProcessingThreadPool("sched", manager, timeslice_ms=5, sched_idle=sched_idle)
    pool.add()
    try:
        for round_ in range(3):  # back and forth: the class follows each task
            heavy.add(round_)
            manager.notify_work()
            wait_until(lambda r=round_: len(heavy.classes) > r, 10, message="heavy not processed")
            # Status shows the class of the latest batch (the thread now waits for work).
            assert thread_statuses(pool.threads())[0].sched_idle is sched_idle
            light.add(round_)
            manager.notify_work()
            wait_until(lambda r=round_: len(light.classes) > r, 10, message="light not processed")
    finally:
        pool.stop_all(5)
    low = os.SCHED_IDLE if sched_idle else os.SCHED_OTHER
    assert set(heavy.classes) == {low}
    assert set(light.classes) == {os.SCHED_OTHER}
