"""Preemption by priority between named queries (issue 17's latency target).

The rule alone (`query_shares.preemptions`, pure), the task manager applying
it to fake tasks (no threads but the test's), and real StreamTasks on a real
processing thread: a lower-priority batch ends within a record or two once a
higher-priority task gets input, where it used to run to its time slice.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import StreamsBuilder, serdes
from runtime.processing.errors import ErrorPolicy
from runtime.processing.query_shares import QueryShare, preemptions
from runtime.processing.task import StreamTask
from runtime.processing.task_manager import TaskManager
from runtime.processing.task_settings import TaskSettings
from runtime.processing.threads import ProcessingThreadPool
from runtime.topology.named_queries import compose
from tests.fakes.tasks import FakeTask
from tests.kafka_helpers import wait_until

# --- the rule ------------------------------------------------------------------


def test_a_higher_priority_waiting_task_preempts_the_lowest_holder() -> None:
    holders = [(5, "mid", False), (0, "low", False)]
    assert preemptions([10], holders, idle=0) == ["low"]
    assert preemptions([10, 10], holders, idle=0) == ["low", "mid"]


def test_no_preemption_with_an_idle_thread_or_an_asked_holder() -> None:
    assert preemptions([10], [(0, "low", False)], idle=1) == []
    assert preemptions([10], [(0, "low", True), (0, "other", False)], idle=0) == []


def test_equal_or_lower_priorities_never_preempt() -> None:
    assert preemptions([3], [(3, "same", False)], idle=0) == []
    assert preemptions([10, 3], [(0, "low", False), (5, "mid", False)], idle=0) == ["low"]
    assert preemptions([], [(0, "low", False)], idle=0) == []


@given(
    st.lists(st.integers(0, 3), max_size=6),
    st.lists(st.tuples(st.integers(0, 3), st.booleans()), max_size=6),
    st.integers(0, 3),
)
def test_preempted_holders_are_strictly_lower_and_no_more_than_needed(
    waiting: list[int], held: list[tuple[int, bool]], idle: int
) -> None:
    holders = [(p, f"t{i}", asked) for i, (p, asked) in enumerate(held)]
    chosen = preemptions(waiting, holders, idle)
    priority = {t: p for p, t, _ in holders}
    asked = sum(1 for _, _, a in holders if a)
    assert len(chosen) == len(set(chosen)) <= max(0, len(waiting) - idle - asked)
    assert all(not a for _, t, a in holders if t in chosen)
    if chosen:
        assert all(priority[t] < max(waiting) for t in chosen)
        # The lowest priorities go first.
        unchosen = [p for p, t, a in holders if not a and t not in chosen]
        assert not unchosen or max(priority[t] for t in chosen) <= min(unchosen)


# --- the task manager, fake tasks ------------------------------------------------


class QueryTask(FakeTask):
    def __init__(self, task_id: str, query: str) -> None:
        super().__init__(task_id)
        self.query = query


def never() -> bool:
    return False


def manager(shares: dict[str, QueryShare], *tasks: FakeTask) -> TaskManager:
    m = TaskManager(shares=shares)
    for task in tasks:
        m.add_task(task)  # type: ignore[arg-type]
    return m


def test_input_for_a_higher_priority_asks_the_running_batch_to_yield() -> None:
    heavy, light = QueryTask("heavy__0_0", "heavy"), QueryTask("light__0_0", "light")
    for i in range(100):
        heavy.add(i)
    m = manager({"light": QueryShare(priority=10)}, heavy, light)
    assert m.acquire_next("t1", 0.1, never) is heavy
    m.notify_work()  # heavy records routed: nothing to preempt for
    assert not heavy.yield_requested
    light.add(0)
    m.notify_work()
    assert heavy.yield_requested and m.preemptions == 1
    m.notify_work()  # asked once
    assert m.preemptions == 1
    m.release(heavy, "t1", None)  # type: ignore[arg-type]
    assert not heavy.yield_requested
    assert m.acquire_next("t1", 0.1, never) is light


@pytest.mark.parametrize(
    "shares",
    [
        {},  # equal priorities: weights share them, no preemption
        {"heavy": QueryShare(priority=10)},  # the holder is the higher one
        {"light": QueryShare(priority=10, max_threads=1)},  # at its cap
    ],
)
def test_no_preemption_for_equal_or_lower_priority_or_a_query_at_its_cap(
    shares: dict[str, QueryShare],
) -> None:
    heavy = QueryTask("heavy__0_0", "heavy")
    light, light2 = QueryTask("light__0_0", "light"), QueryTask("light__0_1", "light")
    heavy.add(0)
    light.add(0)
    m = manager(shares, heavy, light, light2)
    assert m.acquire_next("t1", 0.1, never) is (light if "light" in shares else heavy)
    held = light if "light" in shares else heavy
    other = heavy if held is light else light
    assert m.acquire_next("t2", 0.1, never) is other
    light2.add(0)
    m.notify_work()
    assert not heavy.yield_requested and not light.yield_requested
    assert m.preemptions == 0


def test_a_paused_query_preempts_once_resumed_and_an_idle_thread_prevents_it() -> None:
    heavy, light = QueryTask("heavy__0_0", "heavy"), QueryTask("light__0_0", "light")
    heavy.add(0)
    m = manager({"light": QueryShare(priority=10)}, heavy, light)
    m.pause_query("light")
    assert m.acquire_next("t1", 0.1, never) is heavy
    light.add(0)
    m.notify_work()
    assert not heavy.yield_requested
    # An idle thread would take the light task itself: no preemption.
    got: list[Any] = []
    waiter = threading.Thread(target=lambda: got.append(m.acquire_next("t2", 5.0, never)))
    waiter.start()
    wait_until(lambda: m.idle_threads() == 1, 5)
    m.resume_query("light")
    waiter.join(5)
    assert got == [light] and not heavy.yield_requested
    m.release(light, "t2", None)  # type: ignore[arg-type]
    m.pause_query("light")
    m.resume_query("light")  # no thread idle now: the heavy batch yields
    assert heavy.yield_requested


# --- real tasks on a real processing thread ------------------------------------------


class FakeMessage:
    """What a consumed confluent_kafka.Message offers a task."""

    def __init__(self, value: bytes, offset: int) -> None:
        self._value, self._offset = value, offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, int(time.time() * 1000))

    def headers(self) -> None:
        return None


class Queries:
    """A heavy (1 ms of CPU per record) and a light query, one task each, on
    one processing thread with a 10 s time slice: without preemption a batch
    of the heavy task runs through its whole backlog."""

    def __init__(self, state_dir: Path, shares: dict[str, QueryShare]) -> None:
        self.heavy_done: list[int] = []
        self.light_saw: list[int] = []  # heavy records done when the light one ran

        def heavy_work(value: str) -> str:
            end = time.perf_counter() + 0.001
            while time.perf_counter() < end:
                pass
            self.heavy_done.append(int(value))
            return value

        def light_work(value: str) -> str:
            self.light_saw.append(len(self.heavy_done))
            return value

        topologies = {}
        for name, fn in (("heavy", heavy_work), ("light", light_work)):
            builder = StreamsBuilder()
            stream = builder.stream(
                f"{name}-in", key_serde=serdes.STRING, value_serde=serdes.STRING
            )
            stream.map_values(fn).to(
                f"{name}-out", key_serde=serdes.STRING, value_serde=serdes.STRING
            )
            topologies[name] = builder.build()
        composite = compose(topologies)
        partitions = {t: 1 for t in ("heavy-in", "heavy-out", "light-in", "light-out")}
        settings = TaskSettings(
            "qp", serdes.STRING, serdes.STRING,
            ErrorPolicy("log_and_fail", "log_and_fail", None), partitions, str(state_dir), None,
        )  # fmt: skip
        by_query = {s.query: s for s in composite.subtopologies}
        self.heavy = StreamTask(by_query["heavy"], 0, ["heavy-in"], settings)
        self.light = StreamTask(by_query["light"], 0, ["light-in"], settings)
        self.manager = TaskManager(shares=shares)
        self.pool = ProcessingThreadPool("qp", self.manager, 10_000)

    def start(self, heavy_records: int) -> None:
        queue = self.heavy.queues["heavy-in"].records
        for i in range(heavy_records):
            queue.append(FakeMessage(str(i).encode(), i))  # type: ignore[arg-type]
        self.manager.add_task(self.heavy)
        self.manager.add_task(self.light)
        self.pool.set_count(1)

    def light_record(self) -> int:
        """Route one light record as the polling thread does; how many heavy
        records were done right after (the batch may have yielded already)."""
        self.light.queues["light-in"].records.append(FakeMessage(b"0", 0))  # type: ignore[arg-type]
        self.manager.notify_work()
        return len(self.heavy_done)

    def stop(self) -> None:
        self.pool.stop_all(10)
        self.heavy.close()
        self.light.close()


@pytest.fixture
def queries(tmp_path: Path) -> Iterator[list[Queries]]:
    made: list[Queries] = []
    yield made
    for q in made:
        q.stop()


def test_a_heavy_batch_yields_within_a_record_to_a_higher_priority_record(
    tmp_path: Path, queries: list[Queries]
) -> None:
    q = Queries(tmp_path, {"light": QueryShare(priority=10)})
    queries.append(q)
    q.start(heavy_records=3_000)  # 3 s of CPU in one 10 s batch without preemption
    wait_until(lambda: len(q.heavy_done) >= 20, 10)
    routed_at = q.light_record()
    wait_until(lambda: bool(q.light_saw), 10, message="the light record was never processed")
    # At most the record in progress when the flag was set, where the batch
    # would otherwise have run through all 3,000 (its time slice is 10 s).
    assert q.light_saw[0] - routed_at <= 1, (routed_at, q.light_saw)
    assert q.light_saw[0] < 1_000
    assert q.manager.preemptions == 1
    # The heavy query goes on from where it yielded, in order.
    wait_until(lambda: len(q.heavy_done) >= q.light_saw[0] + 20, 10)
    assert q.heavy_done == list(range(len(q.heavy_done)))


def test_without_a_priority_the_light_record_waits_for_the_heavy_batch(
    tmp_path: Path, queries: list[Queries]
) -> None:
    """The control: equal priorities keep batches whole (the time slice rules)."""
    q = Queries(tmp_path, {})
    queries.append(q)
    q.start(heavy_records=300)
    wait_until(lambda: len(q.heavy_done) >= 20, 10)
    q.light_record()
    wait_until(lambda: bool(q.light_saw), 10, message="the light record was never processed")
    assert q.light_saw[0] == 300
    assert q.manager.preemptions == 0
