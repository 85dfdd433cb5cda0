"""One stream thread of the classic model: its own consumer, producer, restore consumer.

The loop of a classic Kafka Streams ``StreamThread``, with the runtime's parts:

    poll own consumer -> route into own tasks' input queues (pause full ones)
    -> restore own stateful tasks (blocking, or one batch when interleaved)
    -> process own ready tasks inline -> produce their output on own producer
    -> every commit.interval.ms: emit state, produce, flush, commit_state,
       checkpoint, commit offsets (own tasks only, own consumer)

Rebalance callbacks run inside ``consume()`` on this thread: assigned partitions
become tasks (``StreamTask`` exactly as the runtime's polling thread builds
them), revoked ones are committed and closed. Nothing else touches this
thread's clients; other threads only read its counters (racy reads, fine for
monitoring) and set the app's gates.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)

from runtime.collector.collector import OutputRecord
from runtime.config import StreamsConfig
from runtime.logging import get_logger
from runtime.polling.clients import (
    consume_available,
    consumer_config,
    fetch_resumed_now,
    producer_config,
    restore_consumer_config,
)
from runtime.polling.input_buffers import InputBuffers
from runtime.polling.topics import TopicLayout
from runtime.processing.task import StreamTask, TaskSettings, task_id_of
from runtime.topology.topology import Topology

log = get_logger("benchmarks.baseline")

# Changelog records per restore-consumer batch: the runtime's RestorationThread default.
RESTORE_BATCH = 5000
RESTORE_MODES = ("blocking", "interleaved")

TopicPartitionKey = tuple[str, int]


class BaselineFatalError(RuntimeError):
    """A stream thread cannot go on (a failed delivery, a failed task, a client error)."""


@dataclass
class _Restoring:
    task: StreamTask
    store_of: dict[TopicPartitionKey, Any]
    pending: set[TopicPartitionKey]
    started: float = field(default_factory=time.monotonic)
    restored: int = 0


@dataclass
class ThreadGates:
    """Set by the app: until ``process`` is set no task is processed; until
    ``restore`` is set no task is restored (both set: normal operation)."""

    process: threading.Event = field(default_factory=threading.Event)
    restore: threading.Event = field(default_factory=threading.Event)


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
        if restore_mode not in RESTORE_MODES:
            raise ValueError(f"restore_mode must be one of {RESTORE_MODES}, not {restore_mode!r}")
        if config.exactly_once:
            raise ValueError("the baseline implements at_least_once only")
        self.index = index
        self._config = config
        self._layout = layout
        self._settings = settings
        self._gates = gates
        self._restore_mode = restore_mode
        # Called on this thread with a task id as soon as the task is restored
        # (before it is processed): benchmarks take their snapshots there.
        self._on_restored = on_restored
        self._subtopologies = {s.id: s for s in topology.subtopologies}
        self._buffers = InputBuffers(config.buffered_records_per_partition)
        self._tasks: dict[str, StreamTask] = {}
        # Ready tasks, in the order they became ready (processed round-robin).
        self._running: dict[str, StreamTask] = {}
        # Created stateful tasks not restored yet, in creation order.
        self._to_restore: dict[str, StreamTask] = {}
        # Tasks whose changelogs are assigned to the restore consumer now.
        self._restoring: dict[str, _Restoring] = {}
        self._restoring_by_tp: dict[TopicPartitionKey, str] = {}
        self._changelog_topics = set(layout.changelogs)
        self._changelog_produced: dict[TopicPartitionKey, int] = {}
        self._delivery_errors: list[str] = []
        self._stop_event = threading.Event()
        self._abort = False
        self._poll_s = config.poll_ms / 1000.0
        self._timeslice_s = config.task_timeslice_ms / 1000.0
        self._commit_interval_s = config.commit_interval_ms / 1000.0
        self._last_commit = time.monotonic()
        self.fatal_error: BaseException | None = None
        # Monitoring (written here, read racily by other threads).
        self.assigned: frozenset[TopicPartitionKey] = frozenset()
        self.rebalances = 0
        self.last_rebalance = time.monotonic()
        self.consumed_total = 0
        self.produced_total = 0
        self.commits_total = 0
        self.commit_failures_total = 0
        self.restored_total = 0
        # task id -> (restore start, restore end) in time.monotonic() seconds
        self.restore_times: dict[str, tuple[float, float]] = {}
        self.restore_started: dict[str, float] = {}
        self._closed_processed = 0

        multi_source = any(len(s.sources) > 1 for s in topology.subtopologies)
        # As the runtime's polling thread chooses.
        self.assignment_strategy = "range" if multi_source else "cooperative-sticky"
        prefix = f"{config.client_id}-StreamThread-{index}"
        consumer_settings = consumer_config(
            config, self.assignment_strategy, {"error_cb": self._on_client_error}
        )
        consumer_settings["client.id"] = f"{prefix}-consumer"
        producer_settings = producer_config(
            config, {"error_cb": self._on_client_error, "on_delivery": self._on_delivery_error}
        )
        producer_settings["client.id"] = f"{prefix}-producer"
        restore_settings = restore_consumer_config(config)
        restore_settings["client.id"] = f"{prefix}-restore-consumer"
        self._consumer = Consumer(consumer_settings)
        self._producer = Producer(producer_settings)
        self._restore_consumer = Consumer(restore_settings)

    # --- other threads ---------------------------------------------------------

    def request_stop(self, commit: bool = True) -> None:
        if not commit:
            self._abort = True
        self._stop_event.set()

    @property
    def processed_total(self) -> int:
        return self._closed_processed + sum(t.processed_count for t in list(self._tasks.values()))

    def task_states(self) -> dict[str, str]:
        """task id -> RUNNING / RESTORING (racy snapshot)."""
        states = {t: "RUNNING" for t in list(self._running)}
        for t in list(self._to_restore):
            states[t] = "RESTORING"
        return states

    def task_processed(self) -> dict[str, int]:
        return {t.id: t.processed_count for t in list(self._tasks.values())}

    def unacknowledged(self) -> int:
        """Records in this thread's producer not acknowledged yet (thread-safe)."""
        return len(self._producer)

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
        has_work = processing and any(t.buffered for t in self._running.values())
        restoring_steps = bool(self._restoring) and self._restore_mode == "interleaved"
        if has_work or restoring_steps:
            timeout = 0.0
        elif self._buffers.any_paused:
            timeout = 0.005
        else:
            timeout = self._poll_s
        records = consume_available(self._consumer, self._config.max_poll_records, timeout)
        if records:
            routed, to_pause = self._buffers.route(records, self._on_consume_error)
            self.consumed_total += routed
            if to_pause:
                self._consumer.pause([TopicPartition(t, p) for t, p in to_pause])
        if self._buffers.any_paused:
            to_resume = self._buffers.to_resume()
            if to_resume:
                partitions = [TopicPartition(t, p) for t, p in to_resume]
                self._consumer.resume(partitions)
                fetch_resumed_now(self._consumer, partitions)
        if (self._to_restore or self._restoring) and self._gates.restore.is_set():
            self.restore()
        if processing:
            self.process_round()
        self._producer.poll(0)
        if self._delivery_errors:
            raise BaselineFatalError(f"output could not be delivered: {self._delivery_errors[0]}")
        if time.monotonic() - self._last_commit >= self._commit_interval_s or any(
            t.commit_requested for t in self._running.values()
        ):
            self.commit_all("interval")

    def process_round(self) -> int:
        """Process every ready task once: until its buffer is empty or its time slice ends."""
        total = 0
        now = time.monotonic()
        for task in list(self._running.values()):
            if not task.buffered and not task.punctuation_due(now):
                continue
            started = time.monotonic()
            total += task.process(started + self._timeslice_s)
            output = task.take_output()
            if output:
                self._produce(output)
        return total

    def _produce(self, records: list[OutputRecord]) -> None:
        """Send a task's output batch on this thread's producer (in order)."""
        produce = self._producer.produce
        changelogs = self._changelog_topics
        counts = self._changelog_produced
        for topic, partition, key, value, timestamp, headers, _st, _sp, _so in records:
            if topic in changelogs:
                tp = (topic, partition)
                counts[tp] = counts.get(tp, 0) + 1
            while True:
                try:
                    produce(
                        topic,
                        value,
                        key,
                        partition=partition,
                        timestamp=timestamp if timestamp > 0 else 0,
                        headers=headers,  # type: ignore[arg-type]
                    )
                    break
                except BufferError:
                    self._producer.poll(0.1)
        self.produced_total += len(records)

    # --- restoration (inline, on this thread) ----------------------------------------

    def restore(self) -> None:
        """Blocking: restore every pending task completely now. Interleaved: one batch."""
        for task_id in list(self._to_restore):
            if task_id not in self._restoring:
                self._begin_restore(self._to_restore[task_id])
        if self._restore_mode == "blocking":
            while self._restoring and not self._stop_event.is_set():
                self._restore_step()
        elif self._restoring:
            self._restore_step()

    def _begin_restore(self, task: StreamTask) -> None:
        store_of: dict[TopicPartitionKey, Any] = {}
        partitions = []
        for store in task.stores.values():
            if store.changelog_topic is None:
                continue
            tp = (store.changelog_topic, task.partition)
            store_of[tp] = store
            start = task.restore_from.get(tp)
            partitions.append(
                TopicPartition(tp[0], tp[1], start if start is not None else OFFSET_BEGINNING)
            )
            self._restoring_by_tp[tp] = task.id
        self._restoring[task.id] = _Restoring(task, store_of, set(store_of))
        self.restore_started[task.id] = time.monotonic()
        if partitions:
            self._restore_consumer.incremental_assign(partitions)
        else:
            self._task_restored(task.id)

    def _restore_step(self) -> None:
        """One batch of changelog records, applied as the runtime's restoration thread does."""
        messages = self._restore_consumer.consume(RESTORE_BATCH, 0.1)
        batches: dict[TopicPartitionKey, list[tuple[bytes, bytes | None]]] = {}
        next_offsets: dict[TopicPartitionKey, int] = {}
        reached_end: list[tuple[TopicPartitionKey, int]] = []
        for message in messages:
            error = message.error()
            tp: TopicPartitionKey = (message.topic(), message.partition())  # type: ignore[assignment]
            offset: int = message.offset()  # type: ignore[assignment]
            if error is not None:
                if error.code() == KafkaError._PARTITION_EOF:
                    reached_end.append((tp, offset))
                    continue
                if error.fatal():
                    raise KafkaException(error)
                log.warning("restore_consume_error", error=error.str())
                continue
            key = message.key()
            if key is None:
                continue
            batch = batches.get(tp)
            if batch is None:
                batches[tp] = batch = []
            batch.append((key, message.value()))
            next_offsets[tp] = offset + 1
        for tp, records in batches.items():
            task_id = self._restoring_by_tp.get(tp)
            if task_id is None:
                continue
            state = self._restoring[task_id]
            state.store_of[tp].restore_batch(records, next_offsets[tp])
            state.restored += len(records)
            self.restored_total += len(records)
        for tp, end_offset in reached_end:
            task_id = self._restoring_by_tp.get(tp)
            if task_id is None:
                continue
            state = self._restoring[task_id]
            if tp not in state.pending:
                continue
            state.store_of[tp].update_changelog_offset(end_offset)
            state.pending.discard(tp)
            del self._restoring_by_tp[tp]
            self._restore_consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])
            if not state.pending:
                for store in state.store_of.values():
                    store.sync()
                self._task_restored(task_id)

    def _task_restored(self, task_id: str) -> None:
        state = self._restoring.pop(task_id)
        task = self._to_restore.pop(task_id)
        task.restored_records = state.restored
        self.restore_times[task_id] = (state.started, time.monotonic())
        if self._on_restored is not None:
            self._on_restored(task_id)
        self._running[task_id] = task
        log.info(
            "task_restored",
            task_id=task_id,
            records=state.restored,
            seconds=round(time.monotonic() - state.started, 3),
        )

    def _cancel_restore(self, task_id: str) -> None:
        state = self._restoring.pop(task_id, None)
        if state is None:
            return
        for tp in state.store_of:
            self._restoring_by_tp.pop(tp, None)
        if state.pending:
            self._restore_consumer.incremental_unassign(
                [TopicPartition(t, p) for t, p in state.pending]
            )

    # --- the commit protocol (this thread's tasks only) --------------------------------

    def commit_all(self, reason: str) -> bool:
        """Emit state, produce, flush, commit_state + checkpoint, commit offsets."""
        self._last_commit = time.monotonic()
        tasks = list(self._running.values())
        if not tasks:
            return True
        offsets: list[TopicPartition] = []
        per_task: list[tuple[StreamTask, dict[str, int]]] = []
        for task in tasks:
            task.commit_requested = False
            moved = task.offsets_to_commit()
            if moved:
                per_task.append((task, moved))
                offsets.extend(TopicPartition(t, task.partition, o) for t, o in moved.items())
        for task in tasks:
            task.emit_state()
            output = task.take_output()
            if output:
                self._produce(output)
        self._flush_producer()
        if self._delivery_errors:
            raise BaselineFatalError(f"output could not be delivered: {self._delivery_errors[0]}")
        for task in tasks:
            task.commit_state()
            task.write_checkpoint(self._changelog_produced)
        if not offsets:
            return True
        try:
            self._consumer.commit(offsets=offsets, asynchronous=False)
        except KafkaException as exc:
            self.commit_failures_total += 1
            log.warning("commit_failed", reason=reason, error=str(exc))
            return False
        for task, moved in per_task:
            task.mark_committed(moved)
        self.commits_total += 1
        return True

    def _flush_producer(self) -> None:
        waited_since = time.monotonic()
        while True:
            remaining = self._producer.flush(1.0)
            if remaining == 0:
                return
            if time.monotonic() - waited_since > 5.0:
                log.warning("flush_waiting", unacknowledged=remaining)
                waited_since = time.monotonic()
            if self._abort:
                raise BaselineFatalError("shutdown without commit requested during flush")

    # --- rebalance (inside consume(), on this thread) -------------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._create_tasks(partitions)
            self._note_rebalance()
            log.info("partitions_assigned", partitions=len(partitions), tasks=sorted(self._tasks))
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            affected = self._tasks_of(partitions)
            log.info("partitions_revoked", partitions=len(partitions), tasks=affected)
            if affected:
                if not self._abort:
                    self.commit_all("revocation")
                self._close_tasks(affected)
            self._note_rebalance()
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            affected = self._tasks_of(partitions)
            log.warning("partitions_lost", partitions=len(partitions), tasks=affected)
            self._close_tasks(affected)
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

    def _tasks_of(self, partitions: list[TopicPartition]) -> list[str]:
        ids = set()
        for tp in partitions:
            sub = self._layout.subtopology_of.get(tp.topic)
            if sub is not None:
                task_id = task_id_of(sub, tp.partition)
                if task_id in self._tasks:
                    ids.add(task_id)
        return sorted(ids)

    def _create_tasks(self, partitions: list[TopicPartition]) -> None:
        for tp in partitions:
            sub_id = self._layout.subtopology_of.get(tp.topic)
            if sub_id is None:
                continue
            task_id = task_id_of(sub_id, tp.partition)
            task = self._tasks.get(task_id)
            if task is None:
                topics = [
                    t
                    for t in self._layout.sources[sub_id]
                    if tp.partition < self._layout.partitions[t]
                ]
                # Exactly as the runtime's polling thread builds a task.
                task = StreamTask(self._subtopologies[sub_id], tp.partition, topics, self._settings)
                self._tasks[task_id] = task
                if task.changelog_partitions:
                    self._to_restore[task_id] = task
                else:
                    self._running[task_id] = task
            self._buffers.register(task.queues[tp.topic])

    def _close_tasks(self, task_ids: list[str]) -> None:
        for task_id in task_ids:
            task = self._tasks.pop(task_id)
            self._running.pop(task_id, None)
            self._to_restore.pop(task_id, None)
            self._cancel_restore(task_id)
            for topic in task.queues:
                self._buffers.unregister(topic, task.partition)
            try:
                task.close()
            except Exception as exc:
                log.warning("task_close_failed", task_id=task_id, error=str(exc))
            output = task.take_output()
            if output and not self._abort:
                self._produce(output)
            self._closed_processed += task.processed_count

    # --- client callbacks (on this thread) ------------------------------------------

    def _on_client_error(self, error: KafkaError) -> None:
        if error.fatal():
            log.error("client_fatal_error", error=error.str())
            self.fatal_error = KafkaException(error)
            self._abort = True
            self._stop_event.set()
            return
        log.warning("client_error", error=error.str())

    def _on_delivery_error(self, error: KafkaError | None, message: Message) -> None:
        if error is not None:
            self._delivery_errors.append(f"{message.topic()}[{message.partition()}]: {error.str()}")

    def _on_consume_error(self, message: Message) -> None:
        error = message.error()
        assert error is not None
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise KafkaException(error)
        log.warning("consume_error", error=error.str())

    def _close(self) -> None:
        try:
            if self._abort:
                self._close_tasks(list(self._tasks))
            # Leaves the group; on_revoke commits and closes what is left.
            self._consumer.close()
        except Exception as exc:
            log.warning("consumer_close_failed", error=str(exc))
        try:
            remaining = self._producer.flush(self._config.shutdown_timeout_ms / 1000.0)
            if remaining:
                log.warning("producer_close_unflushed", unacknowledged=remaining)
            self._producer.close()
        except Exception as exc:
            log.warning("producer_close_failed", error=str(exc))
        try:
            self._restore_consumer.close()
        except Exception as exc:
            log.warning("restore_consumer_close_failed", error=str(exc))
        if self._tasks:
            self._abort = True
            self._close_tasks(list(self._tasks))
        self._buffers.clear()
