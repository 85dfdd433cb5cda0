"""The application: one process's clients, threads and tasks, and their lifecycle.

`App` wires the parts of the design together (polling thread, task manager,
processing thread pool, record collector) and owns the app state machine. Its
public methods may be called from any thread; state listeners run on the
thread that caused the change.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Any

from runtime import query_control
from runtime.app_status import (
    query_statuses,
    remote_state_figures,
    sum_dicts,
    task_statuses,
    thread_statuses,
    with_polling_figures,
    with_thread_warning,
)
from runtime.collector.collector import RecordCollector
from runtime.config import ConfigError, StreamsConfig, clamp_wait_s
from runtime.isolation.offsets import carry_back_from_children
from runtime.isolation.plan import PROCESS, isolation_of
from runtime.isolation.queries import IsolatedQueries
from runtime.kafka.clients import admin_config, restore_consumer_config
from runtime.kafka.cluster import StartupAdmin
from runtime.kafka.serde_check import check_serdes_on_samples
from runtime.kafka.startup_checks import check_startup
from runtime.kafka.topics import TopicError, TopicLayout, create_user_topics, resolve_topics
from runtime.logging import get_logger
from runtime.partitioning.expansion_marker import finish_interrupted_callbacks
from runtime.partitioning.static import open_static_partitioner
from runtime.placement.records import ShutdownRequest, status_topic_name
from runtime.placement.status_view import StatusTopicView
from runtime.polling.polling_thread import PollingThread, PollingThreadHooks
from runtime.polling.query_changes import QueryChange
from runtime.processing.errors import ErrorPolicy, TaskFailedError
from runtime.processing.key_lanes import key_parallel_settings
from runtime.processing.os_scheduling import idle_class_unavailable
from runtime.processing.query_shares import QueryShare, switch_interval_s
from runtime.processing.store_queries import StoreQuery, StoreUnavailableError
from runtime.processing.task import StreamTask, TaskSettings
from runtime.processing.task_manager import TaskManager
from runtime.processing.threads import ProcessingThreadPool
from runtime.query_control import NamedQueries, reset_query
from runtime.state.cache import CacheBudget
from runtime.state.cleanup import CleanupThread
from runtime.state.remote.capture import SnapshotCapture
from runtime.state.remote.manager import RemoteState
from runtime.state.remote.settings import RemoteSettings
from runtime.state.restoration import RestorationThread
from runtime.status import NO_PROCESSING_THREADS, AppStatus, Progress, QueryStatus
from runtime.topology.named_queries import (
    QueryError,
    query_subtopologies,
    with_query,
    without_query,
)
from runtime.topology.serdes import serde_from_name
from runtime.topology.topology import Topology

log = get_logger("runtime.app")

# A close still waiting after this long logs what it waits for, and again
# every this long (and once more if it times out), so a slow close explains itself.
_CLOSE_REPORT_EVERY_S = 5.0
# How long `start` / `resume_query` / `add_query` wait for a process-isolated
# query's child to start (cluster, topics, its first rebalance).
_CHILD_START_TIMEOUT_S = 120.0


class AppState(Enum):
    """Kafka Streams' client states."""

    CREATED = "CREATED"
    REBALANCING = "REBALANCING"
    RUNNING = "RUNNING"
    PENDING_SHUTDOWN = "PENDING_SHUTDOWN"
    NOT_RUNNING = "NOT_RUNNING"
    PENDING_ERROR = "PENDING_ERROR"
    ERROR = "ERROR"

    def __str__(self) -> str:
        return self.value


_TRANSITIONS: dict[AppState, set[AppState]] = {
    AppState.CREATED: {AppState.REBALANCING, AppState.PENDING_SHUTDOWN, AppState.PENDING_ERROR},
    AppState.REBALANCING: {
        AppState.RUNNING,
        AppState.REBALANCING,
        AppState.PENDING_SHUTDOWN,
        AppState.PENDING_ERROR,
    },
    AppState.RUNNING: {AppState.REBALANCING, AppState.PENDING_SHUTDOWN, AppState.PENDING_ERROR},
    AppState.PENDING_SHUTDOWN: {AppState.NOT_RUNNING},
    AppState.NOT_RUNNING: set(),
    AppState.PENDING_ERROR: {AppState.ERROR},
    AppState.ERROR: set(),
}

StateListener = Callable[[AppState, AppState], None]


class ExceptionHandlerResponse(Enum):
    """What the uncaught exception handler asks for (Kafka Streams' names)."""

    REPLACE_THREAD = "REPLACE_THREAD"
    SHUTDOWN_CLIENT = "SHUTDOWN_CLIENT"
    SHUTDOWN_APPLICATION = "SHUTDOWN_APPLICATION"


REPLACE_THREAD = ExceptionHandlerResponse.REPLACE_THREAD
SHUTDOWN_CLIENT = ExceptionHandlerResponse.SHUTDOWN_CLIENT
SHUTDOWN_APPLICATION = ExceptionHandlerResponse.SHUTDOWN_APPLICATION

UncaughtExceptionHandler = Callable[[BaseException], ExceptionHandlerResponse]


def _failure_text(failure: BaseException | None) -> str | None:
    """`Type: message` for status and progress (a repr would escape the quotes
    of a failed record's preview), None without a failure."""
    if failure is None:
        return None
    return f"{type(failure).__name__}: {failure}"


def _serde(given: Any) -> Any:
    """A serde object from what a topology may hold: None, a name, or a serde."""
    return serde_from_name(given) if isinstance(given, str) else given


class IllegalStateError(RuntimeError):
    """An operation the app's current state does not allow."""


