"""The output side of the polling thread: the shared producer and what feeds it.

`OutputChannel` owns the process's one producer (a transactional one under
exactly_once_v2, wrapped by `Transactions`), moves the record collector's
buffers into it, and reads its delivery reports. Reports are error-only:
refusals go to the production exception handler (`production.OutputErrors`);
a success costs nothing (no Python call per output record). The changelog
positions that checkpoints name are asked of the broker once per commit
instead (`Committer`, after the output is acknowledged).

Used by the polling thread only: the producer is not shared with any other
thread, and delivery reports are served inside its `poll()`/`flush()` calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException, Message, Producer

from runtime.collector.collector import OutputRecord, RecordCollector
from runtime.collector.production_errors import OutputErrors, ProductionCounts
from runtime.collector.transactions import (
    Transactions,
    breaks_producer,
    stable_transactional_id,
)
from runtime.config import StreamsConfig
from runtime.kafka.broker_health import Retrying
from runtime.kafka.clients import producer_config
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
                max(1000, max_message_bytes - 1024),
            )
        self.transactions: Transactions | None = None
        self._plain: Producer | None = None
        if config.exactly_once:
            app_dir = Path(config.state_dir) / config.application_id
            settings["transactional.id"] = stable_transactional_id(app_dir, config.application_id)
            settings.setdefault("transaction.timeout.ms", 10000)
            timeout_s = max(10.0, int(settings["transaction.timeout.ms"]) / 1000.0)
            self.transactions = Transactions(
                lambda: Producer(settings), timeout_s, retrying=retrying
            )
        else:
            self._plain = Producer(settings)
        self.errors = OutputErrors(
            config.production_exception_handler,
            config.dead_letter_queue_topic,
            int(settings.get("message.max.bytes", 1_000_000)),
            config.exactly_once,
            send=self._produce,
        )
        self.produced_total = 0
        self._next_serve = 0.0  # time.monotonic() of the next producer poll

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
        """Move every buffered output record into the producer; how many."""
        buffers = self._collector.take_all()
        if not buffers:
            return 0
        if self.transactions is not None and not self.transactions.ensure_open():
            return 0  # a broken producer: the work is rewound with the abort
        produced = 0
        for records in buffers.values():
            produced += self._produce(records)
        self.produced_total += produced
        return produced

    def send(self, records: list[OutputRecord]) -> int:
        """Produce records straight away, in order (no collector in between)."""
        if self.transactions is not None and not self.transactions.ensure_open():
            return 0  # a broken producer: the work is rewound with the abort
        produced = self._produce(records)
        self.produced_total += produced
        return produced

    def _produce(self, records: list[OutputRecord]) -> int:
        """Records in order, each to its own partition. Refusals go to the handler."""
        producer = self.producer
        produce = producer.produce
        for record in records:
            topic, partition, key, value, timestamp, headers, _st, _sp, _so = record
            refreshed = False
            while True:
                try:
                    produce(
                        topic,
                        value,
                        key,
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
                except KafkaException as exc:
                    if self.transactions is not None and breaks_producer(exc.args[0]):
                        # Fenced or fatally failed: nothing more can be
                        # produced; the abort and rewind redo this work.
                        self.transactions.note_broken(exc.args[0])
                        return len(records)
                    if not refreshed and exc.args[0].code() == KafkaError._UNKNOWN_PARTITION:
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
        if self.transactions is not None and not self.transactions.ensure_open():
            return  # a broken producer: the next status goes out after the abort
        try:
            self.producer.produce(topic, value, key, partition=0)
        except KafkaException as exc:
            if self.transactions is None or not breaks_producer(exc.args[0]):
                raise
            # Fenced between two loop turns: the abort and rewind follow.
            self.transactions.note_broken(exc.args[0])

    def serve(self) -> None:
        """Serve delivery reports and client errors without blocking, at most
        every `_SERVE_INTERVAL_S` (see there)."""
        now = time.monotonic()
        if now < self._next_serve:
            return
        self._next_serve = now + _SERVE_INTERVAL_S
        producer = self.producer
        self._serve_reports(lambda: producer.poll(0))

    def _serve_reports(self, call: Callable[[], int]) -> int:
        """`poll()`/`flush()`: what they return, or 0 once the producer broke.

        confluent-kafka raises a fatal producer error (a fence under
        exactly_once_v2) from whichever call serves callbacks instead of
        passing it to `error_cb`. Under EOS it is noted like any other fence:
        the next commit aborts and the producer is replaced. Otherwise it
        stops the polling thread (rule 3).
        """
        try:
            return call()
        except KafkaException as exc:
            if self.transactions is None or not breaks_producer(exc.args[0]):
                raise
            self.transactions.note_broken(exc.args[0])
            return 0

    def flush(self, abort_requested: Callable[[], bool]) -> None:
        """Wait until every produced record is acknowledged (or failed).

        Reports a stall through `on_stall(unacknowledged)` every few seconds.
        Raises RuntimeError if `abort_requested()` turns true meanwhile.
        """
        producer = self.producer
        waited_since = time.monotonic()
        while True:
            remaining = self._serve_reports(lambda: producer.flush(1.0))
            if remaining == 0:
                # Under EOS a broken producer ends the wait too: the commit
                # that follows aborts instead.
                return
            if time.monotonic() - waited_since > _FLUSH_STALL_S:
                self._on_stall(remaining)
                waited_since = time.monotonic()
            if abort_requested():
                raise RuntimeError("shutdown without commit requested during flush")

    # --- client errors and delivery reports -------------------------------------

    def _on_producer_error(self, error: KafkaError) -> None:
        """The producer's error callback. Under exactly_once_v2 a fenced or
        fatally failed producer is not the end of the app: the open transaction
        is aborted, the producer replaced and every task rewound."""
        if self.transactions is not None and breaks_producer(error):
            self.transactions.note_broken(error)
            return
        self._on_client_error(error)

    def _on_delivery(self, error: KafkaError | None, message: Message) -> None:
        # Error-only reports (delivery.report.only.error): never a success.
        if error is not None:
            self.errors.on_delivery_error(error, message)

    def discard(self) -> None:
        """After an aborted transaction: drop undrained output and its reports."""
        self._collector.take_all()
        self.errors.take_failure()

    # --- shutdown ---------------------------------------------------------------

    def close(self, timeout_s: float, drain_first: bool) -> None:
        """Abort an open transaction or drain and flush, then close the producer."""
        try:
            if self.transactions is not None and self.transactions.broken is not None:
                # Fenced: the broker aborts what it left open; no new producer
                # just to close it.
                pass
            elif self.transactions is not None and self.transactions.open:
                # Whatever is still open was not committed with offsets: abort.
                self.transactions.abort()
            elif self.transactions is None and drain_first:
                self.drain()
            remaining = self.producer.flush(timeout_s)
            if remaining:
                log.warning("producer_close_unflushed", unacknowledged=remaining)
            # Release the client's threads and connections now, not whenever
            # the App object is garbage-collected.
            self.producer.close()
        except Exception as exc:
            log.warning("producer_close_failed", error=str(exc))
