"""Key-parallel tasks with real threads, real stores and the real scheduler (no broker).

The records are fed straight into a task's input queue; the processing
thread pool and the task manager run as in the app; output lands in a real
record collector. Kafka itself is in tests/integration/test_key_parallel.py.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime import Processor, PunctuationType, Record, StreamsBuilder, serdes
from runtime.collector.collector import OutputRecord, RecordCollector
from runtime.processing.errors import ErrorPolicy, TaskFailedError
from runtime.processing.key_lanes import KeyParallelSettings, RetryPolicy
from runtime.processing.key_parallel import KeyParallelTask, make_task
from runtime.processing.task import StreamTask
from runtime.processing.task_manager import TaskManager
from runtime.processing.task_settings import TaskSettings
from runtime.processing.threads import ProcessingThreadPool
from runtime.state.cache_budget import CacheBudget
from runtime.topology.topology import Topology
from tests.kafka_helpers import wait_until

APP = "kp"
PARTITIONS = {"in": 1, "out": 1, "counts": 1, "dlq": 1, f"{APP}-counts-changelog": 1}


class FakeMessage:
    """What a consumed confluent_kafka.Message offers the task."""

    __slots__ = ("_key", "_value", "_offset", "_timestamp")

    def __init__(self, key: bytes | None, value: bytes, offset: int, timestamp: int) -> None:
        self._key, self._value, self._offset, self._timestamp = key, value, offset, timestamp

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes:
        return self._value

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

    def headers(self) -> None:
        return None

    def topic(self) -> str:
        return "in"

    def partition(self) -> int:
        return 0


def settings(
    state_dir: Path,
    threads_per_task: int = 8,
    retry: RetryPolicy | None = None,
    processing: str = "log_and_fail",
    window: int = 5000,
) -> TaskSettings:
    return TaskSettings(
        APP,
        serdes.BYTES,
        serdes.BYTES,
        ErrorPolicy(
            "log_and_fail", processing, "dlq" if processing == "dead_letter_queue" else None
        ),
        PARTITIONS,
        str(state_dir),
        CacheBudget(1 << 20),
        key_parallel=KeyParallelSettings(threads_per_task, retry or RetryPolicy(), window),
    )


def seq_and_count(fn: Callable[[Any], Any]) -> Topology:
    """in -> map_values(fn) -> out; in -> count per key -> counts."""
    builder = StreamsBuilder()
    stream = builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.map_values(fn).to("out", key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.group_by_key().count(store="counts").to_stream().to(
        "counts", key_serde=serdes.STRING, value_serde=serdes.INT64
    )
    return builder.build()


def feed(task: StreamTask, count: int, keys: int, start: int = 0) -> None:
    queue = task.queues["in"].records
    for i in range(start, start + count):
        key = None if keys == 0 else f"k{i % keys}".encode()
        queue.append(FakeMessage(key, str(i).encode(), i, 1_000 + i))  # type: ignore[arg-type]


class Running:
    """A task in a task manager with a pool of processing threads."""

    def __init__(self, task: StreamTask, threads: int) -> None:
        self.task = task
        self.manager = TaskManager()
        self.collector = RecordCollector()
        self.manager.add_task(task)
        self.pool = ProcessingThreadPool("kp", self.manager, 100, self.collector)
        self.pool.set_count(threads)
        self.output: dict[tuple[str, int], list[OutputRecord]] = {}

    def drain(self) -> None:
        for key, records in self.collector.take_all().items():
            self.output.setdefault(key, []).extend(records)

    def commit_offsets(self) -> dict[str, int]:
        """What a commit would take now (every task locked, as the committer does)."""
        self.manager.lock_all_tasks().result(10)
        try:
            batch = self.task.prepare_commit()
            self.collector.hand_over(batch.output)
            self.task.post_commit({}, True)
            return batch.offsets
        finally:
            self.manager.unlock_all_tasks()

    def stop(self) -> None:
        self.pool.stop_all(10)
        self.task.close()


@pytest.fixture
def running() -> Iterator[list[Running]]:
    started: list[Running] = []
    yield started
    for run in started:
        run.stop()


def values_by_key(records: list[OutputRecord]) -> dict[bytes | None, list[int]]:
    out: dict[bytes | None, list[int]] = {}
    for record in records:
        out.setdefault(record[2], []).append(int(record[3] or b"-1"))
    return out


def final_counts(records: list[OutputRecord]) -> dict[bytes | None, int]:
    return {r[2]: int.from_bytes(r[3] or b"", "big") for r in records}


def test_default_settings_keep_todays_task(tmp_path: Path) -> None:
    topology = seq_and_count(lambda v: v)
    plain = TaskSettings(
        APP, serdes.BYTES, serdes.BYTES, ErrorPolicy("log_and_fail", "log_and_fail", None),
        PARTITIONS, str(tmp_path), None,
    )  # fmt: skip
    task = make_task(topology.subtopologies[0], 0, ["in"], plain)
    assert type(task) is StreamTask and not task.key_parallel
    task.close()


def test_a_processor_can_opt_its_subtopology_out(tmp_path: Path) -> None:
    class Shared(Processor):
        def process(self, record: Record) -> None:
            pass

    builder = StreamsBuilder()
    builder.stream("in").process(Shared, key_parallel=False)
    builder.stream("other").process(Shared)
    topology = builder.build()
    first = make_task(topology.subtopologies[0], 0, ["in"], settings(tmp_path))
    second = make_task(topology.subtopologies[1], 0, ["other"], settings(tmp_path))
    try:
        assert type(first) is StreamTask
        assert isinstance(second, KeyParallelTask)
    finally:
        first.close()
        second.close()


def test_keys_run_in_parallel_in_order_and_counts_are_true(
    tmp_path: Path, running: list[Running]
) -> None:
    """1,000 keys, ~1 ms per record, 8 threads on one task."""
    inside = 0
    most_inside = 0
    guard = threading.Lock()

    def slow(value: str) -> str:
        nonlocal inside, most_inside
        with guard:
            inside += 1
            most_inside = max(most_inside, inside)
        time.sleep(0.001)
        with guard:
            inside -= 1
        return value

    task = make_task(seq_and_count(slow).subtopologies[0], 0, ["in"], settings(tmp_path))
    assert isinstance(task, KeyParallelTask)
    total, keys = 4000, 1000
    feed(task, total, keys)
    run = Running(task, threads=8)
    running.append(run)
    wait_until(lambda: task.completed_total == total, 60, message="not all processed")
    assert run.commit_offsets() == {"in": total}
    run.drain()
    out = values_by_key(run.output[("out", 0)])
    assert sum(len(v) for v in out.values()) == total
    for key, values in out.items():
        assert values == sorted(values), f"{key!r} out of order"
        assert len(values) == total // keys
    assert final_counts(run.output[("counts", 0)]) == {
        f"k{k}".encode(): total // keys for k in range(keys)
    }
    # Parallel, not serial: several keys' records were in the processor at once
    # (a count, not a time: the speed-up itself is measured in benchmarks/).
    assert most_inside >= 4, f"at most {most_inside} records at once"
    assert task.stream_time == 1_000 + total - 1
    assert task.in_flight == 0 and task.watermark_lag == 0


def test_records_without_a_key_go_one_at_a_time_in_offset_order(
    tmp_path: Path, running: list[Running]
) -> None:
    inside = []
    guard = threading.Lock()
    seen: list[int] = []

    def record(value: str) -> str:
        with guard:
            inside.append(1)
            assert len(inside) == 1, "two records without a key at once"
        seen.append(int(value))
        time.sleep(0.0005)
        with guard:
            inside.pop()
        return value

    builder = StreamsBuilder()
    builder.stream("in", value_serde=serdes.STRING).map_values(record).to(
        "out", value_serde=serdes.STRING
    )
    task = make_task(builder.build().subtopologies[0], 0, ["in"], settings(tmp_path))
    feed(task, 300, keys=0)
    running.append(Running(task, threads=4))
    wait_until(lambda: task.completed_total == 300, 30, message="not all processed")
    assert seen == list(range(300))


def test_the_watermark_stops_at_a_slow_record_while_later_keys_complete(
    tmp_path: Path, running: list[Running]
) -> None:
    release = threading.Event()

    def hold_key_zero(value: str) -> str:
        if value == "0":
            release.wait(30)
        return value

    task = make_task(seq_and_count(hold_key_zero).subtopologies[0], 0, ["in"], settings(tmp_path))
    assert isinstance(task, KeyParallelTask)
    feed(task, 200, keys=10)
    run = Running(task, threads=4)
    running.append(run)
    # Everything but key k0 (offsets 0, 10, 20, ...) completes.
    wait_until(lambda: task.completed_total == 180, 30, message="other keys stalled")
    assert task.watermark_lag == 180  # offsets 1..9, 11..19, ...: all above offset 0
    assert task.in_flight == 20
    assert task.processed_offsets.get("in") is None  # nothing committable yet
    release.set()
    wait_until(lambda: task.completed_total == 200, 30, message="k0 never finished")
    assert task.processed_offsets["in"] == 199 and task.watermark_lag == 0


def test_commit_takes_the_watermark_and_does_not_wait_for_a_key_backing_off(
    tmp_path: Path, running: list[Running]
) -> None:
    failed_once: set[str] = set()

    def fails_once_on_fifty(value: str) -> str:
        if value == "50" and value not in failed_once:
            failed_once.add(value)
            raise RuntimeError("try again later")
        return value

    retry = RetryPolicy(attempts=1, backoff_ms=1500, max_backoff_ms=1500)
    task = make_task(
        seq_and_count(fails_once_on_fifty).subtopologies[0],
        0,
        ["in"],
        settings(tmp_path, 4, retry),
    )
    assert isinstance(task, KeyParallelTask)
    feed(task, 50, keys=10)
    run = Running(task, threads=4)
    running.append(run)
    wait_until(lambda: task.completed_total == 50, 30, message="stalled")
    feed(task, 150, keys=10, start=50)
    # All but key k0's records from offset 50 on (50, 60, ..., 190) complete.
    wait_until(lambda: task.completed_total == 185, 30, message="stalled")
    assert task.backing_off and task.in_flight == 15
    # The commit does not wait for the key in backoff and takes offset 50:
    # the first record not completed.
    # Had it waited for the key in backoff, it would take 200: 50 says it did not.
    assert run.commit_offsets() == {"in": 50}
    wait_until(lambda: task.completed_total == 200, 30, message="stalled after the retry")
    assert run.commit_offsets() == {"in": 200}


def test_a_failing_key_is_retried_while_other_keys_flow(
    tmp_path: Path, running: list[Running]
) -> None:
    attempts: dict[str, int] = {}
    order: list[str] = []

    def flaky(value: str) -> str:
        if value == "0":
            attempts[value] = attempts.get(value, 0) + 1
            if attempts[value] < 3:
                raise RuntimeError("not yet")
        order.append(value)
        return value

    retry = RetryPolicy(attempts=3, backoff_ms=50, max_backoff_ms=100)
    task = make_task(seq_and_count(flaky).subtopologies[0], 0, ["in"], settings(tmp_path, 4, retry))
    assert isinstance(task, KeyParallelTask)
    feed(task, 100, keys=10)
    run = Running(task, threads=2)
    running.append(run)
    wait_until(lambda: task.completed_total == 100, 30, message="not all processed")
    assert attempts["0"] == 3
    assert task.retried_count == 2
    # Other keys did not wait for the retries; key k0's records kept their order.
    assert order.index("0") > order.index("1")
    k0 = [int(v) for v in order if int(v) % 10 == 0]
    assert k0 == sorted(k0) == list(range(0, 100, 10))
    run.commit_offsets()
    run.drain()
    counts = final_counts(run.output[("counts", 0)])
    # The failed attempts raised before the count: it counts each record once.
    assert counts == {f"k{k}".encode(): 10 for k in range(10)}
    assert [int(r[3] or b"") for r in run.output[("out", 0)]].count(0) == 1


def test_exhausted_retries_go_to_the_handler(tmp_path: Path, running: list[Running]) -> None:
    def always_fails_on_seven(value: str) -> str:
        if value == "7":
            raise ValueError("bad record")
        return value

    retry = RetryPolicy(attempts=2, backoff_ms=1, max_backoff_ms=1)
    task = make_task(
        seq_and_count(always_fails_on_seven).subtopologies[0],
        0,
        ["in"],
        settings(tmp_path, 4, retry, processing="dead_letter_queue"),
    )
    feed(task, 50, keys=5)
    run = Running(task, threads=2)
    running.append(run)
    wait_until(lambda: task.completed_total == 50, 30, message="not all processed")
    assert task.skipped_count == 1 and task.dead_lettered_count == 1
    run.drain()
    dead = run.output[("dlq", 0)]
    assert [(r[3], r[8]) for r in dead] == [(b"7", 7)]
    assert task.processed_offsets["in"] == 49


def test_log_and_fail_parks_the_failure_and_the_watermark_stays_below_it(
    tmp_path: Path, running: list[Running]
) -> None:
    def fails_on_twenty(value: str) -> str:
        if value == "20":
            raise ValueError("bad record")
        return value

    task = make_task(seq_and_count(fails_on_twenty).subtopologies[0], 0, ["in"], settings(tmp_path))
    assert isinstance(task, KeyParallelTask)
    feed(task, 100, keys=10)
    run = Running(task, threads=4)
    running.append(run)
    wait_until(lambda: run.manager.failed_task_ids() == {task.id}, 30, message="no failure")
    failures = run.manager.drain_failures()
    assert len(failures) == 1 and isinstance(failures[0], TaskFailedError)
    wait_until(lambda: run.manager.holders(task.id) == 0, 10, message="still held")
    assert task.failed
    committable = task.processed_offsets.get("in", -1) + 1
    assert committable <= 20


def test_stream_time_punctuation_runs_with_the_task_alone(
    tmp_path: Path, running: list[Running]
) -> None:
    inside = 0
    overlaps: list[str] = []
    fired: list[int] = []
    guard = threading.Lock()

    class Ticking(Processor):
        def init(self, context: Any) -> None:
            self.context = context
            context.schedule(100, PunctuationType.STREAM_TIME, self.punctuate)

        def process(self, record: Record) -> None:
            nonlocal inside
            with guard:
                inside += 1
            time.sleep(0.0002)
            with guard:
                inside -= 1

        def punctuate(self, timestamp: int) -> None:
            with guard:
                if inside:
                    overlaps.append(f"{inside} records in process at {timestamp}")
            fired.append(timestamp)
            time.sleep(0.002)

    builder = StreamsBuilder()
    builder.stream("in").process(Ticking)
    task = make_task(builder.build().subtopologies[0], 0, ["in"], settings(tmp_path, 4))
    feed(task, 1000, keys=50)
    running.append(Running(task, threads=4))
    wait_until(lambda: task.completed_total == 1000, 30, message="not all processed")
    wait_until(lambda: task.stream_time == 1_999, 10, message="stream time behind")
    assert not overlaps, overlaps[:3]
    assert fired and fired == sorted(fired)
    assert all(1_000 <= t <= 1_999 for t in fired)


def test_threads_join_and_leave_a_running_task(tmp_path: Path, running: list[Running]) -> None:
    def slow(value: str) -> str:
        time.sleep(0.0005)
        return value

    task = make_task(seq_and_count(slow).subtopologies[0], 0, ["in"], settings(tmp_path))
    feed(task, 3000, keys=300)
    run = Running(task, threads=1)
    running.append(run)
    for count in (4, 2, 6, 1, 3):
        run.pool.set_count(count, timeout=10)
        time.sleep(0.05)  # let the pool run at this size; nothing below depends on it
    wait_until(lambda: task.completed_total == 3000, 60, message="not all processed")
    run.drain()
    out = values_by_key(run.output[("out", 0)])
    assert sum(len(v) for v in out.values()) == 3000
    assert all(v == sorted(v) for v in out.values())


def test_a_query_and_a_commit_wait_for_every_sharer(tmp_path: Path) -> None:
    task = make_task(seq_and_count(lambda v: v).subtopologies[0], 0, ["in"], settings(tmp_path, 3))
    feed(task, 10, keys=5)
    manager = TaskManager()
    manager.add_task(task)
    try:
        assert manager.acquire_next("t1", 0.1, lambda: False) is task
        assert manager.acquire_next("t2", 0.1, lambda: False) is task
        assert manager.holders(task.id) == 2
        assert manager.owners()[task.id] == "t1,t2"
        future = manager.lock_all_tasks()
        assert not future.done()
        manager.release(task, "t1", None)
        assert not future.done()
        manager.release(task, "t2", None)
        assert future.done()
        manager.unlock_all_tasks()
        with pytest.raises(TimeoutError):
            assert manager.acquire_next("t1", 0.1, lambda: False) is task
            manager.run_exclusive(task.id, lambda: None, timeout=0.1)
        manager.release(task, "t1", None)
        assert manager.run_exclusive(task.id, lambda: "alone", timeout=1) == "alone"
    finally:
        task.close()


def test_a_cache_eviction_of_another_key_keeps_that_keys_output_in_order(
    tmp_path: Path, running: list[Running]
) -> None:
    """A tiny cache evicts (and emits) keys other threads are updating: every
    key's emitted counts still reach the collector in increasing order."""
    kp = settings(tmp_path, 4)
    kp.cache_budget = CacheBudget(2_000)  # a few entries: constant evictions
    task = make_task(seq_and_count(lambda v: v).subtopologies[0], 0, ["in"], kp)
    feed(task, 5000, keys=200)
    run = Running(task, threads=4)
    running.append(run)
    wait_until(lambda: task.completed_total == 5000, 60, message="not all processed")
    run.commit_offsets()
    run.drain()
    by_key: dict[bytes | None, list[int]] = {}
    for record in run.output[("counts", 0)]:
        by_key.setdefault(record[2], []).append(int.from_bytes(record[3] or b"", "big"))
    assert len(by_key) == 200
    for key, counts in by_key.items():
        assert counts == sorted(counts), f"{key!r}: {counts}"
        assert counts[-1] == 25


