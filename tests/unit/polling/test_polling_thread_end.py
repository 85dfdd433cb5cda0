"""The polling thread records whatever ends its loop, a raw KafkaError too
(confluent-kafka can leave one raised that no `except` clause with a class
matches: seen in CI, the thread then ended without its failure and the app
went NOT_RUNNING instead of ERROR)."""

from __future__ import annotations

import threading
import types
from typing import Any

from confluent_kafka import KafkaError, KafkaException

from runtime.kafka.error_chain import kafka_error_in
from runtime.polling.polling_thread import PollingThread
from tests.unit.kafka.test_error_chain import raise_raw_kafka_error


class _Startup:
    def subscribed(self) -> None:
        pass


class _QueryChanges:
    def fail_pending(self, error: BaseException) -> None:
        pass


def _loop_that_fails(failure: Any) -> Any:
    """Just enough of a PollingThread for `run`: its loop turn raises."""
    fake = types.SimpleNamespace(
        assignment_strategy="cooperative-sticky",
        startup=_Startup(),
        query_changes=_QueryChanges(),
        _stop_event=threading.Event(),
        _abort=False,
        fatal_error=None,
        runtime=None,
        closed=[],
    )
    fake.subscribe = lambda: None
    fake.poll_once = failure
    fake._close_clients = lambda: fake.closed.append(True)
    return fake


def test_a_raw_kafka_error_ending_the_loop_is_recorded() -> None:
    def turn() -> None:
        raise_raw_kafka_error(KafkaError(KafkaError._GAPLESS_GUARANTEE, fatal=True))

    fake = _loop_that_fails(turn)
    PollingThread.run(fake)  # returns: nothing escapes to the thread's excepthook
    assert isinstance(fake.fatal_error, KafkaException)
    assert kafka_error_in(fake.fatal_error).code() == KafkaError._GAPLESS_GUARANTEE
    assert fake._abort, "nothing may be committed after the failure"
    assert fake.closed == [True]


def test_an_exception_ending_the_loop_is_recorded_as_is() -> None:
    error = RuntimeError("refused")

    def turn() -> None:
        raise error

    fake = _loop_that_fails(turn)
    PollingThread.run(fake)
    assert fake.fatal_error is error and fake._abort
