"""A rewind starts tasks from the group's committed offsets: an answer that is
not one (a timeout, a partition with an error) is asked again, never read as
"nothing committed", which would send the task back to the partition's start
(pure logic, with a scripted fake consumer)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from runtime.kafka.broker_health import Retrying
from runtime.kafka.clients import committed_offsets

TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "Timed out")
NOT_COORDINATOR = KafkaError(KafkaError.NOT_COORDINATOR, "moved", retriable=True)


class ScriptedConsumer:
    """`committed()` plays the answers queued, then the last one forever."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
        self.calls += 1
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, KafkaError):
            raise KafkaException(answer)
        return answer


class Answer:
    """One partition of `committed()`'s answer (TopicPartition.error is read-only)."""

    def __init__(self, offset: int, error: KafkaError | None = None) -> None:
        self.topic, self.partition, self.offset, self.error = "in", 0, offset, error


def test_timeouts_and_retriable_errors_are_asked_again() -> None:
    consumer = ScriptedConsumer(TIMED_OUT, NOT_COORDINATOR, [Answer(42)])
    answer = committed_offsets(consumer, [TopicPartition("in", 0)])  # type: ignore[arg-type]
    assert [tp.offset for tp in answer] == [42] and consumer.calls == 3


def test_a_partition_with_an_error_is_not_read_as_nothing_committed() -> None:
    unstable = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT, "pending transaction")
    consumer = ScriptedConsumer([Answer(-1001, unstable)], [Answer(42)])
    answer = committed_offsets(consumer, [TopicPartition("in", 0)])  # type: ignore[arg-type]
    assert [tp.offset for tp in answer] == [42] and consumer.calls == 2


def test_after_the_budget_the_error_is_raised() -> None:
    unstable = KafkaError(KafkaError.UNSTABLE_OFFSET_COMMIT, "pending transaction")
    for answer in (TIMED_OUT, [Answer(-1001, unstable)]):
        consumer = ScriptedConsumer(answer)
        with pytest.raises(KafkaException):
            committed_offsets(consumer, [TopicPartition("in", 0)], budget_s=0.0)  # type: ignore[arg-type]
        assert consumer.calls == 1


def test_other_errors_are_raised_at_once() -> None:
    denied = KafkaError(KafkaError.GROUP_AUTHORIZATION_FAILED, "no")
    consumer = ScriptedConsumer(denied)
    with pytest.raises(KafkaException):
        committed_offsets(consumer, [TopicPartition("in", 0)])  # type: ignore[arg-type]
    assert consumer.calls == 1


def test_status_names_the_retried_call_while_it_is_retried() -> None:
    retrying = Retrying()
    seen: list[str | None] = []

    class Watched(ScriptedConsumer):
        def committed(self, partitions: list[TopicPartition], timeout: float) -> Any:
            seen.append((retrying.now or (None,))[0])
            return super().committed(partitions, timeout)

    consumer = Watched(TIMED_OUT, [Answer(42)])
    committed_offsets(consumer, [TopicPartition("in", 0)], retrying=retrying)  # type: ignore[arg-type]
    assert seen == [None, "committed_offsets"]
    assert retrying.now is None
