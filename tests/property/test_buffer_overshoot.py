"""How far `buffered.records.per.partition` can be overshot (issue 21, point 7).

The polling thread pauses a partition after routing the `consume()` batch that
filled its buffer, so one batch can land on top of a buffer just below the bound.
The documented bound: one partition holds at most
`buffered.records.per.partition - 1 + max.poll.records` records. This models the
polling loop around the real `InputBuffers` (batches of up to `max_poll` records
from unpaused partitions, processing draining queues, resumes) and checks that bound,
and that it is reached: the README promises no less and no more.
"""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from runtime.config import KEYS
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.input_queue import InputQueue


class Msg:
    __slots__ = ("_partition",)

    def __init__(self, partition: int) -> None:
        self._partition = partition

    def topic(self) -> str:
        return "t"

    def partition(self) -> int:
        return self._partition

    def error(self) -> None:
        return None


def no_errors(message: object) -> None:
    raise AssertionError(message)


def setup(bound: int, partitions: int) -> tuple[InputBuffers, list[InputQueue]]:
    buffers = InputBuffers(bound)
    queues = [InputQueue("t", p) for p in range(partitions)]
    for queue in queues:
        buffers.register(queue)
    return buffers, queues


@given(
    bound=st.integers(1, 50),
    max_poll=st.integers(1, 60),
    partitions=st.integers(1, 4),
    steps=st.lists(
        st.tuples(
            st.lists(st.integers(0, 3), max_size=60),  # a batch: partition of each record
            st.lists(st.integers(0, 80), min_size=4, max_size=4),  # drained per partition
        ),
        max_size=40,
    ),
)
def test_a_partition_holds_at_most_bound_minus_one_plus_one_batch(
    bound: int, max_poll: int, partitions: int, steps: list[tuple[list[int], list[int]]]
) -> None:
    buffers, queues = setup(bound, partitions)
    paused: set[int] = set()
    for batch, drained in steps:
        # consume(): at most max_poll records, none from a paused partition
        records = [Msg(p) for p in batch if p < partitions and p not in paused][:max_poll]
        _, to_pause = buffers.route(records, no_errors)
        paused |= {p for _, p in to_pause}
        for queue in queues:
            assert len(queue.records) <= bound - 1 + max_poll
        for queue, n in zip(queues, drained, strict=False):  # processing threads
            for _ in range(min(n, len(queue.records))):
                queue.records.popleft()
        paused -= {p for _, p in buffers.to_resume()}


def test_the_bound_is_reached() -> None:
    bound, max_poll = 500, 1000
    buffers, (queue,) = setup(bound, 1)
    buffers.route([Msg(0)] * (bound - 1), no_errors)  # just below: not paused
    assert not buffers.any_paused
    _, to_pause = buffers.route([Msg(0)] * max_poll, no_errors)  # one whole batch lands
    assert to_pause == [("t", 0)]
    assert len(queue.records) == bound - 1 + max_poll == 1499


def test_the_config_doc_states_the_bound() -> None:
    doc = KEYS["buffered.records.per.partition"].doc
    assert "- 1 + `max.poll.records`" in doc and "5,999" in doc
