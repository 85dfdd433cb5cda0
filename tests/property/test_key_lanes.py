"""Key-parallel bookkeeping (runtime.processing.key_lanes) under random interleavings.

A hypothesis state machine plays input arriving, threads joining and leaving,
grabs taken and finished (wholly, partly, with a retry), punctuations, the
exactly-once barrier's dispatch hold and commits, in any order. It checks the
issue's invariants: records of one key complete in offset order and never run
on two threads at once, a committed offset never passes a record not yet
completed, stream time is the largest timestamp of the completed prefix, and
every record completes exactly once when nothing fails.
"""

from __future__ import annotations

from collections import deque

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from runtime.processing.key_lanes import Grab, KeyLanes, RetryPolicy

TOPIC = "in"
KEYS = [b"a", b"b", b"c", b"d", None]  # None: records without a key share a lane


class FakeRecord:
    """A consumed record as the bookkeeping reads it."""

    __slots__ = ("_key", "_offset", "_timestamp")

    def __init__(self, key: bytes | None, offset: int, timestamp: int) -> None:
        self._key, self._offset, self._timestamp = key, offset, timestamp

    def key(self) -> bytes | None:
        return self._key

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

    def topic(self) -> str:
        return TOPIC


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class KeyLanesMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.clock = Clock()
        self.retry = RetryPolicy(attempts=2, backoff_ms=10, max_backoff_ms=40)
        self.lanes = KeyLanes([TOPIC], window=10, threads_per_task=3, clock=self.clock)
        self.queue: deque[FakeRecord] = deque()
        self.next_offset = 0
        self.key_of: dict[int, bytes | None] = {}
        self.timestamp_of: dict[int, int] = {}
        self.completions: dict[int, int] = {}  # offset -> times completed
        self.completed_by_key: dict[bytes | None, list[int]] = {}
        self.threads: dict[str, Grab | None] = {"t1": None, "t2": None, "t3": None}
        self.next_thread = 4
        self.committed = 0  # next offset to read after the last commit
        self.exclusive = False

    # --- input -----------------------------------------------------------------

    @rule(keys=st.lists(st.sampled_from(KEYS), min_size=1, max_size=4), jitter=st.integers(0, 50))
    def records_arrive(self, keys: list[bytes | None], jitter: int) -> None:
        for key in keys:
            offset = self.next_offset
            # Offsets can skip (transaction markers, compaction).
            self.next_offset += 1 + (offset % 3 == 2)
            timestamp = 1000 + offset * 10 - jitter  # not monotonic in offset order
            self.key_of[offset] = key
            self.timestamp_of[offset] = timestamp
            self.queue.append(FakeRecord(key, offset, timestamp))

    def pull(self, limit: int) -> list[FakeRecord]:
        pulled = []
        while self.queue and len(pulled) < limit:
            pulled.append(self.queue.popleft())
        return pulled

    def unpull(self, records: list[FakeRecord]) -> None:
        """A chunk's unfinished records back at the head of the input queue."""
        self.queue.extendleft(reversed(records))

    # --- threads ------------------------------------------------------------------

    @rule()
    def add_thread(self) -> None:
        self.threads[f"t{self.next_thread}"] = None
        self.next_thread += 1

    @precondition(lambda self: any(g is None for g in self.threads.values()))
    @rule(data=st.data())
    def remove_idle_thread(self, data: st.DataObject) -> None:
        idle = sorted(name for name, grab in self.threads.items() if grab is None)
        del self.threads[data.draw(st.sampled_from(idle))]

    @precondition(lambda self: any(g is None for g in self.threads.values()))
    @rule(data=st.data())
    def take(self, data: st.DataObject) -> None:
        idle = sorted(name for name, grab in self.threads.items() if grab is None)
        name = data.draw(st.sampled_from(idle))
        in_flight_before = self.lanes.in_flight
        wanted = self.lanes.exclusive_wanted
        alone = self.lanes.fast and not self.lanes.dispatch_held and not self.lanes.stalled
        others = any(grab is not None for grab in self.threads.values())
        grab = self.lanes.take(self.pull, len(self.queue))
        if wanted:
            assert grab is None, "a grab was taken while a punctuation waited or ran"
        if alone and others:
            assert grab is None, "a second grab beside one on CPU-bound records"
            assert self.lanes.in_flight == in_flight_before, "dispatched beside it"
        if self.lanes.dispatch_held:
            assert self.lanes.in_flight == in_flight_before, "dispatched while held"
        assert self.lanes.in_flight <= self.lanes.window
        if grab is None:
            return
        assert grab.lanes or grab.chunk, "an empty grab"
        event("chunk" if grab.chunk is not None else "lanes")
        if grab.chunk is not None:
            # A chunk: records straight from the input, only when nothing else
            # was in flight; nothing else is taken beside it.
            assert all(other is None for other in self.threads.values())
            offsets = [r.offset() for r in grab.chunk]
            assert offsets == sorted(offsets)
            assert not self.lanes.pending_keys()
            self.threads[name] = grab
            return
        busy = {
            key for other in self.threads.values() if other is not None for key, _ in other.lanes
        }
        for key, records in grab.lanes:
            assert key not in busy, f"key {key!r} taken by two threads"
            assert records, "a lane taken without records"
            offsets = [r.offset() for r in records]
            assert offsets == sorted(offsets)
            assert all(self.key_of[o] == key for o in offsets)
        self.threads[name] = grab

    @precondition(lambda self: any(g is not None for g in self.threads.values()))
    @rule(data=st.data(), leave=st.booleans())
    def finish(self, data: st.DataObject, leave: bool) -> None:
        """A thread completes its grab: each lane wholly, partly (its time slice
        ended), or up to a record that failed and is to be retried."""
        busy = sorted(name for name, grab in self.threads.items() if grab is not None)
        name = data.draw(st.sampled_from(busy))
        grab = self.threads[name]
        assert grab is not None
        done: list[int] = []
        to_retry: list[int] = []
        if grab.chunk is not None:
            count = data.draw(st.integers(0, len(grab.chunk)))
            done.append(count)
            if count < len(grab.chunk) and data.draw(st.booleans()):
                to_retry.append(0)
            for record in grab.chunk[:count]:
                offset = record.offset()
                self.completions[offset] = self.completions.get(offset, 0) + 1
                self.completed_by_key.setdefault(record.key(), []).append(offset)
        for index, (key, records) in enumerate(grab.lanes):
            count = data.draw(st.integers(0, len(records)))
            retry = (
                count < len(records)
                and self.lanes.failures_of(key) < self.retry.attempts
                and data.draw(st.booleans())
            )
            done.append(count)
            if retry:
                to_retry.append(index)
            for record in records[:count]:
                offset = record.offset()
                self.completions[offset] = self.completions.get(offset, 0) + 1
                self.completed_by_key.setdefault(key, []).append(offset)
        give_back = data.draw(st.booleans())
        unpull = self.unpull if give_back else None
        self.lanes.complete(grab, done, self.retry, 0.0, to_retry, None, 1, unpull)
        self.threads[name] = None
        if self.lanes.exclusive_wanted and all(g is None for g in self.threads.values()):
            # The last grab to finish runs the punctuation that waited for it.
            assert self.lanes.begin_exclusive()
            self.lanes.end_exclusive()
        if leave and len(self.threads) > 1:
            del self.threads[name]  # thread removal: after its batch, as the pool does

    @rule(fast=st.booleans())
    def records_get_faster_or_slower(self, fast: bool) -> None:
        """The measured wait per record: below CHUNK_BELOW_S, chunks are taken
        and no second grab runs beside one."""
        cost = self.lanes.cost
        cost.record_s = 1e-6 if fast else 1e-3
        cost.wait_s = cost.alone_wait_s = 0.0 if fast else 1e-3
        cost.cpu_s = 1e-6
        cost.alone_at = self.clock.now

    @rule(seconds=st.sampled_from([0.005, 0.02, 0.1]))
    def time_passes(self, seconds: float) -> None:
        self.clock.now += seconds

    # --- exclusive work, barrier, commit ---------------------------------------------

    @precondition(lambda self: not self.exclusive)
    @rule()
    def punctuation_wanted(self) -> None:
        """A thread finds a punctuation due (again, if one is already waiting)."""
        got = self.lanes.begin_exclusive()
        active = sum(1 for grab in self.threads.values() if grab is not None)
        assert got == (active == 0)
        self.exclusive = got

    @precondition(lambda self: self.exclusive)
    @rule()
    def punctuation_done(self) -> None:
        self.lanes.end_exclusive()
        self.exclusive = False

    @rule(hold=st.booleans())
    def barrier(self, hold: bool) -> None:
        if hold:
            self.lanes.hold_dispatch()
        else:
            self.lanes.resume_dispatch()

    @rule()
    def commit(self) -> None:
        done = self.lanes.done_offsets.get(TOPIC)
        if done is None:
            return
        committed = done + 1
        assert committed >= self.committed, "the committed offset went back"
        for offset in self.key_of:
            if offset < committed:
                assert self.completions.get(offset) == 1, f"commit {committed} passes {offset}"
        self.committed = committed

    # --- invariants ---------------------------------------------------------------------

    @invariant()
    def keys_complete_in_offset_order_once(self) -> None:
        for key, offsets in self.completed_by_key.items():
            assert offsets == sorted(offsets), f"key {key!r} out of order: {offsets}"
            dispatched = sorted(o for o, k in self.key_of.items() if k == key)
            assert offsets == dispatched[: len(offsets)], f"key {key!r} skipped a record"
        assert all(n == 1 for n in self.completions.values())

    @invariant()
    def figures_add_up(self) -> None:
        lanes = self.lanes
        assert lanes.in_flight == lanes.dispatched_total - lanes.completed_total
        assert lanes.completed_total == len(self.completions)
        done = lanes.done_offsets.get(TOPIC, -1)
        prefix = [o for o in self.key_of if o <= done]
        beyond = [o for o in self.completions if o > done]
        assert lanes.completed_beyond == len(beyond)
        assert all(self.completions.get(o) == 1 for o in prefix)
        expected_time = max((self.timestamp_of[o] for o in prefix), default=-1)
        assert lanes.stream_time == expected_time

    def teardown(self) -> None:
        """Nothing fails from here on: everything arrives, and completes once."""
        for name, grab in list(self.threads.items()):
            if grab is not None:
                self.lanes.complete(grab, [], self.retry)
                self.threads[name] = None
        if self.lanes.exclusive_wanted:
            self.lanes.end_exclusive()
        self.lanes.resume_dispatch()
        for _ in range(10_000):
            grab = self.lanes.take(self.pull, len(self.queue))
            if grab is None:
                if not self.queue and self.lanes.in_flight == 0:
                    break
                self.clock.now += 1.0  # retries come due
                continue
            taken = list(grab.lanes)
            if grab.chunk is not None:
                taken = [(r.key(), [r]) for r in grab.chunk]
            for key, records in taken:
                for record in records:
                    offset = record.offset()
                    self.completions[offset] = self.completions.get(offset, 0) + 1
                    self.completed_by_key.setdefault(key, []).append(offset)
            if grab.chunk is not None:
                self.lanes.complete(grab, [len(grab.chunk)], self.retry)
            else:
                self.lanes.complete(grab, [len(r) for _k, r in grab.lanes], self.retry)
        self.keys_complete_in_offset_order_once()
        assert sorted(self.completions) == sorted(self.key_of), "a record never completed"
        if self.key_of:
            assert self.lanes.done_offsets[TOPIC] == max(self.key_of)
        assert self.lanes.in_flight == 0 and self.lanes.completed_beyond == 0


TestKeyLanes = KeyLanesMachine.TestCase
TestKeyLanes.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
