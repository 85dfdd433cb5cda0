"""Key lanes telling I/O-bound records from CPU-bound ones when many threads
share a task (runtime.processing.key_lanes; no threads, no Kafka).

With k threads on one task, a record that sleeps 1 ms and computes 150 us
cannot be told from a CPU-bound one by its shared grabs once k x 150 us
reaches its wall time: both look like GIL waits. A grab run alone settles
it (a probe); these tests drive rounds of concurrent grabs with a fake clock
and the times each kind of record would really take.
"""

from __future__ import annotations

from runtime.processing.key_lanes import Grab, KeyLanes, RetryPolicy
from runtime.processing.record_cost import PROBE_INTERVAL_S
from tests.fakes.lanes import TOPIC, Queue

RETRY = RetryPolicy()
THREADS = 8


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def records_of(grab: Grab) -> int:
    return len(grab.chunk) if grab.chunk is not None else sum(len(r) for _k, r in grab.lanes)


def rounds(
    lanes: KeyLanes, queue: Queue, clock: Clock, seconds: float, wait: float, cpu: float
) -> list[int]:
    """Rounds of up to THREADS concurrent grabs until `seconds` pass; each
    record costs `cpu` of CPU and `wait` off the GIL. Concurrent grabs queue
    for the GIL (wall = cpu x threads, or more when they wait); a grab alone
    sees the polling thread only. Returns the grabs taken per round."""
    taken: list[int] = []
    end = clock.now + seconds
    while clock.now < end:
        grabs = []
        for _ in range(THREADS):
            grab = lanes.take(queue.pull, len(queue.records))
            if grab is None:
                break
            grabs.append(grab)
        assert grabs, "a round with nothing taken"
        n = len(grabs)
        contenders = n + 1
        longest = 0.0
        for grab in grabs:
            count = records_of(grab)
            per_record = max(cpu + wait, cpu * n)
            wall = per_record * count
            longest = max(longest, wall)
            done = [count] if grab.chunk is not None else [len(r) for _k, r in grab.lanes]
            lanes.complete(grab, done, RETRY, wall, (), cpu * count, contenders, queue.unpull)
        clock.now += longest
        taken.append(n)
    return taken


def test_records_waiting_on_io_keep_eight_threads_once_a_probe_settled_it() -> None:
    """io1's records at 8 threads: 1 ms off the GIL, 150 us of CPU. Shared
    grabs alone would call them CPU-bound (8 x 150 us > 1.15 ms); the probe
    says otherwise, and the task keeps its threads between probes."""
    clock = Clock()
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=THREADS, clock=clock)
    queue = Queue(400_000)
    taken = rounds(lanes, queue, clock, 3.0, wait=1e-3, cpu=150e-6)
    shared = sum(1 for n in taken if n >= THREADS - 1)
    assert shared / len(taken) > 0.9, taken[:50]
    assert not lanes.fast


def test_cpu_bound_records_on_eight_threads_end_up_on_one() -> None:
    """The same task with CPU-bound records (15 us, no wait): the probe
    confirms what the shared grabs say, and one thread takes chunks."""
    clock = Clock()
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=THREADS, clock=clock)
    queue = Queue(400_000)
    taken = rounds(lanes, queue, clock, 1.0, wait=0.0, cpu=15e-6)
    assert lanes.fast
    assert taken[-20:] == [1] * 20
    grab = lanes.take(queue.pull, len(queue.records))
    assert grab is not None and grab.chunk is not None


def test_a_probe_waits_for_the_active_grabs_and_runs_alone() -> None:
    clock = Clock()
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=THREADS, clock=clock)
    queue = Queue(10_000)

    def take() -> Grab | None:
        return lanes.take(queue.pull, len(queue.records))

    def ambiguous(grab: Grab) -> None:
        """Shared: 1.2 ms of wall, 150 us of CPU, 9 contenders: looks CPU-bound."""
        count = records_of(grab)
        lanes.complete(grab, [count], RETRY, 1.2e-3 * count, (), 150e-6 * count, 9)

    still_active = None
    for _ in range(20):
        first, second = take(), take()
        assert first is not None and second is not None
        ambiguous(first)
        if lanes.probe_wanted:
            still_active = second
            break
        ambiguous(second)
    assert still_active is not None, "shared measurements never asked for a probe"
    assert take() is None  # the probe waits for the active grab
    ambiguous(still_active)
    probe = take()
    assert probe is not None
    assert take() is None  # the probe runs alone
    count = records_of(probe)
    # Alone, the records show their wait: 1.15 ms with 150 us of CPU.
    lanes.complete(probe, [count], RETRY, 1.15e-3 * count, (), 150e-6 * count, 2)
    assert not lanes.probe_wanted and not lanes.fast
    assert take() is not None
    assert take() is not None  # shared again


def test_an_old_alone_measurement_is_probed_again() -> None:
    clock = Clock()
    lanes = KeyLanes([TOPIC], window=5000, threads_per_task=THREADS, clock=clock)
    queue = Queue(100_000)
    rounds(lanes, queue, clock, 0.5, wait=1e-3, cpu=150e-6)
    assert not lanes.probe_wanted
    clock.now += PROBE_INTERVAL_S
    # Records turned CPU-bound meanwhile: the next probe finds out.
    taken = rounds(lanes, queue, clock, 0.5, wait=0.0, cpu=15e-6)
    assert lanes.fast
    assert taken[-5:] == [1] * 5