def test_status_rows_and_the_tasks_table_show_key_parallel_figures() -> None:
    from runtime.admin.client import format_tasks
    from runtime.status import AppStatus, TaskStatus

    shared = TaskStatus(
        "0_0", "RUNNING", "t-1,t-2", ("in-0",), buffered=3, processed=10, skipped=0,
        dead_lettered=0, key_parallel=True, threads_per_task=8, in_flight=40,
        watermark_lag=12, parallelism=5.25, retried=2,
    )  # fmt: skip
    plain = TaskStatus("1_0", "RUNNING", None, ("other-0",), 0, 1, 0, 0)
    status = AppStatus("a", "c", "i", "RUNNING", None, "at_least_once", None, (), (shared, plain))
    again = AppStatus.from_dict(status.to_dict())
    assert again.tasks == status.tasks
    lines = format_tasks(status.to_dict()["tasks"]).splitlines()
    assert lines[0].split() == [
        "TASK", "STATE", "OWNER", "BUFFERED", "LAG", "PROCESSED", "IN_FLIGHT", "WM_LAG",
        "PARALLEL", "PARTITIONS",
    ]  # fmt: skip
    assert lines[1].split()[6:] == ["40", "12", "5.2/8", "in-0"]
    assert lines[2].split()[6:] == ["-", "-", "-", "other-0"]
    # Without key-parallel tasks the table is unchanged.
    assert "IN_FLIGHT" not in format_tasks([status.to_dict()["tasks"][1]])