class App:
    """A stream-processing application instance (one per process, usually)."""

    def __init__(
        self,
        topology: Topology | Mapping[str, Topology],
        config: Mapping[str, Any] | StreamsConfig,
        *,
        source: str | None = None,
        isolated_query: str | None = None,
    ) -> None:
        """`topology`: one Topology, or a mapping query name -> Topology (named
        queries, see runtime.topology.named_queries: each has its own tasks,
        internal topics, scheduling share, failure and figures).

        `source`: 'module:attr' the topology (mapping) was loaded from; a
        query with `query.<name>.isolation=process` runs in a child process
        that imports it from there (runtime.isolation). `isolated_query`:
        set by such a child for its plain topology, whose tasks it counts
        under that query's name.

        Raises ConfigError (a bad key, a `query.<name>.*` key naming no
        query) and QueryError (a bad query name, a topic two queries read).
        """
        self.config = (
            config if isinstance(config, StreamsConfig) else StreamsConfig.from_dict(config)
        )
        self._named, self.topology = NamedQueries.of(topology, self.config)
        # The interpreter's switch interval before `start` changed it, and
        # what this app set (restored when the app stops).
        self._python_switch_interval = sys.getswitchinterval()
        self._switch_interval_set: float | None = None
        if self._named.enabled and self.config.task_assignment == "runtime":
            # The placer reads task ids as `<subtopology>_<partition>`; named
            # queries' ids carry the query's name as well.
            raise ConfigError(
                "task.assignment",
                "'runtime' does not support named queries yet (App({name: topology})); "
                "run them with task.assignment=group (the default)",
            )
        self._lock = threading.RLock()
        self._state = AppState.CREATED
        self._listeners: list[StateListener] = []
        self._finished = threading.Event()
        self._failure: BaseException | None = None
        # A task with input waits at most about one time slice before it is
        # served ahead of bigger buffers (see runtime.processing.task_manager).
        self._task_manager = TaskManager(
            starvation_s=self.config.task_timeslice_ms / 1000.0,
            shares=self._named.shares(),
            plain_query=isolated_query,
        )
        self._isolated = IsolatedQueries(
            self.config, self._named, source, self._rewind_daemon_offsets
        )
        self._collector = RecordCollector()
        self._pool = ProcessingThreadPool(
            self.config.client_id,
            self._task_manager,
            self.config.task_timeslice_ms,
            self._collector,
            sched_idle=self._sched_idle_wanted(),
        )
        self._polling: PollingThread | None = None
        self._restoration: RestorationThread | None = None
        # What the supervisor thread does after the polling thread ended (for
        # `_closing_on`); written by the supervisor, read racily.
        self._supervisor_step: str | None = None
        self._cleanup: CleanupThread | None = None
        # Distinguishes this process among the application's instances in
        # the status topic (standby placement).
        self.instance_id = f"{self.config.client_id}-{uuid.uuid4().hex[:12]}"
        self._exception_handler: UncaughtExceptionHandler | None = None
        self._error_policy = ErrorPolicy(
            deserialization=self.config.deserialization_exception_handler,
            processing=self.config.processing_exception_handler,
            dead_letter_topic=self.config.dead_letter_queue_topic,
        )
        self.failed_threads = 0
        self._layout: TopicLayout | None = None
        self._started_at: float | None = None
        self._capture: SnapshotCapture | None = None  # remote state, polling thread side
        # Topics the runtime writes besides the topologies' (start-up and add_query).
        self._extra_outputs: dict[str, int] = {}
        self._extra_configs: dict[str, dict[str, str]] = {}
        # One query added or removed at a time (each builds on the topology
        # the previous one left).
        self._query_change = threading.Lock()
        # Undoes static.partitioner's open() (FirstSeenPartitioner's reader).
        self._close_partitioner: Callable[[], None] = lambda: None

    # --- lifecycle ------------------------------------------------------------

    def start(self) -> None:
        """Check topics, start the polling thread and `processing.threads` threads.

        Raises ConfigError (`state.dir` not writable, a client property
        librdkafka refuses; see `runtime.kafka.startup_checks`), TopicError (the
        cluster cannot be reached, missing topics, co-partitioning) and
        SerializationError (a sink's serde refuses what the topology makes of
        the newest input record; `runtime.kafka.serde_check`) before any
        thread starts; the app then stays CREATED.
        """
        with self._lock:
            if self._state is not AppState.CREATED:
                raise IllegalStateError(f"start() needs state CREATED, the app is {self._state}")
            config = self.config
            has_state = bool(self.topology.store_specs())
            check_startup(config, uses_state_dir=has_state or config.exactly_once)
            startup_admin = StartupAdmin(config)
            startup_admin.wait_for_cluster()
            admin = startup_admin.client
            extra = {config.dead_letter_queue_topic: 1} if config.dead_letter_queue_topic else {}
            extra_configs: dict[str, dict[str, str]] = {}
            # Every instance publishes its tasks on the status topic and reads
            # everyone's (standby placement, SHUTDOWN_APPLICATION requests).
            status_topic = status_topic_name(config.application_id)
            extra[status_topic] = 1
            extra_configs[status_topic] = {"cleanup.policy": "compact"}
            if config.topics_create_missing:
                create_user_topics(
                    admin,
                    self.topology,
                    config.topics_create_partitions,
                    config.replication_factor,
                )
            self._extra_outputs, self._extra_configs = extra, extra_configs
            self._layout = resolve_topics(
                admin,
                self.topology,
                config.application_id,
                config.replication_factor,
                extra,
                extra_configs=extra_configs,
            )
            # A sink serde that cannot take what the topology makes fails
            # here, on the newest input, instead of on the first record later.
            check_serdes_on_samples(config, self.topology, self._layout)
            if self._named.enabled:
                # A query that ran in a child process before resumes from
                # its commits there (runtime.isolation.offsets).
                carry_back_from_children(config, self.topology)
            settings = TaskSettings(
                application_id=config.application_id,
                default_key_serde=config.default_key_serde,
                default_value_serde=config.default_value_serde,
                error_policy=self._error_policy,
                partition_counts=self._layout.partitions,
                state_dir=config.state_dir,
                cache_budget=CacheBudget(config.cache_max_bytes),
                static_partitioner=config.static_partitioner,
                key_parallel=key_parallel_settings(config),
            )
            if config.static_partitioner is not None:
                for sink, topic in self.topology.partitioned_sinks():
                    log.warning(
                        "sink_partitioner_ignored",
                        sink=sink,
                        topic=topic,
                        reason="static.partitioner is set: it partitions every sink",
                    )
            # An expansion callback whose runner stopped before recording it
            # done runs again here (runtime.partitioning.expansion_marker).
            finish_interrupted_callbacks(
                admin,
                config.application_id,
                config.static_partitioner,
                config.replication_factor,
            )
            # A partitioner with a map in Kafka (FirstSeenPartitioner) reads
            # it whole before any record is partitioned.
            try:
                self._close_partitioner = open_static_partitioner(
                    config.static_partitioner,
                    config.application_id,
                    admin_config(config),
                    config.replication_factor,
                )
            except Exception as exc:  # the partitioner's own code or its topic
                raise TopicError(
                    f"static.partitioner {config.static_partitioner!r} could not open: "
                    f"{type(exc).__name__}: {exc}"
                ) from exc
            # The state manager's thread; it also reads the status topic, so
            # even a stateless app has one (its consumer is the third client).
            # Remote state (state.remote.url): snapshots are taken at commits
            # and uploaded/downloaded by the restoration thread.
            remote_settings = RemoteSettings.from_config(config)
            remote = (
                RemoteState(remote_settings, config.state_dir, self.instance_id)
                if remote_settings is not None and has_state
                else None
            )
            status_view = StatusTopicView()
            self._restoration = RestorationThread(
                f"{config.client_id}-RestorationThread",
                restore_consumer_config(config),
                status_topic,
                remote=remote,
                status_view=status_view,
            )
            self._polling = PollingThread(
                config,
                self.topology,
                self._layout,
                settings,
                self._task_manager,
                self._collector,
                PollingThreadHooks(
                    on_assigned=self._on_assigned,
                    on_revoking=self._on_revoking,
                    on_task_failures=self._on_task_failures,
                    on_application_shutdown=self._on_application_shutdown,
                    capacity=lambda: len(self._pool.names()),
                ),
                self._restoration,
                self.instance_id,
                query_priorities=[share.priority for share in self._named.shares().values()],
                status_view=status_view,
            )
            if remote is not None:
                self._capture = remote.capture(self._restoration.add_upload)
                self._polling.committer.after_commit = self._capture.after_commit
            if has_state:
                self._cleanup = CleanupThread(
                    f"{config.client_id}-CleanupThread",
                    Path(config.state_dir) / config.application_id,
                    config.state_cleanup_delay_ms,
                    owned=lambda: self._polling.owned if self._polling else frozenset(),
                )
            self._set_state(AppState.REBALANCING)
            self._started_at = time.time()
            # Process-wide; no earlier: a start-up check that fails leaves it be.
            self._python_switch_interval = sys.getswitchinterval()
            self._apply_query_priorities()
            if self._restoration is not None:
                self._restoration.start()
            if self._cleanup is not None:
                self._cleanup.start()
            self._polling.start()
            for _ in range(config.processing_threads):
                self._pool.add()
            threading.Thread(
                target=self._supervise, name=f"{config.client_id}-Supervisor", daemon=True
            ).start()
            log.info(
                "app_started",
                application_id=config.application_id,
                processing_threads=config.processing_threads,
                guarantee=config.processing_guarantee,
            )
            self._warn_if_no_threads("processing.threads=0")
        # Outside the lock: a child's start-up (cluster, topics, restore)
        # takes seconds, and one that fails marks its query FAILED only.
        self._isolated.start_all(timeout=_CHILD_START_TIMEOUT_S)

    def close(self, timeout: float | None = None) -> bool:
        """Shut down gracefully: stop processing, commit, leave the group.

        Returns True if everything stopped within `timeout` seconds (default:
        `shutdown.timeout.ms`; any value is clamped to what can be waited for,
        see `clamp_wait_s`). Safe to call more than once and from any thread
        but the app's own.
        """
        if timeout is None:
            timeout = self.config.shutdown_timeout_ms / 1000.0
        timeout = clamp_wait_s(timeout)
        with self._lock:
            if self._state is AppState.CREATED:
                self._set_state(AppState.PENDING_SHUTDOWN)
                self._set_state(AppState.NOT_RUNNING)
                self._finished.set()
                return True
            if self._state in (AppState.REBALANCING, AppState.RUNNING):
                self._set_state(AppState.PENDING_SHUTDOWN)
                log.info("app_closing")
                # Processing stops first, so the final commit covers everything processed.
                stop_processing = True
            else:
                stop_processing = False
        deadline = time.monotonic() + timeout
        # Children close (and commit) beside this process's own shutdown.
        stopping_children = threading.Thread(
            target=self._isolated.stop_all, args=(timeout,), name="stop-query-processes"
        )
        stopping_children.start()
        if stop_processing:
            # Key-parallel tasks finish their in-flight records first, so the
            # final commit (its exactly-once barrier) covers all they took.
            if self._pool.names():  # only threads can finish them
                self._task_manager.finish_in_flight(timeout / 2)
            self._pool.stop_all(timeout=max(0.0, deadline - time.monotonic()))
            if self._polling is not None:
                self._polling.request_stop(commit=True)
        began = time.monotonic()
        while True:
            remaining = deadline - time.monotonic()
            if self._finished.wait(max(0.0, min(remaining, _CLOSE_REPORT_EVERY_S))):
                stopping_children.join(max(0.0, deadline - time.monotonic()))
                return not stopping_children.is_alive()
            waited = round(time.monotonic() - began, 1)
            if remaining <= _CLOSE_REPORT_EVERY_S:
                log.warning("app_close_timed_out", waited_s=waited, waiting_for=self._closing_on())
                return False
            log.warning("app_close_waiting", waited_s=waited, waiting_for=self._closing_on())

    def _closing_on(self) -> list[str]:
        """What a close still waits for (threads alive and their step), for
        the log. Any thread; racy reads."""
        waiting: list[str] = []
        polling = self._polling
        if polling is not None and polling.is_alive():
            step = polling.shutdown_step or "its loop (the stop request not seen yet)"
            waiting.append(f"polling thread: {step}")
        names = [t.name for t in self._pool.threads() if t.is_alive()]
        if names:
            waiting.append(f"processing threads: {', '.join(names)}")
        if self._restoration is not None and self._restoration.is_alive():
            waiting.append("restoration thread")
        if self._supervisor_step is not None:
            waiting.append(f"supervisor: {self._supervisor_step}")
        return waiting

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the app is NOT_RUNNING or ERROR; True if it is."""
        return self._finished.wait(timeout)

    def _supervise(self) -> None:
        """Turn the polling thread's end into the final state (supervisor thread)."""
        polling = self._polling
        assert polling is not None
        polling.join()
        self._supervisor_step = "stopping the processing threads"
        self._pool.stop_all(timeout=self.config.shutdown_timeout_ms / 1000.0)
        if self._cleanup is not None:
            self._cleanup.request_stop()
        if self._restoration is not None:
            self._supervisor_step = "stopping the restoration thread"
            self._restoration.request_stop()
            self._restoration.join(timeout=self.config.shutdown_timeout_ms / 1000.0)
        self._supervisor_step = "stopping the query processes"
        self._isolated.stop_all(timeout=self.config.shutdown_timeout_ms / 1000.0)
        self._supervisor_step = "closing the static partitioner"
        self._close_partitioner()  # no thread partitions any more
        if self._switch_interval_set is not None and (
            sys.getswitchinterval() == self._switch_interval_set
        ):
            # Unless someone else changed it since: the process's own again.
            sys.setswitchinterval(self._python_switch_interval)
        self._supervisor_step = None
        with self._lock:
            failure = self._failure or polling.fatal_error
            if failure is not None:
                self._failure = failure
                if self._state is not AppState.PENDING_ERROR:
                    self._force_state(AppState.PENDING_ERROR)
                self._set_state(AppState.ERROR)
                log.error("app_failed", error=f"{type(failure).__name__}: {failure}")
            else:
                if self._state is not AppState.PENDING_SHUTDOWN:
                    self._force_state(AppState.PENDING_SHUTDOWN)
                self._set_state(AppState.NOT_RUNNING)
                log.info("app_closed")
        self._finished.set()

    # --- processing threads at runtime -------------------------------------------

    def add_processing_thread(self) -> str | None:
        """Start one more processing thread; its name, or None unless running
        or when `processing.threads.limit` threads are alive already."""
        with self._lock:
            if self._state not in (AppState.RUNNING, AppState.REBALANCING):
                return None
            if len(self._pool.names()) >= self.config.processing_threads_limit:
                log.warning(
                    "processing_thread_limit_reached", limit=self.config.processing_threads_limit
                )
                return None
            return self._pool.add()

    def remove_processing_thread(self, timeout: float | None = None) -> str | None:
        """Stop one processing thread after its current batch; its name or None.

        Raises TimeoutError if the thread has not finished within `timeout`.
        """
        with self._lock:
            if self._state not in (AppState.RUNNING, AppState.REBALANCING):
                return None
        removed = self._pool.remove(None if timeout is None else clamp_wait_s(timeout))
        if removed is not None:
            self._warn_if_no_threads("remove_processing_thread")
        return removed

    def set_processing_threads(self, count: int, timeout: float | None = None) -> list[str]:
        """Add or remove threads until `count` are alive; returns their names.

        Raises ValueError for a count below 0 or above `processing.threads.limit`.
        """
        limit = self.config.processing_threads_limit
        if not 0 <= count <= limit:
            raise ValueError(
                f"thread count must be between 0 and {limit} (processing.threads.limit)"
            )
        with self._lock:
            if self._state not in (AppState.RUNNING, AppState.REBALANCING):
                raise IllegalStateError(f"cannot resize threads in state {self._state}")
        names = self._pool.set_count(count, None if timeout is None else clamp_wait_s(timeout))
        if not names:
            self._warn_if_no_threads("set_processing_threads")
        return names

    def _warn_if_no_threads(self, cause: str) -> bool:
        """Log `no_processing_threads` when none is left; whether none is.

        Any thread (the admin loop's executor, the caller of `start`). Why:
        with no thread the app reads input and processes nothing while the
        lag grows, and nothing else says so (`status().waiting_for` does
        too, and the admin socket's reply)."""
        if self._pool.names():
            return False
        log.warning("no_processing_threads", cause=cause, hint=NO_PROCESSING_THREADS)
        return True

    def store(self, name: str, timeout: float = 10.0) -> StoreQuery:
        """Read-only access to store `name` across this instance's running tasks.

        `get(key)`, `range(lo, hi)`, `all()` for key-value stores, `fetch(key,
        from, to)` for window stores. Keys and values are decoded with the
        store's serdes (the config defaults where the topology names none).
        """
        self._isolated.refuse_store(name)
        definition = self.topology.store_def(name)
        # Named queries: `<query>.<store>` names one query's store; a plain
        # name used by two queries is ambiguous.
        query, _, plain = name.partition(".")
        if not plain or query not in self.topology.queries:
            query, plain = "", name
            owners = {
                s.query for s in self.topology.subtopologies if name in s.state_stores and s.query
            }
            if len(owners) > 1:
                raise KeyError(
                    f"store {name!r} is used by queries {sorted(owners)}: name one, "
                    f"e.g. {sorted(owners)[0]}.{name}"
                )
        key_serde = _serde(definition.key_serde) or self.config.default_key_serde
        value_serde = _serde(definition.value_serde) or self.config.default_value_serde
        return StoreQuery(
            plain,
            self._task_manager,
            key_serde,
            value_serde,
            definition.windowed,
            timeout,
            available=lambda: self._check_queryable(name),
            key_serde_source="given in the topology"
            if definition.key_serde is not None
            else "default.key.serde",
            query=query or None,
        )

    def _check_queryable(self, store: str) -> None:
        """Raise StoreUnavailableError unless the app runs (or rebalances)."""
        state = self._state
        if state in (AppState.RUNNING, AppState.REBALANCING):
            return
        app = self.config.application_id
        if state in (AppState.ERROR, AppState.PENDING_ERROR):
            failure = self._failure
            reason = f": {type(failure).__name__}: {failure}" if failure is not None else ""
            raise StoreUnavailableError(
                f"store {store!r} cannot be queried: application {app!r} failed "
                f"(state {state}){reason}; fix the cause and start it again"
            )
        if state is AppState.CREATED:
            raise StoreUnavailableError(
                f"store {store!r} cannot be queried: application {app!r} is not started "
                "(call start() first)"
            )
        raise StoreUnavailableError(
            f"store {store!r} cannot be queried: application {app!r} is stopped (state {state})"
        )

    def pause(self, task_id: str | None = None) -> None:
        """Stop scheduling one task (or all); input keeps buffering up to the bound."""
        self._task_manager.pause(task_id)
        log.info("tasks_paused", task_id=task_id or "all")

    def resume(self, task_id: str | None = None) -> None:
        self._task_manager.resume(task_id)
        log.info("tasks_resumed", task_id=task_id or "all")

    def prepare_leave(self) -> None:
        """Planned departure (`task.assignment=runtime`): this instance's tasks
        are learned elsewhere and handed over; once it owns nothing it stops
        as for `close()` (the daemon then exits 0). Returns at once.

        Raises IllegalStateError unless the app runs with task.assignment=runtime.
        """
        polling = self._polling
        if self.config.task_assignment != "runtime" or polling is None or polling.runtime is None:
            raise IllegalStateError("prepare-leave needs task.assignment=runtime")
        with self._lock:
            if self._state not in (AppState.RUNNING, AppState.REBALANCING):
                raise IllegalStateError(f"cannot prepare to leave in state {self._state}")
        polling.runtime.request_leave()
        log.info("prepare_leave_requested")

    @property
    def processing_threads(self) -> list[str]:
        return self._pool.names()

    # --- named queries --------------------------------------------------------------

    @property
    def queries(self) -> list[str]:
        """Names of the named queries this app runs (empty: one plain topology)."""
        return self._named.names()

    def add_query(
        self,
        name: str,
        topology: Topology,
        *,
        priority: int | None = None,
        weight: int | None = None,
        max_threads: int | None = None,
        timeout: float = 60.0,
        source: str | None = None,
        isolation: str | None = None,
    ) -> None:
        """Run one more named query, without restarting the others.

        Its internal topics are created here (the caller's thread); the
        polling thread then subscribes to its topics too, which is one
        rebalance (runtime.polling.query_changes). Scheduling settings not
        given come from the `query.<name>.*` keys, else the defaults.
        Any thread but the app's own. Raises IllegalStateError (not running,
        or the app runs one plain topology), QueryError (a bad name, a name
        in use, a topic another query reads, a join under cooperative
        assignment), TopicError, TimeoutError.

        With `isolation` 'process' (default: `query.<name>.isolation`) it
        starts in a child process
        that imports `source` ('module:attr': the Topology, or a mapping
        holding it under `name`; default: the app's `source`); RuntimeError
        if that child cannot start.
        """
        with self._query_change:
            if (isolation or isolation_of(self.config, name)) == PROCESS:
                self._add_isolated_query(name, topology, priority, max_threads, timeout, source)
            else:
                self._add_query(name, topology, priority, weight, max_threads, timeout)

    def _add_isolated_query(
        self,
        name: str,
        topology: Topology,
        priority: int | None,
        max_threads: int | None,
        timeout: float,
        source: str | None,
    ) -> None:
        with self._lock:
            self._check_named("add a query")
            if self._state not in (AppState.RUNNING, AppState.REBALANCING):
                raise IllegalStateError(f"add_query() needs a running app, it is {self._state}")
            in_process = self.topology
        self._isolated.add(
            name, topology, in_process, source, priority, max_threads, clamp_wait_s(timeout)
        )

    def _rewind_daemon_offsets(self, name: str, topology: Topology, timeout: float) -> None:
        """This group's commits of an isolated query's input back to the start
        (its reset; runtime.polling.query_changes, on the polling thread)."""
        polling = self._polling
        if polling is None:
            return
        change = QueryChange("rewind", name, query_subtopologies(name, topology, 0))
        polling.query_changes.request(change).result(timeout=timeout)

    def _add_query(
        self,
        name: str,
        topology: Topology,
        priority: int | None,
        weight: int | None,
        max_threads: int | None,
        timeout: float,
    ) -> None:
        polling = self._polling
        with self._lock:
            self._check_named("add a query")
            if self._state not in (AppState.RUNNING, AppState.REBALANCING) or polling is None:
                raise IllegalStateError(f"add_query() needs a running app, it is {self._state}")
            composite = with_query(self.topology, name, topology)
        added = [s for s in composite.subtopologies if s.query == name]
        if polling.assignment_strategy != "range" and any(len(s.sources) > 1 for s in added):
            raise QueryError(
                f"query {name!r} joins co-partitioned topics, which needs the range assignor, "
                f"and this app started with {polling.assignment_strategy}: start the app "
                "with the query in its mapping instead"
            )
        defaults = query_control.share_from_config(self.config, name)
        share = QueryShare(
            priority=defaults.priority if priority is None else priority,
            weight=defaults.weight if weight is None else weight,
            max_threads=defaults.max_threads if max_threads is None else max_threads,
        )
        if share.weight <= 0 or (share.max_threads is not None and share.max_threads < 1):
            raise ValueError("weight must be above 0 and max_threads at least 1")
        config = self.config
        startup_admin = StartupAdmin(config)
        startup_admin.wait_for_cluster()
        if config.topics_create_missing:
            create_user_topics(
                startup_admin.client,
                topology,
                config.topics_create_partitions,
                config.replication_factor,
            )
        layout = resolve_topics(
            startup_admin.client,
            composite,
            config.application_id,
            config.replication_factor,
            self._extra_outputs,
            extra_configs=self._extra_configs,
        )
        check_serdes_on_samples(config, Topology.of_subtopologies(added), layout)
        self._task_manager.set_query_share(name, share)
        self._named.add(name, topology, share)
        done = polling.query_changes.request(
            QueryChange("add", name, added, layout, topology=composite)
        )
        try:
            done.result(timeout=clamp_wait_s(timeout))
        except BaseException:
            self._named.remove(name)
            self._task_manager.forget_query(name)
            raise
        with self._lock:
            self.topology = composite
        self._apply_query_priorities()
        log.info("query_added", query=name, priority=share.priority, weight=share.weight)

    def _sched_idle_wanted(self) -> bool:
        """`sched.idle.lower.priorities`, where the OS lets a thread leave
        SCHED_IDLE again (runtime.processing.os_scheduling). Named queries
        only: a single topology has no lower priority."""
        if not self.config.sched_idle_lower_priorities or not self._named.enabled:
            return False
        unavailable = idle_class_unavailable()
        if unavailable is not None:
            log.info("sched_idle_lower_priorities_off", reason=unavailable)
        return unavailable is None

    def _apply_query_priorities(self) -> None:
        """Tune latency for the priorities of the queries running now: the
        polling thread's refill (`query_shares.input_refill`) and the
        interpreter's switch interval (`gil.switch.interval.us`; 0: shorter
        while their priorities differ, see `query_shares.switch_interval_s`;
        process-wide). Called by `start`, `add_query` and `remove_query`."""
        priorities = [share.priority for share in self._named.shares().values()]
        if self._polling is not None:
            self._polling.tune_refill(priorities)
        wanted = switch_interval_s(
            self.config.gil_switch_interval_us, priorities, self._python_switch_interval
        )
        if wanted != sys.getswitchinterval():
            sys.setswitchinterval(wanted)
            self._switch_interval_set = wanted
            log.info("gil_switch_interval_set", microseconds=round(wanted * 1_000_000))

    def remove_query(self, name: str, reset: bool = False, timeout: float = 60.0) -> None:
        """Stop and remove a named query; the others keep running.

        Its tasks are committed and closed on the polling thread, and its
        topics leave the subscription (one rebalance; the others resume from
        where they were, nothing is rewound past a commit). With `reset`, its
        committed offsets go back to the start of its input topics and its
        internal topics and local state are deleted, so adding it again
        starts over.
        Raises IllegalStateError, QueryError (no such query), TimeoutError.
        """
        with self._query_change:
            self._remove_query(name, reset, timeout)

    def _remove_query(self, name: str, reset: bool, timeout: float) -> None:
        if name in self._isolated:
            with self._lock:
                if self._state not in (AppState.RUNNING, AppState.REBALANCING):
                    raise IllegalStateError(
                        f"remove_query() needs a running app, it is {self._state}"
                    )
            self._isolated.remove(name, reset, clamp_wait_s(timeout))
            self._named.remove(name)
            log.info("query_removed", query=name, reset=reset, isolation="process")
            return
        polling = self._polling
        with self._lock:
            self._check_named("remove a query")
            if self._state not in (AppState.RUNNING, AppState.REBALANCING) or polling is None:
                raise IllegalStateError(f"remove_query() needs a running app, it is {self._state}")
            remaining = without_query(self.topology, name)
        removed = [s for s in self.topology.subtopologies if s.query == name]
        done = polling.query_changes.request(
            QueryChange("remove", name, removed, reset=reset, topology=remaining)
        )
        done.result(timeout=clamp_wait_s(timeout))
        with self._lock:
            self.topology = remaining
        self._named.remove(name)
        self._task_manager.forget_query(name)
        self._apply_query_priorities()
        log.info("query_removed", query=name, reset=reset)
        if reset:
            reset_query(self.config, name, removed, timeout=clamp_wait_s(timeout))

    def pause_query(self, name: str) -> None:
        """Stop scheduling a named query's tasks (input buffers up to its bound)."""
        self._check_known(name)
        if name in self._isolated:
            self._isolated.pause(name)
        else:
            self._task_manager.pause_query(name)
        self._named.set_state(name, query_control.PAUSED)
        log.info("query_paused", query=name)

    def resume_query(self, name: str) -> None:
        """Schedule a paused (or failed) named query again. A failed query
        starts from its last commit, so from the record that failed (a
        process-isolated one in a new child process)."""
        self._check_known(name)
        if name in self._isolated:
            self._isolated.resume(name, _CHILD_START_TIMEOUT_S)
            log.info("query_resumed", query=name, state=self._named.state(name))
            return
        self._task_manager.resume_query(name)
        self._named.set_state(name, query_control.RUNNING)
        log.info("query_resumed", query=name)

    def _check_named(self, what: str) -> None:
        if not self._named.enabled:
            raise IllegalStateError(
                f"cannot {what}: this app runs one plain topology; start it with a mapping "
                "App({name: topology, ...}, config) to run named queries"
            )

    def _check_known(self, name: str) -> None:
        self._check_named("pause or resume a query")
        if name not in self._named.names():
            raise QueryError(f"no query {name!r} (queries: {', '.join(self._named.names())})")

    # --- state -----------------------------------------------------------------

    @property
    def state(self) -> AppState:
        return self._state

    @property
    def failure(self) -> BaseException | None:
        """The error that put the app into ERROR, if any."""
        return self._failure

    def set_state_listener(self, listener: StateListener) -> None:
        """`listener(new_state, old_state)`, called on every state change."""
        with self._lock:
            self._listeners = [listener]

    def _set_state(self, new: AppState) -> None:
        with self._lock:
            old = self._state
            if new not in _TRANSITIONS[old]:
                raise IllegalStateError(f"state change {old} -> {new} is not allowed")
            self._force_state(new)

    def _force_state(self, new: AppState) -> None:
        with self._lock:
            old = self._state
            if old is new:
                return
            self._state = new
            listeners = list(self._listeners)
        log.info("app_state_changed", old=str(old), new=str(new))
        for listener in listeners:
            try:
                listener(new, old)
            except Exception as exc:
                log.warning("state_listener_failed", error=str(exc))

    # --- hooks from the polling thread -----------------------------------------

    def _on_assigned(self) -> None:
        with self._lock:
            if self._state in (AppState.REBALANCING,):
                self._set_state(AppState.RUNNING)

    def _on_revoking(self) -> None:
        with self._lock:
            if self._state is AppState.RUNNING:
                self._set_state(AppState.REBALANCING)

    def set_uncaught_exception_handler(self, handler: UncaughtExceptionHandler) -> None:
        """`handler(exc)` decides what a failed processing thread leads to.

        It is called on the polling thread with the error (a TaskFailedError
        whose `cause` is the user's exception) and returns REPLACE_THREAD (the
        failed task is rewound to its last commit and retried, the thread is
        replaced), SHUTDOWN_CLIENT (default: this instance stops, state ERROR)
        or SHUTDOWN_APPLICATION (every instance stops: the request goes on the
        `<application.id>-status` topic, which every instance's restoration
        thread reads). The failing batch is never committed.
        """
        self._exception_handler = handler

    def _decide(self, failure: TaskFailedError) -> ExceptionHandlerResponse:
        handler = self._exception_handler
        if handler is None:
            return SHUTDOWN_CLIENT
        try:
            response = handler(failure)
        except Exception as exc:
            log.error("exception_handler_failed", error=f"{type(exc).__name__}: {exc}")
            return SHUTDOWN_CLIENT
        if not isinstance(response, ExceptionHandlerResponse):
            log.error("exception_handler_bad_response", response=repr(response))
            return SHUTDOWN_CLIENT
        return response

    def _on_task_failures(self, failures: list[TaskFailedError]) -> None:
        """Apply the failure policy to tasks that failed (polling thread).

        Stopping (SHUTDOWN_CLIENT, SHUTDOWN_APPLICATION) under at_least_once
        commits what the tasks processed before they failed, never the failed
        record (`_stop_after_failure`).
        """
        polling = self._polling
        assert polling is not None
        fatal: list[TaskFailedError] = []
        for failure in failures:
            failure.explain(self._error_policy)  # before anyone reads its message
            self.failed_threads += 1
            query = self._task_manager.query_of(failure.task_id)
            if query is not None and self._exception_handler is None:
                self._stop_failed_query(query, failure)
                continue
            response = self._decide(failure)
            log.error(
                "processing_thread_failed",
                task_id=failure.task_id,
                failed_thread=failure.thread_name,
                stage=failure.stage,
                error=str(failure),
                response=response.value,
            )
            if response is REPLACE_THREAD:
                if failure.thread_name is not None:
                    self._pool.replace(failure.thread_name)
                polling.rewind_task(failure.task_id)
            else:
                if response is SHUTDOWN_APPLICATION:
                    polling.request_application_shutdown(str(failure))
                fatal.append(failure)
        if not fatal:
            return
        failures = fatal
        with self._lock:
            if self._failure is None:
                self._failure = failures[0]
            if self._state in (AppState.RUNNING, AppState.REBALANCING, AppState.PENDING_SHUTDOWN):
                self._force_state(AppState.PENDING_ERROR)
        self._stop_after_failure(polling, failures)

    def _stop_after_failure(self, polling: PollingThread, failures: list[TaskFailedError]) -> None:
        """Stop the processing threads, then the polling thread (its thread).

        Under at_least_once the polling thread's final commit runs (issue
        32): the records before the failed one were processed and their
        output handed to the collector; committing them (the producer
        flushed first, rule 3) keeps a restart from writing their output
        again. A failed task's offsets stop below the record that failed
        (`processed_offsets` never includes it; a key-parallel task's
        watermark never passes it), so a restart begins with that record.
        Under exactly_once_v2 the open transaction may hold partial output
        of the failed record: it is aborted, nothing committed. A processing
        thread that did not stop in time may still hold a task, and a commit
        would wait for it: then nothing is committed either (as before).
        """
        self._pool.stop_all(timeout=self.config.shutdown_timeout_ms / 1000.0)
        stuck = [t.name for t in self._pool.threads() if t.is_alive()]
        commit = not self.config.exactly_once and not stuck
        if commit:
            log.info(
                "committing_before_stop",
                reason="a task failed; what it processed before the failed record is committed",
                failed_records=[
                    f.record.origin for f in failures if f.record is not None and f.record.origin
                ],
            )
        elif stuck:
            log.warning(
                "stop_without_commit",
                reason="processing threads did not stop in time",
                threads=stuck,
            )
        polling.request_stop(commit=commit)

    def _stop_failed_query(self, query: str, failure: TaskFailedError) -> None:
        """A named query's task failed and no uncaught exception handler is
        set: stop that query only (polling thread). Its tasks are no longer
        scheduled; the failed task is rewound to its last commit (under
        at_least_once its records before the failed one are committed first,
        see `PollingThread.rewind_task`), so the failed batch is never
        committed (under exactly_once_v2 that aborts the open transaction and
        rewinds every task: the other queries go on from their last commit,
        their aborted output is never seen)."""
        polling = self._polling
        assert polling is not None
        reason = str(failure)
        self._task_manager.pause_query(query)
        self._named.set_state(query, query_control.FAILED, reason)
        polling.rewind_task(failure.task_id)
        log.error(
            "query_failed",
            query=query,
            task_id=failure.task_id,
            stage=failure.stage,
            error=str(failure),
            hint=f"fix the cause, then `query resume {query}` (or remove it)",
        )

    def _on_application_shutdown(self, request: ShutdownRequest) -> None:
        """Another instance (or this one) asked the whole application to stop."""
        with self._lock:
            if self._failure is not None or self._state not in (
                AppState.RUNNING,
                AppState.REBALANCING,
            ):
                return
            self._failure = RuntimeError(
                f"application shutdown requested by {request.requested_by}: {request.reason}"
            )
            self._force_state(AppState.PENDING_ERROR)
        log.error("application_shutdown", requested_by=request.requested_by, reason=request.reason)
        self._pool.stop_all(timeout=self.config.shutdown_timeout_ms / 1000.0)
        assert self._polling is not None
        # Nothing failed here: commit what was processed, then stop.
        self._polling.request_stop(commit=True)

    # --- observability -----------------------------------------------------------

    def _query_statuses(self, live_tasks: list[StreamTask]) -> tuple[QueryStatus, ...]:
        """Per named query figures for `status()` (empty for a plain topology)."""
        if not self._named.enabled:
            return ()
        return query_statuses(
            self._named,
            self.topology,
            self._task_manager,
            self._polling,
            live_tasks,
            self._isolated.figures(),
            self._isolated.pids(),
        )

    def query_figures(self) -> tuple[dict[str, float], dict[str, float]]:
        """Busy seconds and p99 batch latency (ms) per query this process
        schedules (a child of runtime.isolation reports its query's). Any thread."""
        manager = self._task_manager
        return manager.query_busy_seconds(), manager.query_latency_p99_ms()

    def progress(self) -> Progress:
        """Running totals, cheap enough to poll many times a second (any thread;
        see runtime.status.Progress). The same counts as `status()`."""
        polling = self._polling
        live = self._task_manager.tasks()
        processed = sum(t.processed_count for t in live)
        failure = _failure_text(self._failure)
        if polling is None:
            return Progress(str(self._state), failure, 0, processed, 0, 0, None, None)
        committer = polling.committer
        return Progress(
            state=str(self._state),
            failure=failure,
            consumed=polling.consumed_total,
            processed=processed + polling.tasks.closed_totals["processed"],
            produced=polling.output.produced_total,
            commits=committer.commits_total,
            last_commit=committer.last_commit_wall_time,
            last_commit_duration_s=committer.last_commit_duration_s,
        )

    def status(self) -> AppStatus:
        """A typed snapshot for metrics, the autoscaler, the admin socket, the
        demo and tests (any thread; see runtime.status and runtime.app_status)."""
        polling = self._polling
        restoration = self._restoration
        live_tasks = sorted(self._task_manager.tasks(), key=lambda t: t.id)
        tasks = task_statuses(self._task_manager, live_tasks, polling, restoration)
        base = AppStatus(
            application_id=self.config.application_id,
            client_id=self.config.client_id,
            instance_id=self.instance_id,
            state=str(self._state),
            started_at=self._started_at,
            processing_guarantee=self.config.processing_guarantee,
            assignment_strategy=polling.assignment_strategy if polling else None,
            threads=thread_statuses(self._pool.threads()),
            tasks=tasks,
            failed_threads=self.failed_threads,
            failure=_failure_text(self._failure),
            restored=restoration.restored_total if restoration else 0,
            restores=dict(restoration.restores) if restoration else {},
            remote_state=remote_state_figures(restoration, self._capture),
            standbys=dict(restoration.standby_positions) if restoration else {},
            processed=sum(t.processed_count for t in live_tasks),
            skipped=sum(t.skipped_count for t in live_tasks),
            dead_lettered=sum(t.dead_lettered for t in tasks),
            dropped=sum_dicts(t.dropped for t in live_tasks),
            queries=self._query_statuses(live_tasks),
        )
        if polling is None:
            return with_thread_warning(base, self._pool.names())
        status = with_polling_figures(base, polling, self._layout)
        return with_thread_warning(status, self._pool.names())
