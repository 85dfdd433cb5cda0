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

A checkpointed position the changelog does not have (beyond its end: the
topic was deleted and recreated, or a leader lost records; or before its
start) is learnt from the fetch path too: the restore consumer runs with
`auto.offset.reset=error`, so the fetch reports it instead of quietly
jumping to the beginning and replaying over a store that holds records the
changelog no longer has. Such a store is wiped and restored from the
changelog's start, with a warning (Kafka Streams does the same on an
invalid offset); a standby's likewise.

Remote state (`state.remote.url`, runtime.state.remote): this thread, and no
other, talks to the object store. A task or standby without usable local
state (a RocksDB store with no checkpointed position) first downloads the
newest usable snapshot, one bounded step per loop turn, and then replays only
the changelog after the snapshot's offsets; when no snapshot is usable it
replays the whole changelog, as without remote state. Snapshots captured by
the polling thread at commits arrive as upload actions and are uploaded one
bounded step per loop turn.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from runtime.logging import get_logger
from runtime.state.builders import LayeredStore
from runtime.state.checkpoint import checkpoint_path, write_checkpoint
from runtime.state.remote.capture import UploadJob, snapshot_stores
from runtime.state.remote.download import SnapshotDownload, SnapshotUnusable
from runtime.state.remote.manager import RemoteState
from runtime.state.remote.objects import RemoteStoreError
from runtime.state.standby import StandbyTask

log = get_logger("runtime.restoration")

TopicPartitionKey = tuple[str, int]


class StatusTopicReader(Protocol):
    """Where the status topic's records go (`runtime.placement.status_view`):
    this thread owns the consumer that reads them, not their meaning."""

    def apply(self, key: bytes | None, value: bytes | None) -> None: ...

    def advance(self, position: int) -> None: ...


