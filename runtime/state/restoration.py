"""The restoration thread (Kafka Streams' StateUpdater): restores and standbys.

Owns the one restore consumer of the process. The polling thread hands it
active tasks whose stores have changelogs (`add_task`); it assigns their
changelog partitions from the checkpoint offset (or the beginning), applies
changelog records to the stores, and, once every partition of a task reached
the changelog's end, hands the task back (`drain_restored`) for the polling
thread to give to the task manager. Tasks move between the two threads only
through these queues. While some tasks restore, the ready ones process.
Standbys (`add_standby`) are kept current from their changelogs the same way.

The end of a changelog is learnt from the fetch path (`enable.partition.eof`),
not from ListOffsets: the development broker answers ListOffsets(latest)
wrongly for multi-record batches, and a fetch's high watermark is what a
read_committed consumer can actually reach.

A checkpointed position the changelog does not have (beyond its end: the
topic was deleted and recreated, or a leader lost records; or before its
start) is learnt from the fetch path too: the restore consumer runs with
`auto.offset.reset=error`, so the fetch reports it instead of quietly
jumping to the beginning and replaying over a store that holds records the
changelog no longer has. Such a store is wiped and restored from the
changelog's start, with a warning (Kafka Streams does the same on an
invalid offset); a standby's likewise.

Two other pieces of work share this thread's loop, each a step object with
its own module, so that this one holds restoration only:

- the status topic (`<application.id>-status`) is read on this consumer (the
  design gives the process three clients): its messages go to a `SideReader`
  (`runtime.placement.status_reader`), which gives them meaning;
- remote state (`state.remote.url`): a task or standby without usable local
  state first downloads a snapshot, and captured snapshots are uploaded, one
  bounded step per loop turn (`runtime.state.remote.driver.SnapshotDriver`,
  whose docstring says why it runs here); a finished download hands the task
  back here to replay only the changelog after the snapshot.

What other threads learn of restoration (progress, how each restore went,
standby positions and lags) is one immutable `RestorationFigures`, replaced
whole once per loop turn (`figures`); nothing else of this thread's state is
read from outside it.

Over 500 lines as one thing: the thread's inbox, its loop and the restores
of active tasks; standbys (`standby_updates`), batch sorting
(`changelog_reading`), the seams' types (`restoration_seams`) and the two
steps above live in their own modules.

Threads: the loop, and everything private, on this thread; `add_task`,
`remove_task`, `drain_restored`, `add_standby`, `remove_standby`,
`add_upload` from the polling thread; `figures` (and its views) and
`request_stop` from any thread.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Mapping
from concurrent.futures import Future
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, TopicPartition

from runtime.logging import get_logger
from runtime.state.changelog_reading import (
    TopicPartitionKey,
    restart_from_start,
    sort_changelog_messages,
)
from runtime.state.remote.capture import UploadJob
from runtime.state.remote.download import SnapshotDownload
from runtime.state.remote.driver import Fetched, SnapshotDriver
from runtime.state.remote.manager import RemoteState
from runtime.state.restoration_seams import (
    RestorableTask,
    RestorationFigures,
    SideReader,
    SideReaderSource,
)
from runtime.state.standby import StandbyTask
from runtime.state.standby_updates import StandbyUpdates

log = get_logger("runtime.restoration")


# The restoration thread's inbox: one small typed message per request from the
# polling thread. Futures, where present, complete on the restoration thread.
@dataclass(frozen=True)
class _AddTask:
    task: RestorableTask


@dataclass(frozen=True)
class _RemoveTask:
    task_id: str
    done: Future[bool]


@dataclass(frozen=True)
class _AddStandby:
    standby: StandbyTask


@dataclass(frozen=True)
class _RemoveStandby:
    task_id: str
    done: Future[bool]


@dataclass(frozen=True)
class _Upload:
    job: UploadJob


@dataclass(frozen=True)
class _Wake:
    """Only wakes the loop (a stop request)."""


_Action = _AddTask | _RemoveTask | _AddStandby | _RemoveStandby | _Upload | _Wake

SOURCE_CHANGELOG = "changelog"
SOURCE_SNAPSHOT = "snapshot+tail"


@dataclass
class _Restoring:
    task: RestorableTask
    pending: set[TopicPartitionKey]
    store_of: dict[TopicPartitionKey, Any]
    started: float = field(default_factory=time.monotonic)
    restored: int = 0
    source: str = SOURCE_CHANGELOG
    snapshot: str | None = None
    downloaded_bytes: int = 0


class RestorationThread(threading.Thread):
    """Restores active tasks before they process and keeps standbys current.
    See the module docstring."""

    def __init__(
        self,
        name: str,
        consumer_settings: dict[str, Any],
        status_topic: str | None = None,
        batch_size: int = 5000,
        remote: RemoteState | None = None,
        status_view: SideReaderSource | None = None,
    ):
        """`status_topic` and `status_view`: the wiring's names for the status
        topic and the view the polling thread reads it through; the view
        makes the topic's reader (`SideReaderSource`), which runs on this
        loop. `remote`: remote state's parts; its transfers run on this loop
        through a `SnapshotDriver`."""
        super().__init__(name=name, daemon=True)
        if status_topic is not None and status_view is None:
            raise ValueError("a status topic needs a status_view to read it into")
        self._side: SideReader | None = (
            status_view.reader(status_topic)
            if status_topic is not None and status_view is not None
            else None
        )
        self._side_topics = self._side.topics if self._side is not None else frozenset()
        self.remote = remote  # its stats are read by status (runtime.app_status)
        self._snapshots = SnapshotDriver(remote, self._watermarks) if remote is not None else None
        # An invalid position must reach this thread as an error event, not
        # be reset to the beginning behind its back (module docstring). Every
        # assignment here names a position or OFFSET_BEGINNING, so the reset
        # policy matters only when a position is out of range.
        self._consumer = Consumer({**consumer_settings, "auto.offset.reset": "error"})
        self._standbys = StandbyUpdates(self._consumer)
        self._batch_size = batch_size
        self._actions: queue.SimpleQueue[_Action] = queue.SimpleQueue()
        self._restored: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._restoring: dict[str, _Restoring] = {}
        self._by_partition: dict[TopicPartitionKey, str] = {}
        self._stop_event = threading.Event()
        # Set once, when the loop failed; read by the polling thread.
        self.fatal_error: BaseException | None = None
        # This thread's working copies of the figures (`_publish` hands them over).
        self._progress: dict[str, dict[str, float]] = {}
        self._restores: dict[str, dict[str, Any]] = {}
        self._standby_positions: dict[str, dict[str, int]] = {}
        self._standby_lags: dict[str, int] = {}
        self._restored_total = 0
        self._figures = RestorationFigures()

    # --- any thread -------------------------------------------------------------

    def figures(self) -> RestorationFigures:
        """The figures as of the last loop turn (one immutable snapshot)."""
        return self._figures

    # Views of `figures()` for callers that read one figure (status).
    @property
    def progress(self) -> Mapping[str, dict[str, float]]:
        return self._figures.progress

    @property
    def restores(self) -> Mapping[str, dict[str, Any]]:
        return self._figures.restores

    @property
    def standby_positions(self) -> Mapping[str, dict[str, int]]:
        return self._figures.standby_positions

    @property
    def standby_lags(self) -> Mapping[str, int]:
        return self._figures.standby_lags

    @property
    def restored_total(self) -> int:
        return self._figures.restored_total

    def request_stop(self) -> None:
        self._stop_event.set()
        self._actions.put(_Wake())

    # --- polling thread -------------------------------------------------------

    def add_task(self, task: RestorableTask) -> None:
        """Restore this task's stores; it comes back through drain_restored."""
        self._actions.put(_AddTask(task))

    def remove_task(self, task_id: str) -> Future[bool]:
        """Stop restoring a task (revoked); True if it was still restoring.

        The future completes once its partitions are unassigned, after which
        the caller may close the task.
        """
        future: Future[bool] = Future()
        self._actions.put(_RemoveTask(task_id, future))
        return future

    def drain_restored(self) -> list[Any]:
        """Tasks restored since the last call, as they were added (polling thread)."""
        tasks = []
        while True:
            try:
                tasks.append(self._restored.get_nowait())
            except queue.Empty:
                return tasks

    def add_standby(self, standby: StandbyTask) -> None:
        """Keep this standby's stores current (polling thread)."""
        self._actions.put(_AddStandby(standby))

    def remove_standby(self, task_id: str) -> Future[bool]:
        """Checkpoint and close a standby; the future completes when its
        stores are closed (so an active task may open them)."""
        future: Future[bool] = Future()
        self._actions.put(_RemoveStandby(task_id, future))
        return future

    def add_upload(self, job: UploadJob) -> None:
        """Upload a captured snapshot (polling thread, from the commit)."""
        self._actions.put(_Upload(job))

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        log.info("restoration_thread_started")
        snapshots, side = self._snapshots, self._side
        try:
            if side is not None:
                side.start(self._consumer)
            if snapshots is not None:
                snapshots.start()
            while not self._stop_event.is_set():
                transfers = snapshots is not None and snapshots.busy
                busy = bool(self._restoring or self._standbys or transfers) or side is not None
                self._handle_actions(block=not busy)
                if busy:
                    # With transfers pending, no waiting on the consumer.
                    self.restore_once(0.0 if transfers else 0.1)
                    self._standbys.maybe_checkpoint()
                    if snapshots is not None:
                        self._step_snapshots(snapshots)
                self._publish()
            fetching = snapshots.fetching_standbys() if snapshots is not None else []
            for task_id in self._standbys.ids() + fetching:
                self._drop_standby(task_id)
        except BaseException as exc:  # noqa: BLE001 - reported via fatal_error
            self.fatal_error = exc
            log.error("restoration_thread_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            if snapshots is not None:
                snapshots.close()
            try:
                self._consumer.close()
            except Exception as exc:
                log.warning("restore_consumer_close_failed", error=str(exc))
            self._publish()
            log.info("restoration_thread_stopped")

    def _publish(self) -> None:
        """Hand this turn's figures over: one new immutable snapshot. The
        inner dicts are replaced, never changed in place, so they are shared."""
        self._figures = RestorationFigures(
            self._restored_total,
            MappingProxyType(dict(self._progress)),
            MappingProxyType(self._restores),
            MappingProxyType(self._standby_positions),
            MappingProxyType(self._standby_lags),
        )

    def _handle_actions(self, block: bool) -> None:
        try:
            action = self._actions.get(timeout=0.1) if block else self._actions.get_nowait()
        except queue.Empty:
            return
        while True:
            if isinstance(action, _AddTask):
                self._start(action.task)
            elif isinstance(action, _AddStandby):
                self._start_standby(action.standby)
            elif isinstance(action, _RemoveStandby):
                action.done.set_result(self._drop_standby(action.task_id))
            elif isinstance(action, _RemoveTask):
                action.done.set_result(self._stop_restoring(action.task_id))
            elif isinstance(action, _Upload) and self._snapshots is not None:
                self._snapshots.submit(action.job)
            try:
                action = self._actions.get_nowait()
            except queue.Empty:
                return

    def _start(self, task: RestorableTask) -> None:
        if self._snapshots is not None and self._snapshots.fetch(task, standby=False):
            self._progress[task.id] = {"restored": 0, "remaining": -1, "rate": 0.0}
            return
        self._start_changelog(task)

    def _start_changelog(
        self,
        task: RestorableTask,
        started: float | None = None,
        download: SnapshotDownload | None = None,
    ) -> None:
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
        state = _Restoring(task, set(store_of), store_of)
        if started is not None:
            state.started = started
        if download is not None:
            state.source = SOURCE_SNAPSHOT
            state.snapshot = download.snapshot_id
            state.downloaded_bytes = download.downloaded_bytes
        self._restoring[task.id] = state
        self._progress[task.id] = {"restored": 0, "remaining": -1, "rate": 0.0}
        self._consumer.incremental_assign(partitions)
        log.info(
            "task_restoring",
            task_id=task.id,
            changelogs=[
                f"{t}-{p}@{tp.offset}" for (t, p), tp in zip(store_of, partitions, strict=True)
            ],
        )

    def _stop_restoring(self, task_id: str) -> bool:
        if self._snapshots is not None and self._snapshots.cancel(task_id, False) is not None:
            self._progress.pop(task_id, None)
            log.info("task_restore_cancelled", task_id=task_id)
            return True
        state = self._restoring.pop(task_id, None)
        self._progress.pop(task_id, None)
        if state is None:
            return False
        remaining = [TopicPartition(t, p) for t, p in state.pending]
        for tp in state.store_of:
            self._by_partition.pop(tp, None)
        if remaining:
            self._consumer.incremental_unassign(remaining)
        self._checkpoint_restored(state.task)
        log.info("task_restore_cancelled", task_id=task_id, restored=state.restored)
        return True

    def _checkpoint_restored(self, task: RestorableTask) -> None:
        """Checkpoint what a cancelled restore applied, so that the next restore
        of the task here (it moved away mid-restore and came back, or a
        rebalance closed and re-created it) continues from there instead of
        the changelog's start (issue 31: under rebalances every few seconds a
        large store restored from offset 0 again and again). The stores hold
        exactly the changelog's records up to their positions (read_committed
        under exactly_once_v2), which is what a checkpoint claims."""
        offsets: dict[TopicPartitionKey, int] = {}
        positions = None
        for store in task.stores.values():
            if store.positions is None:
                continue
            positions = store.positions
            try:
                store.sync()
            except Exception as exc:  # the task closes next; its restore starts over
                log.warning("restore_checkpoint_failed", task_id=task.id, error=str(exc))
                return
            offsets.update(store.checkpoint_offsets())
        if positions is not None and offsets:
            positions.write(offsets)

    def _start_standby(self, standby: StandbyTask) -> None:
        if self._snapshots is None or not self._snapshots.fetch(standby, standby=True):
            self._standbys.start(standby)

    def _drop_standby(self, task_id: str) -> bool:
        fetching = self._snapshots.cancel(task_id, True) if self._snapshots is not None else None
        if fetching is None:
            return self._standbys.drop(task_id)
        try:
            fetching.close()
        except Exception as exc:
            log.warning("standby_close_failed", task_id=task_id, error=str(exc))
        log.info("standby_stopped", task_id=task_id, applied=0)
        return True

    def restore_once(self, timeout: float = 0.1) -> None:
        messages = self._consumer.consume(self._batch_size, timeout)
        batch = sort_changelog_messages(messages, self._side_topics)
        if batch.side and self._side is not None:
            self._side.take(self._consumer, batch.side)
        next_offsets, reached_end = batch.next_offsets, batch.reached_end
        for tp, records in batch.records.items():
            task_id = self._by_partition.get(tp)
            if task_id is None:
                self._standbys.apply(tp, records, next_offsets[tp])
                continue
            state = self._restoring[task_id]
            state.store_of[tp].restore_batch(records, next_offsets[tp])
            state.restored += len(records)
            self._restored_total += len(records)
        # After the records (a wipe discards any applied from the same
        # batch), before the ends: a wiped partition's end in this batch
        # is the end of a position it no longer restores from.
        restarted = {tp for tp, position in batch.out_of_range if self._out_of_range(tp, position)}
        for tp, end_offset in reached_end:
            if tp not in restarted:
                self._partition_done(tp, end_offset)
        self._update_progress()
        if self._standbys:
            self._standby_positions = self._standbys.positions()
            self._standby_lags = self._standbys.lags()
        elif self._standby_positions:
            self._standby_positions = {}
            self._standby_lags = {}

    def _out_of_range(self, tp: TopicPartitionKey, position: int) -> bool:
        """The changelog does not have `position`: wipe the store restoring
        from it (a task's or a standby's) and restore it from the changelog's
        start. True when the partition was restarted."""
        task_id = self._by_partition.get(tp)
        if task_id is None:
            return self._standbys.out_of_range(tp, position)
        state = self._restoring[task_id]
        if tp not in state.pending:
            return False
        restart_from_start(self._consumer, tp, position, state.store_of[tp], state.task, False)
        return True

    def _partition_done(self, tp: TopicPartitionKey, end_offset: int) -> None:
        task_id = self._by_partition.get(tp)
        if task_id is None:
            self._standbys.reached_end(tp, end_offset)
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
        self._progress.pop(task_id, None)
        elapsed = time.monotonic() - state.started
        # Replaced whole: published snapshots share it (`_publish`).
        self._restores = {
            **self._restores,
            task_id: {
                "source": state.source,
                "seconds": round(elapsed, 3),
                "records": state.restored,
                "snapshot": state.snapshot,
                "downloaded_bytes": state.downloaded_bytes,
            },
        }
        log.info(
            "task_restored",
            task_id=task_id,
            records=state.restored,
            seconds=round(elapsed, 3),
            source=state.source,
            snapshot=state.snapshot,
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
            self._progress[task_id] = {
                "restored": state.restored,
                "remaining": remaining,
                "rate": round(state.restored / elapsed, 1),
            }

    # --- remote state (runtime.state.remote.driver) -------------------------------

    def _step_snapshots(self, snapshots: SnapshotDriver) -> None:
        """One bounded step of snapshot transfers; a download that ended
        starts its owner's changelog tail here."""
        fetched: Fetched | None = snapshots.step()
        if fetched is None:
            return
        if fetched.standby:
            self._standbys.start(fetched.owner)
        else:
            self._start_changelog(fetched.owner, fetched.started, fetched.download)

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        """A changelog's (low, high), asked of the broker (choosing a snapshot)."""
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10.0, cached=False
        )
        return int(low), int(high)
