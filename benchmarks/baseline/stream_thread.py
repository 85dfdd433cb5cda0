"""One stream thread of the classic model: its own consumer, producer, restore consumer.

The loop of a classic Kafka Streams ``StreamThread``, with the runtime's parts:

    poll own consumer -> route into own tasks' input queues (pause full ones)
    -> restore own stateful tasks (blocking, or one batch when interleaved)
    -> process own ready tasks inline -> produce their output on own producer
    -> every commit.interval.ms: the runtime's commit protocol on own tasks

What is not the model's own comes from the runtime, so a fix there reaches
both sides of the comparison: tasks are created, closed and rewound by
``runtime.polling.active_tasks.ActiveTasks``, output and delivery reports go
through ``runtime.collector.output.OutputChannel``, and commits run
``runtime.polling.committer.Committer`` (with nothing to lock: no other thread
holds these tasks). Rebalance callbacks run inside ``consume()`` on this
thread. Nothing else touches this thread's clients; other threads only read
its counters (racy reads, fine for monitoring) and set the app's gates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from benchmarks.baseline.inline_restore import RESTORE_MODES, InlineRestorer
from runtime.collector.collector import RecordCollector
from runtime.collector.output import OutputChannel
from runtime.config import StreamsConfig
from runtime.kafka.clients import (
    LIBRDKAFKA_PREFETCH,
    consume_available,
    consumer_config,
    fetch_resumed_now,
    log_consume_error,
    restore_consumer_config,
)
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.polling.active_tasks import ActiveTasks
from runtime.polling.committer import Committer
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.topology.topology import Topology

log = get_logger("benchmarks.baseline")

__all__ = ["RESTORE_MODES", "StreamThread", "ThreadGates"]


@dataclass
class ThreadGates:
    """Set by the app: until ``process`` is set no task is processed; until
    ``restore`` is set no task is restored (both set: normal operation)."""

    process: threading.Event = field(default_factory=threading.Event)
    restore: threading.Event = field(default_factory=threading.Event)


class _RunningTasks:
    """The thread's ready tasks, in the order they became ready (processed
    round-robin). The runtime's task manager in the classic model."""

    def __init__(self) -> None:
        self.tasks: dict[str, StreamTask] = {}

    def add_task(self, task: StreamTask) -> None:
        self.tasks[task.id] = task

    def remove_task(self, task_id: str) -> StreamTask | None:
        return self.tasks.pop(task_id, None)


class _NothingToLock:
    """No other thread ever holds this thread's tasks."""

    def lock_all_tasks(self) -> Future[None]:
        future: Future[None] = Future()
        future.set_result(None)
        return future

    def unlock_all_tasks(self) -> None:
        pass

    def wait_for_change(self, timeout: float) -> None:
        pass  # no barrier here: baseline tasks are never key-parallel


