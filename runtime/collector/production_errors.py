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

Refusals come two ways. librdkafka refuses a record larger than the
producer's `message.max.bytes` at `produce()` (synchronously); the runtime
lowers that limit to the smallest `max.message.bytes` of the topics it writes,
so "too large" is usually caught there, where the record is at hand. The
broker refuses what `produce()` cannot know (the topic's limit lowered while
running, timestamps outside `message.timestamp.after.max.ms` /
`before.max.ms`, a null key on a compacted topic); that comes back in delivery
reports, one per record. What librdkafka 2.16 reports from Kafka 4.x, found by
experiment (an idempotent producer, a batch of 16-200 records):

- the batch over the topic's `max.message.bytes` (whether one record or only
  their sum is too large): MSG_SIZE_TOO_LARGE for every record of the batch;
- one invalid record in the batch (a future timestamp): the broker's
  top-level error (INVALID_TIMESTAMP) for every record of the batch;
- two or more invalid records (KIP-467 record errors): INVALID_RECORD for
  each of them, `_INVALID_DIFFERENT_RECORD` for every other record;
- records queued behind a failed batch: `_PURGE_QUEUE` (under
  exactly_once_v2 the transaction must abort; under at_least_once when the
  producer keeps the gap-less guarantee, see `output.py`); without it,
  librdkafka bumps the producer epoch and writes later batches of the same
  partition after the failed one;
- a failed record's report has no timestamp (-1) and no offset, and purge
  reports can come before the failed batch's.

So a report's error is about a batch, not a record. Only a record refused
for itself may go to the handler (`classify`): `_INVALID_DIFFERENT_RECORD`
and `_PURGE_*` records are produced again, in order; INVALID_RECORD beside an
`_INVALID_DIFFERENT_RECORD` of its partition was named by the broker; a
whole-batch error makes every record of the batch a suspect. Suspects too
large for the topic are found by asking the broker for the topic's
`max.message.bytes` again (the producer is rebuilt with the lower limit and
refuses them at `produce()`); the others are produced alone, one at a time,
and a record refused alone was refused for itself. `output.OutputChannel`
does this: in place under at_least_once (`InFlight` maps reports back to the
records and their origins), through an aborted transaction and a rewind
under exactly_once_v2 (`Verdicts` carries what was learnt into the replay).

Used by the polling thread only (the only thread that produces); delivery
callbacks may run on a transactional call's helper thread while the polling
thread waits for it (transactions.py), never concurrently with it.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from confluent_kafka import KafkaError, KafkaException, Message

from runtime.collector.collector import OutputRecord, TopicPartitionKey
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

# Errors about one record, which retrying cannot fix and which say nothing
# about the health of the producer or the cluster: the handler decides, once
# the record is known to be refused for itself (see `classify`).
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
# A record refused for its size: a lower producer limit finds it at produce().
SIZE_ERROR_CODES = frozenset({KafkaError.MSG_SIZE_TOO_LARGE, KafkaError.RECORD_LIST_TOO_LARGE})
# Refused only because it shared a batch with an invalid record (KIP-467).
BATCH_MATE_CODES = frozenset({KafkaError._INVALID_DIFFERENT_RECORD})
# Never reached the broker, or its outcome was dropped: a failed batch ahead
# of it made the producer purge its queue (fatal error, transaction abort).
NOT_SENT_CODES = frozenset({KafkaError._PURGE_QUEUE, KafkaError._PURGE_INFLIGHT})
# A delivery report that belongs to a refused batch.
REFUSAL_CODES = RECORD_ERROR_CODES | BATCH_MATE_CODES | NOT_SENT_CODES

# Room left for record and batch framing when a dead-letter record is cut to
# fit: librdkafka counts only key, value and headers against its limit, the
# broker counts the whole batch.
_FRAMING_BYTES = 1024

# How many verdicts exactly_once_v2 keeps for replays (`Verdicts`): far more
# than the records of one transaction that a broker refuses.
_MAX_VERDICTS = 10_000
# Commits after which verdicts never met are dropped (output that is not
# deterministic is never met again; checking each record costs a lookup).
_QUIET_COMMITS = 50

Decision = Literal["resend", "culprit", "suspect"]
RESEND: Decision = "resend"
"""Produce it again as usual (a batch-mate, never sent, or found by produce())."""
CULPRIT: Decision = "culprit"
"""Refused for itself: the handler decides."""
SUSPECT: Decision = "suspect"
"""Refused with its batch: produce it alone to find out."""


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


