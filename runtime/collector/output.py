"""The output side of the polling thread: the shared producer and what feeds it.

`OutputChannel` owns the process's one producer (a transactional one under
exactly_once_v2, wrapped by `Transactions`), moves the record collector's
buffers into it, and reads its delivery reports. Reports are error-only:
refusals go to the production exception handler (`production.OutputErrors`);
a success costs nothing (no Python call per output record). The changelog
positions that checkpoints name are asked of the broker once per commit
instead (`Committer`, after the output is acknowledged).

A refused batch (see production.py for what librdkafka reports) is settled
so that only records refused for themselves reach the handler, every other
record reaches its topic in order, and nothing is committed past a record
whose fate is open:

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
  loop ends. The commit's flush (`flush`) returns only once all of this is
  settled, so offsets never pass a record whose fate is open (rule 3).
  confluent-kafka raises the gap-less fatal error from `poll()`/`flush()`,
  and can run delivery callbacks while that error is pending, where the
  first call into the library raises SystemError (measured: a report was
  lost that way until `_on_delivery` handled it).
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

Used by the polling thread only: the producer is not shared with any other
thread, and delivery reports are served inside its `poll()`/`flush()` calls
(or, under exactly_once_v2, inside a transactional call that a helper thread
makes while the polling thread waits for it).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer
from confluent_kafka.admin import AdminClient

from runtime.collector.collector import OutputRecord, RecordCollector, TopicPartitionKey
from runtime.collector.production_errors import (
    CULPRIT,
    NOT_SENT_CODES,
    REFUSAL_CODES,
    RESEND,
    SIZE_ERROR_CODES,
    SUSPECT,
    Decision,
    InFlight,
    OutputErrors,
    ProductionCounts,
    ProductionFailed,
    Refusal,
    Verdicts,
    classify,
    origin_of,
)
from runtime.collector.transactions import (
    Transactions,
    breaks_producer,
    stable_transactional_id,
)
from runtime.config import StreamsConfig
from runtime.kafka.broker_health import Retrying
from runtime.kafka.clients import admin_config, producer_config
from runtime.kafka.topics import smallest_max_message_bytes
from runtime.logging import get_logger

log = get_logger("runtime.output")

# A flush that makes no progress for this long is reported as a broker outage
# (a stalled broker raises no client error until socket timeouts expire).
_FLUSH_STALL_S = 5.0
# A metadata request when a record names a partition the producer has not seen.
_METADATA_TIMEOUT_S = 5.0
# `serve()` polls the producer at most this often. A poll releases the GIL,
# and while a processing thread runs Python, taking it back waits up to the
# interpreter's switch interval (5 ms): a poll on every loop turn doubled the
# GIL waits of a turn whose only other one is consume(), halving the batches
# the polling thread could route per second. Reports are error-only, so
# there is rarely anything to serve; `flush()` serves everything anyway.
_SERVE_INTERVAL_S = 0.05
# DescribeConfigs of a topic that refused a batch as too large.
_DESCRIBE_TIMEOUT_S = 10.0
# exactly_once_v2: refused transactions in a row (no commit between) after
# which the app stops: a replay that never meets its verdicts would loop.
_MAX_REFUSED_ROUNDS = 20
# Room for record and batch framing under a topic's `max.message.bytes`
# (as at start-up: the producer's limit counts key, value and headers only).
_FRAMING_BYTES = 1024


# A record to produce again with its refusal: (None, refusal) when no record
# matched the report, (record, None) for a record never sent.
_Work = tuple[OutputRecord | None, Refusal | None]


def _enabled(value: object) -> bool:
    return str(value).strip().lower() in ("true", "1")


def _kafka_error_in(exc: BaseException) -> KafkaError | None:
    """The KafkaError an exception carries, or one it was raised from."""
    seen: BaseException | None = exc
    for _ in range(4):
        if seen is None:
            return None
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        seen = seen.__cause__ or seen.__context__
    return None


class OutputChannel:
    """The shared producer, the collector drain and the delivery reports.

    Called by the polling thread only.
    """

    def __init__(
        self,
        config: StreamsConfig,
        collector: RecordCollector,
        max_message_bytes: int | None,
        on_client_error: Callable[[KafkaError], None],
        on_stall: Callable[[int], None],
        client_id: str | None = None,
        retrying: Retrying | None = None,
    ) -> None:
        self._config = config
        self._collector = collector
        self._on_stall = on_stall
        self._on_client_error = on_client_error
        settings = producer_config(
            config, {"error_cb": self._on_producer_error, "on_delivery": self._on_delivery}
        )
        if client_id is not None:
            settings["client.id"] = client_id
        # Error-only reports: a success report is one Python call (and one
        # GIL acquisition) per output record on this thread. Changelog
        # positions are looked up once per commit instead (committer.py).
        settings["delivery.report.only.error"] = True
        if max_message_bytes is not None:
            # Records too large for a topic are then refused by produce(),
            # where the record and its origin are at hand (see production.py).
            settings["message.max.bytes"] = min(
                int(settings.get("message.max.bytes", 1_000_000)),
                max(1000, max_message_bytes - _FRAMING_BYTES),
            )
        # Kept: a producer built later (a lower limit learnt, a fatal error)
        # is built from the same settings.
        self._settings = settings
        self.transactions: Transactions | None = None
        self._plain: Producer | None = None
        if config.exactly_once:
            app_dir = Path(config.state_dir) / config.application_id
            settings["transactional.id"] = stable_transactional_id(app_dir, config.application_id)
            settings.setdefault("transaction.timeout.ms", 10000)
            timeout_s = max(10.0, int(settings["transaction.timeout.ms"]) / 1000.0)
            self.transactions = Transactions(
                lambda: Producer(self._settings), timeout_s, retrying=retrying
            )
        else:
            if _enabled(settings.get("enable.idempotence", False)):
                # Nothing after a refused batch may reach its partition before
                # the batch's good records are produced again (rule 2): see
                # the module docstring. A user setting wins.
                settings.setdefault("enable.gapless.guarantee", True)
            self._plain = Producer(settings)
        self._gapless = _enabled(settings.get("enable.gapless.guarantee", False))
        self.errors = OutputErrors(
            config.production_exception_handler,
            config.dead_letter_queue_topic,
            int(settings.get("message.max.bytes", 1_000_000)),
            config.exactly_once,
            send=self._produce,
            application_id=config.application_id,
        )
        self.produced_total = 0
        self._next_serve = 0.0  # time.monotonic() of the next producer poll
        # --- refused batches (see the module docstring) ---
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
        self._committed_counts = self.errors.counts.settled()
        self._refused_rounds = 0  # exactly_once_v2: refused transactions since a commit
        self._admin: AdminClient | None = None

    @property
    def producer(self) -> Producer:
        """The current producer (under EOS a fenced one is replaced on abort)."""
        if self.transactions is not None:
            return self.transactions.producer
        assert self._plain is not None
        return self._plain

    @property
    def error_counts(self) -> ProductionCounts:
        return self.errors.counts

    # --- producing ------------------------------------------------------------

    def hand_over(self, batch: list[OutputRecord]) -> None:
        """Queue a task's output behind what the collector holds (commit, close)."""
        self._collector.hand_over(batch)

    def drain(self) -> int:
        """Move every buffered output record into the producer; how many.

        Under at_least_once a refused batch is settled first: its records
        come before anything drained now (rule 2).
        """
        if self.transactions is None:
            self._resolve()
        buffers = self._collector.take_all()
        if not buffers:
            return 0
        if self.transactions is not None:
            self._note_commits()
            if not self.transactions.ensure_open():
                return 0  # a broken producer: the work is rewound with the abort
        produced = 0
        for key, records in buffers.items():
            produced += self._produce(records, key)
        self.produced_total += produced
        return produced

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

    def send(self, records: list[OutputRecord]) -> int:
        """Produce records straight away, in order (no collector in between)."""
        if self.transactions is not None:
            self._note_commits()
            if not self.transactions.ensure_open():
                return 0  # a broken producer: the work is rewound with the abort
        else:
            self._resolve()
        produced = self._produce(records)
        self.produced_total += produced
        return produced

    def _produce(self, records: list[OutputRecord], key: TopicPartitionKey | None = None) -> int:
        """Records in order, each to its own partition. Refusals go to the handler.

        `key`: the one partition all `records` are for (a collector buffer),
        else any. Never settles refused batches itself (its callers do, when
        no list is half produced).
        """
        if self._verdicts:
            return self._produce_judged(records)
        return self._produce_run(records, key)

    def _produce_run(
        self, records: list[OutputRecord], key: TopicPartitionKey | None = None
    ) -> int:
        """`_produce` without verdicts (the hot path)."""
        if self._dead is not None:
            # at_least_once, the producer failed: these wait for `_resolve`.
            self._unsent.extend(records)
            return len(records)
        producer = self.producer
        produce = producer.produce
        for record in records:
            topic, partition, rkey, value, timestamp, headers, _st, _sp, _so = record
            refreshed = False
            while True:
                try:
                    produce(
                        topic,
                        value,
                        rkey,
                        partition=partition,
                        # 0 asks the producer for "now": used when the
                        # input had no timestamp (-1).
                        timestamp=timestamp if timestamp > 0 else 0,
                        headers=headers,  # type: ignore[arg-type]
                    )
                    break
                except BufferError:
                    # The producer's queue is full (a slow or absent broker):
                    # serve delivery reports until there is room.
                    self._serve_reports(lambda: producer.poll(0.1))
                    if self._dead is not None:
                        return self._put_aside(records, record, key)
                except KafkaException as exc:
                    error: KafkaError = exc.args[0]
                    if self.transactions is not None:
                        if breaks_producer(error):
                            # Fenced or fatally failed: nothing more can be
                            # produced; the abort and rewind redo this work.
                            self.transactions.note_broken(error)
                            return len(records)
                        if self._doomed(error, producer):
                            return len(records)  # redone after the abort and rewind
                    elif error.fatal() or self._dead is not None:
                        self._note_fatal(error)
                        return self._put_aside(records, record, key)
                    if not refreshed and error.code() == KafkaError._UNKNOWN_PARTITION:
                        # A partition added a moment ago (a static partitioner
                        # placed a key there during an expansion this instance
                        # has not accepted yet): learn it, then try once more.
                        refreshed = self._refresh_metadata(topic)
                        if refreshed:
                            continue
                    # Refused for good (too large, ...): the handler skips it,
                    # dead-letters it, or raises ProductionFailed.
                    self.errors.on_produce_error(record, exc)
                    break
        if key is not None:
            self._in_flight.hold(key, records)
        else:
            self._in_flight.hold_mixed(records)
        return len(records)

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

    def _refresh_metadata(self, topic: str) -> bool:
        """Ask the cluster for `topic`'s partitions (the producer keeps what it
        hears); False if the request failed."""
        try:
            self.producer.list_topics(topic, timeout=_METADATA_TIMEOUT_S)
        except KafkaException as exc:
            log.warning("producer_metadata_failed", topic=topic, error=str(exc))
            return False
        log.info("producer_metadata_refreshed", topic=topic, reason="unknown partition")
        return True

    def produce_one(self, topic: str, key: bytes | None, value: bytes | None) -> None:
        """A control record (status, shutdown request) on partition 0 of `topic`."""
        if self.transactions is not None:
            self._note_commits()
            if not self.transactions.ensure_open():
                return  # a broken producer: the next status goes out after the abort
        else:
            self._resolve()
        try:
            self.producer.produce(topic, value, key, partition=0)
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if self.transactions is None and (error.fatal() or self._dead is not None):
                # Produced again, in order, once the refused batch is settled.
                self._note_fatal(error)
                self._unsent.append((topic, 0, key, value, -1, None, "", -1, -1))
                return
            if self.transactions is None or not breaks_producer(error):
                raise
            # Fenced between two loop turns: the abort and rewind follow.
            self.transactions.note_broken(error)

    def serve(self) -> None:
        """Serve delivery reports and client errors without blocking, at most
        every `_SERVE_INTERVAL_S` (see there); settle a refused batch
        (at_least_once)."""
        now = time.monotonic()
        if now < self._next_serve:
            return
        self._next_serve = now + _SERVE_INTERVAL_S
        producer = self.producer
        self._serve_reports(lambda: producer.poll(0))
        if self.transactions is None:
            self._resolve()
        # Here, not per drain: a pass over the held partitions every
        # `_SERVE_INTERVAL_S` is cheap, and holds little more.
        self._forget_settled()

    def _serve_reports(self, call: Callable[[], int]) -> int:
        """`poll()`/`flush()`: what they return, or 0 once the producer broke.

        confluent-kafka raises a fatal producer error (a fence under
        exactly_once_v2, the gap-less guarantee under at_least_once) from
        whichever call serves callbacks instead of passing it to `error_cb`;
        and when a delivery callback ran while that error was pending, the
        call raises SystemError instead (measured; see `_on_delivery`).
        Under EOS a fence is noted like any other: the next commit aborts and
        the producer is replaced. Under at_least_once the gap-less failure
        means a refused batch, settled by `_resolve`. Anything else stops the
        polling thread (rule 3).
        """
        try:
            return call()
        except (KafkaException, SystemError) as exc:
            error = _kafka_error_in(exc)
            if self.transactions is not None:
                if error is None or not breaks_producer(error):
                    raise
                self.transactions.note_broken(error)
                return 0
            if error is not None and error.code() == KafkaError._GAPLESS_GUARANTEE:
                self._note_fatal(error)
                return 0
            if isinstance(exc, SystemError) and error is None and self._gapless:
                # The fatal error was taken by a callback that ran while it
                # was pending (a delivery report notes it; a log line may
                # swallow it). `_resolve` settles whatever it was: a new
                # producer, the reports matched, the rest produced again.
                log.warning("producer_fatal_error_taken_by_callback", error=str(exc))
                self._note_fatal(KafkaError(KafkaError._FATAL, str(exc)))
                return 0
            raise

    def flush(self, abort_requested: Callable[[], bool]) -> None:
        """Wait until every produced record is acknowledged (or failed) and
        refused batches are settled (at_least_once).

        Reports a stall through `on_stall(unacknowledged)` every few seconds.
        Raises RuntimeError if `abort_requested()` turns true meanwhile, and
        ProductionFailed when the handler says stop.
        """
        waited_since = time.monotonic()
        while True:
            if self.transactions is None:
                self._resolve()
            remaining = self._serve_reports(self._flush_current)
            if self.errors.failed:
                return  # the committer's take_failure() stops the app
            if self.transactions is None and self._unsettled():
                continue
            if remaining == 0:
                # Under EOS a broken producer ends the wait too: the commit
                # that follows aborts instead.
                if self.transactions is None:
                    self._forget_settled()
                return
            if time.monotonic() - waited_since > _FLUSH_STALL_S:
                self._on_stall(remaining)
                waited_since = time.monotonic()
            if abort_requested():
                raise RuntimeError("shutdown without commit requested during flush")

    def _flush_current(self) -> int:
        return int(self.producer.flush(1.0))

    # --- client errors and delivery reports -------------------------------------

    def _on_producer_error(self, error: KafkaError) -> None:
        """The producer's error callback. Under exactly_once_v2 a fenced or
        fatally failed producer is not the end of the app: the open transaction
        is aborted, the producer replaced and every task rewound."""
        if self.transactions is not None and breaks_producer(error):
            self.transactions.note_broken(error)
            return
        if self.transactions is None and error.code() == KafkaError._GAPLESS_GUARANTEE:
            self._note_fatal(error)
            return
        self._on_client_error(error)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        """A failed delivery (reports are error-only). Runs inside the
        producer's `poll()`/`flush()`, or a transactional call's helper
        thread while the polling thread waits for it.

        Refusals are kept for settling (see the module docstring); other
        failures go to `OutputErrors.on_delivery_error`.
        """
        if error is None:
            return
        try:
            code = error.code()
        except SystemError as exc:
            # confluent-kafka can serve a delivery report while the fatal
            # error it is about to raise is already set (measured with the
            # gap-less guarantee): the first call into the C library raises
            # SystemError from it. Note the error; the calls work again.
            self._note_fatal(_kafka_error_in(exc) or KafkaError(KafkaError._FATAL))
            code = error.code()
        if code in REFUSAL_CODES:
            if self.transactions is not None:
                if code in NOT_SENT_CODES:
                    return  # purged with the doomed transaction: redone after the rewind
                if self.transactions.open:
                    # (A late report of an aborted transaction is judged with
                    # the next abort; it dooms nothing now.)
                    self.transactions.note_doomed(error)
            self._refusals.append(Refusal.read(error, message))
            return
        self.errors.on_delivery_error(error, message)

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
        """Serve every report the producer owes (a dead one purges quickly)."""
        if producer is None:
            return
        waited_since = time.monotonic()
        while True:
            remaining = self._serve_reports(lambda: producer.flush(1.0))
            if remaining == 0 or len(producer) == 0:
                return
            if time.monotonic() - waited_since > _FLUSH_STALL_S:
                self._on_stall(remaining)
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
        allowed = max(1000, limit - _FRAMING_BYTES)
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

    # --- shutdown ---------------------------------------------------------------

    def close(self, timeout_s: float, drain_first: bool) -> None:
        """Abort an open transaction or drain and flush, then close the producer."""
        try:
            if self.transactions is not None and self.transactions.unusable:
                # Fenced: the broker aborts what it left open; no new producer
                # just to close it.
                pass
            elif self.transactions is not None and (
                self.transactions.open or self.transactions.broken is not None
            ):
                # Whatever is still open was not committed with offsets: abort.
                self.transactions.abort()
            elif self.transactions is None and drain_first:
                self.drain()
            remaining = self.producer.flush(timeout_s)
            if remaining:
                log.warning("producer_close_unflushed", unacknowledged=remaining)
        except ProductionFailed as exc:
            # Output refused at shutdown: its offsets were not committed.
            log.warning("producer_close_refused_output", error=str(exc))
        except Exception as exc:
            log.warning("producer_close_failed", error=str(exc))
        finally:
            # Release the clients' threads and connections now, not whenever
            # the App object is garbage-collected.
            with contextlib.suppress(Exception):
                self.producer.close()
            self._close_careful()
            self._admin = None
