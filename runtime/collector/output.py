"""The output side of the polling thread: the shared producer and what feeds it.

`OutputChannel` owns the process's one producer (a transactional one under
exactly_once_v2, wrapped by `Transactions`), moves the record collector's
buffers into it, and reads its delivery reports. Reports are error-only:
refusals go to the production exception handler (`production_errors.OutputErrors`);
a success costs nothing (no Python call per output record). The changelog
positions that checkpoints name are asked of the broker once per commit
instead (`Committer`, after the output is acknowledged).

A refused batch is settled so that only records refused for themselves
reach the handler, every other record reaches its topic in order, and
nothing is committed past a record whose fate is open: what librdkafka
reports is in `refusals.py`, how the channel settles it (in place under
at_least_once, through the aborted transaction's replay under
exactly_once_v2) in `refused_batches.py`, the base class of `OutputChannel`.

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

from runtime.collector.collector import OutputRecord, RecordCollector, TopicPartitionKey
from runtime.collector.production_errors import OutputErrors, ProductionCounts, ProductionFailed
from runtime.collector.refusals import NOT_SENT_CODES, REFUSAL_CODES, Refusal
from runtime.collector.refused_batches import (
    FLUSH_STALL_S,
    FRAMING_BYTES,
    RefusedBatchSettling,
)
from runtime.collector.transactions import (
    Transactions,
    breaks_producer,
    stable_transactional_id,
)
from runtime.config import StreamsConfig
from runtime.kafka.broker_health import Retrying
from runtime.kafka.clients import producer_config
from runtime.kafka.error_chain import kafka_error_in
from runtime.logging import get_logger, repair_chain

log = get_logger("runtime.output")

# A metadata request when a record names a partition the producer has not seen.
_METADATA_TIMEOUT_S = 5.0
# `serve()` polls the producer at most this often. A poll releases the GIL,
# and while a processing thread runs Python, taking it back waits up to the
# interpreter's switch interval (5 ms): a poll on every loop turn doubled the
# GIL waits of a turn whose only other one is consume(), halving the batches
# the polling thread could route per second. Reports are error-only, so
# there is rarely anything to serve; `flush()` serves everything anyway.
_SERVE_INTERVAL_S = 0.05


def _enabled(value: object) -> bool:
    return str(value).strip().lower() in ("true", "1")


class OutputChannel(RefusedBatchSettling):
    """The shared producer, the collector drain and the delivery reports;
    refused batches are settled by the base class (refused_batches.py).

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
                max(1000, max_message_bytes - FRAMING_BYTES),
            )
        # Kept: a producer built later (a lower limit learnt, a fatal error)
        # is built from the same settings.
        self._settings = settings
        self.transactions: Transactions | None = None
        self._plain: Producer | None = None
        if config.exactly_once:
            app_dir = Path(config.state_dir) / config.application_id
            settings["transactional.id"] = stable_transactional_id(
                app_dir, config.application_id, config.process_slot
            )
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
        self._init_settling()  # refused batches (refused_batches.py)

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
                    # Positional: confluent-kafka's C parser takes keywords
                    # by name lookups (1.06 against 0.71 us a call, measured).
                    # Its order: topic, value, key, partition, callback,
                    # on_delivery (None: the producer's own), timestamp,
                    # headers. A timestamp of 0 asks the producer for "now":
                    # used when the input had none (-1).
                    produce(
                        topic,
                        value,
                        rkey,
                        partition,
                        None,
                        None,
                        timestamp if timestamp > 0 else 0,
                        headers,  # type: ignore[arg-type]
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
        polling thread (rule 3), a raw KafkaError too (runtime.kafka.error_chain):
        it may have interrupted a delivery report being served, and a record
        whose report was lost would be neither produced again nor handed to
        the handler (the one fresh-clone run that settled it like the forms
        above lost one record; that it was this path is not proven). The
        polling thread commits nothing after it.
        """
        try:
            return call()
        except (KafkaException, SystemError) as exc:
            error = kafka_error_in(exc)
            repair_chain(exc)  # whatever is raised from here must be loggable
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
            if time.monotonic() - waited_since > FLUSH_STALL_S:
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
            self._note_fatal(kafka_error_in(exc) or KafkaError(KafkaError._FATAL))
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