class StreamThread(threading.Thread):
    """A classic stream thread. Create, ``start()``, ``request_stop()``, ``join()``."""

    def __init__(
        self,
        index: int,
        config: StreamsConfig,
        topology: Topology,
        layout: TopicLayout,
        settings: TaskSettings,
        gates: ThreadGates,
        restore_mode: str = "blocking",
        on_restored: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(name=f"{config.client_id}-StreamThread-{index}", daemon=True)
        if config.exactly_once:
            raise ValueError("the baseline implements at_least_once only")
        self.index = index
        self._config = config
        self._layout = layout
        self._gates = gates
        self._buffers = InputBuffers(config.buffered_records_per_partition)
        self._stop_event = threading.Event()
        self._abort = False
        self._poll_s = config.poll_ms / 1000.0
        self._timeslice_s = config.task_timeslice_ms / 1000.0
        self._commit_interval_s = config.commit_interval_ms / 1000.0
        self._last_commit = time.monotonic()
        self.fatal_error: BaseException | None = None
        # Monitoring (written here, read racily by other threads).
        self.assigned: frozenset[tuple[str, int]] = frozenset()
        self.rebalances = 0
        self.last_rebalance = time.monotonic()
        self.consumed_total = 0

        multi_source = any(len(s.sources) > 1 for s in topology.subtopologies)
        # As the runtime's polling thread chooses.
        self.assignment_strategy = "range" if multi_source else "cooperative-sticky"
        prefix = f"{config.client_id}-StreamThread-{index}"
        consumer_settings = consumer_config(
            config, self.assignment_strategy, {"error_cb": self._on_client_error}
        )
        # librdkafka's own prefetch, not the runtime's (sized to its input
        # buffers because its polling thread runs ahead of processing and
        # pauses often): a stream thread consumes what it processes and
        # rarely pauses, and the reference must not move with a runtime
        # tuning. Measured (quiet, 3 rounds, 2,000,000-record stateful count
        # at 1 thread): 287-312k records/s with these, 229-246k with the
        # runtime's. A `consumer.*` setting still wins.
        for key, value in LIBRDKAFKA_PREFETCH.items():
            if key not in config.consumer_overrides:
                consumer_settings[key] = value
        consumer_settings["client.id"] = f"{prefix}-consumer"
        restore_settings = restore_consumer_config(config)
        restore_settings["client.id"] = f"{prefix}-restore-consumer"
        self._consumer = Consumer(consumer_settings)
        self._output = OutputChannel(
            config,
            RecordCollector(),
            layout.max_message_bytes,
            on_client_error=self._on_client_error,
            on_stall=lambda unacknowledged: log.warning(
                "flush_waiting", unacknowledged=unacknowledged
            ),
            client_id=f"{prefix}-producer",
        )
        self._restorer = InlineRestorer(
            restore_settings, restore_mode, self._stop_event.is_set, on_restored
        )
        self._running = _RunningTasks()
        self._tasks = ActiveTasks(
            topology,
            layout,
            settings,
            self._buffers,
            self._running,
            self._restorer,
            self._output,
            self._consumer,
            release_standby=lambda task_id: None,
        )
        self._committer = Committer(
            _NothingToLock(), self._output, self._consumer, lambda: self._abort
        )

    # --- other threads ---------------------------------------------------------

    def request_stop(self, commit: bool = True) -> None:
        if not commit:
            self._abort = True
        self._stop_event.set()

    @property
    def processed_total(self) -> int:
        running = list(self._running.tasks.values())
        return self._tasks.closed_totals["processed"] + sum(t.processed_count for t in running)

    @property
    def produced_total(self) -> int:
        return self._output.produced_total

    @property
    def commits_total(self) -> int:
        return self._committer.commits_total

    @property
    def commit_failures_total(self) -> int:
        return self._committer.failures_total

    @property
    def restored_total(self) -> int:
        return self._restorer.restored_total

    @property
    def restore_times(self) -> dict[str, tuple[float, float]]:
        return self._restorer.restore_times

    @property
    def restore_started(self) -> dict[str, float]:
        return self._restorer.restore_started

    def task_states(self) -> dict[str, str]:
        """task id -> RUNNING / RESTORING (racy snapshot)."""
        states = {t: "RUNNING" for t in list(self._running.tasks)}
        for t in self._restorer.pending_ids():
            states[t] = "RESTORING"
        return states

    def task_processed(self) -> dict[str, int]:
        return {t.id: t.processed_count for t in list(self._running.tasks.values())}

    def unacknowledged(self) -> int:
        """Records in this thread's producer not acknowledged yet (thread-safe)."""
        return len(self._output.producer)

    # --- the loop ----------------------------------------------------------------

    def run(self) -> None:
        log.info("stream_thread_started", assignment_strategy=self.assignment_strategy)
        try:
            self._consumer.subscribe(
                sorted(self._layout.subtopology_of),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stop_event.is_set():
                self.run_once()
            if not self._abort:
                self.commit_all("shutdown")
        except BaseException as exc:  # noqa: BLE001 - reported through fatal_error
            self.fatal_error = exc
            self._abort = True
            log.error("stream_thread_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._close()
            log.info("stream_thread_stopped")

    def run_once(self) -> None:
        processing = self._gates.process.is_set()
        has_work = processing and any(t.buffered for t in self._running.tasks.values())
        if has_work or self._restorer.stepping:
            timeout = 0.0
        elif self._buffers.any_paused:
            timeout = 0.005
        else:
            timeout = self._poll_s
        records = consume_available(self._consumer, self._config.max_poll_records, timeout)
        if records:
            routed, to_pause = self._buffers.route(records, log_consume_error)
            self.consumed_total += routed
            if to_pause:
                self._consumer.pause([TopicPartition(t, p) for t, p in to_pause])
        if self._buffers.any_paused:
            to_resume = self._buffers.to_resume()
            if to_resume:
                partitions = [TopicPartition(t, p) for t, p in to_resume]
                self._consumer.resume(partitions)
                fetch_resumed_now(self._consumer, partitions)
        if self._restorer.pending and self._gates.restore.is_set():
            self._restorer.restore()
            self._tasks.take_restored()
        if self._tasks.unsought:  # a rewind waiting for its committed offsets
            self._tasks.seek_unsought()
        if processing:
            self.process_round()
        self._output.serve()
        refused = self._output.errors.take_failure()
        if refused is not None:
            raise refused
        if time.monotonic() - self._last_commit >= self._commit_interval_s or any(
            t.commit_requested for t in self._running.tasks.values()
        ):
            self.commit_all("interval")

    def process_round(self) -> int:
        """Process every ready task once: until its buffer is empty or its time slice ends."""
        total = 0
        now = time.monotonic()
        for task in list(self._running.tasks.values()):
            if not task.buffered and not task.punctuation_due(now):
                continue
            started = time.monotonic()
            total += task.process(started + self._timeslice_s)
            output = task.take_output()
            if output:
                self._output.send(output)
        return total

    def commit_all(self, reason: str) -> bool:
        """The runtime's commit protocol, on this thread's ready tasks."""
        self._last_commit = time.monotonic()
        tasks = list(self._running.tasks.values())
        if not tasks:
            return True
        with self._committer.tasks_locked():
            return self._committer.commit(tasks, reason).committed

    # --- rebalance (inside consume(), on this thread) -------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._tasks.create(partitions)
            self._note_rebalance()
            log.info(
                "partitions_assigned", partitions=len(partitions), tasks=sorted(self._tasks.ids())
            )
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            affected = self._tasks.of(partitions)
            log.info("partitions_revoked", partitions=len(partitions), tasks=affected)
            if affected:
                if not self._abort:
                    self.commit_all("revocation")
                self._tasks.close(affected, discard_output=self._abort)
            self._note_rebalance()
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            affected = self._tasks.of(partitions)
            log.warning("partitions_lost", partitions=len(partitions), tasks=affected)
            self._tasks.close(affected, discard_output=self._abort)
            self._note_rebalance()
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _note_rebalance(self) -> None:
        self.assigned = frozenset(self._buffers.partitions())
        self.rebalances += 1
        self.last_rebalance = time.monotonic()

    def _fail_in_callback(self, exc: BaseException) -> None:
        log.error("rebalance_callback_failed", error=f"{type(exc).__name__}: {exc}")
        self.fatal_error = exc
        self._abort = True
        self._stop_event.set()

    # --- client callbacks (on this thread) ------------------------------------------

    def _on_client_error(self, error: KafkaError) -> None:
        if error.fatal():
            log.error("client_fatal_error", error=error.str())
            self.fatal_error = KafkaException(error)
            self._abort = True
            self._stop_event.set()
            return
        log.warning("client_error", error=error.str())

    def _close(self) -> None:
        try:
            if self._abort:
                self._tasks.close_all_dirty()
            # Leaves the group; on_revoke commits and closes what is left.
            self._consumer.close()
        except Exception as exc:
            log.warning("consumer_close_failed", error=str(exc))
        self._output.close(self._config.shutdown_timeout_ms / 1000.0, drain_first=not self._abort)
        self._restorer.close()
        self._tasks.close_all_dirty()
