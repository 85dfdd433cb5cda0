"""`max.task.idle.ms`: a task with several input partitions waits for an empty one.

The rule alone (`PartitionSync`), then a real StreamTask of a merge fed
straight into its input queues (no broker; Kafka is in
tests/integration/test_task_idle.py).
"""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import StreamsBuilder, serdes
from runtime.processing.errors import ErrorPolicy
from runtime.processing.input_queue import InputQueue
from runtime.processing.partition_sync import PartitionSync
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.state.cache_budget import CacheBudget


class Msg:
    """What a consumed confluent_kafka.Message offers the task."""

    def __init__(self, topic: str, offset: int, timestamp: int) -> None:
        self._topic, self._offset, self._timestamp = topic, offset, timestamp

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return f"{self._topic}:{self._offset}".encode()

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, self._timestamp)

    def headers(self) -> None:
        return None


def queue(topic: str, records: int = 0) -> InputQueue:
    q = InputQueue(topic, 0)
    for i in range(records):
        q.records.append(Msg(topic, i, i))  # type: ignore[arg-type]
    return q


# --- the rule -----------------------------------------------------------------


def test_every_queue_buffered_is_ready_without_looking_at_lags() -> None:
    sync = PartitionSync(0)
    assert sync.ready([queue("a", 1), queue("b", 1)], now=0.0)
    assert sync.enforced_total == 0


def test_an_empty_queue_of_unknown_or_positive_lag_is_waited_for() -> None:
    sync = PartitionSync(0)
    a, b = queue("a", 1), queue("b")
    assert not sync.ready([a, b], now=0.0), "lag unknown: wait"
    b.fetched = (0, 3)
    assert not sync.ready([a, b], now=100.0), "records beyond the position: wait, however long"
    b.fetched = (0, 0)
    assert sync.ready([a, b], now=100.0), "known empty, max.task.idle.ms 0: go on"
    assert sync.enforced_total == 1


def test_a_figure_older_than_the_last_record_taken_is_not_trusted() -> None:
    sync = PartitionSync(0)
    a, b = queue("a", 1), queue("b")
    b.fetched = (5, 0)  # computed at position 5
    b.taken_to = 5  # then offset 5 was consumed and taken: the figure is stale
    assert not sync.ready([a, b], now=0.0)
    b.fetched = (6, 0)
    assert sync.ready([a, b], now=0.0)


def test_idle_time_is_waited_from_when_the_partition_was_seen_caught_up() -> None:
    sync = PartitionSync(200)
    a, b = queue("a", 1), queue("b")
    b.fetched = (0, 0)
    assert not sync.ready([a, b], now=10.0)
    assert not sync.ready([a, b], now=10.19)
    assert sync.ready([a, b], now=10.2, count=False)
    assert sync.enforced_total == 0, "the scheduler's look is not counted"
    assert sync.ready([a, b], now=10.3)
    assert sync.enforced_total == 1
    # A record arrives and is taken: the next wait starts afresh.
    message = Msg("b", 0, 0)
    b.emptied_by(message)  # type: ignore[arg-type]
    b.fetched = (1, 0)
    assert not sync.ready([a, b], now=10.4)
    assert sync.ready([a, b], now=10.6)


def test_nothing_buffered_anywhere_is_never_ready() -> None:
    sync = PartitionSync(0)
    a, b = queue("a"), queue("b")
    a.fetched = b.fetched = (0, 0)
    assert not sync.ready([a, b], now=1.0)


# --- a real task ----------------------------------------------------------------


def merge_task(state_dir: Path, idle_ms: int, seen: list[tuple[str, int]]) -> StreamTask:
    builder = StreamsBuilder()
    a = builder.stream("a", key_serde=serdes.BYTES, value_serde=serdes.STRING)
    b = builder.stream("b", key_serde=serdes.BYTES, value_serde=serdes.STRING)

    def note(key: bytes, value: str) -> None:
        topic, offset = value.split(":")
        seen.append((topic, int(offset)))

    a.merge(b).foreach(note)
    task_settings = TaskSettings(
        "sync",
        serdes.BYTES,
        serdes.BYTES,
        ErrorPolicy("log_and_fail", "log_and_fail", None),
        {"a": 1, "b": 1},
        str(state_dir),
        CacheBudget(0),
        max_task_idle_ms=idle_ms,
    )
    return StreamTask(builder.build().subtopologies[0], 0, ["a", "b"], task_settings)


def fill(task: StreamTask, topic: str, timestamps: list[int]) -> dict[int, int]:
    records = task.queues[topic].records
    for offset, ts in enumerate(timestamps):
        records.append(Msg(topic, offset, ts))  # type: ignore[arg-type]
    return dict(enumerate(timestamps))


@settings(max_examples=60, deadline=None)
@given(
    a=st.lists(st.integers(0, 50), min_size=1, max_size=12),
    b=st.lists(st.integers(0, 50), min_size=1, max_size=12),
)
def test_records_are_taken_oldest_head_first_and_only_while_every_queue_holds_one(
    tmp_path_factory: object, a: list[int], b: list[int]
) -> None:
    seen: list[tuple[str, int]] = []
    task = merge_task(tmp_path_factory.mktemp("s"), 0, seen)  # type: ignore[attr-defined]
    try:
        times = {"a": fill(task, "a", a), "b": fill(task, "b", b)}
        task.process(deadline=float("inf"))
        # Replay the rule: take the older head (ties to the first queue) while both hold one.
        expected: list[tuple[str, int]] = []
        heads = {"a": 0, "b": 0}
        while heads["a"] < len(a) and heads["b"] < len(b):
            topic = "a" if times["a"][heads["a"]] <= times["b"][heads["b"]] else "b"
            expected.append((topic, heads[topic]))
            heads[topic] += 1
        assert seen == expected
        assert task.buffered == 0, "waiting for the emptied partition: nothing to schedule"
        assert task.input_buffered == len(a) + len(b) - len(expected)
        # The polling thread learns that the emptied partition holds nothing more.
        emptied = "a" if heads["a"] == len(a) else "b"
        task.queues[emptied].fetched = (heads[emptied], 0)
        assert task.buffered == task.input_buffered
        task.process(deadline=float("inf"))
        assert len(seen) == len(a) + len(b)
        assert task.enforced_processing == len(a) + len(b) - len(expected)
    finally:
        task.close()


def test_minus_one_takes_whatever_is_buffered(tmp_path: Path) -> None:
    seen: list[tuple[str, int]] = []
    task = merge_task(tmp_path, -1, seen)
    try:
        fill(task, "a", [5, 6, 7])
        assert task.buffered == 3
        task.process(deadline=float("inf"))
        assert seen == [("a", 0), ("a", 1), ("a", 2)]
        assert task.enforced_processing == 0
    finally:
        task.close()


def test_a_single_input_partition_never_waits(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    builder.stream("a", key_serde=serdes.BYTES, value_serde=serdes.STRING).foreach(
        lambda k, v: None
    )
    task_settings = TaskSettings(
        "sync",
        serdes.BYTES,
        serdes.BYTES,
        ErrorPolicy("log_and_fail", "log_and_fail", None),
        {"a": 1},
        str(tmp_path),
        CacheBudget(0),
        max_task_idle_ms=10_000,
    )
    task = StreamTask(builder.build().subtopologies[0], 0, ["a"], task_settings)
    try:
        fill(task, "a", [1, 2])
        assert task._sync is None and not task.queues["a"].synced
        assert task.process(deadline=float("inf")) == 2
    finally:
        task.close()