@dataclass(frozen=True, slots=True)
class Refusal:
    """One failed delivery report, read out of librdkafka's message (on the
    thread serving the report; the message is not kept)."""

    error: KafkaError
    topic: str
    partition: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    """As reported: -1 for a failed record (librdkafka reports none)."""
    headers: Headers | None

    @property
    def code(self) -> int:
        return int(self.error.code())

    @staticmethod
    def read(error: KafkaError, message: Message) -> Refusal:
        reported = message.partition()
        headers = message.headers()
        return Refusal(
            error,
            message.topic() or "",
            reported if reported is not None else -1,
            message.key(),
            message.value(),
            message.timestamp()[1],
            list(headers) if headers else None,  # type: ignore[arg-type]
        )

    def as_record(self) -> OutputRecord:
        """The record as the report shows it, for one no held record matched
        (a control record): its origin is unknown, and without a timestamp
        the producer stamps it anew."""
        return (
            self.topic,
            self.partition,
            self.key,
            self.value,
            self.timestamp,
            self.headers,
            "",
            -1,
            -1,
        )


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


def classify(
    pairs: Sequence[tuple[OutputRecord | None, Refusal]],
    limits_lowered: bool,
    known_alone: Callable[[OutputRecord], bool] = lambda _record: False,
) -> list[Decision]:
    """What to do with each record of refused batches (see the module docstring).

    `pairs`: each refusal with the record it reports on (None: no record
    matched it). `limits_lowered`: the producer now refuses, at produce(),
    what is too large for the topics (their `max.message.bytes` was asked for
    again), so a size refusal is no reason to suspect a record.
    `known_alone(record)`: the record stood alone in its batch (it was
    produced alone), so its error is its own.

    A record is a culprit only when that is certain: reports carry no
    timestamp and no offset, so records equal in topic, partition, key and
    value are told apart by order only; when such records got different
    errors, which got which is not certain, and each is a suspect instead.
    """
    named = {(r.topic, r.partition) for _, r in pairs if r.code in BATCH_MATE_CODES}
    codes: dict[tuple[str, int, bytes | None, bytes | None], set[int]] = {}
    for _, refusal in pairs:
        content = (refusal.topic, refusal.partition, refusal.key, refusal.value)
        codes.setdefault(content, set()).add(refusal.code)
    decisions: list[Decision] = []
    for record, refusal in pairs:
        code = refusal.code
        content = (refusal.topic, refusal.partition, refusal.key, refusal.value)
        alone = record is not None and known_alone(record)
        # Named by the broker (the others of its partition were told apart),
        # and no equal record got another error.
        named_culprit = (
            record is not None
            and len(codes[content]) == 1
            and code == KafkaError.INVALID_RECORD
            and (refusal.topic, refusal.partition) in named
        )
        if code not in RECORD_ERROR_CODES:
            decisions.append(RESEND)
        elif alone or named_culprit:
            decisions.append(CULPRIT)
        elif code in SIZE_ERROR_CODES and limits_lowered:
            decisions.append(RESEND)
        else:
            decisions.append(SUSPECT)
    return decisions


_Content = tuple[str, bytes | None, bytes | None]


class InFlight:
    """Output records the producer may still report on.

    Delivery reports carry what librdkafka has of a record (topic, partition,
    key, value; no timestamp or offset for a failed one: measured), not the
    input record it came from; to hand a refused record to the handler with
    its origin, and to produce the rest of a refused batch again in order,
    the channel keeps the lists it produced, per output partition, until the
    producer has settled them. Holding costs no per-record work: whole lists
    are kept. A partition's unsettled records are the newest of that
    partition (the producer settles each partition in order, and a failed
    batch fails everything after it: the gap-less guarantee, or the
    transaction's abort), and there are at most `len(producer)` of them, so
    `trim(len(producer))` keeps, per partition, the newest lists covering
    that many (and everything goes whenever the producer is idle, at every
    at_least_once commit's flush and every committed transaction at the
    latest). With little in flight that is little; while the broker lags it
    is up to `len(producer)` records per output partition, never more than
    what was produced since the last commit.

    Polling thread only.
    """

    __slots__ = ("_lists", "_counts", "_seq")

    def __init__(self) -> None:
        self._lists: dict[TopicPartitionKey, deque[tuple[int, list[OutputRecord]]]] = {}
        self._counts: dict[TopicPartitionKey, int] = {}
        self._seq = 0  # produce order across partitions

    def __len__(self) -> int:
        return sum(self._counts.values())

    def hold(self, key: TopicPartitionKey, records: list[OutputRecord]) -> None:
        """`records` (all of partition `key`) were handed to the producer."""
        self._seq += 1
        lists = self._lists.get(key)
        if lists is None:
            lists = self._lists[key] = deque()
            self._counts[key] = 0
        lists.append((self._seq, records))
        self._counts[key] += len(records)

    def hold_mixed(self, records: Iterable[OutputRecord]) -> None:
        """Records of any partitions (dead-letter copies, records produced again)."""
        by_key: dict[TopicPartitionKey, list[OutputRecord]] = {}
        for record in records:
            by_key.setdefault((record[0], record[1]), []).append(record)
        for key, part in by_key.items():
            self.hold(key, part)

    def trim(self, pending: int) -> None:
        """Forget what the producer has settled: all of it when `pending` is 0,
        else the oldest lists of each partition beyond its newest `pending`."""
        if pending == 0:
            self.clear()
            return
        for key, lists in self._lists.items():
            count = self._counts[key]
            while len(lists) > 1 and count - len(lists[0][1]) >= pending:
                count -= len(lists.popleft()[1])
            self._counts[key] = count

    def clear(self) -> None:
        self._lists.clear()
        self._counts.clear()

    def match(self, refusals: Sequence[Refusal]) -> list[tuple[OutputRecord | None, Refusal]]:
        """Each refusal with the record it reports on, in produce order.

        A report names topic, partition, key and value; of equal records the
        earliest not yet matched is taken (see `classify` for what that
        leaves uncertain). A record produced to partition -1 was placed by
        the producer. A report nothing matches (a control record) comes last,
        with None.
        """
        topics = {r.topic for r in refusals}
        candidates: dict[_Content, list[tuple[int, int, OutputRecord]]] = {}
        for (topic, _partition), lists in self._lists.items():
            if topic not in topics:
                continue
            for seq, records in lists:
                for index, record in enumerate(records):
                    candidates.setdefault((topic, record[2], record[3]), []).append(
                        (seq, index, record)
                    )
        for found in candidates.values():
            found.sort(key=lambda entry: (entry[0], entry[1]))
        used: set[tuple[int, int]] = set()
        matched: list[tuple[tuple[int, int], OutputRecord, Refusal]] = []
        unmatched: list[tuple[OutputRecord | None, Refusal]] = []
        for refusal in refusals:
            hit = None
            for seq, index, record in candidates.get(
                (refusal.topic, refusal.key, refusal.value), ()
            ):
                if (seq, index) not in used and record[1] in (refusal.partition, -1):
                    hit = (seq, index, record)
                    break
            if hit is None:
                unmatched.append((None, refusal))
                continue
            used.add((hit[0], hit[1]))
            matched.append(((hit[0], hit[1]), hit[2], refusal))
        matched.sort(key=lambda entry: entry[0])
        if unmatched:
            log.warning(
                "delivery_reports_unmatched",
                count=len(unmatched),
                topics=sorted({r.topic for _, r in unmatched}),
            )
        return [(record, refusal) for _, record, refusal in matched] + unmatched


