"""How paused input buffers refill while named queries of different priorities run.

A CPU-bound query's backlog refills its paused buffers in bursts; a
higher-priority query's record routed behind a burst waits for all of it
(issue 17's latency target). `input_refill` keeps bursts small only while
priorities differ; the simulation checks what the polling thread then does
with a partition that a slow task drains.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime import App, StreamsBuilder, serdes
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.input_queue import InputQueue
from runtime.processing.query_shares import (
    PRIORITY_MAX_POLL_RECORDS,
    PRIORITY_REFILL_RECORDS,
    InputRefill,
    QueryShare,
    input_refill,
)
from runtime.topology.topology import Topology


@given(
    st.integers(1, 100_000),
    st.integers(1, 1_000_000),
    st.booleans(),
    st.lists(st.integers(-3, 3), max_size=5),
)
def test_refill_is_small_only_while_priorities_differ(
    bound: int, max_poll: int, max_poll_set: bool, priorities: list[int]
) -> None:
    refill = input_refill(bound, max_poll, max_poll_set, priorities)
    half = max(1, bound // 2)
    if len(set(priorities)) <= 1:
        assert refill == InputRefill(half, max_poll)
        return
    # Never resumes earlier than the default, never later than 500 free places.
    assert half <= refill.resume_below <= max(half, bound - PRIORITY_REFILL_RECORDS)
    assert refill.resume_below >= min(bound, bound - PRIORITY_REFILL_RECORDS)
    if max_poll_set:
        assert refill.max_poll_records == max_poll
    else:
        assert refill.max_poll_records == min(max_poll, PRIORITY_MAX_POLL_RECORDS)


class _Record:
    def topic(self) -> str:
        return "heavy-in"

    def partition(self) -> int:
        return 0

    def error(self) -> None:
        return None


def _refills(refill: InputRefill, bound: int = 5000, drain_per_step: int = 50) -> list[int]:
    """How much each refill raised the buffer (its level at the pause minus its
    level at the resume), over 200,000 records, for one partition with an
    endless backlog that a task drains slowly."""
    buffers = InputBuffers(bound)
    buffers.resume_below = refill.resume_below
    queue = InputQueue("heavy-in", 0)
    buffers.register(queue)
    offset = 0
    rises: list[int] = []
    level_at_resume: int | None = None
    lowest = bound
    while offset < 200_000:
        if not queue.paused:
            batch = [_Record()] * refill.max_poll_records
            offset += len(batch)
            _, to_pause = buffers.route(batch, lambda m: None)
            if to_pause and level_at_resume is not None:
                rises.append(len(queue.records) - level_at_resume)
        for _ in range(min(drain_per_step, len(queue.records))):
            queue.records.popleft()
        if queue.paused:
            lowest = min(lowest, len(queue.records))
        if buffers.to_resume():
            level_at_resume = len(queue.records)
    assert lowest > 0, "the task ran out of input: the refill came too late"
    return rises


def test_equal_priorities_refill_half_the_buffer_at_a_time() -> None:
    refills = _refills(input_refill(5000, 1000, False, [0, 0]))
    assert refills and min(refills) >= 2500


def test_different_priorities_refill_in_small_batches_and_never_starve_the_task() -> None:
    refill = input_refill(5000, 1000, False, [0, 10])
    assert refill == InputRefill(4500, 200)
    refills = _refills(refill)
    assert refills and max(refills) <= PRIORITY_REFILL_RECORDS + PRIORITY_MAX_POLL_RECORDS


def _copy(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).to(
        sink, key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    return builder.build()


class _PollingSpy:
    def __init__(self) -> None:
        self.priorities: list[list[int]] = []

    def tune_refill(self, priorities: list[int]) -> None:
        self.priorities.append(sorted(priorities))


def test_the_app_retunes_the_refill_as_queries_come_and_go() -> None:
    app = App(
        {"light": _copy("l-in", "l-out"), "heavy": _copy("h-in", "h-out")},
        {
            "application.id": "refill-test",
            "bootstrap.servers": "localhost:1",
            "query.light.priority": 10,
        },
    )
    spy = _PollingSpy()
    app._queries.attach(spy, {}, {})  # type: ignore[arg-type]
    app._queries.apply_priorities()  # start()
    app._named.remove("light")  # remove_query()
    app._queries.apply_priorities()
    app._named.add("light", _copy("l-in", "l-out"), QueryShare(priority=10))  # add_query()
    app._queries.apply_priorities()
    assert spy.priorities == [[0, 10], [0], [0, 10]]
