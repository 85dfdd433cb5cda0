"""A fenced transactional producer is aborted and replaced, never the end of the app
(pure logic, with a fake producer)."""

from __future__ import annotations

import threading
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from runtime.collector.output import OutputChannel
from runtime.collector.transactions import (
    TransactionFailed,
    Transactions,
    breaks_producer,
    call_with_deadline,
)
from runtime.kafka.broker_health import Retrying

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


def test_a_commit_stuck_past_its_deadline_abandons_and_replaces_the_producer() -> None:
    """librdkafka#5456: send_offsets_to_transaction can block far past its timeout
    when the group coordinator moved. The runtime gives up on that producer after
    its deadline, never calls it again, and starts over with a new one."""
    release = threading.Event()
    producers: list[FakeProducer] = []

    class StuckProducer(FakeProducer):
        def send_offsets_to_transaction(self, *_args: Any) -> None:
            self.calls.append("send_offsets")
            release.wait(30)

    def new() -> FakeProducer:
        producers.append(StuckProducer() if not producers else FakeProducer())
        return producers[-1]

    transactions = Transactions(new, 0.1, stuck_grace_s=0.2)  # type: ignore[arg-type]
    assert transactions.ensure_open()
    try:
        with pytest.raises(TransactionFailed) as failed:
            transactions.commit([TopicPartition("in", 0, 5)], object())
        # The commit gave up while the stuck call was still stuck (it is
        # released only below): it did not wait for it.
        assert not release.is_set()
        assert failed.value.recreated_producer
        assert "did not return" in str(failed.value)
        stuck, fresh = producers
        assert stuck.calls == ["init", "begin", "send_offsets"], "a stuck producer is not reused"
        assert transactions.producer is fresh and fresh.calls == ["init"]
        # The next transaction runs on the new producer.
        assert transactions.ensure_open()
        transactions.commit([TopicPartition("in", 0, 5)], object())
        assert fresh.calls == ["init", "begin", "send_offsets", "commit"]
    finally:
        release.set()


def test_call_with_deadline_returns_and_raises_like_the_call() -> None:
    call_with_deadline("ok", lambda: None, 1.0)
    with pytest.raises(KafkaException) as raised:
        call_with_deadline("fenced", lambda: (_ for _ in ()).throw(KafkaException(FENCED)), 1.0)
    assert raised.value.args[0].code() == KafkaError._FENCED


def test_a_fatal_error_raised_by_poll_is_a_fence_under_exactly_once() -> None:
    """confluent-kafka raises a fatal producer error from poll()/flush() instead of
    calling error_cb (seen on Kafka: the fence escaped and stopped the app)."""
    channel = OutputChannel.__new__(OutputChannel)
    channel.transactions, _ = make()

    def fenced_poll() -> int:
        raise KafkaException(FENCED)

    assert channel._serve_reports(fenced_poll) == 0
    assert channel.transactions.broken is not None
    assert channel.transactions.broken.code() == KafkaError._FENCED


def test_a_fatal_error_raised_by_poll_stops_at_least_once() -> None:
    channel = OutputChannel.__new__(OutputChannel)
    channel.transactions = None

    def fatal_poll() -> int:
        raise KafkaException(FENCED)

    with pytest.raises(KafkaException):
        channel._serve_reports(fatal_poll)


TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "Timed out", retriable=True)


class ScriptedProducer(FakeProducer):
    """A fake whose calls raise the errors queued for them, in order."""

    def __init__(self, failures: dict[str, list[KafkaError]]) -> None:
        super().__init__()
        self.failures = failures

    def _fail(self, name: str) -> None:
        self.calls.append(name)
        queued = self.failures.get(name)
        if queued:
            raise KafkaException(queued.pop(0))

    def init_transactions(self, _timeout: float) -> None:
        self._fail("init")

    def abort_transaction(self, _timeout: float) -> None:
        self._fail("abort")


def test_init_transactions_timeouts_are_retried_on_the_same_producer() -> None:
    """The coordinator of our transactional.id moving to another node took longer
    than one call's timeout on a three-node cluster: the app failed (CI, test_eos_failover)."""
    producers: list[ScriptedProducer] = []

    def new() -> ScriptedProducer:
        producers.append(ScriptedProducer({"init": [TIMED_OUT, TIMED_OUT]}))
        return producers[-1]

    txn = Transactions(new, 1.0)  # type: ignore[arg-type]
    assert len(producers) == 1 and producers[0].calls == ["init", "init", "init"]
    assert txn.producer is producers[0]


def test_a_fatal_init_error_starts_over_with_a_new_producer() -> None:
    producers: list[ScriptedProducer] = []

    def new() -> ScriptedProducer:
        producers.append(ScriptedProducer({"init": [FENCED] if not producers else []}))
        return producers[-1]

    txn = Transactions(new, 1.0)  # type: ignore[arg-type]
    assert len(producers) == 2 and txn.producer is producers[1]


def test_init_transactions_gives_up_after_its_budget_and_on_other_errors() -> None:
    forever = [TIMED_OUT] * 1000
    with pytest.raises(KafkaException) as raised:
        Transactions(lambda: ScriptedProducer({"init": forever}), 1.0, init_budget_s=0.0)  # type: ignore[arg-type,return-value]
    assert raised.value.args[0].code() == KafkaError._TIMED_OUT
    bad = KafkaError(KafkaError.INVALID_CONFIG, "bad")
    with pytest.raises(KafkaException):
        Transactions(lambda: ScriptedProducer({"init": [bad]}), 1.0)  # type: ignore[arg-type,return-value]


def test_an_abort_that_times_out_is_retried_before_the_producer_is_replaced() -> None:
    producers: list[ScriptedProducer] = []

    def new() -> ScriptedProducer:
        producers.append(ScriptedProducer({"abort": [TIMED_OUT]}))
        return producers[-1]

    txn = Transactions(new, 1.0)  # type: ignore[arg-type]
    assert txn.ensure_open()
    failure = txn.abort(KafkaError(KafkaError._INCONSISTENT, "9 message(s) failed delivery"))
    assert not failure.recreated_producer and len(producers) == 1
    assert producers[0].calls == ["init", "begin", "abort", "abort"]


def test_status_names_the_call_being_retried_while_it_is_and_clears_after() -> None:
    """During a coordinator outage the polling thread's loop stands still in
    these retries: status says which call and since when."""
    retrying = Retrying()
    seen: list[str | None] = []

    class Watched(ScriptedProducer):
        def _fail(self, name: str) -> None:
            seen.append((retrying.now or (None,))[0])
            super()._fail(name)

    producer = Watched({"init": [TIMED_OUT, TIMED_OUT], "abort": [TIMED_OUT]})
    txn = Transactions(lambda: producer, 1.0, retrying=retrying)  # type: ignore[arg-type,return-value]
    # The first try is not a retry; the second and third are.
    assert seen == [None, "init_transactions", "init_transactions"]
    assert retrying.now is None
    seen.clear()
    txn.ensure_open()
    txn.abort(KafkaError(KafkaError._INCONSISTENT, "9 message(s) failed delivery"))
    assert seen == [None, "abort_transaction"]
    assert retrying.now is None
