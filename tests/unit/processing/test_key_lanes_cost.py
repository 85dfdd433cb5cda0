"""Key lanes on CPU-bound records: the rules that keep key-parallel mode at the
default mode's cost (runtime.processing.key_lanes; no threads, no Kafka).

Under the GIL, N threads on CPU-bound records each see about N times the wall
time per record; records are classified by the time they wait beyond their
CPU time and that contention, so CPU-bound records stay in chunks and keep
other threads off their task at any thread count, while records waiting on
I/O keep their lanes.
"""

from __future__ import annotations

from runtime.processing.key_lanes import CHUNK_TARGET_S, STALL_S, Grab, KeyLanes, RetryPolicy
from tests.fakes.lanes import TOPIC, Queue

RETRY = RetryPolicy()


def run(lanes: KeyLanes, queue: Queue, grab: Grab, wall: float, cpu: float, n: int) -> None:
    """Complete `grab` whole, each record costing `wall` s of wall time and
    `cpu` s of CPU time, with `n` threads competing for the GIL."""
    done = [len(grab.chunk)] if grab.chunk is not None else [len(r) for _k, r in grab.lanes]
    count = sum(done)
    lanes.complete(grab, done, RETRY, wall * count, (), cpu * count, n, queue.unpull)


def measured(lanes: KeyLanes, queue: Queue, grabs: int, wall: float, cpu: float, n: int) -> None:
    """Take and complete `grabs` grabs whole (see `run`)."""
    for _ in range(grabs):
        grab = lanes.take(queue.pull, len(queue.records))
        assert grab is not None
        run(lanes, queue, grab, wall, cpu, n)


def next_chunk(lanes: KeyLanes, queue: Queue, wall: float, cpu: float, n: int) -> Grab:
    """Complete grabs (see `run`) until the next one is a chunk; return it."""
    for _ in range(1000):
        grab = lanes.take(queue.pull, len(queue.records))
        assert grab is not None
        if grab.chunk is not None:
            return grab
        run(lanes, queue, grab, wall, cpu, n)
    raise AssertionError("no chunk")


def test_cpu_bound_records_stay_fast_when_many_threads_contend_for_the_gil() -> None:
    """15 us of CPU per record, 9 busy threads and the polling thread: each
    record takes ~10x its CPU time in wall time, 150 us, over the old 100 us
    wall-time threshold, and is still fast (chunks, no second thread)."""
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8)
    queue = Queue(50_000)
    measured(lanes, queue, 30, wall=10 * 15e-6, cpu=15e-6, n=10)
    assert lanes.fast
    next_chunk(lanes, queue, wall=10 * 15e-6, cpu=15e-6, n=10)
    assert lanes.fast


def test_the_same_wall_time_without_contention_is_waiting_not_computing() -> None:
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8)
    measured(lanes, Queue(50_000), 30, wall=10 * 15e-6, cpu=15e-6, n=2)
    assert not lanes.fast


def test_records_waiting_on_io_stay_slow_with_eight_threads() -> None:
    """io1's records: ~1.1 ms of wall time, ~60 us of CPU, 8 threads busy."""
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8)
    measured(lanes, Queue(50_000), 30, wall=1.1e-3, cpu=60e-6, n=9)
    assert not lanes.fast


def test_no_cpu_time_measured_keeps_the_wall_time_rule() -> None:
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8)
    queue = Queue(50_000)
    for _ in range(30):
        grab = lanes.take(queue.pull, len(queue.records))
        assert grab is not None
        done = [len(grab.chunk)] if grab.chunk is not None else [len(r) for _k, r in grab.lanes]
        lanes.complete(grab, done, RETRY, 150e-6 * sum(done))
    assert not lanes.fast


def test_chunks_are_sized_by_cpu_time_not_by_contended_wall_time() -> None:
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8)
    queue = Queue(50_000)
    measured(lanes, queue, 40, wall=9 * 20e-6, cpu=20e-6, n=9)
    grab = next_chunk(lanes, queue, wall=9 * 20e-6, cpu=20e-6, n=9)
    # ~10 ms of CPU: about 500 records, not the ~55 that 180 us of wall time gives.
    assert len(grab.chunk) >= 0.8 * CHUNK_TARGET_S / 20e-6


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def fast_lanes(clock: Clock | None = None) -> tuple[KeyLanes, Queue, Grab]:
    """Lanes that measured CPU-bound records, and the chunk they hand out next."""
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8, clock=clock or Clock())
    queue = Queue(50_000)
    measured(lanes, queue, 30, wall=15e-6, cpu=15e-6, n=2)
    assert lanes.fast
    return lanes, queue, next_chunk(lanes, queue, wall=15e-6, cpu=15e-6, n=2)


