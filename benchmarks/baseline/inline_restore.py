"""Restoration inside a classic stream thread: its own restore consumer, its own loop.

The classic model has no restoration thread: a stream thread restores its
stateful tasks itself, either completely before it processes anything
(`blocking`, Kafka Streams before 2.6) or one batch per loop turn between
processing rounds (`interleaved`, Kafka Streams 2.6-3.x). Changelog records are
applied exactly as the runtime's restoration thread applies them.

This class has the runtime restoration thread's interface towards
`runtime.polling.active_tasks.ActiveTasks` (`add_task`, `remove_task`,
`drain_restored`), so the baseline creates, closes and rewinds tasks with the
runtime's own lifecycle code. Used by its stream thread only.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from runtime.logging import get_logger
from runtime.processing.task import StreamTask
from runtime.state.changelog_reading import sort_changelog_messages

log = get_logger("benchmarks.baseline")

# Changelog records per restore-consumer batch: the runtime's RestorationThread default.
RESTORE_BATCH = 5000
RESTORE_MODES = ("blocking", "interleaved")

TopicPartitionKey = tuple[str, int]


@dataclass
class _Restoring:
    task: StreamTask
    store_of: dict[TopicPartitionKey, Any]
    pending: set[TopicPartitionKey]
    started: float = field(default_factory=time.monotonic)
    restored: int = 0


class InlineRestorer:
    """Restores a stream thread's tasks on that thread. See the module docstring."""

    def __init__(
        self,
        consumer_settings: dict[str, Any],
        mode: str,
        should_stop: Callable[[], bool],
        on_restored: Callable[[str], None] | None = None,
    ) -> None:
        if mode not in RESTORE_MODES:
            raise ValueError(f"restore_mode must be one of {RESTORE_MODES}, not {mode!r}")
        self.mode = mode
        self._consumer = Consumer(consumer_settings)
        self._should_stop = should_stop
        # Called with a task id as soon as the task is restored (before it is
        # processed): benchmarks take their snapshots there.
        self._on_restored = on_restored
        # Created stateful tasks not restored yet, in creation order.
        self._to_restore: dict[str, StreamTask] = {}
        # Tasks whose changelogs are assigned to the restore consumer now.
        self._restoring: dict[str, _Restoring] = {}
        self._by_tp: dict[TopicPartitionKey, str] = {}
        self._restored: list[StreamTask] = []
        self.restored_total = 0
        # task id -> (restore start, restore end) in time.monotonic() seconds
        self.restore_times: dict[str, tuple[float, float]] = {}
        self.restore_started: dict[str, float] = {}

    # --- the Restorer interface (ActiveTasks) ----------------------------------------

    def add_task(self, task: StreamTask) -> None:
        self._to_restore[task.id] = task

    def remove_task(self, task_id: str) -> Future[bool]:
        was_restoring = self._to_restore.pop(task_id, None) is not None
        self._cancel(task_id)
        future: Future[bool] = Future()
        future.set_result(was_restoring)
        return future

    def drain_restored(self) -> list[StreamTask]:
        restored, self._restored = self._restored, []
        return restored

    # --- the stream thread's loop ------------------------------------------------------

    @property
    def pending(self) -> bool:
        return bool(self._to_restore)

    @property
    def stepping(self) -> bool:
        """Interleaved mode has restore batches to run between processing rounds."""
        return bool(self._restoring) and self.mode == "interleaved"

    def pending_ids(self) -> list[str]:
        return list(self._to_restore)

    def restore(self) -> None:
        """Blocking: restore every pending task completely now. Interleaved: one batch."""
        for task_id, task in list(self._to_restore.items()):
            if task_id not in self._restoring:
                self._begin(task)
        if self.mode == "blocking":
            while self._restoring and not self._should_stop():
                self._step()
        elif self._restoring:
            self._step()

    def close(self) -> None:
        try:
            self._consumer.close()
        except Exception as exc:
            log.warning("restore_consumer_close_failed", error=str(exc))

    # --- helpers -----------------------------------------------------------------------

    def _begin(self, task: StreamTask) -> None:
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
            self._by_tp[tp] = task.id
        self._restoring[task.id] = _Restoring(task, store_of, set(store_of))
        self.restore_started[task.id] = time.monotonic()
        if partitions:
            self._consumer.incremental_assign(partitions)
        else:
            self._finish(task.id)

    def _step(self) -> None:
        """One batch of changelog records, applied as the runtime's restoration thread does."""
        batch = sort_changelog_messages(self._consumer.consume(RESTORE_BATCH, 0.1))
        next_offsets, reached_end = batch.next_offsets, batch.reached_end
        for tp, records in batch.records.items():
            task_id = self._by_tp.get(tp)
            if task_id is None:
                continue
            state = self._restoring[task_id]
            state.store_of[tp].restore_batch(records, next_offsets[tp])
            state.restored += len(records)
            self.restored_total += len(records)
        for tp, end_offset in reached_end:
            task_id = self._by_tp.get(tp)
            if task_id is None:
                continue
            state = self._restoring[task_id]
            if tp not in state.pending:
                continue
            state.store_of[tp].update_changelog_offset(end_offset)
            state.pending.discard(tp)
            del self._by_tp[tp]
            self._consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])
            if not state.pending:
                for store in state.store_of.values():
                    store.sync()
                self._finish(task_id)

    def _finish(self, task_id: str) -> None:
        state = self._restoring.pop(task_id)
        task = self._to_restore.pop(task_id)
        task.restored_records = state.restored
        self.restore_times[task_id] = (state.started, time.monotonic())
        if self._on_restored is not None:
            self._on_restored(task_id)
        self._restored.append(task)
        log.info(
            "task_restored",
            task_id=task_id,
            records=state.restored,
            seconds=round(time.monotonic() - state.started, 3),
        )

    def _cancel(self, task_id: str) -> None:
        state = self._restoring.pop(task_id, None)
        if state is None:
            return
        for tp in state.store_of:
            self._by_tp.pop(tp, None)
        if state.pending:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in state.pending])
