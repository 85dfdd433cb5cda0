"""production.exception.handler decisions, with a fake producer (pure logic)."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from runtime.collector.collector import OutputRecord
from runtime.collector.production_errors import (
    HEADER_ORIGINAL_TIMESTAMP,
    HEADER_SINK_TOPIC,
    HEADER_TRUNCATED,
    OutputErrors,
    ProductionFailed,
    record_size,
)

LIMIT = 10_000


class FakeProducer:
    """The output channel's produce loop over a producer that refuses records
    over LIMIT bytes as librdkafka does: a refusal goes back to the handler."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.errors: OutputErrors | None = None

    def send(self, records: list[OutputRecord]) -> None:
        assert self.errors is not None
        for rec in records:
            topic, partition, key, value, timestamp, headers = rec[:6]
            if record_size(key, value, headers) > LIMIT:
                self.errors.on_produce_error(rec, too_large())
                continue
            self.sent.append(
                {
                    "topic": topic,
                    "key": key,
                    "value": value,
                    "partition": partition,
                    "timestamp": timestamp,
                    "headers": headers,
                }
            )


def record(topic: str, value: bytes, headers: list | None = None) -> OutputRecord:
    return (topic, 0, b"k", value, 1000, headers, "input", 3, 42)


def errors(
    handler: str, dlq: str | None = "dlq", eos: bool = False
) -> tuple[OutputErrors, FakeProducer]:
    producer = FakeProducer()
    producer.errors = OutputErrors(handler, dlq, LIMIT, eos, producer.send, application_id="app")
    return producer.errors, producer


def too_large() -> KafkaException:
    return KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))


def test_log_and_fail_raises_naming_output_input_and_fix() -> None:
    handler, producer = errors("log_and_fail", dlq=None)
    with pytest.raises(ProductionFailed) as failed:
        handler.on_produce_error(record("out", b"x" * 20_000), too_large())
    message = str(failed.value)
    assert "out[0]" in message and "input[3]@42" in message
    assert "max.message.bytes" in message and "production.exception.handler" in message
    assert producer.sent == []


def test_log_and_continue_skips_and_counts() -> None:
    handler, producer = errors("log_and_continue", dlq=None)
    handler.on_produce_error(record("out", b"x" * 20_000), too_large())
    assert handler.counts.skipped == 1 and handler.counts.dead_lettered == 0
    assert producer.sent == []


def test_dead_letter_queue_truncates_the_too_large_copy_with_a_header() -> None:
    handler, producer = errors("dead_letter_queue")
    handler.on_produce_error(record("out", b"x" * 20_000), too_large())
    assert handler.counts.skipped == 1
    assert handler.counts.dead_lettered == 1 and handler.counts.truncated == 1
    [sent] = producer.sent
    headers = dict(sent["headers"])
    assert sent["topic"] == "dlq"
    assert headers[HEADER_SINK_TOPIC] == b"out"
    assert headers["__streams.errors.offset"] == b"42"
    assert int(headers[HEADER_TRUNCATED]) > 20_000
    assert 0 < len(sent["value"]) < 20_000 and b"x" * len(sent["value"]) == sent["value"]


def test_a_too_large_dead_letter_record_is_cut_whatever_the_handler() -> None:
    handler, producer = errors("log_and_fail")
    stack = [("__streams.errors.stacktrace", b"s" * 3000)]
    handler.on_produce_error(record("dlq", b"v" * 50_000, stack), too_large())
    [sent] = producer.sent
    names = [name for name, _ in sent["headers"]]
    assert "__streams.errors.stacktrace" not in names
    assert record_size(sent["key"], sent["value"], sent["headers"]) <= LIMIT


def test_a_cut_dead_letter_record_refused_again_stops_instead_of_looping() -> None:
    handler, producer = errors("dead_letter_queue")
    cut = record("dlq", b"v", [(HEADER_TRUNCATED, b"50000")])
    with pytest.raises(ProductionFailed) as failed:
        handler.on_produce_error(cut, too_large())
    assert "dlq[0]" in str(failed.value)
    handler.on_delivery_error(
        KafkaError(KafkaError.MSG_SIZE_TOO_LARGE),
        FakeMessage("dlq", b"v", [(HEADER_TRUNCATED, b"9")]),
    )  # type: ignore[arg-type]
    assert handler.take_failure() is not None
    assert producer.sent == []


def test_errors_that_are_not_about_one_record_always_stop() -> None:
    handler, _ = errors("log_and_continue")
    with pytest.raises(ProductionFailed):
        handler.on_produce_error(
            record("out", b"v"), KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED))
        )


