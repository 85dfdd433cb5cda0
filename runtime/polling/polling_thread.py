"""The polling thread: the coordinator, and the only user of the shared consumer.

Its loop reads like the design: poll -> route records into task buffers ->
pause/resume partitions -> take restored tasks -> drain the record collector
into the producer -> act on parked task failures -> maybe commit -> publish
status. Rebalance callbacks run inside the consumer's poll, so on this thread
too: they create tasks for assigned partitions and commit then close tasks for
revoked ones (correctness rule 6).

The work itself lives in helpers this thread owns, one idea each:
`output.OutputChannel` (the producer, collector drain, delivery reports),
`committer.Committer` (the commit protocol), `active_tasks.ActiveTasks` (task
create/close/rewind), `placement.TaskPlacement` (status, standbys, shutdown
requests), `expansion.PartitionExpansion` (partition increases),
`lag.LagTracker` and `input_wait.InputWait` (how long to wait for input),
`fetched_lags.FetchedLags` (what a task waiting for a partition knows of it),
`stall_watch.StallWatch` (input partitions that stopped fetching).
This class decides what happens when: on a failed transaction it rewinds
every task; on any other failure it stops without committing.

Over 500 lines as one thing: the loop, its steps in their order and the
rebalance callbacks are the one place where the polling thread's order of
events is decided; split, that order would be spread over files.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from confluent_kafka import Consumer, Message, TopicPartition

from runtime.collector.collector import RecordCollector
from runtime.collector.output import OutputChannel
from runtime.collector.transactions import TransactionFailed
from runtime.config import StreamsConfig
from runtime.kafka.broker_health import BrokerHealth
from runtime.kafka.clients import (
    admin_config,
    assignment_strategy,
    consumer_config,
    fetch_resumed_now,
    log_consume_error,
)
from runtime.kafka.consumer_release import close_in_background
from runtime.kafka.error_chain import as_exception
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger, log_failure
from runtime.placement.parts import Handovers, PollingSide, RuntimePlacementSettings
from runtime.placement.placer import PlacerSettings
from runtime.placement.records import ShutdownRequest
from runtime.placement.runtime_assignment import RuntimeAssignment
from runtime.placement.status_view import StatusTopicView
from runtime.polling.active_tasks import ActiveTasks
from runtime.polling.committer import CommitResult, Committer
from runtime.polling.expansion import PartitionExpansion
from runtime.polling.fetched_lags import FetchedLags
from runtime.polling.input_buffers import InputBuffers
from runtime.polling.input_wait import InputWait
from runtime.polling.lag import LagTracker
from runtime.polling.query_changes import QueryChanges
from runtime.polling.rebalance_wait import RebalanceCommitWait
from runtime.polling.stall_watch import StallWatch
from runtime.polling.startup import StartupProgress
from runtime.polling.status_and_standbys import TaskPlacement
from runtime.processing.errors import TaskFailedError
from runtime.processing.task_manager import TaskManager
from runtime.processing.task_settings import TaskSettings
from runtime.state.global_thread import GlobalStoreError, GlobalStreamThread
from runtime.state.restoration import RestorationThread
from runtime.topology.topology import Topology

log = get_logger("runtime.polling")

_LAG_REFRESH_S = 1.0
# Commits right before their tasks close (a revocation, a removed query): one
# that cannot be made while a failure awaits its policy aborts instead.
_CLOSES_TASKS = ("revocation", "query removed")
_STATUS_INTERVAL_S = 2.0


class FatalError(RuntimeError):
    """The polling thread cannot go on (a failed restoration, a bug)."""


@dataclass(frozen=True)
class PollingThreadHooks:
    """What the polling thread reports to the app (called on the polling thread)."""

    on_assigned: Callable[[], None]
    on_revoking: Callable[[], None]
    on_task_failures: Callable[[list[TaskFailedError]], None]
    on_application_shutdown: Callable[[ShutdownRequest], None] = lambda request: None
    # Runtime-owned placement: the processing threads this instance offers.
    capacity: Callable[[], int] = lambda: 1


class PollingThread(threading.Thread):
    """Owns the consumer and, through its helpers, the producer, tasks and commits."""

    def __init__(
        self,
        config: StreamsConfig,
        topology: Topology,
        layout: TopicLayout,
        settings: TaskSettings,
        task_manager: TaskManager,
        collector: RecordCollector,
        hooks: PollingThreadHooks,
        restoration: RestorationThread,
        instance_id: str,
        query_priorities: Iterable[int] = (),
        status_view: StatusTopicView | None = None,
        named_queries: bool = False,
    ) -> None:
        super().__init__(name=f"{config.client_id}-PollingThread", daemon=True)
        self._config = config
        self._layout = layout
        self.layout = layout  # read by QueryChanges (same object)
        self._task_manager = task_manager
        self._collector = collector
        self._hooks = hooks
        self._restoration = restoration
        self._buffers = InputBuffers(config.buffered_records_per_partition)
        self._stop_event = threading.Event()
        self._commit_now = threading.Event()
        self._input = InputWait(
            config,
            self._buffers,
            collector,
            task_manager,
            lambda: self._stop_event.is_set() or self._commit_now.is_set(),
        )
        self._input.tune(list(query_priorities))
        self._abort = False  # stop without the final commit (a fatal error)
        self._last_commit = time.monotonic()
        self._last_lag_refresh = 0.0
        self._last_status = 0.0
        self.fatal_error: BaseException | None = None
        # Figures for status and metrics: written here, read racily elsewhere.
        self.consumed_total = 0
        self.health = BrokerHealth(on_fatal=self._on_fatal_client_error)
        # Task ids with state here (active, restoring, standby), for the
        # cleanup thread; replaced whole, read racily.
        self.owned: frozenset[str] = frozenset()
        # Set by the first rebalance callback: until then the group was never
        # joined and closing need not wait for a LeaveGroup (_close_clients).
        self.joined = False
        # Set once the consumer was handed to a background close before the
        # group was joined: its callbacks, if librdkafka still runs any, do nothing.
        self._consumer_released = False
        # What shutdown is doing now, for App.close's report when it takes
        # long; written by this thread, read racily.
        self.shutdown_step: str | None = None

        runtime_placed = config.task_assignment == "runtime"
        # Runtime-owned placement joins the group on the one-partition status
        # topic only, with cooperative-sticky (runtime.placement.runtime_assignment).
        self.assignment_strategy = (
            "cooperative-sticky" if runtime_placed else assignment_strategy(topology)
        )
        consumer_settings = consumer_config(
            config,
            self.assignment_strategy,
            {"error_cb": self.health.on_client_error},
            named_queries,
        )
        self._consumer = Consumer(consumer_settings)
        session_timeout = consumer_settings.get("session.timeout.ms")
        self.startup = StartupProgress(
            config.application_id,
            config.bootstrap_servers,
            int(session_timeout) if session_timeout is not None else None,
        )
        self.output = OutputChannel(
            config,
            collector,
            layout.max_message_bytes,
            on_client_error=self.health.on_client_error,
            on_stall=self.health.on_flush_stall,
            retrying=self.health.retrying,
        )
        self.committer = Committer(task_manager, self.output, self._consumer, lambda: self._abort)
        transactions = self.output.transactions
        self._rebalance_wait = RebalanceCommitWait(
            not runtime_placed and self.assignment_strategy == "cooperative-sticky",
            transactions.timeout_s if transactions is not None else None,
        )
        # The status topic as the restoration thread's loop reads it (one
        # snapshot a decision), shared by standby placement and placement.
        status_view = status_view or StatusTopicView()
        self.placement = TaskPlacement(
            config.application_id,
            instance_id,
            config.num_standby_replicas,
            topology,
            layout,
            settings,
            restoration,
            self.output,
            active_ids=lambda: self.tasks.ids(),
            status_view=status_view,
            daemon=config.process_daemon or "",
        )
        settings.while_directory_waits = self.placement.release_claimed_standbys
        self.tasks = ActiveTasks(
            topology,
            layout,
            settings,
            self._buffers,
            task_manager,
            restoration,
            self.output,
            self._consumer,
            release_standby=self.placement.release_standby,
            retrying=self.health.retrying,
        )
        self.runtime: RuntimeAssignment | None = None
        if runtime_placed:
            self.runtime = RuntimeAssignment(
                RuntimePlacementSettings(
                    instance_id,
                    config.application_id,
                    admin_config(config),
                    PlacerSettings(config.acceptable_recovery_lag, config.max_warmup_replicas),
                ),
                PollingSide(
                    self._consumer,
                    layout,
                    self.tasks,
                    self.placement,
                    self.committer,
                    self.output,
                    lifecycle=self,
                    request_commit=self.request_commit,
                    on_left=lambda: self.request_stop(commit=True),
                ),
                Handovers(
                    status_view,
                    standby_lags=lambda: restoration.figures().standby_lags,
                    capacity=hooks.capacity,
                ),
            )
        self.lag_tracker = LagTracker(self._consumer, self._buffers, self._processed_offset)
        # The app's global thread, if its topology has global tables (set by
        # the assembly): its failure after start-up stops the app.
        self.global_thread: GlobalStreamThread | None = None
        self.fetched_lags = FetchedLags(self._consumer, self._buffers, self.lag_tracker.committed)
        self.stall_watch = StallWatch()
        self.expansion = PartitionExpansion(config, topology, layout, self.tasks, self.output)
        self.query_changes = QueryChanges(self)

    # --- requests from other threads ------------------------------------------

    def request_stop(self, commit: bool = True) -> None:
        """Ask for shutdown; with commit=False the final commit is skipped. Any thread."""
        if not commit:
            self._abort = True
        self._stop_event.set()

    @property
    def stop_requested(self) -> bool:
        """Whether anything asked this thread to stop (a close, a failure
        policy, a planned departure, a fatal client error). Its loop ends
        otherwise only by an exception it records in `fatal_error`. Any thread."""
        return self._stop_event.is_set()

    def request_commit(self) -> None:
        """Commit at the next loop turn. Any thread."""
        self._commit_now.set()

    # --- the loop ---------------------------------------------------------------

    def run(self) -> None:
        log.info("polling_thread_started", assignment_strategy=self.assignment_strategy)
        try:
            self.subscribe()
            self.startup.subscribed()
            while not self._stop_event.is_set():
                self.poll_once()
            if not self._abort and self.runtime is not None:
                self.shutdown_step = "the final commit and leaving the placement"
                self.runtime.stop_cleanly(self.commit_all, self.joined)
            elif not self._abort:
                if self.joined:  # before that, no status was published
                    self.shutdown_step = "publishing the final status"
                    self.placement.publish_status(gone=True)
                self.shutdown_step = "the final commit"
                self.commit_all("shutdown")
        except:  # noqa: E722 - reported to the app, never lost; bare: a raw KafkaError
            # matches no exception class, BaseException included (error_chain).
            exc = as_exception(sys.exc_info()[1])
            # Whatever failed, nothing may be committed from here on: output
            # in flight may be lost, and the revocation that closing the
            # consumer triggers must not commit past it (rule 3).
            self._abort = True
            # Recorded before anything that could fail in turn: the app must
            # end in ERROR with this failure, never NOT_RUNNING without it.
            self.fatal_error = exc
            log_failure(log, "polling_thread_failed", exc)
        finally:
            try:
                self.query_changes.fail_pending(FatalError("the polling thread stopped"))
                self._close_clients()
            except Exception as exc:  # noqa: BLE001 - the thread ends either way
                if self.fatal_error is None:
                    self.fatal_error = exc
                log_failure(log, "polling_thread_close_failed", exc)
            log.info("polling_thread_stopped")

    @property
    def consumer(self) -> Consumer:
        """The main consumer, for this thread's helpers (QueryChanges)."""
        return self._consumer

    def subscribe(self) -> None:
        """(Re)subscribe to every source topic of the layout: at start-up, and
        after a named query was added or removed (one rebalance). Under
        runtime-owned placement the group covers the coordination topic only;
        the placer hands out the data partitions."""
        topics = sorted(self._layout.subtopology_of)
        if self.runtime is not None:
            topics = [self.runtime.coordination.topic]
        self._consumer.subscribe(
            topics,
            on_assign=self._on_assign,
            on_revoke=self._on_revoke,
            on_lost=self._on_lost,
        )

    def poll_once(self) -> None:
        """One turn of the loop (see the module docstring)."""
        records = self._input.next_records(self._consumer)  # runtime.polling.input_wait
        if records:
            self.route_records(records)
        if self.fetched_lags.refresh():  # max.task.idle.ms: a waiting task may go on
            self._task_manager.notify_work()
        if self._buffers.any_paused:
            self.resume_drained_partitions()
        if self.tasks.any_restoring:
            self.take_restored_tasks()
        if self.tasks.unsought and self.tasks.seek_unsought():
            self._update_owned()  # rewound tasks are back (runtime.polling.active_tasks)
        self.output.drain()
        self.output.serve()
        self.recover_broken_producer()
        self.check_failures()
        self.query_changes.apply_requested()
        self.maybe_commit()
        if self.runtime is not None and self.joined:
            self.runtime.tick()
            self._update_owned()
        self.expansion.tick()
        now = time.monotonic()
        if now - self._last_status >= _STATUS_INTERVAL_S:
            self._last_status = now
            self.publish_status()
        if now - self._last_lag_refresh >= _LAG_REFRESH_S:
            self._last_lag_refresh = now
            self.lag_tracker.refresh()
            self.watch_stalls()
        if not self.startup.done:
            self.observe_startup()

    def observe_startup(self) -> None:
        """Name what start-up waits for (runtime.polling.startup), until it is over."""
        self.startup.observe(self._consumer.memberid(), self.joined, len(self.tasks.restoring()))

    def tune_refill(self, query_priorities: Iterable[int]) -> None:
        """Any thread (App.start, add_query, remove_query): see `InputWait.tune`."""
        self._input.tune(query_priorities)

    def route_records(self, records: list[Message]) -> None:
        """Append consumed records to their task's input queue; pause full ones."""
        routed, to_pause = self._buffers.route(records, log_consume_error)
        self.consumed_total += routed
        if routed:
            self.health.note_ok()
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

    def watch_stalls(self) -> None:
        """Report and resume input partitions that should fetch and do not
        (runtime.polling.stall_watch)."""
        lag = self.lag_tracker
        stalled = self.stall_watch.observe(lag.positions, lag.fetchable, self._buffers.paused())
        if stalled:
            partitions = [TopicPartition(t, p) for t, p in stalled]
            log.warning(
                "partitions_stalled",
                partitions=[f"{t}-{p}" for t, p in stalled],
                seconds=self.stall_watch.after_s,
                action="resumed in the consumer",
                hint="not paused by the runtime, records to fetch, position unchanged",
            )
            self._consumer.resume(partitions)
            fetch_resumed_now(self._consumer, partitions)

    def take_restored_tasks(self) -> None:
        if self._restoration.fatal_error is not None:
            raise FatalError(f"restoration failed: {self._restoration.fatal_error}")
        self.tasks.take_restored()

    def recover_broken_producer(self) -> None:
        """Under exactly_once_v2, a fenced producer (another producer took our
        transactional.id) ends the open transaction at once: abort it, replace
        the producer and rewind every task, without waiting for the commit."""
        transactions = self.output.transactions
        if transactions is None or transactions.broken is None:
            return
        with self.committer.tasks_locked():
            self._rewind_after_abort(transactions.abort())

    def check_failures(self) -> None:
        """Hand parked task failures to the app; stop on refused output."""
        failures = self._task_manager.drain_failures()
        if failures:
            self._hooks.on_task_failures(failures)
        refused = self.output.errors.take_failure()
        if refused is not None:
            raise refused
        global_thread = self.global_thread
        if global_thread is not None and global_thread.failure is not None:
            # As Kafka Streams (its global thread may only shut the client
            # down): joins would go on against a table that no longer moves.
            raise GlobalStoreError(
                f"the global thread failed: {global_thread.failure!r}; the global tables "
                "stopped following their topics"
            ) from global_thread.failure

    def publish_status(self) -> None:
        """Status to the other instances, standbys toward placement, shutdown requests."""
        if self.runtime is not None:  # its status goes out from runtime.tick
            self.runtime.reconcile_copies()
        else:
            if self.joined:  # an instance that has no tasks yet has nothing to say
                self.placement.publish_status()
            self.placement.reconcile_standbys()
        self._update_owned()
        request = self.placement.shutdown_request()
        if request is not None:
            self._hooks.on_application_shutdown(request)

    # --- commits --------------------------------------------------------------

    def maybe_commit(self) -> None:
        now = time.monotonic()
        if self._rebalance_wait.holds(now):
            return
        due = now - self._last_commit >= self._config.commit_interval_ms / 1000.0
        if due or self._commit_now.is_set() or self.tasks.commit_requested():
            self._commit_now.clear()
            self.commit_all("interval" if due else "requested")

    def commit_all(self, reason: str) -> bool:
        """Commit every processing task (rule 4). True if committed."""
        self._last_commit = time.monotonic()
        if self.runtime is not None and self.joined:
            # A membership lost since the last loop turn: the tasks go, not
            # their offsets (a rejoined member's commit would be accepted).
            self.runtime.check_membership()
        transactions = self.output.transactions
        if not self.tasks and not (transactions is not None and transactions.open):
            return True
        with self.committer.tasks_locked(barrier=self.tasks.processable()):  # key-parallel
            return self._commit_locked(reason)

    def commit_locked(self, reason: str) -> bool:
        """`_commit_locked` for helpers of this thread (QueryChanges)."""
        return self._commit_locked(reason)

    def _commit_locked(self, reason: str) -> bool:
        """Commit with every task locked; on a failed transaction, rewind all.

        Nothing is committed once a stop without commit was asked (a fatal
        error, a task failure under exactly_once_v2): the loop may reach
        `maybe_commit` after the failure policy asked for it (rule 3). Under
        exactly_once_v2 a failed task not yet handed to the failure policy
        may have put partial output of its failed record into the open
        transaction: no commit until the policy has aborted it (the next
        `check_failures`; every outcome of the policy aborts). A commit whose
        tasks close right after (`_CLOSES_TASKS`) cannot wait: it aborts and
        rewinds at once.
        """
        if self._abort:
            return False
        transactions = self.output.transactions
        if transactions is not None and self._task_manager.failed_task_ids():
            if reason in _CLOSES_TASKS:
                self._rewind_after_abort(transactions.abort())
            else:
                log.debug("commit_deferred", reason=reason, cause="a failed task awaits its policy")
            return False
        result: CommitResult = self.committer.commit(self.tasks.processable(), reason)
        if result.aborted is not None:
            self._rewind_after_abort(result.aborted)
            return False
        if result.committed and result.partitions:
            self.health.note_ok()
        return result.committed

    def _rewind_after_abort(self, failure: TransactionFailed) -> None:
        """The transaction was aborted: drop its work and rewind every task.

        Output not yet produced belongs to the aborted work too; state writes
        since the last commit were never applied to disk, and closing the
        tasks drops them. All tasks are locked by the caller.
        """
        self.output.discard()
        rewound = self.tasks.rewind_all()
        self._update_owned()
        log.warning(
            "transaction_aborted_tasks_rewound",
            error=str(failure),
            tasks=rewound,
            producer_recreated=failure.recreated_producer,
        )

    def rewind_task(self, task_id: str) -> bool:
        """Start a failed task again from its committed offsets (REPLACE_THREAD,
        a failed named query).

        Under at_least_once every task is committed first (issue 32): the
        failed task's records before the failed one were processed and their
        output handed over, and its offsets stop below the failed record, so
        only that record is processed again, not its predecessors' output
        written twice. Under exactly-once the failed batch's output shares the
        open transaction with every other task's: it is aborted and all tasks
        are rewound. Called on this thread by the failure policy. False if
        the task is gone.
        """
        if self.tasks.get(task_id) is None:
            return False
        transactions = self.output.transactions
        with self.committer.tasks_locked():
            if transactions is not None:
                self._rewind_after_abort(transactions.abort())
            else:
                self._commit_locked("task failure")
                self.tasks.rewind(task_id)
        return True

    # --- what runtime-owned placement needs (placement.parts.TaskLifecycle) ----------

    def restart_commit_interval(self) -> None:
        self._last_commit = time.monotonic()

    def tasks_changed(self) -> None:
        self._update_owned()

    def close_without_commit(self, task_ids: list[str]) -> None:
        """The group moved on without this member: the tasks' offsets can no
        longer be committed. Produced output stays (at-least-once) or is aborted
        with the transaction, every task rewound (exactly-once); the new owner
        reprocesses."""
        transactions = self.output.transactions
        with self.committer.tasks_locked():
            if transactions is not None and transactions.open:
                self._rewind_after_abort(transactions.abort())
            self.tasks.close(
                [t for t in task_ids if self.tasks.get(t) is not None],
                discard_output=transactions is not None,
            )
        self._update_owned()

    def request_application_shutdown(self, reason: str) -> None:
        """SHUTDOWN_APPLICATION: ask every instance (this one included) to stop."""
        self.placement.request_application_shutdown(reason)

    # --- rebalance (inside consume(), on this thread) -----------------------------

    def _on_assign(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._consumer_released:
            return
        self.joined = True
        self._rebalance_wait.assigned()
        try:
            if self.runtime is not None:
                self.runtime.on_assign(partitions)
                log.info("group_assigned", placer=self.runtime.is_placer)
                self._hooks.on_assigned()
                return
            self.lag_tracker.forget_committed()
            created = self.tasks.create(partitions)
            self._update_owned()
            log.info(
                "partitions_assigned",
                partitions=len(partitions),
                tasks_created=created,
                tasks=sorted(self.tasks.ids()),
            )
            self._hooks.on_assigned()
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_revoke(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._consumer_released:
            return
        try:
            if self.runtime is not None:  # only the coordination partition: no task moves
                self.runtime.on_revoke(partitions)
                return
            self._hooks.on_revoking()
            self._rebalance_wait.revoked(len(partitions))
            affected = self.tasks.of(partitions)
            log.info("partitions_revoked", partitions=len(partitions), tasks=affected)
            if not affected:
                return
            with self.committer.tasks_locked(barrier=self.tasks.processable()):  # key-parallel
                if not self._abort:
                    self._commit_locked("revocation")
                self.tasks.close([t for t in affected if self.tasks.get(t) is not None])
            self._update_owned()
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_lost(self, consumer: Consumer, partitions: list[TopicPartition]) -> None:
        if self._consumer_released:
            return
        try:
            if self.runtime is not None:
                self._hooks.on_revoking()
                self.runtime.on_lost()
                return
            self._hooks.on_revoking()
            affected = self.tasks.of(partitions)
            log.warning("partitions_lost", partitions=len(partitions), tasks=affected)
            self.close_without_commit(affected)
        except BaseException as exc:
            self._fail_in_callback(exc)

    def _on_fatal_client_error(self, exc: BaseException) -> None:
        self.fatal_error = exc
        self._abort = True
        self._stop_event.set()

    def _fail_in_callback(self, exc: BaseException) -> None:
        log.error("rebalance_callback_failed", error=f"{type(exc).__name__}: {exc}")
        self._on_fatal_client_error(exc)

    # --- shutdown ---------------------------------------------------------------

    def _close_clients(self) -> None:
        try:
            if self._abort:
                # Leave the group without committing: close() would call
                # on_revoke, which must not commit after a fatal error.
                self.tasks.close_all_dirty()
            if self.runtime is not None:
                self.runtime.closing = True
            if self.joined:
                self.shutdown_step = "closing the consumer (commit of revoked tasks, LeaveGroup)"
                self._consumer.close()
            else:
                self._drop_consumer_unjoined()
        except Exception as exc:
            log.warning("consumer_close_failed", error=str(exc))
        self.shutdown_step = "flushing and closing the producer"
        self.output.close(self._config.shutdown_timeout_ms / 1000.0, drain_first=not self._abort)
        # Left over only if close() did not call on_revoke: close them dirty.
        self.tasks.close_all_dirty()
        self._update_owned()

    def _drop_consumer_unjoined(self) -> None:
        """Stop during start-up without waiting for the group.

        Closing a consumer whose JoinGroup is in flight waits for the
        coordinator's answer: usually well under a second, but a rebalance
        waiting for a pending member's session made one close during start-up
        on a loaded machine take over 60 s (runtime.kafka.consumer_release).
        Nothing was assigned, so nothing is lost: the consumer is closed on a
        background thread and this thread never touches it again.
        """
        log.info("consumer_dropped_before_joining", reason="the group was never joined")
        self._consumer_released = True
        close_in_background(self._consumer, f"{self.name}-UnjoinedConsumerClose")
        for holder in (self, self.committer, self.tasks, self.lag_tracker, self.fetched_lags):
            holder._consumer = None  # type: ignore[assignment]

    # --- figures (read racily by status) -------------------------------------------

    def _update_owned(self) -> None:
        self.owned = self.tasks.ids() | self.placement.standby_ids()

    def _processed_offset(self, topic: str, partition: int) -> int | None:
        task = self.tasks.get(self._layout.task_id(self._layout.subtopology_of[topic], partition))
        return task.processed_offsets.get(topic) if task is not None else None
