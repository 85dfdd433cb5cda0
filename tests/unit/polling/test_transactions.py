"""A fenced transactional producer is aborted and replaced, never the end of the app
(pure logic, with a fake producer)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from runtime.polling.transactions import TransactionFailed, Transactions, breaks_producer

FENCED = KafkaError(KafkaError._FENCED, "fenced by newer producer instance", fatal=True)


class FakeProducer:
    """Records the transactional calls; `fenced` makes them fail as a fenced one does."""

    made = 0

    def __init__(self) -> None:
        FakeProducer.made += 1
        self.number = FakeProducer.made
        self.calls: list[str] = []
        self.fenced = False

    def _call(self, name: str) -> None:
        self.calls.append(name)
        if self.fenced:
            raise KafkaException(FENCED)

    def init_transactions(self, _timeout: float) -> None:
        self.calls.append("init")

    def begin_transaction(self) -> None:
        self._call("begin")

    def send_offsets_to_transaction(self, *_args: Any) -> None:
        self._call("send_offsets")

    def commit_transaction(self, _timeout: float) -> None:
        self._call("commit")

    def abort_transaction(self, _timeout: float) -> None:
        self._call("abort")

    def flush(self, _timeout: float) -> int:
        return 0


def make() -> tuple[Transactions, list[FakeProducer]]:
    producers: list[FakeProducer] = []

    def new() -> FakeProducer:
        producers.append(FakeProducer())
        return producers[-1]

    return Transactions(new, 1.0), producers  # type: ignore[arg-type]


def test_breaks_producer_names_fenced_and_fatal_errors() -> None:
    assert breaks_producer(FENCED)
    assert breaks_producer(KafkaError(KafkaError._FATAL, "x"))
    assert not breaks_producer(KafkaError(KafkaError._TIMED_OUT, "slow"))


def test_a_noted_fence_stops_producing_and_the_next_commit_aborts_and_replaces() -> None:
    txn, producers = make()
    assert txn.ensure_open()
    producers[0].fenced = True
    txn.note_broken(FENCED)
    assert not txn.ensure_open(), "nothing may be produced on a fenced producer"
    with pytest.raises(TransactionFailed) as failed:
        txn.commit([TopicPartition("in", 0, 5)], object())
    assert failed.value.recreated_producer
    assert len(producers) == 2 and txn.producer is producers[1]
    assert producers[1].calls == ["init"]
    assert txn.broken is None and not txn.open
    assert (txn.committed, txn.aborted) == (0, 1)
    # The new producer works: the rewound work commits.
    txn.commit([TopicPartition("in", 0, 5)], object())
    assert txn.committed == 1
    assert producers[1].calls == ["init", "begin", "send_offsets", "commit"]


def test_a_fenced_begin_is_noted_and_aborted_by_the_polling_thread() -> None:
    txn, producers = make()
    producers[0].fenced = True
    assert not txn.ensure_open()
    assert txn.broken is not None
    failure = txn.abort()  # what PollingThread.recover_broken_producer does
    assert failure.recreated_producer and txn.broken is None
    assert txn.ensure_open() and producers[1].calls == ["init", "begin"]


def test_a_fence_met_in_the_commit_itself_aborts_and_replaces() -> None:
    txn, producers = make()
    assert txn.ensure_open()
    producers[0].fenced = True
    with pytest.raises(TransactionFailed) as failed:
        txn.commit([TopicPartition("in", 0, 1)], object())
    assert failed.value.recreated_producer and txn.producer is producers[1]