class RestorableTask(Protocol):
    """What restoration needs of an active task (`StreamTask` is one).

    The stores are opened by the task's owner; restoration writes them only
    between `add_task` and the hand-back through `drain_restored`, while no
    processing thread can see the task.
    """

    @property
    def id(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def stores(self) -> dict[str, LayeredStore]: ...

    @property
    def restore_from(self) -> dict[TopicPartitionKey, int | None]: ...

    restored_records: int


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
class ChangelogBatch:
    """One consumed batch of changelog records, sorted per partition."""

    records: dict[TopicPartitionKey, list[tuple[bytes, bytes | None]]]
    next_offsets: dict[TopicPartitionKey, int]  # after the last record taken
    reached_end: list[tuple[TopicPartitionKey, int]]  # partitions at their end (EOF)
    # Partitions whose fetch position the log does not have, with that
    # position (only with auto.offset.reset=error, as the restoration thread's).
    out_of_range: list[tuple[TopicPartitionKey, int]] = field(default_factory=list)


def sort_changelog_messages(
    messages: list[Any],
    side_topic: str | None = None,
    on_side_record: Callable[[bytes | None, bytes | None], None] | None = None,
) -> ChangelogBatch:
    """Sort a restore consumer's batch: records per changelog partition, the
    end-of-partition events, and records of `side_topic` (the status topic)
    handed to `on_side_record`. A keyless changelog record is garbage and
    skipped; a fatal consumer error raises. Shared by the restoration thread
    and the thread-per-client baseline, so both apply changelogs alike."""
    records: dict[TopicPartitionKey, list[tuple[bytes, bytes | None]]] = defaultdict(list)
    next_offsets: dict[TopicPartitionKey, int] = {}
    reached_end: list[tuple[TopicPartitionKey, int]] = []
    out_of_range: list[tuple[TopicPartitionKey, int]] = []
    for message in messages:
        error = message.error()
        tp: TopicPartitionKey = (message.topic(), message.partition())
        offset: int = message.offset()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                reached_end.append((tp, offset))
                continue
            if error.code() == KafkaError._AUTO_OFFSET_RESET and message.topic() is not None:
                out_of_range.append((tp, offset))
                continue
            if error.fatal():
                raise KafkaException(error)
            log.warning("restore_consume_error", error=error.str())
            continue
        key = message.key()
        if tp[0] == side_topic and on_side_record is not None:
            on_side_record(key, message.value())
            continue
        if key is None:
            continue
        records[tp].append((key, message.value()))
        next_offsets[tp] = offset + 1
    return ChangelogBatch(dict(records), next_offsets, reached_end, out_of_range)


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


@dataclass
class _Fetching:
    """A task or standby downloading a snapshot before its changelog tail."""

    owner: Any  # RestorableTask or StandbyTask
    standby: bool
    download: SnapshotDownload


class RestorationThread(threading.Thread):
    """Restores active tasks before they process. See the module docstring."""

    def __init__(
        self,
        name: str,
        consumer_settings: dict[str, Any],
        status_topic: str | None = None,
        batch_size: int = 5000,
        remote: RemoteState | None = None,
        status_view: StatusTopicReader | None = None,
    ):
        super().__init__(name=name, daemon=True)
        if status_topic is not None and status_view is None:
            raise ValueError("a status topic needs a status_view to read it into")
        self._status_topic = status_topic
        # The status topic's records go there (read by the polling thread).
        self.status_view = status_view
        self.remote = remote
        # Tasks and standbys downloading a snapshot, by task id.
        self._fetching: dict[str, _Fetching] = {}
        # task id -> how its last restore went ("source", "seconds", "records",
        # "snapshot", "downloaded_bytes"); replaced whole, read racily.
        self.restores: dict[str, dict[str, Any]] = {}
        # Standbys: task id -> standby; changelog partition -> standby id.
        self._standbys: dict[str, StandbyTask] = {}
        self._standby_of: dict[TopicPartitionKey, str] = {}
        self._standby_stores: dict[TopicPartitionKey, Any] = {}
        self._last_standby_checkpoint = time.monotonic()
        # task id -> {"<changelog>-<partition>": position}, replaced whole.
        self.standby_positions: dict[str, dict[str, int]] = {}
        # task id -> records its copy here lags behind its changelogs' ends
        # (absent while an end is unknown); replaced whole, read racily.
        self.standby_lags: dict[str, int] = {}
        # An invalid position must reach this thread as an error event, not
        # be reset to the beginning behind its back (module docstring). Every
        # assignment here names a position or OFFSET_BEGINNING, so the reset
        # policy matters only when a position is out of range.
        self._consumer = Consumer({**consumer_settings, "auto.offset.reset": "error"})
        self._batch_size = batch_size
        self._actions: queue.SimpleQueue[_Action] = queue.SimpleQueue()
        self._restored: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._restoring: dict[str, _Restoring] = {}
        self._by_partition: dict[TopicPartitionKey, str] = {}
        self._stop_event = threading.Event()
        self.fatal_error: BaseException | None = None
        # Read racily by status(): task id -> progress figures.
        self.progress: dict[str, dict[str, float]] = {}
        self.restored_total = 0

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

    def standby_ids(self) -> list[str]:
        return sorted(self._standbys)

    def request_stop(self) -> None:
        self._stop_event.set()
        self._actions.put(_Wake())

    def restoring_task_ids(self) -> list[str]:
        return sorted(self.progress)

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        log.info("restoration_thread_started")
        try:
            if self._status_topic is not None:
                self._consumer.incremental_assign(
                    [TopicPartition(self._status_topic, 0, OFFSET_BEGINNING)]
                )
            if self.remote is not None:
                self.remote.clean_staging()
            while not self._stop_event.is_set():
                remote_work = self._remote_busy()
                busy = bool(self._restoring or self._standbys or self._status_topic or remote_work)
                self._handle_actions(block=not busy)
                if busy:
                    self.restore_once(0.0 if remote_work else 0.1)
                    self._maybe_checkpoint_standbys()
                    self._step_remote()
            for task_id in list(self._standbys) + [
                t for t, f in self._fetching.items() if f.standby
            ]:
                self._drop_standby(task_id)
        except BaseException as exc:  # noqa: BLE001 - reported via fatal_error
            self.fatal_error = exc
            log.error("restoration_thread_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            if self.remote is not None:
                self.remote.uploader.close()
            for fetching in self._fetching.values():
                fetching.download.abandon()
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
            if isinstance(action, _AddTask):
                self._start(action.task)
            elif isinstance(action, _AddStandby):
                self._start_standby(action.standby)
            elif isinstance(action, _RemoveStandby):
                action.done.set_result(self._drop_standby(action.task_id))
            elif isinstance(action, _RemoveTask):
                action.done.set_result(self._stop_restoring(action.task_id))
            elif isinstance(action, _Upload) and self.remote is not None:
                self.remote.uploader.submit(action.job)
            try:
                action = self._actions.get_nowait()
            except queue.Empty:
                return

    def _start(self, task: RestorableTask) -> None:
        if not self._fetch_snapshot(task, standby=False):
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
        fetching = self._fetching.get(task_id)
        if fetching is not None and not fetching.standby:
            del self._fetching[task_id]
            fetching.download.abandon()
            self.progress.pop(task_id, None)
            log.info("task_restore_cancelled", task_id=task_id)
            return True
        state = self._restoring.pop(task_id, None)
        self.progress.pop(task_id, None)
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
        directory = None
        for store in task.stores.values():
            if store.task_dir is None:
                continue
            directory = store.task_dir
            try:
                store.sync()
            except Exception as exc:  # the task closes next; its restore starts over
                log.warning("restore_checkpoint_failed", task_id=task.id, error=str(exc))
                return
            offsets.update(store.checkpoint_offsets())
        if directory is not None and offsets:
            write_checkpoint(checkpoint_path(directory), offsets)

    def _start_standby(self, standby: StandbyTask) -> None:
        if not self._fetch_snapshot(standby, standby=True):
            self._start_standby_changelog(standby)

    def _start_standby_changelog(self, standby: StandbyTask) -> None:
        partitions = []
        for store in standby.stores.values():
            if store.changelog_topic is None:
                continue
            tp = (store.changelog_topic, standby.partition)
            self._standby_of[tp] = standby.id
            self._standby_stores[tp] = store
            start = standby.restore_from.get(tp)
            partitions.append(
                TopicPartition(tp[0], tp[1], start if start is not None else OFFSET_BEGINNING)
            )
        self._standbys[standby.id] = standby
        if partitions:
            self._consumer.incremental_assign(partitions)
        log.info("standby_started", task_id=standby.id)

    def _drop_standby(self, task_id: str) -> bool:
        fetching = self._fetching.get(task_id)
        if fetching is not None and fetching.standby:
            del self._fetching[task_id]
            fetching.download.abandon()
            try:
                fetching.owner.close()
            except Exception as exc:
                log.warning("standby_close_failed", task_id=task_id, error=str(exc))
            log.info("standby_stopped", task_id=task_id, applied=0)
            return True
        standby = self._standbys.pop(task_id, None)
        if standby is None:
            return False
        partitions = [tp for tp, owner in self._standby_of.items() if owner == task_id]
        for tp in partitions:
            del self._standby_of[tp]
            del self._standby_stores[tp]
        if partitions:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in partitions])
        try:
            standby.close()
        except Exception as exc:
            log.warning("standby_close_failed", task_id=task_id, error=str(exc))
        log.info("standby_stopped", task_id=task_id, applied=standby.applied)
        return True

    def _maybe_checkpoint_standbys(self) -> None:
        if not self._standbys or time.monotonic() - self._last_standby_checkpoint < 5.0:
            return
        self._last_standby_checkpoint = time.monotonic()
        for standby in self._standbys.values():
            try:
                standby.checkpoint()
            except Exception as exc:
                log.warning("standby_checkpoint_failed", task_id=standby.id, error=str(exc))

    def _apply_status(self, key: bytes | None, value: bytes | None) -> None:
        if self.status_view is not None:
            self.status_view.apply(key, value)

    def restore_once(self, timeout: float = 0.1) -> None:
        messages = self._consumer.consume(self._batch_size, timeout)
        batch = sort_changelog_messages(messages, self._status_topic, self._apply_status)
        for message in messages:
            offset = message.offset()
            if (
                message.topic() == self._status_topic
                and message.error() is None
                and offset is not None
                and self.status_view is not None
            ):
                self.status_view.advance(offset + 1)
        next_offsets, reached_end = batch.next_offsets, batch.reached_end
        for tp, records in batch.records.items():
            task_id = self._by_partition.get(tp)
            if task_id is None:
                standby_id = self._standby_of.get(tp)
                if standby_id is not None:
                    self._standby_stores[tp].restore_batch(records, next_offsets[tp])
                    self._standbys[standby_id].applied += len(records)
                continue
            state = self._restoring[task_id]
            state.store_of[tp].restore_batch(records, next_offsets[tp])
            state.restored += len(records)
            self.restored_total += len(records)
        # After the records (a wipe discards any applied from the same
        # batch), before the ends: a wiped partition's end in this batch
        # is the end of a position it no longer restores from.
        restarted = {tp for tp, position in batch.out_of_range if self._out_of_range(tp, position)}
        for tp, end_offset in reached_end:
            if tp not in restarted:
                self._partition_done(tp, end_offset)
        self._update_progress()
        if self._standbys:
            self.standby_positions = {
                task_id: {
                    f"{t}-{p}": store.changelog.changelog_offset
                    for (t, p), store in self._standby_stores.items()
                    if self._standby_of[(t, p)] == task_id
                    and store.changelog is not None
                    and store.changelog.changelog_offset is not None
                }
                for task_id in self._standbys
            }
            self.standby_lags = self._standby_lags()
        elif self.standby_positions:
            self.standby_positions = {}
            self.standby_lags = {}

    def _out_of_range(self, tp: TopicPartitionKey, position: int) -> bool:
        """The changelog does not have `position`: wipe the store restoring
        from it (a task's or a standby's) and restore it from the changelog's
        start; the status topic is read again from its start. True when the
        partition was restarted."""
        restart = [TopicPartition(tp[0], tp[1], OFFSET_BEGINNING)]
        if tp == (self._status_topic, 0):
            log.warning("status_topic_position_out_of_range", topic=tp[0], position=position)
            self._consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])
            self._consumer.incremental_assign(restart)
            return True
        task_id = self._by_partition.get(tp)
        owner: Any
        if task_id is not None:
            state = self._restoring[task_id]
            if tp not in state.pending:
                return False
            store, owner, standby = state.store_of[tp], state.task, False
        else:
            standby_id = self._standby_of.get(tp)
            if standby_id is None:
                return False  # no longer restored here
            store, owner, standby = self._standby_stores[tp], self._standbys[standby_id], True
        log.warning(
            "changelog_position_out_of_range",
            task_id=owner.id,
            standby=standby,
            store=store.name,
            directory=str(store.directory or getattr(owner, "directory", "")),
            changelog=f"{tp[0]}-{tp[1]}",
            position=position,
            action="wiping the store: restoring it from the changelog's start",
        )
        self._consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])
        store.wipe()
        owner.restore_from[tp] = None
        self._consumer.incremental_assign(restart)
        return True

    def _partition_done(self, tp: TopicPartitionKey, end_offset: int) -> None:
        if tp == (self._status_topic, 0):
            if self.status_view is not None:
                self.status_view.advance(end_offset)
            return
        task_id = self._by_partition.get(tp)
        if task_id is None:
            standby_store = self._standby_stores.get(tp)
            if standby_store is not None:
                # Caught up; an empty changelog still has a position.
                standby_store.update_changelog_offset(end_offset)
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
        self.restores = {
            **self.restores,
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

    def _standby_lags(self) -> dict[str, int]:
        """Per standby (learners are standbys): records behind its changelogs'
        ends, from the watermarks the fetches brought (no request)."""
        lags: dict[str, int] = {}
        unknown: set[str] = set()
        for tp, store in self._standby_stores.items():
            task_id = self._standby_of[tp]
            changelog = store.changelog
            position = changelog.changelog_offset if changelog is not None else None
            try:
                _low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(tp[0], tp[1]), cached=True
                )
            except KafkaException:
                high = -1
            if position is None or high < 0:
                unknown.add(task_id)
                continue
            lags[task_id] = lags.get(task_id, 0) + max(0, high - position)
        return {t: lag for t, lag in lags.items() if t not in unknown}

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

    # --- remote state ---------------------------------------------------------------

    def _remote_busy(self) -> bool:
        return bool(self._fetching) or (self.remote is not None and self.remote.uploader.busy)

    def _step_remote(self) -> None:
        """One bounded step of snapshot work: a download first (a task waits for
        it), else an upload."""
        if self._fetching:
            task_id = next(iter(self._fetching))
            self._step_fetch(task_id, self._fetching[task_id])
        elif self.remote is not None:
            self.remote.uploader.step()

    def _fetch_snapshot(self, owner: Any, standby: bool) -> bool:
        """Start downloading a snapshot for a task (or standby) that has no
        usable local state; False when it restores from the changelog alone."""
        remote = self.remote
        if remote is None:
            return False
        stores = snapshot_stores(owner)
        if not stores or all(
            owner.restore_from.get((store.changelog_topic, owner.partition)) is not None
            for store in stores.values()
        ):
            return False  # nothing a snapshot would restore, or local state to use
        try:
            download = remote.find_snapshot(owner.id, stores, self._watermarks)
        except RemoteStoreError as exc:
            log.warning("remote_snapshot_list_failed", task_id=owner.id, error=str(exc))
            return False
        if download is None:
            log.info("remote_snapshot_none", task_id=owner.id)
            return False
        self._fetching[owner.id] = _Fetching(owner, standby, download)
        if not standby:
            self.progress[owner.id] = {"restored": 0, "remaining": -1, "rate": 0.0}
        return True

    def _step_fetch(self, task_id: str, fetching: _Fetching) -> None:
        download = fetching.download
        try:
            done = download.step()
        except SnapshotUnusable as exc:
            assert self.remote is not None
            self.remote.stats.snapshot_restore_failures += 1
            log.warning("remote_snapshot_fallback_to_changelog", task_id=task_id, reason=str(exc))
            del self._fetching[task_id]
            self._continue_after_fetch(fetching, None)
            return
        if not done:
            return
        del self._fetching[task_id]
        positions = download.install()
        owner = fetching.owner
        for tp, position in positions.items():
            owner.restore_from[tp] = position
        seconds = round(time.monotonic() - download.started, 3)
        log.info(
            "remote_snapshot_installed",
            task_id=task_id,
            standby=fetching.standby,
            snapshot=download.snapshot_id,
            bytes=download.downloaded_bytes,
            seconds=seconds,
            positions={f"{t}-{p}": o for (t, p), o in positions.items()},
        )
        if positions and self.remote is not None:
            self.remote.stats.snapshot_installed(
                task_id,
                {
                    "snapshot": download.snapshot_id,
                    "standby": fetching.standby,
                    "bytes": download.downloaded_bytes,
                    "seconds": seconds,
                },
            )
        self._continue_after_fetch(fetching, download if positions else None)

    def _continue_after_fetch(self, fetching: _Fetching, download: SnapshotDownload | None) -> None:
        if fetching.standby:
            self._start_standby_changelog(fetching.owner)
        else:
            self._start_changelog(fetching.owner, fetching.download.started, download)

    def _watermarks(self, topic: str, partition: int) -> tuple[int, int]:
        low, high = self._consumer.get_watermark_offsets(
            TopicPartition(topic, partition), timeout=10.0, cached=False
        )
        return int(low), int(high)
