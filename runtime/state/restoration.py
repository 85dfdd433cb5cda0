"""The restoration thread (Kafka Streams' StateUpdater).

Owns the one restore consumer of the process. The polling thread hands it
active tasks whose stores have changelogs (`add_task`); it assigns their
changelog partitions from the checkpoint offset (or the beginning), applies
changelog records to the stores, and, once every partition of a task reached
the changelog's end, hands the task back (`drain_restored`) for the polling
thread to give to the task manager. Tasks move between the two threads only
through these queues. While some tasks restore, the ready ones process.

The end of a changelog is learnt from the fetch path (`enable.partition.eof`),
not from ListOffsets: the development broker answers ListOffsets(latest)
wrongly for multi-record batches, and a fetch's high watermark is what a
read_committed consumer can actually reach.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from runtime.logging import get_logger
from runtime.processing.task import StreamTask

log = get_logger("runtime.restoration")

TopicPartitionKey = tuple[str, int]


@dataclass
class _Restoring:
    task: StreamTask
    pending: set[TopicPartitionKey]
    store_of: dict[TopicPartitionKey, Any]
    started: float = field(default_factory=time.monotonic)
    restored: int = 0


class RestorationThread(threading.Thread):
    """Restores active tasks before they process. See the module docstring."""

    def __init__(self, name: str, consumer_settings: dict[str, Any], batch_size: int = 5000):
        super().__init__(name=name, daemon=True)
        self._consumer = Consumer(consumer_settings)
        self._batch_size = batch_size
        self._actions: queue.SimpleQueue[tuple[str, Any, Future[bool] | None]] = queue.SimpleQueue()
        self._restored: queue.SimpleQueue[StreamTask] = queue.SimpleQueue()
        self._restoring: dict[str, _Restoring] = {}
        self._by_partition: dict[TopicPartitionKey, str] = {}
        self._stop_event = threading.Event()
        self.fatal_error: BaseException | None = None
        # Read racily by status(): task id -> progress figures.
        self.progress: dict[str, dict[str, float]] = {}
        self.restored_total = 0

    # --- polling thread -------------------------------------------------------

    def add_task(self, task: StreamTask) -> None:
        """Restore this task's stores; it comes back through drain_restored."""
        self._actions.put(("add", task, None))

    def remove_task(self, task_id: str) -> Future[bool]:
        """Stop restoring a task (revoked); True if it was still restoring.

        The future completes once its partitions are unassigned, after which
        the caller may close the task.
        """
        future: Future[bool] = Future()
        self._actions.put(("remove", task_id, future))
        return future

    def drain_restored(self) -> list[StreamTask]:
        tasks = []
        while True:
            try:
                tasks.append(self._restored.get_nowait())
            except queue.Empty:
                return tasks

    def request_stop(self) -> None:
        self._stop_event.set()
        self._actions.put(("wake", None, None))

    def restoring_task_ids(self) -> list[str]:
        return sorted(self.progress)

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        log.info("restoration_thread_started")
        try:
            while not self._stop_event.is_set():
                self._handle_actions(block=not self._restoring)
                if self._restoring:
                    self.restore_once()
        except BaseException as exc:  # noqa: BLE001 - reported via fatal_error
            self.fatal_error = exc
            log.error("restoration_thread_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            try:
                self._consumer.close()
            except Exception as exc:
                log.warning("restore_consumer_close_failed", error=str(exc))
            log.info("restoration_thread_stopped")

    def _handle_actions(self, block: bool) -> None:
        try:
            action = self._actions.get(timeout=0.1) if block else self._actions.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload, future = action
            if kind == "add":
                self._start(payload)
            elif kind == "remove":
                removed = self._stop_restoring(payload)
                assert future is not None
                future.set_result(removed)
            try:
                action = self._actions.get_nowait()
            except queue.Empty:
                return

    def _start(self, task: StreamTask) -> None:
        partitions = []
        store_of = {}
        for store in task.stores.values():
            if store.changelog_topic is None:
                continue
            tp = (store.changelog_topic, task.partition)
            store_of[tp] = store
            start = task.restore_from.get(tp)
            partitions.append(
                TopicPartition(tp[0], tp[1], start if start is not None else OFFSET_BEGINNING)
            )
            self._by_partition[tp] = task.id
        self._restoring[task.id] = _Restoring(task, set(store_of), store_of)
        self.progress[task.id] = {"restored": 0, "remaining": -1, "rate": 0.0}
        self._consumer.incremental_assign(partitions)
        log.info(
            "task_restoring",
            task_id=task.id,
            changelogs=[
                f"{t}-{p}@{tp.offset}" for (t, p), tp in zip(store_of, partitions, strict=True)
            ],
        )

    def _stop_restoring(self, task_id: str) -> bool:
        state = self._restoring.pop(task_id, None)
        self.progress.pop(task_id, None)
        if state is None:
            return False
        remaining = [TopicPartition(t, p) for t, p in state.pending]
        for tp in state.store_of:
            self._by_partition.pop(tp, None)
        if remaining:
            self._consumer.incremental_unassign(remaining)
        log.info("task_restore_cancelled", task_id=task_id)
        return True

    def restore_once(self) -> None:
        messages = self._consumer.consume(self._batch_size, 0.1)
        batches: dict[TopicPartitionKey, list[tuple[bytes, bytes | None]]] = defaultdict(list)
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
                continue  # a changelog record always has a key; skip garbage
            batches[tp].append((key, message.value()))
            next_offsets[tp] = offset + 1
        for tp, records in batches.items():
            task_id = self._by_partition.get(tp)
            if task_id is None:
                continue
            state = self._restoring[task_id]
            state.store_of[tp].restore_batch(records, next_offsets[tp])
            state.restored += len(records)
            self.restored_total += len(records)
        for tp, end_offset in reached_end:
            self._partition_done(tp, end_offset)
        self._update_progress()

    def _partition_done(self, tp: TopicPartitionKey, end_offset: int) -> None:
        task_id = self._by_partition.get(tp)
        if task_id is None:
            return
        state = self._restoring[task_id]
        if tp not in state.pending:
            return
        store = state.store_of[tp]
        # Also right for an empty changelog: the store reflects it up to its end.
        store.update_changelog_offset(end_offset)
        state.pending.discard(tp)
        self._consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])
        self._by_partition.pop(tp, None)
        if state.pending:
            return
        for restored_store in state.store_of.values():
            restored_store.sync()
        del self._restoring[task_id]
        self.progress.pop(task_id, None)
        elapsed = time.monotonic() - state.started
        log.info(
            "task_restored",
            task_id=task_id,
            records=state.restored,
            seconds=round(elapsed, 3),
        )
        state.task.restored_records = state.restored
        self._restored.put(state.task)

    def _update_progress(self) -> None:
        for task_id, state in self._restoring.items():
            remaining = 0
            for tp in state.pending:
                try:
                    _low, high = self._consumer.get_watermark_offsets(
                        TopicPartition(tp[0], tp[1]), cached=True
                    )
                    position = self._consumer.position([TopicPartition(tp[0], tp[1])])[0].offset
                except KafkaException:
                    continue
                if high >= 0 and position >= 0:
                    remaining += max(0, high - position)
            elapsed = max(1e-6, time.monotonic() - state.started)
            self.progress[task_id] = {
                "restored": state.restored,
                "remaining": remaining,
                "rate": round(state.restored / elapsed, 1),
            }
