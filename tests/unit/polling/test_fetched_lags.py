"""FetchedLags: the polling thread's figure for each empty synchronized queue (no broker)."""

from __future__ import annotations

from confluent_kafka import TopicPartition

from runtime.polling.fetched_lags import FetchedLags
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.input_queue import InputQueue


class FakeConsumer:
    def __init__(self) -> None:
        self.positions: dict[tuple[str, int], int] = {}
        self.watermarks: dict[tuple[str, int], tuple[int, int]] = {}
        self.position_calls = 0

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        self.position_calls += 1
        return [
            TopicPartition(
                tp.topic, tp.partition, self.positions.get((tp.topic, tp.partition), -1001)
            )
            for tp in partitions
        ]

    def get_watermark_offsets(self, tp: TopicPartition, cached: bool) -> tuple[int, int]:
        assert cached, "no broker round trip on the polling thread's loop"
        return self.watermarks.get((tp.topic, tp.partition), (-1001, -1001))


def setup(
    committed: dict[tuple[str, int], int] | None = None,
) -> tuple[FakeConsumer, InputBuffers, FetchedLags, InputQueue, InputQueue]:
    consumer = FakeConsumer()
    buffers = InputBuffers(100)
    a, b = InputQueue("a", 0), InputQueue("b", 0)
    a.synced = b.synced = True
    buffers.register(a)
    buffers.register(b)
    buffers.register(InputQueue("plain", 0))  # a one-partition task: never looked at
    known = committed or {}
    lags = FetchedLags(consumer, buffers, known.get)  # type: ignore[arg-type]
    return consumer, buffers, lags, a, b


def test_nothing_to_do_without_synchronized_queues() -> None:
    consumer = FakeConsumer()
    buffers = InputBuffers(100)
    buffers.register(InputQueue("plain", 0))
    assert not FetchedLags(consumer, buffers, lambda key: None).refresh()  # type: ignore[arg-type]
    assert consumer.position_calls == 0


def test_position_and_cached_high_watermark_give_the_records_to_fetch() -> None:
    consumer, _, lags, a, b = setup()
    a.records.append(object())  # type: ignore[arg-type]  # buffered: not looked at
    consumer.positions[("b", 0)] = 7
    consumer.watermarks[("b", 0)] = (0, 10)
    assert not lags.refresh()
    assert b.fetched == (7, 3) and a.fetched is None
    consumer.positions[("b", 0)] = 10
    assert lags.refresh(), "caught up: a waiting task may go on"
    assert b.fetched == (10, 0)
    assert not lags.refresh(), "no news, no wake-up"


def test_unknown_before_the_first_fetch_response_or_the_committed_offset() -> None:
    consumer, _, lags, a, b = setup()
    lags.refresh()
    assert a.fetched is None and b.fetched is None, "no watermark yet"
    consumer.watermarks[("b", 0)] = (0, 4)
    lags.refresh()
    assert b.fetched is None, "nothing consumed, committed offset not learnt yet"


def test_a_partition_not_consumed_yet_starts_at_its_committed_offset_or_the_log_start() -> None:
    consumer, _, lags, a, b = setup({("a", 0): 4, ("b", 0): -1})
    consumer.watermarks[("a", 0)] = (0, 4)
    consumer.watermarks[("b", 0)] = (2, 5)
    lags.refresh()
    assert a.fetched == (4, 0)
    assert b.fetched == (2, 3)


def test_a_drained_partition_without_a_position_is_where_its_last_record_ended() -> None:
    """librdkafka has no position for a partition resumed with a seek until it
    hands a record over; a queue its last record emptied says where that is.
    (The committed offset there made a join task wait forever: found by the
    peers `join` benchmark at 2 threads.)"""
    consumer, _, lags, a, b = setup({("a", 0): -1, ("b", 0): -1})
    consumer.watermarks[("a", 0)] = (0, 50)
    consumer.watermarks[("b", 0)] = (0, 60)
    a.taken_to = 49  # a's last record, offset 49, emptied it
    b.taken_to = 39  # 20 more of b to fetch
    assert lags.refresh(), "a is caught up"
    assert a.fetched == (50, 0)
    assert b.fetched == (40, 20)