VerdictKey = tuple[str, bytes | None, bytes | None, int]


def _verdict_key(record: OutputRecord) -> VerdictKey:
    return (record[0], record[2], record[3], record[4])


class Verdicts:
    """What refused transactions taught about records, for their replays
    (exactly_once_v2).

    A refused batch dooms the open transaction: it is aborted and every task
    rewound, and the replay makes the same records again. A culprit met in
    the replay goes to the handler before it reaches the producer; a suspect
    is produced alone (`output.OutputChannel`), and its report then says
    whether it was refused for itself. Records are known by topic, key, value
    and timestamp (a replay makes them again alike; the origin is taken from
    the replayed record). At most `_MAX_VERDICTS` are kept, oldest dropped
    first; verdicts met in a committed transaction are spent, and the rest go
    after `_QUIET_COMMITS` commits (output that is not deterministic is never
    met again, and checking each record costs a lookup).

    Polling thread only.
    """

    __slots__ = ("_book", "_alone", "_met", "_quiet_commits")

    def __init__(self) -> None:
        self._book: dict[VerdictKey, tuple[Decision, KafkaError]] = {}
        self._alone: set[VerdictKey] = set()  # produced alone in the open transaction
        self._met: set[VerdictKey] = set()  # looked up in the open transaction
        self._quiet_commits = 0

    def __bool__(self) -> bool:
        return bool(self._book)

    def __len__(self) -> int:
        return len(self._book)

    def add(self, record: OutputRecord, decision: Decision, error: KafkaError) -> None:
        key = _verdict_key(record)
        self._book.pop(key, None)
        self._book[key] = (decision, error)
        while len(self._book) > _MAX_VERDICTS:
            del self._book[next(iter(self._book))]

    def lookup(self, record: OutputRecord) -> tuple[Decision, KafkaError] | None:
        key = _verdict_key(record)
        verdict = self._book.get(key)
        if verdict is not None:
            self._met.add(key)
        return verdict

    def acquit(self, record: OutputRecord) -> None:
        """`record` was produced alone and the broker took it."""
        self._book.pop(_verdict_key(record), None)

    def note_alone(self, record: OutputRecord) -> None:
        """`record` is being produced alone in the open transaction."""
        self._alone.add(_verdict_key(record))

    def was_alone(self, record: OutputRecord) -> bool:
        return _verdict_key(record) in self._alone

    def aborted(self) -> None:
        """The transaction was aborted: what was produced alone in it is
        settled (its refusals were judged); what was met is met again in the
        replay."""
        self._alone.clear()
        self._met.clear()
        self._quiet_commits = 0

    def committed(self) -> None:
        """A transaction committed: the verdicts met in it are spent (their
        input offsets are committed)."""
        for key in self._met:
            self._book.pop(key, None)
        self._met.clear()
        self._alone.clear()
        self._quiet_commits += 1
        if self._quiet_commits >= _QUIET_COMMITS:
            self._book.clear()


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
