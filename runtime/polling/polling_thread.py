"""The polling thread: the only user of the shared consumer and producer.

Its loop reads like the design: poll -> route records into task buffers ->
pause/resume partitions -> drain the record collector into the producer ->
act on parked task failures -> maybe commit. Rebalance callbacks run inside
`consume()`, so on this thread too: they create tasks for assigned partitions
and commit then close tasks for revoked ones (correctness rule 6).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from pathlib import Path
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

from runtime.collector.collector import OutputRecord, RecordCollector
from runtime.config import StreamsConfig
from runtime.logging import get_logger
from runtime.polling.clients import (
    consume_available,
    consumer_config,
    fetch_resumed_now,
    producer_config,
)
from runtime.polling.input_buffers import InputBuffers
from runtime.polling.production import OutputErrors, ProductionCounts
from runtime.polling.topics import TopicLayout
from runtime.polling.transactions import (
    TransactionFailed,
    Transactions,
    stable_transactional_id,
)
from runtime.processing.errors import TaskFailedError
from runtime.processing.task import StreamTask, TaskSettings, task_id_of
from runtime.processing.task_manager import TaskManager
from runtime.state.placement import (
    SHUTDOWN_REQUEST_KEY,
    InstanceStatus,
    ShutdownRequest,
    live_instances,
    standbys_for,
    status_topic_name,
)
from runtime.state.restoration import RestorationThread
from runtime.state.standby import StandbyTask
from runtime.topology.topology import Topology

log = get_logger("runtime.polling")

# How long the commit waits for processing threads to release their tasks
# before it logs that it is still waiting (it keeps waiting: a batch is
# bounded by task.timeslice.ms unless user code hangs).
_LOCK_WARN_AFTER_S = 5.0
_LAG_REFRESH_S = 1.0
# A long `poll.ms` is waited in slices of this length, so that a shutdown, a
# commit request or output handed over meanwhile is served at once.
_WAIT_SLICE_S = 0.05
_STATUS_INTERVAL_S = 2.0
# An instance whose status is older than this is taken for gone.
_INSTANCE_TIMEOUT_MS = 10_000


class FatalError(RuntimeError):
    """The polling thread cannot go on (a failed delivery, a failed task, a bug)."""


class PollingThreadHooks:
    """What the polling thread reports to the app (called on the polling thread)."""

    def __init__(
        self,
        on_assigned: Callable[[], None],
        on_revoking: Callable[[], None],
        on_task_failures: Callable[[list[TaskFailedError]], None],
        on_application_shutdown: Callable[[ShutdownRequest], None] = lambda request: None,
    ) -> None:
        self.on_assigned = on_assigned
        self.on_revoking = on_revoking
        self.on_task_failures = on_task_failures
        self.on_application_shutdown = on_application_shutdown


class PollingThread(threading.Thread):
    """Owns the consumer, the producer, task creation and the commit protocol."""

    def __init__(
        self,
        config: StreamsConfig,
        topology: Topology,
        layout: TopicLayout,
        settings: TaskSettings,
        task_manager: TaskManager,
        collector: RecordCollector,
        hooks: PollingThreadHooks,
        restoration: RestorationThread | None = None,
        instance_id: str = "",
    ) -> None:
        super().__init__(name=f"{config.client_id}-PollingThread", daemon=True)
        self._config = config
        self._topology = topology
        self._layout = layout
        self._settings = settings
        self._task_manager = task_manager
        self._collector = collector
        self._hooks = hooks
        self._subtopologies = {s.id: s for s in topology.subtopologies}
        self._buffers = InputBuffers(config.buffered_records_per_partition)
        self._stop_event = threading.Event()
        self._commit_now = threading.Event()
        self._abort = False  # stop without the final commit (a fatal error)
        self._tasks: dict[str, StreamTask] = {}
        # Tasks handed to the restoration thread and not yet back: in _tasks
        # (this instance owns them) but not in the task manager.
        self._restoring: set[str] = set()
        self._restoration = restoration
        self._changelog_topics = set(layout.changelogs)
        # Standbys (see runtime.state.placement): tasks whose stores the
        # restoration thread keeps warm here, decided from the status topic.
        self.instance_id = instance_id or config.client_id
        self._standby_replicas = config.num_standby_replicas if restoration else 0
        self._status_topic = status_topic_name(config.application_id) if restoration else None
        self._standbys: dict[str, StandbyTask] = {}
        self._standby_removals: dict[str, Future[bool]] = {}
        self._last_status = 0.0
        # Shutdown requests older than this instance are history.
        self._started_ms = int(time.time() * 1000)
        self._stateful_tasks = {
            task_id_of(sub.id, p): (sub, p)
            for sub in topology.subtopologies
            if any(spec.changelog and spec.kind != "memory" for spec in sub.store_specs)
            for p in range(layout.task_partitions(sub.id))
        }
        # Task ids with state here (active, restoring, standby), for the
        # cleanup thread; replaced whole, read racily.
        self.owned: frozenset[str] = frozenset()
        self._changelog_produced: dict[tuple[str, int], int] = {}
        self._last_commit = time.monotonic()
        self._last_lag_refresh = 0.0
        self.fatal_error: BaseException | None = None
        # Figures for status and metrics: written here, read racily elsewhere.
        self.consumed_total = 0
        self.produced_total = 0
        self.commits_total = 0
        self.commit_failures_total = 0
        self.last_commit_wall_time: float | None = None
        self.last_commit_duration_s = 0.0
        self.lag: dict[tuple[str, int], int] = {}
        self._committed_for_lag: dict[tuple[str, int], int] = {}
        self.broker_down_since: float | None = None
        self.assigned: list[tuple[str, int]] = []
        # Counts of tasks closed here, so totals survive rebalances.
        self.closed_task_totals = {"processed": 0, "skipped": 0, "dead_lettered": 0}

        multi_source = any(len(s.sources) > 1 for s in topology.subtopologies)
        # Co-partitioned inputs must land on the same member: range does that
        # for topics with equal partition counts; otherwise cooperative-sticky
        # avoids stop-the-world rebalances.
        self.assignment_strategy = "range" if multi_source else "cooperative-sticky"
        self._consumer = Consumer(
            consumer_config(
                config,
                self.assignment_strategy,
                {"error_cb": self._on_client_error},
            )
        )
        producer_settings = producer_config(
            config,
            {"error_cb": self._on_client_error, "on_delivery": self._on_delivery_error},
        )
        if layout.max_message_bytes is not None:
            # Records too large for a topic are then refused by produce(),
            # where the record and its origin are at hand (see production.py).
            producer_settings["message.max.bytes"] = min(
                int(producer_settings.get("message.max.bytes", 1_000_000)),
                max(1000, layout.max_message_bytes - 1024),
            )
        self._eos = config.exactly_once
        self._txn: Transactions | None = None
        if self._eos:
            app_dir = Path(config.state_dir) / config.application_id
            producer_settings["transactional.id"] = stable_transactional_id(
                app_dir, config.application_id
            )
            producer_settings.setdefault("transaction.timeout.ms", 10000)
            timeout_s = max(10.0, int(producer_settings["transaction.timeout.ms"]) / 1000.0)
            self._txn = Transactions(lambda: Producer(producer_settings), timeout_s)
            self._producer = self._txn.producer
        else:
            self._producer = Producer(producer_settings)
        self._output_errors = OutputErrors(
            config.production_exception_handler,
            config.dead_letter_queue_topic,
            int(producer_settings.get("message.max.bytes", 1_000_000)),
            self._eos,
            lambda: self._producer,
        )

    # --- requests from other threads ------------------------------------------

    def request_stop(self, commit: bool = True) -> None:
        """Ask for shutdown; with commit=False the final commit is skipped."""
        if not commit:
            self._abort = True
        self._stop_event.set()

    def request_commit(self) -> None:
        self._commit_now.set()

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        log.info("polling_thread_started", assignment_strategy=self.assignment_strategy)
        try:
            self._consumer.subscribe(
                sorted(self._layout.subtopology_of),
                on_assign=self._on_assign,
                on_revoke=self._on_revoke,
                on_lost=self._on_lost,
            )
            while not self._stop_event.is_set():
                self.poll_once()
            if self._status_topic is not None and not self._abort:
                self.publish_status(gone=True)
            if not self._abort:
                self.commit_all("shutdown")
        except BaseException as exc:  # noqa: BLE001 - reported to the app, never lost
            # Whatever failed, nothing may be committed from here on: output
            # in flight may be lost, and the revocation that closing the
            # consumer triggers must not commit past it (rule 3).
            self._abort = True
            self.fatal_error = exc
            log.error("polling_thread_failed", error=f"{type(exc).__name__}: {exc}")
        finally:
            self._close_clients()
            log.info("polling_thread_stopped")

    def poll_once(self) -> None:
        # Block for input only when nothing else will need this thread soon:
        # output on its way (buffered, or being made by a processing thread)
        # must be produced within a few ms, not after the next poll.ms.
        soon = (
            self._buffers.any_paused
            or self._collector.buffered > 0
            or self._task_manager.has_work_in_flight()
        )
        timeout = 0.005 if soon else self._config.poll_ms / 1000.0
        records = self.wait_for_records(timeout)
        if records:
            self.route_records(records)
        if self._buffers.any_paused:
            self.resume_drained_partitions()
        if self._restoring:
            self.take_restored_tasks()
        self.drain_collector()
        self._producer.poll(0)
        self.check_failures()
        self.maybe_commit()
        now = time.monotonic()
        if self._status_topic is not None and now - self._last_status >= _STATUS_INTERVAL_S:
            self._last_status = now
            self.publish_status()
            self.reconcile_standbys()
            self.check_shutdown_requests()
        if now - self._last_lag_refresh >= _LAG_REFRESH_S:
            self._last_lag_refresh = now
            self.refresh_lag()

    def wait_for_records(self, timeout: float) -> list[Message]:
        """Consume what is there, waiting up to `timeout` s for something to do.

        The wait ends early on input, on a stop or commit request, and on
        output or buffered work appearing (a processing thread finished a
        batch): `poll.ms` bounds idleness, never responsiveness.
        """
        deadline = time.monotonic() + timeout
        max_records = self._config.max_poll_records
        while True:
            remaining = deadline - time.monotonic()
            records = consume_available(
                self._consumer, max_records, max(0.0, min(remaining, _WAIT_SLICE_S))
            )
            if records or remaining <= _WAIT_SLICE_S:
                return records
            if (
                self._stop_event.is_set()
                or self._commit_now.is_set()
                or self._collector.buffered > 0
                or self._task_manager.has_work_in_flight()
            ):
                return records

    def route_records(self, records: list[Message]) -> None:
        """Append consumed records to their task's input queue; pause full ones."""
        routed, to_pause = self._buffers.route(records, self._on_consume_error)
        self.consumed_total += routed
        if routed and self.broker_down_since is not None:
            self.note_broker_ok()
        if to_pause:
            self._consumer.pause([TopicPartition(t, p) for t, p in to_pause])
        if routed:
            self._task_manager.notify_work()

    def resume_drained_partitions(self) -> None:
        to_resume = self._buffers.to_resume()
        if to_resume:
            partitions = [TopicPartition(t, p) for t, p in to_resume]
            self._consumer.resume(partitions)
            fetch_resumed_now(self._consumer, partitions)

    # --- standbys ---------------------------------------------------------------

    def publish_status(self, gone: bool = False) -> None:
        """Tell the other instances which tasks run here (a tombstone when gone)."""
        assert self._status_topic is not None
        if self._txn is not None:
            self._txn.ensure_open()
        value = None
        if not gone:
            value = InstanceStatus(
                self.instance_id,
                frozenset(self._tasks),
                frozenset(self._standbys),
                int(time.time() * 1000),
            ).encode()
        self._producer.produce(self._status_topic, value, self.instance_id.encode(), partition=0)

    def request_application_shutdown(self, reason: str) -> None:
        """SHUTDOWN_APPLICATION: ask every instance (this one included) to stop.

        The request goes on the status topic, which every instance's
        restoration thread reads. Under exactly-once the open transaction
        holds the failed batch's output: it is aborted first, and the
        request goes in a transaction of its own.
        """
        if self._status_topic is None:
            return
        request = ShutdownRequest(self.instance_id, reason, int(time.time() * 1000))
        if self._txn is not None:
            self._txn.abort()
            self._producer = self._txn.producer
            self._txn.ensure_open()
        self._producer.produce(
            self._status_topic, request.encode(), SHUTDOWN_REQUEST_KEY, partition=0
        )
        if self._txn is not None:
            self._txn.commit([], None)
        else:
            self._producer.flush(10)
        log.warning("application_shutdown_requested", reason=reason)

    def check_shutdown_requests(self) -> None:
        assert self._restoration is not None
        request = self._restoration.shutdown_request
        if request is not None and request.timestamp_ms >= self._started_ms:
            self._hooks.on_application_shutdown(request)

    def reconcile_standbys(self) -> None:
        """Move the standbys kept here toward what placement says."""
        assert self._restoration is not None
        live = live_instances(self._restoration.statuses, timeout_ms=_INSTANCE_TIMEOUT_MS)
        live[self.instance_id] = InstanceStatus(
            self.instance_id, frozenset(self._tasks), timestamp_ms=int(time.time() * 1000)
        )
        wanted = standbys_for(
            self.instance_id, self._stateful_tasks, live, self._standby_replicas
        ) - set(self._tasks)
        for task_id in sorted(set(self._standbys) - wanted):
            self._standbys.pop(task_id)
            self._standby_removals[task_id] = self._restoration.remove_standby(task_id)
        for task_id in sorted(wanted - set(self._standbys)):
            self._wait_standby_removed(task_id)
            sub, partition = self._stateful_tasks[task_id]
            standby = StandbyTask(
                task_id,
                partition,
                sub.store_specs,
                self._settings.state_dir,
                self._config.application_id,
            )
            self._standbys[task_id] = standby
            self._restoration.add_standby(standby)
        self._update_owned()

    def _release_standby(self, task_id: str) -> None:
        """Before a task becomes active here: close its standby (same stores)."""
        if task_id in self._standbys:
            assert self._restoration is not None
            self._standbys.pop(task_id)
            self._standby_removals[task_id] = self._restoration.remove_standby(task_id)
        self._wait_standby_removed(task_id)

    def _wait_standby_removed(self, task_id: str) -> None:
        future = self._standby_removals.pop(task_id, None)
        if future is not None:
            future.result(timeout=30)

    def _update_owned(self) -> None:
        self.owned = frozenset(self._tasks) | frozenset(self._standbys)

    def take_restored_tasks(self) -> None:
        """Give tasks the restoration thread finished to the task manager."""
        assert self._restoration is not None
        if self._restoration.fatal_error is not None:
            raise FatalError(f"restoration failed: {self._restoration.fatal_error}")
        for task in self._restoration.drain_restored():
            if task.id in self._restoring and not task.closed:
                self._restoring.discard(task.id)
                self._task_manager.add_task(task)
                log.info("task_running", task_id=task.id, restored=task.restored_records)

    def restoring_tasks(self) -> list[StreamTask]:
        return [self._tasks[t] for t in sorted(self._restoring) if t in self._tasks]

    def drain_collector(self) -> int:
        """Move every buffered output record into the producer."""
        buffers = self._collector.take_all()
        if not buffers:
            return 0
        produced = 0
        for records in buffers.values():
            produced += self._produce(records)
        self.produced_total += produced
        return produced

    def _produce(self, records: list[OutputRecord]) -> int:
        if self._txn is not None:
            self._txn.ensure_open()
        topic, partition = records[0][0], records[0][1]
        if topic in self._changelog_topics:
            tp = (topic, partition)
            self._changelog_produced[tp] = self._changelog_produced.get(tp, 0) + len(records)
        produce = self._producer.produce
        for record in records:
            _t, _p, key, value, timestamp, headers, _st, _sp, _so = record
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
                    self._producer.poll(0.1)
                except KafkaException as exc:
                    # Refused for good (too large, ...): the handler skips it,
                    # dead-letters it, or raises ProductionFailed.
                    self._output_errors.on_produce_error(record, exc)
                    break
        return len(records)

    def check_failures(self) -> None:
        failures = self._task_manager.drain_failures()
        if failures:
            self._hooks.on_task_failures(failures)
        failure = self._output_errors.take_failure()
        if failure is not None:
            raise failure

    def maybe_commit(self) -> None:
        due = time.monotonic() - self._last_commit >= self._config.commit_interval_ms / 1000.0
        if due or self._commit_now.is_set() or self._any_task_requested_commit():
            self._commit_now.clear()
            self.commit_all("interval" if due else "requested")

    def _any_task_requested_commit(self) -> bool:
        return any(t.commit_requested for t in self._tasks.values())

    # --- the commit protocol (rule 4) -----------------------------------------

    @contextmanager
    def all_tasks_locked(self) -> Iterator[None]:
        """Stop scheduling and wait until no processing thread holds a task."""
        future = self._task_manager.lock_all_tasks()
        try:
            started = time.monotonic()
            while True:
                try:
                    future.result(timeout=0.05)
                    break
                except TimeoutError:
                    # Keep the producer serving delivery reports meanwhile.
                    self._producer.poll(0)
                    if time.monotonic() - started > _LOCK_WARN_AFTER_S:
                        log.warning("commit_waiting_for_processing_threads")
                        started = time.monotonic()
            yield
        finally:
            self._task_manager.unlock_all_tasks()

    def commit_all(self, reason: str) -> bool:
        """Lock tasks, drain, flush, commit offsets. Returns True if committed."""
        self._last_commit = time.monotonic()
        if not self._tasks and not (self._txn is not None and self._txn.open):
            return True
        with self.all_tasks_locked():
            return self._commit_locked(reason)

    def _commit_locked(self, reason: str, tasks: list[StreamTask] | None = None) -> bool:
        started = time.monotonic()
        if tasks is None:
            tasks = [t for t in self._tasks.values() if t.id not in self._restoring]
        offsets: list[TopicPartition] = []
        per_task: list[tuple[StreamTask, dict[str, int]]] = []
        for task in tasks:
            task.commit_requested = False
            moved = task.offsets_to_commit()
            if moved:
                per_task.append((task, moved))
                offsets.extend(TopicPartition(t, task.partition, o) for t, o in moved.items())
        # State first: cached writes become changelog records and downstream
        # output, all of it handed to the collector.
        for task in tasks:
            task.emit_state()
            self._collector.hand_over(task.take_output())
        self.drain_collector()
        if self._txn is not None:
            # One transaction: every task's output and changelog records, and
            # the input offsets that produced them.
            try:
                self._txn.commit(offsets, self._consumer.consumer_group_metadata())
            except TransactionFailed as failure:
                refused = self._output_errors.take_failure()
                if refused is not None:
                    # A record the broker refused for good: rewinding would
                    # only refuse it again.
                    raise refused from failure
                self._after_abort(failure)
                return False
        else:
            # Output acknowledged, then the offsets that produced it (rule 3).
            self.flush_producer()
            refused = self._output_errors.take_failure()
            if refused is not None:
                raise refused
        # Only now does state reach the disk, then the checkpoint names it.
        for task in tasks:
            task.commit_state()
            task.write_checkpoint(self._changelog_produced)
        if not offsets:
            return True
        if self._txn is None:
            try:
                self._consumer.commit(offsets=offsets, asynchronous=False)
            except KafkaException as exc:
                # At-least-once: the offsets are committed with the next commit;
                # nothing is lost, at worst reprocessed.
                self.commit_failures_total += 1
                log.warning("commit_failed", reason=reason, error=str(exc))
                return False
        for task, moved in per_task:
            task.mark_committed(moved)
        self.commits_total += 1
        if self.broker_down_since is not None:
            self.note_broker_ok()
        self.last_commit_wall_time = time.time()
        self.last_commit_duration_s = time.monotonic() - started
        log.debug("committed", reason=reason, partitions=len(offsets))
        return True

    def flush_producer(self) -> None:
        """Wait until every produced record is acknowledged (or failed)."""
        waited_since = time.monotonic()
        while True:
            remaining = self._producer.flush(1.0)
            if remaining == 0:
                return
            if time.monotonic() - waited_since > 5.0:
                # A stalled (not disconnected) broker raises no client error
                # until socket timeouts expire: report the outage from here.
                if self.broker_down_since is None:
                    self.broker_down_since = time.time()
                    log.warning(
                        "broker_unreachable", reason="flush stalled", unacknowledged=remaining
                    )
                else:
                    log.warning("flush_waiting", unacknowledged=remaining)
                waited_since = time.monotonic()
            if self._abort:
                raise FatalError("shutdown without commit requested during flush")

    # --- rebalance (inside consume(), on this thread) -----------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._committed_for_lag.clear()
            created = self._create_tasks(partitions)
            self.assigned = self._buffers.partitions()
            log.info(
                "partitions_assigned",
                partitions=len(partitions),
                tasks_created=created,
                tasks=sorted(self._tasks),
            )
            self._hooks.on_assigned()
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._hooks.on_revoking()
            affected = self._tasks_of(partitions)
            log.info("partitions_revoked", partitions=len(partitions), tasks=sorted(affected))
            if not affected:
                return
            with self.all_tasks_locked():
                if not self._abort:
                    self._commit_locked("revocation")
                self._close_tasks(affected)
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        try:
            self._hooks.on_revoking()
            affected = self._tasks_of(partitions)
            log.warning("partitions_lost", partitions=len(partitions), tasks=sorted(affected))
            with self.all_tasks_locked():
                # The group moved on without us: these offsets can no longer be
                # committed. Produced output stays (at-least-once) or is
                # aborted with the transaction (exactly-once); the new owner
                # reprocesses.
                if self._txn is not None and self._txn.open:
                    self._after_abort(self._txn.abort())
                    affected = [t for t in affected if t in self._tasks]
                self._close_tasks(affected, discard_output=self._txn is not None)
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _after_abort(self, failure: TransactionFailed) -> None:
        """The transaction was aborted: drop its work and rewind every task.

        All tasks are locked by the caller. Output not yet produced belongs
        to the aborted work too; state writes since the last commit were
        never applied to disk, and closing the tasks drops them.
        """
        assert self._txn is not None
        self._producer = self._txn.producer
        self.commit_failures_total += 1
        self._collector.take_all()
        self._changelog_produced.clear()
        # A delivery failure inside the aborted transaction went with it.
        self._output_errors.take_failure()
        task_ids = [t for t in self._tasks if t not in self._restoring]
        partitions = [
            TopicPartition(topic, self._tasks[t].partition)
            for t in task_ids
            for topic in self._tasks[t].queues
            if (topic, self._tasks[t].partition) in self._buffers
        ]
        self._close_tasks(task_ids, discard_output=True)
        self._seek_to_committed(partitions)
        self._create_tasks(partitions)
        log.warning(
            "transaction_aborted_tasks_rewound",
            error=str(failure),
            tasks=task_ids,
            producer_recreated=failure.recreated_producer,
        )

    def _seek_to_committed(self, partitions: list[TopicPartition]) -> None:
        if not partitions:
            return
        committed = self._consumer.committed(partitions, timeout=30)
        for tp in committed:
            # No committed offset yet: start where auto.offset.reset says.
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        self._consumer.resume(partitions)

    def rewind_task(self, task_id: str) -> bool:
        """Close a failed task and start it again from its committed offsets.

        The failed batch is not committed: its input is fetched and processed
        again (output it already produced may repeat: at-least-once). Called
        on this thread, by the failure policy. Returns False if the task is gone.
        """
        task = self._tasks.get(task_id)
        if task is None:
            return False
        if self._txn is not None:
            # Under exactly-once the failed batch's output shares the open
            # transaction with every other task's: abort it all and rewind.
            with self.all_tasks_locked():
                self._after_abort(self._txn.abort())
            return True
        partitions = [TopicPartition(topic, task.partition) for topic in task.queues]
        assigned = [tp for tp in partitions if (tp.topic, tp.partition) in self._buffers]
        with self.all_tasks_locked():
            self._close_tasks([task_id])
            self._seek_to_committed(assigned)
            self._create_tasks(assigned)
        log.info("task_rewound", task_id=task_id)
        return True

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

    def _create_tasks(self, partitions: list[TopicPartition]) -> int:
        created = 0
        for tp in partitions:
            sub_id = self._layout.subtopology_of.get(tp.topic)
            if sub_id is None:
                continue
            task_id = task_id_of(sub_id, tp.partition)
            task = self._tasks.get(task_id)
            if task is None:
                self._release_standby(task_id)
                topics = [
                    t
                    for t in self._layout.sources[sub_id]
                    if tp.partition < self._layout.partitions[t]
                ]
                task = StreamTask(self._subtopologies[sub_id], tp.partition, topics, self._settings)
                self._tasks[task_id] = task
                created += 1
                if task.changelog_partitions:
                    assert self._restoration is not None, "stores need the restoration thread"
                    self._restoring.add(task_id)
                    self._restoration.add_task(task)
                    log.info("task_created", task_id=task_id, restoring=True)
                else:
                    self._task_manager.add_task(task)
                    log.info("task_created", task_id=task_id)
            self._buffers.register(task.queues[tp.topic])
        self._update_owned()
        return created

    def _close_tasks(self, task_ids: list[str], discard_output: bool = False) -> None:
        """Remove and close tasks; all tasks must be locked by the caller."""
        for task_id in task_ids:
            task = self._tasks.pop(task_id)
            if task_id in self._restoring:
                assert self._restoration is not None
                self._restoring.discard(task_id)
                # The restoration thread must let go of the stores first.
                self._restoration.remove_task(task_id).result(timeout=30)
            self._task_manager.remove_task(task_id)
            for topic in task.queues:
                self._buffers.unregister(topic, task.partition)
            try:
                task.close()
            except Exception as exc:  # a user close() failing must not stop the rebalance
                log.warning("task_close_failed", task_id=task_id, error=str(exc))
            # Output produced during close (or still taken) belongs to the
            # collector, so the next drain sends it (unless it belongs to an
            # aborted transaction).
            output = task.take_output()
            if not discard_output:
                self._collector.hand_over(output)
            self._retire_counts(task)
            log.info("task_closed", task_id=task_id)
        self.assigned = self._buffers.partitions()
        self._update_owned()

    def _retire_counts(self, task: StreamTask) -> None:
        totals = self.closed_task_totals
        totals["processed"] += task.processed_count
        totals["skipped"] += task.skipped_count
        totals["dead_lettered"] += task.dead_lettered_count

    # --- client callbacks (on this thread, from poll/consume/flush) ----------------

    def _on_client_error(self, error: KafkaError) -> None:
        code = error.code()
        if code in (KafkaError._ALL_BROKERS_DOWN, KafkaError._TRANSPORT, KafkaError._TIMED_OUT):
            if self.broker_down_since is None:
                self.broker_down_since = time.time()
                log.warning("broker_unreachable", error=error.str())
            return
        if error.fatal():
            log.error("client_fatal_error", error=error.str())
            self.fatal_error = KafkaException(error)
            self._abort = True
            self._stop_event.set()
            return
        log.warning("client_error", error=error.str())

    def _on_delivery_error(self, error: KafkaError | None, message: Message) -> None:
        if error is None:
            return
        self._output_errors.on_delivery_error(error, message)

    def _on_consume_error(self, message: Message) -> None:
        error = message.error()
        assert error is not None
        if error.code() == KafkaError._PARTITION_EOF:
            return
        if error.fatal():
            raise KafkaException(error)
        log.warning("consume_error", error=error.str())

    def note_broker_ok(self) -> None:
        if self.broker_down_since is not None:
            log.info(
                "broker_reachable_again", down_s=round(time.time() - self.broker_down_since, 1)
            )
            self.broker_down_since = None

    def refresh_lag(self) -> None:
        """Records behind the end of each assigned partition (cached watermarks).

        "Done" is the next offset to process: after the last processed record
        when the task processed any; else the consumer's position less what
        sits in the input buffer; else the group's committed offset (asked of
        the broker once per partition); else the log start. A task that has
        not processed yet after a restart therefore shows the lag of its
        committed offset, not of offset 0.
        """
        keys = self._buffers.partitions()
        if not keys:
            self.lag = {}
            return
        try:
            positions = {
                (tp.topic, tp.partition): tp.offset
                for tp in self._consumer.position([TopicPartition(t, p) for t, p in keys])
            }
        except KafkaException:
            positions = {}
        lag: dict[tuple[str, int], int] = {}
        needs_committed: list[tuple[str, int]] = []
        done_at: dict[tuple[str, int], int] = {}
        for topic, partition in keys:
            task = self._tasks.get(task_id_of(self._layout.subtopology_of[topic], partition))
            processed = task.processed_offsets.get(topic) if task else None
            position = positions.get((topic, partition), -1)
            if processed is not None:
                done_at[(topic, partition)] = processed + 1
            elif position >= 0:
                done_at[(topic, partition)] = position - self._buffers.buffered((topic, partition))
            elif (topic, partition) in self._committed_for_lag:
                done_at[(topic, partition)] = self._committed_for_lag[(topic, partition)]
            else:
                needs_committed.append((topic, partition))
        if needs_committed:
            self._learn_committed_for_lag(needs_committed)
        for key in keys:
            topic, partition = key
            try:
                low, high = self._consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), cached=True
                )
            except KafkaException:
                continue
            if high < 0:
                continue
            done = done_at.get(key, self._committed_for_lag.get(key, -1))
            if done < 0:
                done = max(low, 0)
            lag[key] = max(0, high - done)
        self.lag = lag

    def _learn_committed_for_lag(self, keys: list[tuple[str, int]]) -> None:
        """Ask the group's committed offsets once for partitions with nothing else known."""
        try:
            committed = self._consumer.committed(
                [TopicPartition(t, p) for t, p in keys], timeout=2.0
            )
        except KafkaException:
            return
        for tp in committed:
            # -1 (nothing committed) is remembered too: ask once, not every second.
            self._committed_for_lag[(tp.topic, tp.partition)] = tp.offset if tp.offset >= 0 else -1

    def _close_clients(self) -> None:
        try:
            if self._abort:
                # Leave the group without committing: close() would call
                # on_revoke, which must not commit after a fatal error.
                self._tasks_close_all_dirty()
            self._consumer.close()
        except Exception as exc:
            log.warning("consumer_close_failed", error=str(exc))
        try:
            if self._txn is not None and self._txn.open:
                # Whatever is still open was not committed with offsets: abort.
                self._txn.abort()
            elif self._txn is None:
                self.drain_collector()
            remaining = self._producer.flush(self._config.shutdown_timeout_ms / 1000.0)
            if remaining:
                log.warning("producer_close_unflushed", unacknowledged=remaining)
            # Release the client's threads and connections now, not whenever
            # the App object is garbage-collected.
            self._producer.close()
        except Exception as exc:
            log.warning("producer_close_failed", error=str(exc))
        # Left over only if close() did not call on_revoke: close them dirty.
        self._tasks_close_all_dirty()

    def _tasks_close_all_dirty(self) -> None:
        """Close every task without committing (after a fatal error).

        The app stops processing threads before this runs; a thread that did
        not stop in time still holds its task, which is then left to it.
        """
        for task_id in list(self._tasks):
            task = self._tasks.pop(task_id)
            self._retire_counts(task)
            try:
                if task_id in self._restoring and self._restoration is not None:
                    self._restoration.remove_task(task_id).result(timeout=30)
                self._task_manager.remove_task(task_id)
                task.close()
            except Exception as exc:
                log.warning("task_close_failed", task_id=task_id, error=str(exc))
        self._buffers.clear()

    @property
    def output_error_counts(self) -> ProductionCounts:
        """Output records the production handler skipped, dead-lettered, truncated."""
        return self._output_errors.counts

    @property
    def transactions_committed(self) -> int:
        return self._txn.committed if self._txn else 0

    @property
    def transactions_aborted(self) -> int:
        return self._txn.aborted if self._txn else 0

    def status(self) -> dict[str, Any]:
        return {
            "consumed": self.consumed_total,
            "produced": self.produced_total,
            "commits": self.commits_total,
            "commit_failures": self.commit_failures_total,
        }
