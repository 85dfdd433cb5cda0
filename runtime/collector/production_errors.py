"""What happens to an output record the producer or the broker refuses.

Kafka Streams' `production.exception.handler`: a record the broker will never
take (too large, invalid) goes to the handler; every other produce failure
(authorization, a fenced producer, an unknown topic) stops the application.
`log_and_fail` (the default) stops it too, naming the output record and the
input record that made it. Stopping never commits past the failed record: the
polling thread closes its tasks dirty, so a restart resumes from the last
commit whose output the broker acknowledged (correctness rule 3).

`log_and_continue` skips the record (counted); `dead_letter_queue` skips it and
writes it to the dead-letter topic with headers naming the error, the sink
topic and the origin. A dead-letter record that is itself too large is
truncated, with a header giving its original size: it is never dropped
silently, whatever the handler says.

Refusals come two ways. librdkafka refuses a record larger than the
producer's `message.max.bytes` at `produce()` (synchronously); the runtime
lowers that limit to the smallest `max.message.bytes` of the topics it writes,
so "too large" is almost always caught here, where the record is at hand.
A refusal in a delivery report (asynchronous) is handled the same way under
at_least_once; under exactly_once_v2 it has already poisoned the open
transaction, and rewinding would only meet it again, so it always stops the
application. A record lost in transit (a timeout during an outage) stops the
application under at_least_once; under exactly_once_v2 its transaction is
aborted and every task rewound instead.

Used by the polling thread only (the only thread that produces).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message

from runtime.collector.collector import OutputRecord
from runtime.logging import get_logger
from runtime.processing.errors import (
    DEAD_LETTER_QUEUE,
    HEADER_EXCEPTION,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_STACKTRACE,
    HEADER_STAGE,
    HEADER_TOPIC,
    LOG_AND_FAIL,
)
from runtime.topology.record import Headers

log = get_logger("runtime.production")

HEADER_SINK_TOPIC = "__streams.errors.sink.topic"
HEADER_TRUNCATED = "__streams.errors.truncated.original.bytes"

# Errors about one record, which retrying cannot fix and which say nothing
# about the health of the producer or the cluster: the handler decides.
RECORD_ERROR_CODES = frozenset(
    {
        KafkaError.MSG_SIZE_TOO_LARGE,
        KafkaError.RECORD_LIST_TOO_LARGE,
        KafkaError.INVALID_MSG,
        KafkaError.INVALID_MSG_SIZE,
        KafkaError.INVALID_RECORD,
        KafkaError.INVALID_TIMESTAMP,
    }
)

# Room left for record and batch framing when a dead-letter record is cut to
# fit: librdkafka counts only key, value and headers against its limit, the
# broker counts the whole batch.
_FRAMING_BYTES = 1024


class ProductionFailed(RuntimeError):
    """Output could not be produced and the handler says stop (or cannot help).

    The message names the output topic and partition, the input record that
    made the output (topic, partition, offset) when known, the error, and what
    to do about it.
    """


@dataclass
class ProductionCounts:
    """Records the handler skipped or dead-lettered (read racily for status)."""

    skipped: int = 0
    dead_lettered: int = 0
    truncated: int = 0
    by_error: dict[str, int] = field(default_factory=dict)


def record_size(key: bytes | None, value: bytes | None, headers: Headers | None) -> int:
    """Bytes librdkafka counts against `message.max.bytes` for one record."""
    size = (len(key) if key else 0) + (len(value) if value else 0)
    if headers:
        for name, data in headers:
            size += len(name) + (len(data) if data else 0)
    return size


def _was_truncated(headers: Headers | None) -> bool:
    """Whether a dead-letter record was cut to fit already (a second refusal is final)."""
    return any(name == HEADER_TRUNCATED for name, _ in headers or ())


def origin_of(record: OutputRecord) -> str:
    """'topic[partition]@offset' of the input record that produced `record`."""
    source_topic, source_partition, source_offset = record[6], record[7], record[8]
    if not source_topic or source_offset < 0:
        return "unknown (output of a punctuation or of a state flush)"
    return f"{source_topic}[{source_partition}]@{source_offset}"


def _advice(error: KafkaError, topic: str) -> str:
    if error.code() in (KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE):
        return (
            f"raise max.message.bytes of topic {topic!r} and producer.message.max.bytes, "
            "make the record smaller, or set production.exception.handler to "
            "log_and_continue or dead_letter_queue to skip such records"
        )
    if error.code() in RECORD_ERROR_CODES:
        return (
            "fix the record, or set production.exception.handler to log_and_continue "
            "or dead_letter_queue to skip such records"
        )
    return "check the broker, the topic and the producer's settings"


class OutputErrors:
    """Applies `production.exception.handler` to refused output records.

    Called by the polling thread only: `on_produce_error` from inside the
    produce loop, `on_delivery_error` from the producer's delivery callback
    (inside `poll()`/`flush()` on the polling thread), `take_failure` when it
    checks for a reason to stop.
    """

    def __init__(
        self,
        handler: str,
        dead_letter_topic: str | None,
        max_record_bytes: int,
        exactly_once: bool,
        send: Callable[[list[OutputRecord]], object],
    ) -> None:
        if handler == DEAD_LETTER_QUEUE and dead_letter_topic is None:
            raise ValueError("the dead_letter_queue handler needs a dead-letter topic")
        self.handler = handler
        self.dead_letter_topic = dead_letter_topic
        self.max_record_bytes = max_record_bytes
        self._exactly_once = exactly_once
        # The output channel's produce loop: a refusal comes back here.
        self._send = send
        self.counts = ProductionCounts()
        self._failure: ProductionFailed | None = None

    # --- failures raised by produce() ------------------------------------------

    def on_produce_error(self, record: OutputRecord, exc: KafkaException) -> None:
        """`produce()` refused `record`: skip it, dead-letter it, or raise.

        Raises ProductionFailed when the handler is log_and_fail or the error
        is not about this one record.
        """
        error: KafkaError = exc.args[0]
        topic, partition = record[0], record[1]
        if error.code() not in RECORD_ERROR_CODES or (
            self.handler == LOG_AND_FAIL and topic != self.dead_letter_topic
        ):
            raise self._failed(error, topic, partition, origin_of(record)) from exc
        if topic == self.dead_letter_topic:
            # A dead-letter record is the last copy of a failed record.
            self._send_truncated(record, error)
            return
        self._skip(error, topic, partition, origin_of(record))
        if self.handler == DEAD_LETTER_QUEUE:
            self._dead_letter(record, error)

    # --- failures in delivery reports -----------------------------------------

    def on_delivery_error(self, error: KafkaError, message: Message) -> None:
        """A delivery report says the broker refused `message` for good."""
        topic = message.topic() or ""
        reported = message.partition()
        partition: int = reported if reported is not None else -1
        headers: Headers | None = list(message.headers() or ()) or None  # type: ignore[arg-type]
        origin = "unknown (refused by the broker after produce)"
        if self._exactly_once and error.code() not in RECORD_ERROR_CODES:
            # Lost in transit (a timeout, an outage): the open transaction
            # cannot commit now; the polling thread aborts it and rewinds.
            return
        if (
            self._exactly_once
            or error.code() not in RECORD_ERROR_CODES
            or (self.handler == LOG_AND_FAIL and topic != self.dead_letter_topic)
        ):
            if self._failure is None:
                self._failure = self._failed(error, topic, partition, origin)
            return
        record: OutputRecord = (
            topic,
            partition,
            message.key(),
            message.value(),
            message.timestamp()[1],
            headers,
            "",
            -1,
            -1,
        )
        if topic == self.dead_letter_topic:
            if _was_truncated(headers):
                self._failure = self._failure or self._failed(error, topic, partition, origin)
            else:
                self._send_truncated(record, error)
            return
        self._skip(error, topic, partition, origin)
        if self.handler == DEAD_LETTER_QUEUE:
            self._dead_letter(record, error)

    def take_failure(self) -> ProductionFailed | None:
        """The failure a delivery report left for the polling thread, once."""
        failure, self._failure = self._failure, None
        return failure

    # --- helpers --------------------------------------------------------------

    def _failed(
        self, error: KafkaError, topic: str, partition: int, origin: str
    ) -> ProductionFailed:
        return ProductionFailed(
            f"output to {topic}[{partition}] could not be produced: {error.str()} "
            f"(input record {origin}; handler {self.handler}); nothing past the last "
            f"commit was committed; to go on: {_advice(error, topic)}"
        )

    def _skip(self, error: KafkaError, topic: str, partition: int, origin: str) -> None:
        name = error.name()
        self.counts.skipped += 1
        self.counts.by_error[name] = self.counts.by_error.get(name, 0) + 1
        log.warning(
            "production_error",
            topic=topic,
            partition=partition,
            origin=origin,
            handler=self.handler,
            error=error.str(),
        )

    def _dead_letter(self, record: OutputRecord, error: KafkaError) -> None:
        assert self.dead_letter_topic is not None
        origin_topic, origin_partition, origin_offset = record[6], record[7], record[8]
        headers: list[tuple[str, bytes | None]] = list(record[5] or ())
        headers += [
            (HEADER_EXCEPTION, b"KafkaException"),
            (HEADER_MESSAGE, error.str().encode("utf-8", "replace")),
            (HEADER_STAGE, b"production"),
            (HEADER_SINK_TOPIC, record[0].encode()),
            (HEADER_TOPIC, origin_topic.encode()),
            (HEADER_PARTITION, str(origin_partition).encode()),
            (HEADER_OFFSET, str(origin_offset).encode()),
        ]
        dead: OutputRecord = (
            self.dead_letter_topic,
            -1,
            record[2],
            record[3],
            record[4],
            headers,
            origin_topic,
            origin_partition,
            origin_offset,
        )
        self.counts.dead_lettered += 1
        self._send([dead])

    def _send_truncated(self, record: OutputRecord, error: KafkaError) -> None:
        """Cut a dead-letter record's value (then key) until it fits, and send it.

        A record that was cut already and is refused again cannot be kept: that
        stops the app (nothing past the last commit is committed).
        """
        topic, partition, key, value, timestamp, headers = record[:6]
        if _was_truncated(headers):
            raise self._failed(error, topic, partition, origin_of(record))
        original = record_size(key, value, headers)
        # The stack trace is the one header that can go without losing what
        # failed or where the record came from.
        kept_headers: list[tuple[str, bytes | None]] = [
            (name, data) for name, data in (headers or ()) if name != HEADER_STACKTRACE
        ]
        kept_headers.append((HEADER_TRUNCATED, str(original).encode()))
        room = self.max_record_bytes - _FRAMING_BYTES - record_size(None, None, kept_headers)
        if key is not None and len(key) > room // 2:
            key = key[: max(0, room // 2)]
        room -= len(key) if key else 0
        if value is not None and len(value) > room:
            value = value[: max(0, room)]
        self.counts.truncated += 1
        log.warning(
            "dead_letter_record_truncated",
            topic=topic,
            original_bytes=original,
            error=error.str(),
        )
        self._send([(topic, partition, key, value, timestamp, kept_headers, *record[6:])])
