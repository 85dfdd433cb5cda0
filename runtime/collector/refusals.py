"""What a refused batch's delivery reports mean, record by record.

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
  producer keeps the gap-less guarantee, see `refused_batches.py`); without it,
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
and a record refused alone was refused for itself. `InFlight` maps reports
back to the records produced and their origins (at_least_once), `Verdicts`
carries what was learnt into the replay of an aborted transaction
(exactly_once_v2); `refused_batches.py` acts on both, the handler
(`production_errors.OutputErrors`) gets only the culprits.

Used by the polling thread only (the only thread that produces); a
`Refusal` is read on whichever thread serves the delivery report (a
transactional call's helper thread while the polling thread waits for it).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from confluent_kafka import KafkaError, Message

from runtime.collector.collector import OutputRecord, TopicPartitionKey
from runtime.logging import get_logger
from runtime.topology.record import Headers

log = get_logger("runtime.production")

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
    is produced alone (`refused_batches.py`), and its report then says
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
