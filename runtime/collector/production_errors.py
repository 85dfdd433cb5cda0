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
topic and the origin (input topic, partition, offset). A dead-letter record
that is itself too large is truncated, with a header giving its original
size; one refused for its timestamp is stamped with the time of writing, with
a header giving the original: it is never dropped silently, whatever the
handler says. A changelog or repartition record is never skipped, whatever
the handler says: a store whose changelog misses a write restores to a wrong
value, and a lost repartition record is lost output. The app stops, naming
the store (changelog topic), the record's size and the limit.

Which records count as refused for themselves, and how a refused batch is
settled, is in `refusals.py` and `refused_batches.py`: this module gets only
the culprits (and the failures that are not about one record).

Used by the polling thread only (the only thread that produces); delivery
callbacks may run on a transactional call's helper thread while the polling
thread waits for it (transactions.py), never concurrently with it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException, Message

from runtime.collector.collector import OutputRecord
from runtime.collector.refusals import RECORD_ERROR_CODES, SIZE_ERROR_CODES
from runtime.error_handlers import (
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
from runtime.logging import get_logger
from runtime.topology.record import Headers

log = get_logger("runtime.production")

HEADER_SINK_TOPIC = "__streams.errors.sink.topic"
HEADER_TRUNCATED = "__streams.errors.truncated.original.bytes"
HEADER_ORIGINAL_TIMESTAMP = "__streams.errors.original.timestamp"

# Room left for record and batch framing when a dead-letter record is cut to
# fit: librdkafka counts only key, value and headers against its limit, the
# broker counts the whole batch.
_FRAMING_BYTES = 1024


class ProductionFailed(RuntimeError):
    """Output could not be produced and the handler says stop (or cannot help).

    The message names the output topic and partition, the input record that
    made the output (topic, partition, offset) when known, the broker's
    reason, and what to do about it.
    """


@dataclass
class ProductionCounts:
    """Records the handler skipped or dead-lettered, and what refused batches
    cost (read racily for status)."""

    skipped: int = 0
    dead_lettered: int = 0
    truncated: int = 0
    by_error: dict[str, int] = field(default_factory=dict)
    resent: int = 0
    """Records of refused batches produced again (batch-mates, never sent)."""
    isolated: int = 0
    """Suspects produced alone to learn whether the broker refuses them."""

    def settled(self) -> ProductionCounts:
        """A copy of what the handler did (exactly_once_v2: as of a commit)."""
        return ProductionCounts(
            self.skipped, self.dead_lettered, self.truncated, dict(self.by_error)
        )

    def restore(self, settled: ProductionCounts) -> None:
        """Back to `settled` after an abort: the replay does it again."""
        self.skipped = settled.skipped
        self.dead_lettered = settled.dead_lettered
        self.truncated = settled.truncated
        self.by_error = dict(settled.by_error)


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


def _was_restamped(headers: Headers | None) -> bool:
    return any(name == HEADER_ORIGINAL_TIMESTAMP for name, _ in headers or ())


def origin_of(record: OutputRecord) -> str:
    """'topic[partition]@offset' of the input record that produced `record`."""
    source_topic, source_partition, source_offset = record[6], record[7], record[8]
    if not source_topic or source_offset < 0:
        return "unknown (output of a punctuation or of a state flush)"
    return f"{source_topic}[{source_partition}]@{source_offset}"


def internal_topic(topic: str, application_id: str) -> str | None:
    """'changelog of store X' or 'repartition topic' when `topic` is one of
    the app's internal topics, else None.

    By name (`<application.id>-...-changelog` / `-repartition`, as
    runtime.kafka.topics creates them): the output channel is not told the
    layout. A user topic named like that is treated as internal, which is the
    safe side: its refused records stop the app instead of being skipped.
    """
    prefix = f"{application_id}-"
    if not application_id or not topic.startswith(prefix):
        return None
    if topic.endswith("-changelog"):
        return f"changelog of store {topic[len(prefix) : -len('-changelog')]!r}"
    if topic.endswith("-repartition"):
        return "repartition topic"
    return None


def _describe_timestamp(timestamp: int) -> str:
    if timestamp <= 0:
        return "none (the producer's clock)"
    ahead_s = (timestamp - time.time() * 1000) / 1000
    if abs(ahead_s) < 1:
        return f"{timestamp} (now)"
    return f"{timestamp} ({abs(ahead_s):.0f} s in the {'future' if ahead_s > 0 else 'past'})"


def _advice(error: KafkaError, topic: str) -> str:
    if error.code() in SIZE_ERROR_CODES:
        return (
            f"raise max.message.bytes of topic {topic!r} and producer.message.max.bytes, "
            "make the record smaller, or set production.exception.handler to "
            "log_and_continue or dead_letter_queue to skip such records"
        )
    if error.code() in (KafkaError.INVALID_TIMESTAMP, KafkaError.INVALID_RECORD):
        return (
            f"check the record's timestamp against topic {topic!r}'s "
            "message.timestamp.after.max.ms / before.max.ms (or its cleanup.policy: a "
            "compacted topic refuses null keys), fix the record, or set "
            "production.exception.handler to log_and_continue or dead_letter_queue"
        )
    if error.code() in RECORD_ERROR_CODES:
        return (
            "fix the record, or set production.exception.handler to log_and_continue "
            "or dead_letter_queue to skip such records"
        )
    return "check the broker, the topic and the producer's settings"


class OutputErrors:
    """Applies `production.exception.handler` to refused output records.

    Called by the polling thread only: `refused` and `on_produce_error` for a
    record refused for itself, `on_delivery_error` from the producer's
    delivery callback for failures that are not about one record,
    `take_failure` when it checks for a reason to stop.
    """

    def __init__(
        self,
        handler: str,
        dead_letter_topic: str | None,
        max_record_bytes: int,
        exactly_once: bool,
        send: Callable[[list[OutputRecord]], object],
        application_id: str = "",
    ) -> None:
        if handler == DEAD_LETTER_QUEUE and dead_letter_topic is None:
            raise ValueError("the dead_letter_queue handler needs a dead-letter topic")
        self.handler = handler
        self.dead_letter_topic = dead_letter_topic
        self.max_record_bytes = max_record_bytes
        """The producer's `message.max.bytes` (lowered when a topic's limit is)."""
        self._exactly_once = exactly_once
        self._application_id = application_id
        # The output channel's produce loop: dead-letter copies go there.
        self._send = send
        self.counts = ProductionCounts()
        self._failure: ProductionFailed | None = None

    # --- records refused for themselves ----------------------------------------

    def on_produce_error(self, record: OutputRecord, exc: KafkaException) -> None:
        """`produce()` refused `record`: skip it, dead-letter it, or raise."""
        self.refused(record, exc.args[0])

    def refused(self, record: OutputRecord, error: KafkaError) -> None:
        """`record` was refused for itself (by produce(), or by the broker when
        it stood alone or was named): skip it, dead-letter it, or raise.

        Raises ProductionFailed when the handler is log_and_fail, the record
        belongs to a changelog or repartition topic, or the error is not
        about this one record. A dead-letter record is the last copy of a
        failed record: it is cut to fit (or stamped with the time of writing)
        and sent again, whatever the handler.
        """
        topic = record[0]
        if error.code() not in RECORD_ERROR_CODES:
            raise self._failed(error, record)
        if topic == self.dead_letter_topic:
            self._send_again(record, error)
            return
        kind = internal_topic(topic, self._application_id)
        if kind is not None:
            raise self._internal_failed(kind, error, record)
        if self.handler == LOG_AND_FAIL:
            raise self._failed(error, record)
        self._skip(error, record)
        if self.handler == DEAD_LETTER_QUEUE:
            self._dead_letter(record, error)

    # --- failures not about one record -----------------------------------------

    def on_delivery_error(self, error: KafkaError, message: Message) -> None:
        """A delivery report failed for a reason that is not about the record
        (a timeout during an outage, authorization, an unknown topic).

        Under exactly_once_v2 a record lost in transit leaves the open
        transaction unable to commit: the polling thread aborts it and
        rewinds. Anything else stops the app (taken with `take_failure`).
        """
        if self._exactly_once and error.code() not in RECORD_ERROR_CODES:
            return
        if self._failure is None:
            reported = message.partition()
            record: OutputRecord = (
                message.topic() or "",
                reported if reported is not None else -1,
                None,
                None,
                -1,
                None,
                "",
                -1,
                -1,
            )
            self._failure = self._failed(error, record)

    def fail(self, failure: ProductionFailed) -> None:
        """Keep `failure` for the polling thread (the first one wins)."""
        if self._failure is None:
            self._failure = failure

    def take_failure(self) -> ProductionFailed | None:
        """The failure a delivery report left for the polling thread, once."""
        failure, self._failure = self._failure, None
        return failure

    @property
    def failed(self) -> bool:
        return self._failure is not None

    # --- helpers --------------------------------------------------------------

    def _failed(self, error: KafkaError, record: OutputRecord) -> ProductionFailed:
        topic, partition = record[0], record[1]
        what = ""
        if record[2] is not None or record[3] is not None:
            size = record_size(record[2], record[3], record[5])
            what = f"; the record: {size} bytes, timestamp {_describe_timestamp(record[4])}"
        return ProductionFailed(
            f"output to {topic}[{partition}] could not be produced: {error.name()}: "
            f"{error.str()}{what} (input record {origin_of(record)}; handler {self.handler}); "
            f"nothing past the last commit was committed; to go on: {_advice(error, topic)}"
        )

    def _internal_failed(
        self, kind: str, error: KafkaError, record: OutputRecord
    ) -> ProductionFailed:
        topic, partition = record[0], record[1]
        size = record_size(record[2], record[3], record[5])
        return ProductionFailed(
            f"{kind} ({topic}[{partition}]) refused a record of {size} bytes, timestamp "
            f"{_describe_timestamp(record[4])}: {error.name()}: {error.str()} (the producer's "
            f"limit is {self.max_record_bytes} bytes; input record {origin_of(record)}); an "
            "internal record is never skipped, whatever production.exception.handler says "
            "(a store restored from a changelog that misses a write has a wrong value); "
            "nothing past the last commit was committed; to go on: raise max.message.bytes "
            f"of topic {topic!r} (and producer.message.max.bytes), make the store's values "
            "smaller, or fix the record's timestamp"
        )

    def _skip(self, error: KafkaError, record: OutputRecord) -> None:
        name = error.name()
        self.counts.skipped += 1
        self.counts.by_error[name] = self.counts.by_error.get(name, 0) + 1
        log.warning(
            "production_error",
            topic=record[0],
            partition=record[1],
            origin=origin_of(record),
            handler=self.handler,
            error=f"{name}: {error.str()}",
        )

    def _dead_letter(self, record: OutputRecord, error: KafkaError) -> None:
        assert self.dead_letter_topic is not None
        origin_topic, origin_partition, origin_offset = record[6], record[7], record[8]
        headers: list[tuple[str, bytes | None]] = list(record[5] or ())
        headers += [
            (HEADER_EXCEPTION, b"KafkaException"),
            (HEADER_MESSAGE, f"{error.name()}: {error.str()}".encode("utf-8", "replace")),
            (HEADER_STAGE, b"production"),
            (HEADER_SINK_TOPIC, record[0].encode()),
            (HEADER_TOPIC, origin_topic.encode()),
            (HEADER_PARTITION, str(origin_partition).encode()),
            (HEADER_OFFSET, str(origin_offset).encode()),
        ]
        timestamp = record[4]
        if error.code() not in SIZE_ERROR_CODES and timestamp > 0:
            # Refused for its timestamp (or another record property): the
            # dead-letter topic would likely refuse the same timestamp.
            headers.append((HEADER_ORIGINAL_TIMESTAMP, str(timestamp).encode()))
            timestamp = 0
        dead: OutputRecord = (
            self.dead_letter_topic,
            -1,
            record[2],
            record[3],
            timestamp,
            headers,
            origin_topic,
            origin_partition,
            origin_offset,
        )
        self.counts.dead_lettered += 1
        self._send([dead])

    def _send_again(self, record: OutputRecord, error: KafkaError) -> None:
        """A refused dead-letter record: cut to fit, or stamped now, and sent again."""
        headers = record[5]
        if error.code() in SIZE_ERROR_CODES:
            self._send_truncated(record, error)
            return
        if _was_restamped(headers) or record[4] <= 0:
            raise self._failed(error, record)
        stamped = [*(headers or ()), (HEADER_ORIGINAL_TIMESTAMP, str(record[4]).encode())]
        log.warning("dead_letter_record_restamped", topic=record[0], error=error.str())
        self._send([(record[0], record[1], record[2], record[3], 0, stamped, *record[6:])])

    def _send_truncated(self, record: OutputRecord, error: KafkaError) -> None:
        """Cut a dead-letter record's value (then key) until it fits, and send it.

        A record that was cut already and is refused again cannot be kept: that
        stops the app (nothing past the last commit is committed).
        """
        topic, partition, key, value, timestamp, headers = record[:6]
        if _was_truncated(headers):
            raise self._failed(error, record)
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
