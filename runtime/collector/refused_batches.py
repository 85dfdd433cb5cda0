"""Settling refused batches: only records refused for themselves reach the
production exception handler, every other record reaches its topic in order,
and nothing is committed past a record whose fate is open (rule 3).

What librdkafka reports about a refused batch, and how each record of it is
judged, is in `refusals.py`. Here is what the output channel does about it,
as `RefusedBatchSettling`, the base class of `output.OutputChannel`:

- at_least_once: the producer keeps librdkafka's gap-less guarantee
  (`enable.gapless.guarantee`, with idempotence): a failed batch makes it
  fail fatally and purge what is queued behind, so nothing after the failed
  batch reaches its partition (without it librdkafka bumps the epoch and
  writes later batches first: measured). `InFlight` maps the reports back to
  the records produced and their origins; `_resolve` then, on the polling
  thread, replaces the producer, produces batch-mates and purged records
  again in produce order, hands culprits to the handler, and produces each
  suspect alone through a producer without the guarantee (one record, then
  a flush: a refusal then names that record). Size refusals first lower the
  producer's `message.max.bytes` to the topic's current `max.message.bytes`
  (asked with DescribeConfigs), so the producer refuses the records too
  large at `produce()` and batches the rest small enough. Each round
  settles at least one record (a suspect produced alone is settled), so the
  loop ends. The channel's commit flush returns only once all of this is
  settled, so offsets never pass a record whose fate is open.
  confluent-kafka raises the gap-less fatal error from `poll()`/`flush()`,
  and can run delivery callbacks while that error is pending, where the
  first call into the library raises SystemError (measured: a report was
  lost that way until the channel's `_on_delivery` handled it).
- exactly_once_v2: a refused record dooms the open transaction
  (`Transactions.note_doomed`): the polling thread aborts it and rewinds
  every task at once. `discard` (called between the abort and the rewind)
  turns the reports into `Verdicts` and replaces the producer (after the
  abort librdkafka kept the refused batch's sequence numbers, and the next
  transaction failed with OUT_OF_ORDER_SEQUENCE_NUMBER: measured). In the
  replay a culprit goes to the handler before it reaches the producer and a
  suspect is produced alone (flushes before and after it); a suspect
  refused alone dooms that transaction too and is a culprit in the next
  replay. Each round settles at least one record, so a rewind loop ends,
  provided the replay makes the same records: after `_MAX_REFUSED_ROUNDS`
  refused transactions in a row the app stops instead (output that differs
  on every replay, e.g. built from the wall clock, is never met again).

A base class rather than a collaborator: settling runs inside the channel's
produce loop, on its producer and its reports, and the hot path
(`OutputChannel._produce_run`) reads the settling state (`_dead`,
`_in_flight`) with no indirection per call. The channel supplies the
attributes and methods declared at the top of the class.
One file for both guarantees (a little over 500 lines, much of it this text):
they share the report matching, the limit lowering and the counts.

Polling thread only, as the channel (delivery callbacks may run on a
transactional call's helper thread while the polling thread waits for it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from runtime.collector.collector import OutputRecord, RecordCollector, TopicPartitionKey
from runtime.collector.production_errors import (
    OutputErrors,
    ProductionCounts,
    ProductionFailed,
    origin_of,
)
from runtime.collector.refusals import (
    CULPRIT,
    RESEND,
    SIZE_ERROR_CODES,
    SUSPECT,
    Decision,
    InFlight,
    Refusal,
    Verdicts,
    classify,
)
from runtime.collector.transactions import Transactions, breaks_producer
from runtime.config import StreamsConfig
from runtime.kafka.clients import admin_config
from runtime.kafka.topics import smallest_max_message_bytes
from runtime.logging import get_logger

log = get_logger("runtime.output")

# A flush that makes no progress for this long is reported as a broker outage
# (a stalled broker raises no client error until socket timeouts expire).
FLUSH_STALL_S = 5.0
# Room for record and batch framing under a topic's `max.message.bytes`
# (as at start-up: the producer's limit counts key, value and headers only).
FRAMING_BYTES = 1024
# DescribeConfigs of a topic that refused a batch as too large.
_DESCRIBE_TIMEOUT_S = 10.0
# exactly_once_v2: refused transactions in a row (no commit between) after
# which the app stops: a replay that never meets its verdicts would loop.
_MAX_REFUSED_ROUNDS = 20


# A record to produce again with its refusal: (None, refusal) when no record
# matched the report, (record, None) for a record never sent.
_Work = tuple[OutputRecord | None, Refusal | None]


class RefusedBatchSettling:
    """Refused batches settled in place (at_least_once) or through the
    replay of an aborted transaction (exactly_once_v2). See the module
    docstring. Polling thread only.
    """

    # Supplied by the channel (`output.OutputChannel`).
    _config: StreamsConfig
    _settings: dict[str, Any]
    _plain: Producer | None
    transactions: Transactions | None
    errors: OutputErrors
    _on_stall: Callable[[int], None]
    _collector: RecordCollector

    @property
    def producer(self) -> Producer:
        raise NotImplementedError

    def _produce(self, records: list[OutputRecord], key: TopicPartitionKey | None = None) -> int:
        raise NotImplementedError

    def _produce_run(
        self, records: list[OutputRecord], key: TopicPartitionKey | None = None
    ) -> int:
        raise NotImplementedError

    def _serve_reports(self, call: Callable[[], int]) -> int:
        raise NotImplementedError

    def _init_settling(self) -> None:
        """The settling state; the channel calls it once `errors` exists."""
        self._refusals: list[Refusal] = []  # reports not settled yet
        self._in_flight = InFlight()  # at_least_once: what reports can be about
        self._unsent: list[OutputRecord] = []  # at_least_once: not produced (producer dead)
        self._dead: KafkaError | None = None  # at_least_once: the producer failed fatally
        self._resent_ids: set[int] = set()  # records produced again since output settled
        self._resolving = False
        self._careful: Producer | None = None  # at_least_once: one record at a time
        self._careful_error: KafkaError | None = None
        self._verdicts = Verdicts()  # exactly_once_v2: what the last refusals taught
        self._commits_seen = 0  # exactly_once_v2: Transactions.committed at the last drain
        # exactly_once_v2: the handler's counts as of the last commit (what an
        # aborted transaction skipped or dead-lettered is done again in the replay)
        self._committed_counts: ProductionCounts = self.errors.counts.settled()
        self._refused_rounds = 0  # exactly_once_v2: refused transactions since a commit
        self._admin: AdminClient | None = None

    # --- a failed producer, an aborted or committed transaction ----------------

    def _note_fatal(self, error: KafkaError) -> None:
        """The producer failed fatally (at_least_once: settled by `_resolve`)."""
        if self.transactions is not None:
            if breaks_producer(error):
                self.transactions.note_broken(error)
            return
        if self._dead is None:
            log.warning("producer_failed_refused_batch", error=error.str(), code=error.name())
            self._dead = error

    def discard(self) -> None:
        """After an aborted transaction: drop undrained output and its reports,
        and learn from refused records for the replay (exactly_once_v2)."""
        self._collector.take_all()
        self.errors.take_failure()
        if self.transactions is not None:
            # A commit since the last drain: the restore below keeps its counts.
            self._note_commits()
            self.errors.counts.restore(self._committed_counts)
        self._judge_refusals()

    def _note_commits(self) -> None:
        """exactly_once_v2, before a transaction begins or ends: what the
        transactions committed since the last call settled (the handler's
        counts, verdicts met, the refused rounds)."""
        assert self.transactions is not None
        if self.transactions.committed == self._commits_seen:
            return
        self._commits_seen = self.transactions.committed
        self._committed_counts = self.errors.counts.settled()
        self._refused_rounds = 0
        if self._verdicts:
            # The replay's records met before that commit are settled.
            self._verdicts.committed()

    def _put_aside(
        self, records: list[OutputRecord], at: OutputRecord, key: TopicPartitionKey | None
    ) -> int:
        """at_least_once, the producer died at `at`: hold what was produced,
        keep the rest for `_resolve` (in order)."""
        index = next(i for i, record in enumerate(records) if record is at)
        produced = records[:index]
        if produced:
            if key is not None:
                self._in_flight.hold(key, produced)
            else:
                self._in_flight.hold_mixed(produced)
        self._unsent.extend(records[index:])
        return len(records)

    def _doomed(self, error: KafkaError, producer: Producer) -> bool:
        """exactly_once_v2: whether `produce()` failed because the open
        transaction is doomed (a refused record; librdkafka answers `_STATE`)."""
        assert self.transactions is not None
        if self.transactions.broken is None and error.code() == KafkaError._STATE:
            # The refusal's report may not have been served yet.
            self._serve_reports(lambda: producer.poll(0))
        if self.transactions.broken is None and (
            error.txn_requires_abort() or error.code() == KafkaError._STATE
        ):
            # `_STATE`: the transaction is not in a state to produce (it
            # failed: an abortable error); abort and rewind recover.
            self.transactions.note_doomed(error)
        return self.transactions.broken is not None

    # --- refused batches under at_least_once ----------------------------------

    def _unsettled(self) -> bool:
        return bool(self._refusals) or self._dead is not None or bool(self._unsent)

    def _forget_settled(self) -> None:
        """Let go of held records the producer settled (`InFlight.trim`);
        not while refusals wait (their records must stay matchable)."""
        if self._unsettled():
            return
        pending = len(self.producer)
        self._in_flight.trim(pending)
        if pending == 0:
            self._resent_ids.clear()

    def _resolve(self) -> None:
        """at_least_once: settle refused batches in place (module docstring).

        Polling thread, never while a list is half produced. Raises
        ProductionFailed when the handler says stop (a culprit under
        log_and_fail, a changelog record); a failure that is not a refusal
        is left for `take_failure`.
        """
        if self._resolving or not self._unsettled():
            return
        self._resolving = True
        started = time.monotonic()
        counts = self.errors.counts
        before = (counts.resent, counts.isolated, counts.skipped, counts.dead_lettered)
        waiting: list[_Work] = []
        try:
            while True:
                self._settle(self._plain)
                if self.errors.failed:
                    return  # not a refusal (an outage, authorization): stop
                refusals, self._refusals = self._refusals, []
                unsent, self._unsent = self._unsent, []
                dead, self._dead = self._dead, None
                if not refusals and dead is None and not unsent and not waiting:
                    break
                pairs = self._in_flight.match(refusals)
                self._in_flight.clear()
                lowered = self._lower_limits(refusals)
                if dead is not None or lowered or refusals:
                    # Fatal under the gap-less guarantee; without it, a new
                    # producer costs little and starts with a clean slate.
                    self._replace_plain_producer()
                work: list[_Work] = [(record, refusal) for record, refusal in pairs]
                waiting = self._produce_again(
                    work + [(record, None) for record in unsent] + waiting, lowered
                )
        finally:
            self._resolving = False
            self._close_careful()
            after = (counts.resent, counts.isolated, counts.skipped, counts.dead_lettered)
            if after != before:
                log.warning(
                    "refused_batch_settled",
                    resent=after[0] - before[0],
                    produced_alone=after[1] - before[1],
                    skipped=after[2] - before[2],
                    dead_lettered=after[3] - before[3],
                    seconds=round(time.monotonic() - started, 3),
                )

    def _produce_again(self, work: list[_Work], lowered: bool) -> list[_Work]:
        """Produce `work` again in order: records with their refusal, records
        never sent (no refusal), refusals no record matched (no record).
        Returns what is left when a batch produced here was refused in turn
        (settled in the next round, before these).
        """
        pairs = [(record, refusal) for record, refusal in work if refusal is not None]
        decided = iter(classify(pairs, lowered))
        run: list[OutputRecord] = []
        for position, (matched, refusal) in enumerate(work):
            decision: Decision = RESEND if refusal is None else next(decided)
            if matched is not None:
                record = matched
            else:
                assert refusal is not None  # a work item has a record or a refusal
                record = refusal.as_record()
            if (
                decision == RESEND
                and refusal is not None
                and refusal.code in SIZE_ERROR_CODES
                and id(record) in self._resent_ids
            ):
                # Refused for its size again under the lowered limit: find out alone.
                decision = SUSPECT
            if decision == RESEND:
                run.append(record)
                continue
            assert refusal is not None
            if decision == CULPRIT:
                self.errors.refused(record, refusal.error)
                continue
            # A suspect goes alone, after everything before it is settled.
            self._resend(run)
            run = []
            self._settle(self._plain)
            if self._unsettled():
                return work[position:]
            verdict = self._produce_alone(record)
            if verdict is not None:
                self.errors.refused(record, verdict)
        self._resend(run)
        self._settle(self._plain)
        return []

    def _resend(self, records: list[OutputRecord]) -> None:
        if not records:
            return
        self._resent_ids.update(id(record) for record in records)
        self.errors.counts.resent += len(records)
        self._produce(records)

    def _settle(self, producer: Producer | None) -> None:
        """Serve every report the producer owes (a dead one purges quickly).

        Ends on the producer's own count, not on what `flush` returned: a
        flush that raises the gap-less fatal error counts as 0 in
        `_serve_reports` while reports may still wait to be served, and a
        record whose report was not served before `_resolve` lets go of the
        records in flight would be lost (a CI run lost one that way)."""
        if producer is None:
            return
        waited_since = time.monotonic()
        while True:
            self._serve_reports(lambda: producer.flush(1.0))
            if len(producer) == 0:
                return
            if time.monotonic() - waited_since > FLUSH_STALL_S:
                self._on_stall(len(producer))
                waited_since = time.monotonic()

    def _produce_alone(self, record: OutputRecord) -> KafkaError | None:
        """Produce `record` alone and wait for it: None if the broker took it,
        else why not. Through a producer without the gap-less guarantee: a
        record refused alone leaves nothing behind it to keep in order."""
        self.errors.counts.isolated += 1
        if self._careful is None:
            settings = dict(self._settings)
            # Absent rather than false: librdkafka warns about the setting
            # (experimental) whenever it is given.
            settings.pop("enable.gapless.guarantee", None)
            settings["linger.ms"] = 0
            settings["on_delivery"] = self._on_careful_delivery
            settings["client.id"] = f"{settings.get('client.id', 'streams')}-alone"
            self._careful = Producer(settings)
        topic, partition, key, value, timestamp, headers = record[:6]
        self._careful_error = None
        try:
            self._careful.produce(
                topic,
                value,
                key,
                partition=partition,
                timestamp=timestamp if timestamp > 0 else 0,
                headers=headers,  # type: ignore[arg-type]
            )
        except KafkaException as exc:
            refused: KafkaError = exc.args[0]
            return refused
        self._settle(self._careful)
        return self._careful_error

    def _on_careful_delivery(self, error: KafkaError | None, _message: Message) -> None:
        if error is not None:
            self._careful_error = error

    def _close_careful(self) -> None:
        careful, self._careful = self._careful, None
        if careful is not None:
            with contextlib.suppress(Exception):
                careful.flush(1.0)
                careful.close()

    def _replace_plain_producer(self) -> None:
        """A new producer from the current settings; the old one is settled."""
        old, self._plain = self._plain, Producer(self._settings)
        if old is not None:
            with contextlib.suppress(Exception):
                old.close()
        log.info("producer_replaced", reason="refused batch")

    def _lower_limits(self, refusals: list[Refusal]) -> bool:
        """After size refusals: lower the producer's `message.max.bytes` to
        what the refusing topics allow now. True if the producer must be
        rebuilt (it then refuses, at produce(), what is too large)."""
        topics = sorted({r.topic for r in refusals if r.code in SIZE_ERROR_CODES})
        if not topics:
            return False
        if self._admin is None:
            self._admin = AdminClient(admin_config(self._config))
        limit = smallest_max_message_bytes(self._admin, topics, _DESCRIBE_TIMEOUT_S)
        if limit is None:
            log.warning("topic_limit_unknown", topics=topics)
            return False
        allowed = max(1000, limit - FRAMING_BYTES)
        current = int(self._settings.get("message.max.bytes", 1_000_000))
        if allowed >= current:
            return False
        self._settings["message.max.bytes"] = allowed
        if "batch.size" in self._settings:
            self._settings["batch.size"] = min(int(self._settings["batch.size"]), allowed)
        self.errors.max_record_bytes = allowed
        log.warning(
            "producer_limit_lowered",
            topics=topics,
            max_message_bytes=limit,
            producer_message_max_bytes=allowed,
        )
        return True

    # --- refused records under exactly_once_v2 ----------------------------------

    def _judge_refusals(self) -> None:
        """Turn the refusals of the aborted transaction into verdicts for its
        replay; rebuild the producer if a topic's limit was lowered."""
        if self.transactions is None:
            return
        refusals, self._refusals = self._refusals, []
        pairs = self._in_flight.match(refusals) if refusals else []
        self._in_flight.clear()
        if not pairs:
            self._verdicts.aborted()
            return
        self._refused_rounds += 1
        if self._refused_rounds > _MAX_REFUSED_ROUNDS:
            first = refusals[0]
            self.errors.fail(
                ProductionFailed(
                    f"{self._refused_rounds} transactions in a row were refused by the "
                    f"broker (last: {first.topic}[{first.partition}]: {first.error.name()}: "
                    f"{first.error.str()}), and their replays never met the records found "
                    "refused: is the output different on every replay (the wall clock in "
                    "keys or values)? Nothing past the last commit was committed"
                )
            )
        lowered = self._lower_limits(refusals)
        decisions = classify(pairs, lowered, known_alone=self._verdicts.was_alone)
        for (record, refusal), decision in zip(pairs, decisions, strict=True):
            if decision != RESEND and record is not None:
                self._verdicts.add(record, decision, refusal.error)
        self._verdicts.aborted()
        if not self.transactions.open:
            # A new producer: librdkafka keeps the refused batch's sequence
            # numbers past the abort, and the next transaction then failed
            # with OUT_OF_ORDER_SEQUENCE_NUMBER ("requires epoch bump", seen
            # on Kafka 4); a new producer's init_transactions starts clean,
            # with the lowered `message.max.bytes` if a limit was learnt.
            self.transactions.replace_producer()
        log.warning(
            "transaction_refused_records",
            refused=len(refusals),
            culprits=decisions.count(CULPRIT),
            suspects=decisions.count(SUSPECT),
            producer_limit_lowered=lowered,
            first=f"{refusals[0].topic}[{refusals[0].partition}]: {refusals[0].error.name()}",
        )

    def _produce_judged(self, records: list[OutputRecord]) -> int:
        """exactly_once_v2 after a refused transaction: culprits go to the
        handler, suspects are produced alone, the rest as usual."""
        verdicts = self._verdicts
        run: list[OutputRecord] = []
        for record in records:
            verdict = verdicts.lookup(record)
            if verdict is None:
                run.append(record)
                continue
            decision, error = verdict
            if run:
                self._produce_run(run)
                run = []
            if decision == CULPRIT:
                self.errors.refused(record, error)
                continue
            if not self._isolate(record):
                return len(records)  # doomed: redone after the abort and rewind
        if run:
            self._produce_run(run)
        return len(records)

    def _isolate(self, record: OutputRecord) -> bool:
        """Produce a suspect alone in the open transaction; False if the
        transaction is doomed (then by this record, if it was refused)."""
        assert self.transactions is not None
        producer = self.producer
        timeout_s = self.transactions.timeout_s
        self._serve_reports(lambda: producer.flush(timeout_s))
        if self.transactions.broken is not None:
            return False
        self.errors.counts.isolated += 1
        self._verdicts.note_alone(record)
        self._produce_run([record])
        remaining = self._serve_reports(lambda: producer.flush(timeout_s))
        if self.transactions.broken is not None:
            return False
        if remaining == 0:
            self._verdicts.acquit(record)
            log.info("suspect_record_accepted", topic=record[0], origin=origin_of(record))
        return True
