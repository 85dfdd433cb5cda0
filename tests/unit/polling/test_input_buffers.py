"""Routing into bounded input queues, and the pause/resume decisions (rule 5)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.polling.input_buffers import InputBuffers
from runtime.processing.input_queue import InputQueue


class FakeMessage:
    def __init__(self, topic: str, partition: int, offset: int, error: object = None) -> None:
        self._topic, self._partition, self._offset, self._error = topic, partition, offset, error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def error(self) -> object:
        return self._error


def buffers_for(*partitions: int, bound: int = 3) -> tuple[InputBuffers, dict[int, InputQueue]]:
    buffers = InputBuffers(bound)
    queues = {p: InputQueue("t", p) for p in partitions}
    for queue in queues.values():
        buffers.register(queue)
    return buffers, queues


def no_errors(message: object) -> None:
    raise AssertionError(f"unexpected error record {message}")


def test_records_go_to_their_partition_queue_in_order() -> None:
    buffers, queues = buffers_for(0, 1)
    records = [FakeMessage("t", p, o) for o in range(2) for p in (0, 1)]
    routed, to_pause = buffers.route(records, no_errors)
    assert routed == 4
    assert [m.offset() for m in queues[0].records] == [0, 1]
    assert [m.offset() for m in queues[1].records] == [0, 1]
    assert to_pause == []


def test_full_queue_pauses_once_and_resumes_below_the_bound() -> None:
    buffers, queues = buffers_for(0, bound=3)
    routed, to_pause = buffers.route([FakeMessage("t", 0, o) for o in range(3)], no_errors)
    assert to_pause == [("t", 0)]
    assert buffers.any_paused
    # More records of a paused partition (already fetched) do not pause it twice.
    _, to_pause = buffers.route([FakeMessage("t", 0, 3)], no_errors)
    assert to_pause == []
    assert buffers.to_resume() == []  # still at 4 >= 3
    queues[0].records.popleft()
    queues[0].records.popleft()
    assert buffers.to_resume() == []  # 2: below the bound, not yet half empty
    queues[0].records.popleft()
    queues[0].records.popleft()
    assert buffers.to_resume() == [("t", 0)]  # 0 < 3 // 2
    assert not buffers.any_paused


def test_records_of_unassigned_partitions_are_dropped() -> None:
    buffers, queues = buffers_for(0)
    routed, _ = buffers.route([FakeMessage("t", 5, 0), FakeMessage("other", 0, 0)], no_errors)
    assert routed == 0
    assert not queues[0].records


def test_error_records_go_to_the_error_callback() -> None:
    buffers, queues = buffers_for(0)
    errors: list[object] = []
    bad = FakeMessage("t", 0, 0, error="boom")
    routed, _ = buffers.route([bad, FakeMessage("t", 0, 1)], errors.append)
    assert errors == [bad]
    assert routed == 1


def test_unregister_forgets_a_paused_partition() -> None:
    buffers, _ = buffers_for(0, bound=1)
    buffers.route([FakeMessage("t", 0, 0)], no_errors)
    assert buffers.paused() == [("t", 0)]
    buffers.unregister("t", 0)
    assert buffers.paused() == []
    assert ("t", 0) not in buffers


@given(
    st.lists(st.tuples(st.sampled_from(["route", "drain"]), st.integers(0, 2), st.integers(1, 8))),
    st.integers(1, 6),
)
def test_paused_exactly_when_over_the_bound_after_each_step(
    steps: list[tuple[str, int, int]], bound: int
) -> None:
    """After every route/drain step (and the polling thread's resume check), a
    full queue is paused and a paused queue is at least half full; memory is
    bounded by bound + one consume batch."""
    buffers, queues = buffers_for(0, 1, 2, bound=bound)
    offsets = dict.fromkeys(queues, 0)
    for action, partition, count in steps:
        if action == "route":
            batch = []
            for _ in range(count):
                batch.append(FakeMessage("t", partition, offsets[partition]))
                offsets[partition] += 1
            # A paused partition is not fetched: the consumer would return nothing for it.
            if ("t", partition) in buffers.paused():
                batch = []
                offsets[partition] -= count
            buffers.route(batch, no_errors)
        else:
            for _ in range(min(count, len(queues[partition].records))):
                queues[partition].records.popleft()
        buffers.to_resume()
        for p, queue in queues.items():
            paused = ("t", p) in buffers.paused()
            # Full means paused; a paused queue resumes once half empty.
            if len(queue.records) >= bound:
                assert paused
            if paused:
                assert len(queue.records) >= buffers.resume_below
            assert len(queue.records) < bound + 8