class FakeMessage:
    def __init__(self, topic: str, value: bytes, headers: list | None = None) -> None:
        self._topic, self._value, self._headers = topic, value, headers

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return 1

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return self._value

    def timestamp(self) -> tuple[int, int]:
        return (1, 5)

    def headers(self) -> list | None:
        return self._headers


def test_a_delivery_failure_not_about_the_record_stops_at_least_once() -> None:
    """Refusals of records are settled by the output channel; what reaches
    on_delivery_error is not about one record and stops the app."""
    handler, producer = errors("dead_letter_queue")
    handler.on_delivery_error(
        KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED),
        FakeMessage("out", b"v"),  # type: ignore[arg-type]
    )
    failure = handler.take_failure()
    assert failure is not None and "out[1]" in str(failure)
    assert handler.take_failure() is None, "a failure is taken once"
    assert producer.sent == []


def test_dead_letter_handler_needs_a_topic() -> None:
    with pytest.raises(ValueError):
        errors("dead_letter_queue", dlq=None)


def test_a_timeout_under_exactly_once_is_left_to_the_transaction_abort() -> None:
    handler, _ = errors("log_and_fail", eos=True)
    handler.on_delivery_error(KafkaError(KafkaError._MSG_TIMED_OUT), FakeMessage("out", b"v"))  # type: ignore[arg-type]
    assert handler.take_failure() is None


def test_a_timeout_under_at_least_once_stops() -> None:
    handler, _ = errors("log_and_continue")
    handler.on_delivery_error(KafkaError(KafkaError._MSG_TIMED_OUT), FakeMessage("out", b"v"))  # type: ignore[arg-type]
    assert handler.take_failure() is not None


INVALID_TIMESTAMP = KafkaError(KafkaError.INVALID_TIMESTAMP, "Broker: Invalid timestamp")


def test_a_refused_record_is_named_with_its_input_record_and_the_brokers_reason() -> None:
    handler, _ = errors("log_and_fail", dlq=None)
    future = ("out", 1, b"k", b"v", int(time.time() * 1000) + 86_400_000, None, "in", 0, 7)
    with pytest.raises(ProductionFailed) as failed:
        handler.refused(future, INVALID_TIMESTAMP)
    message = str(failed.value)
    assert "out[1]" in message and "in[0]@7" in message
    assert "INVALID_TIMESTAMP" in message and "Invalid timestamp" in message
    assert "in the future" in message and "message.timestamp.after.max.ms" in message


@pytest.mark.parametrize("handler_name", ["log_and_continue", "dead_letter_queue"])
@pytest.mark.parametrize(
    ("topic", "kind"),
    [
        ("app-totals-changelog", "changelog of store 'totals'"),
        ("app-by-key-repartition", "repartition"),
    ],
)
def test_an_internal_record_is_never_skipped(handler_name: str, topic: str, kind: str) -> None:
    handler, producer = errors(handler_name)
    with pytest.raises(ProductionFailed) as failed:
        handler.refused(record(topic, b"x" * 20_000), too_large().args[0])
    message = str(failed.value)
    assert kind in message and topic in message and "20001 bytes" in message
    assert "never skipped" in message
    assert handler.counts.skipped == 0 and producer.sent == []


def test_a_user_topic_named_like_another_apps_changelog_is_a_user_topic() -> None:
    handler, _ = errors("log_and_continue")
    handler.refused(record("other-totals-changelog", b"x"), too_large().args[0])
    assert handler.counts.skipped == 1


def test_a_dead_letter_copy_of_a_timestamp_refusal_is_stamped_now() -> None:
    """The dead-letter topic would refuse the same timestamp (Kafka 4 refuses
    timestamps over an hour ahead by default): the copy is written with the
    time of writing, the original kept in a header."""
    handler, producer = errors("dead_letter_queue")
    future_ts = int(time.time() * 1000) + 86_400_000
    handler.refused(("out", 0, b"k", b"v", future_ts, None, "in", 3, 42), INVALID_TIMESTAMP)
    [sent] = producer.sent
    headers = dict(sent["headers"])
    assert sent["topic"] == "dlq" and sent["timestamp"] == 0
    assert headers[HEADER_ORIGINAL_TIMESTAMP] == str(future_ts).encode()
    assert headers["__streams.errors.offset"] == b"42"


def test_a_dead_letter_record_refused_for_its_timestamp_is_restamped_once() -> None:
    handler, producer = errors("log_and_fail")
    handler.refused(("dlq", -1, b"k", b"v", 123, None, "in", 0, 1), INVALID_TIMESTAMP)
    [sent] = producer.sent
    assert sent["timestamp"] == 0
    with pytest.raises(ProductionFailed):
        handler.refused(("dlq", -1, b"k", b"v", 0, sent["headers"], "in", 0, 1), INVALID_TIMESTAMP)