def test_a_second_thread_gets_nothing_beside_a_cpu_bound_chunk() -> None:
    lanes, queue, _first = fast_lanes()
    in_flight = lanes.in_flight
    assert lanes.take(queue.pull, len(queue.records)) is None
    assert lanes.in_flight == in_flight and lanes.lanes == 0


def test_a_second_thread_gets_no_lanes_beside_a_cpu_bound_grab() -> None:
    """Records in lanes (left by a retry) and one grab active: a second thread
    takes nothing and dispatches nothing (it would only add lanes)."""
    lanes, queue, chunk = fast_lanes()
    # The first record fails and is to be retried at once: the rest go into lanes.
    lanes.complete(chunk, [0], RetryPolicy(attempts=3, backoff_ms=0), 1e-6, [0], 1e-6, 2)
    assert lanes.lanes > 1
    first = lanes.take(queue.pull, len(queue.records))
    assert first is not None and first.lanes
    in_flight, undispatched = lanes.in_flight, len(queue.records)
    assert lanes.take(queue.pull, len(queue.records)) is None
    assert lanes.in_flight == in_flight and len(queue.records) == undispatched


def test_slow_records_share_the_task() -> None:
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=8)
    queue = Queue(50_000)
    measured(lanes, queue, 30, wall=1.1e-3, cpu=60e-6, n=9)
    first = lanes.take(queue.pull, len(queue.records))
    second = lanes.take(queue.pull, len(queue.records))
    assert first is not None and first.lanes
    assert second is not None and second.lanes
    assert not {k for k, _ in first.lanes} & {k for k, _ in second.lanes}


def test_a_chunk_cut_short_goes_back_to_the_input_queue() -> None:
    """The time slice ends in a chunk: its unfinished records go back to the
    head of the input queue, in order, not into lanes; the next grab is a
    chunk again, from the first unfinished record."""
    lanes, queue, grab = fast_lanes()
    assert grab.chunk is not None
    first = grab.chunk[0].offset()
    size = len(grab.chunk)
    assert size > 40
    completed = lanes.complete(grab, [40], RETRY, 40e-6, (), 40e-6, 2, queue.unpull)
    assert completed == 40
    assert lanes.in_flight == 0 and lanes.lanes == 0
    assert lanes.done_offsets[TOPIC] == first + 39
    assert [r.offset() for r in list(queue.records)[: size - 40]] == list(
        range(first + 40, first + size)
    )
    again = lanes.take(queue.pull, len(queue.records))
    assert isinstance(again, Grab) and again.chunk is not None
    assert again.chunk[0].offset() == first + 40
    assert lanes.dispatched_total - lanes.completed_total == lanes.in_flight


def test_a_grab_stuck_on_a_slow_record_lets_a_second_thread_take_other_keys() -> None:
    """Fast records, but the active grab has run for longer than STALL_S (a
    surprise slow record): other keys go to another thread again."""
    clock = Clock()
    lanes, queue, chunk = fast_lanes(clock)
    lanes.complete(chunk, [0], RetryPolicy(attempts=3, backoff_ms=0), 1e-6, [0], 1e-6, 2)
    stuck = lanes.take(queue.pull, len(queue.records))
    assert stuck is not None and stuck.lanes
    clock.now += STALL_S / 2
    assert not lanes.stalled
    assert lanes.take(queue.pull, len(queue.records)) is None
    clock.now += STALL_S
    assert lanes.stalled and lanes.fast
    other = lanes.take(queue.pull, len(queue.records))
    assert other is not None and other.lanes
    assert not {k for k, _ in stuck.lanes} & {k for k, _ in other.lanes}
    run(lanes, queue, other, 15e-6, 15e-6, 2)
    assert lanes.stalled  # the stuck grab is still the oldest
    run(lanes, queue, stuck, 15e-6, 15e-6, 2)
    assert not lanes.stalled and lanes.active_grabs == 0
