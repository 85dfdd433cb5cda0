"""The application: one process's clients, threads and tasks, and their lifecycle.

`App` is the public face of one running application and a small facade over
its state machine (runtime.lifecycle). The work lives beside it, one concern
per module:

- runtime.assembly: the start-up checks and the wiring of the polling,
  restoration and cleanup threads (`start`), and their take-down;
- runtime.failure_policy: what a failed task leads to (the uncaught
  exception handler, SHUTDOWN_APPLICATION requests);
- runtime.query_operations: adding, removing, pausing and resuming named
  queries, in process or isolated, and their priorities;
- runtime.store_lookup: `store(name)` (interactive queries);
- runtime.app_status: the figures of `status()`.

The names this module has always exported (AppState, IllegalStateError,
ExceptionHandlerResponse and its members, ...) stay importable from here.
It is over 500 lines because it is the whole public API, each method with
its contract; every method is a state check and a call into one of the
modules above.
Its public methods may be called from any thread; state listeners run on the
thread that caused the change.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from runtime.app_status import (
    progress_of,
    query_statuses,
    remote_state_figures,
    state_memory_figures,
    sum_dicts,
    task_statuses,
    thread_statuses,
    with_polling_figures,
    with_thread_warning,
)
from runtime.assembly import Assembly, assemble
from runtime.collector.collector import RecordCollector
from runtime.config import ConfigError, StreamsConfig, clamp_wait_s
from runtime.failure_policy import (
    REPLACE_THREAD,
    SHUTDOWN_APPLICATION,
    SHUTDOWN_CLIENT,
    ExceptionHandlerResponse,
    FailurePolicy,
    UncaughtExceptionHandler,
)
from runtime.lifecycle import (
    ACTIVE,
    AppState,
    IllegalStateError,
    Lifecycle,
    StateListener,
    failure_text,
)
from runtime.logging import get_logger
from runtime.polling.polling_thread import PollingThreadHooks
from runtime.processing.errors import ErrorPolicy
from runtime.processing.store_queries import StoreQuery
from runtime.processing.task import StreamTask
from runtime.processing.task_manager import TaskManager
from runtime.processing.threads import ProcessingThreadPool
from runtime.query_control import NamedQueries
from runtime.query_operations import CHILD_START_TIMEOUT_S, QueryOperations, sched_idle_wanted
from runtime.status import NO_PROCESSING_THREADS, AppStatus, Progress, QueryStatus
from runtime.store_lookup import GlobalStoreQuery, open_global_store, open_store
from runtime.topology.topology import Topology

__all__ = [
    "REPLACE_THREAD",
    "SHUTDOWN_APPLICATION",
    "SHUTDOWN_CLIENT",
    "App",
    "AppState",
    "ExceptionHandlerResponse",
    "IllegalStateError",
    "StateListener",
    "UncaughtExceptionHandler",
]

log = get_logger("runtime.app")

# A close still waiting after this long logs what it waits for, and again
# every this long (and once more if it times out), so a slow close explains itself.
_CLOSE_REPORT_EVERY_S = 5.0


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
        self._named, topology = NamedQueries.of(topology, self.config)
        if self._named.enabled and self.config.task_assignment == "runtime":
            # The placer reads task ids as `<subtopology>_<partition>`; named
            # queries' ids carry the query's name as well.
            raise ConfigError(
                "task.assignment",
                "'runtime' does not support named queries yet (App({name: topology})); "
                "run them with task.assignment=group (the default)",
            )
        self._lifecycle = Lifecycle()
        # A task with input waits at most about one time slice before it is
        # served ahead of bigger buffers (see runtime.processing.task_manager).
        self._task_manager = TaskManager(
            starvation_s=self.config.task_timeslice_ms / 1000.0,
            shares=self._named.shares(),
            plain_query=isolated_query,
        )
        self._queries = QueryOperations(
            self._lifecycle, self.config, self._named, topology, self._task_manager, source
        )
        self._collector = RecordCollector()
        self._pool = ProcessingThreadPool(
            self.config.client_id,
            self._task_manager,
            self.config.task_timeslice_ms,
            self._collector,
            sched_idle=sched_idle_wanted(self.config, self._named),
        )
        # Distinguishes this process among the application's instances in
        # the status topic (standby placement).
        self.instance_id = f"{self.config.client_id}-{uuid.uuid4().hex[:12]}"
        self._error_policy = ErrorPolicy(
            deserialization=self.config.deserialization_exception_handler,
            processing=self.config.processing_exception_handler,
            dead_letter_topic=self.config.dead_letter_queue_topic,
        )
        self._failures = FailurePolicy(
            self._lifecycle,
            self.config,
            self._error_policy,
            self._pool,
            self._task_manager,
            self._named,
        )
        # What `start` built (runtime.assembly); None until then.
        self._parts: Assembly | None = None
        self._started_at: float | None = None

    @property
    def topology(self) -> Topology:
        """The topology this process runs: its in-process queries composed
        (changes as queries are added and removed)."""
        return self._queries.topology

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
        lifecycle = self._lifecycle
        with lifecycle.lock:
            if lifecycle.state is not AppState.CREATED:
                raise IllegalStateError(
                    f"start() needs state CREATED, the app is {lifecycle.state}"
                )
            config = self.config
            parts = assemble(
                config,
                self.topology,
                named_queries=self._named.enabled,
                query_priorities=[share.priority for share in self._named.shares().values()],
                task_manager=self._task_manager,
                collector=self._collector,
                error_policy=self._error_policy,
                hooks=PollingThreadHooks(
                    on_assigned=lifecycle.on_assigned,
                    on_revoking=lifecycle.on_revoking,
                    on_task_failures=self._failures.on_task_failures,
                    on_application_shutdown=self._failures.on_application_shutdown,
                    capacity=lambda: len(self._pool.names()),
                ),
                instance_id=self.instance_id,
            )
            self._parts = parts  # status() shows the global tables loading
            try:
                parts.bootstrap_global_stores()
            except BaseException:
                self._parts = None
                raise
            self._failures.attach(parts.polling)
            self._queries.attach(parts.polling, parts.extra_outputs, parts.extra_configs)
            lifecycle.set_state(AppState.REBALANCING)
            self._started_at = time.time()
            # Process-wide; no earlier: a start-up check that fails leaves it be.
            self._queries.remember_switch_interval()
            self._queries.apply_priorities()
            parts.start()
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
        self._queries.isolated.start_all(timeout=CHILD_START_TIMEOUT_S)

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
        lifecycle = self._lifecycle
        with lifecycle.lock:
            if lifecycle.state is AppState.CREATED:
                lifecycle.set_state(AppState.PENDING_SHUTDOWN)
                lifecycle.set_state(AppState.NOT_RUNNING)
                lifecycle.finished.set()
                return True
            if lifecycle.state in ACTIVE:
                lifecycle.set_state(AppState.PENDING_SHUTDOWN)
                log.info("app_closing")
                # Processing stops first, so the final commit covers everything processed.
                stop_processing = True
            else:
                stop_processing = False
        deadline = time.monotonic() + timeout
        # Children close (and commit) beside this process's own shutdown.
        stopping_children = threading.Thread(
            target=self._queries.isolated.stop_all, args=(timeout,), name="stop-query-processes"
        )
        stopping_children.start()
        if stop_processing:
            # Key-parallel tasks finish their in-flight records first, so the
            # final commit (its exactly-once barrier) covers all they took.
            if self._pool.names():  # only threads can finish them
                self._task_manager.finish_in_flight(timeout / 2)
            self._pool.stop_all(timeout=max(0.0, deadline - time.monotonic()))
            if self._parts is not None:
                self._parts.polling.request_stop(commit=True)
        began = time.monotonic()
        while True:
            remaining = deadline - time.monotonic()
            if lifecycle.finished.wait(max(0.0, min(remaining, _CLOSE_REPORT_EVERY_S))):
                stopping_children.join(max(0.0, deadline - time.monotonic()))
                return not stopping_children.is_alive()
            waited = round(time.monotonic() - began, 1)
            waiting_for = self._parts.closing_on(self._pool) if self._parts else []
            if remaining <= _CLOSE_REPORT_EVERY_S:
                log.warning("app_close_timed_out", waited_s=waited, waiting_for=waiting_for)
                return False
            log.warning("app_close_waiting", waited_s=waited, waiting_for=waiting_for)

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the app is NOT_RUNNING or ERROR; True if it is."""
        return self._lifecycle.finished.wait(timeout)

    def _supervise(self) -> None:
        """Turn the polling thread's end into the final state (supervisor thread)."""
        parts = self._parts
        assert parts is not None
        parts.take_down(
            self._pool, self._queries.isolated, self.config.shutdown_timeout_ms / 1000.0
        )
        self._queries.restore_switch_interval()
        self._lifecycle.finish(parts.polling.fatal_error, parts.polling.stop_requested)

    # --- processing threads at runtime -------------------------------------------

    def add_processing_thread(self) -> str | None:
        """Start one more processing thread; its name, or None unless running
        or when `processing.threads.limit` threads are alive already."""
        with self._lifecycle.lock:
            if self._lifecycle.state not in ACTIVE:
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
        with self._lifecycle.lock:
            if self._lifecycle.state not in ACTIVE:
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
        with self._lifecycle.lock:
            if self._lifecycle.state not in ACTIVE:
                raise IllegalStateError(f"cannot resize threads in state {self._lifecycle.state}")
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

    @property
    def processing_threads(self) -> list[str]:
        return self._pool.names()

    # --- stores and tasks ------------------------------------------------------------

    def store(self, name: str, timeout: float = 10.0) -> StoreQuery | GlobalStoreQuery:
        """Read-only access to store `name` across this instance's running tasks.

        `get(key)`, `range(lo, hi)`, `all()` for key-value stores, `fetch(key,
        from, to)` for window stores. Keys and values are decoded with the
        store's serdes (the config defaults where the topology names none).
        A global table's store (`StreamsBuilder.global_table`) is read from
        this process's copy.
        """
        self._queries.isolated.refuse_store(name)
        parts = self._parts
        stores = parts.global_thread.stores if parts and parts.global_thread else {}
        global_query = open_global_store(name, self.topology, self.config, stores, self._lifecycle)
        if global_query is not None:
            return global_query
        return open_store(
            name, self.topology, self.config, self._task_manager, self._lifecycle, timeout
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
        polling = self._parts.polling if self._parts is not None else None
        if self.config.task_assignment != "runtime" or polling is None or polling.runtime is None:
            raise IllegalStateError("prepare-leave needs task.assignment=runtime")
        with self._lifecycle.lock:
            if self._lifecycle.state not in ACTIVE:
                raise IllegalStateError(f"cannot prepare to leave in state {self._lifecycle.state}")
        polling.runtime.request_leave()
        log.info("prepare_leave_requested")

    # --- named queries (runtime.query_operations) ----------------------------------

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
        self._queries.add(name, topology, priority, weight, max_threads, timeout, source, isolation)

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
        self._queries.remove(name, reset, timeout)

    def rewind_query_input(self, name: str, topology: Topology, timeout: float = 60.0) -> None:
        """Commit this app's group offsets of `topology`'s input back to the
        start: the reset of query `name` that runs in a process of its own
        (a daemon with processes > 1 asks one processing process,
        runtime.isolation.pool_queries). Any thread but the app's own."""
        self._queries.rewind_daemon_offsets(name, topology, timeout)

    def pause_query(self, name: str) -> None:
        """Stop scheduling a named query's tasks (input buffers up to its bound)."""
        self._queries.pause(name)

    def resume_query(self, name: str) -> None:
        """Schedule a paused (or failed) named query again. A failed query
        starts from its last commit, so from the record that failed (a
        process-isolated one in a new child process)."""
        self._queries.resume(name)

    # --- state -----------------------------------------------------------------

    @property
    def state(self) -> AppState:
        return self._lifecycle.state

    @property
    def failure(self) -> BaseException | None:
        """The error that put the app into ERROR, if any."""
        return self._lifecycle.failure

    def set_state_listener(self, listener: StateListener) -> None:
        """`listener(new_state, old_state)`, called on every state change."""
        self._lifecycle.set_listener(listener)

    # --- failures (runtime.failure_policy) -----------------------------------------

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
        self._failures.handler = handler

    @property
    def failed_threads(self) -> int:
        """Processing-thread failures so far."""
        return self._failures.failed_threads

    # --- observability -----------------------------------------------------------

    def _query_statuses(self, live_tasks: list[StreamTask]) -> tuple[QueryStatus, ...]:
        """Per named query figures for `status()` (empty for a plain topology)."""
        if not self._named.enabled:
            return ()
        isolated = self._queries.isolated
        return query_statuses(
            self._named,
            self.topology,
            self._task_manager,
            self._parts.polling if self._parts is not None else None,
            live_tasks,
            isolated.figures(),
            isolated.pids(),
        )

    def query_figures(self) -> tuple[dict[str, float], dict[str, float]]:
        """Busy seconds and p99 batch latency (ms) per query this process
        schedules (a child of runtime.isolation reports its query's). Any thread."""
        manager = self._task_manager
        return manager.query_busy_seconds(), manager.query_latency_p99_ms()

    def progress(self) -> Progress:
        """Running totals, cheap enough to poll many times a second (any thread;
        see runtime.status.Progress). The same counts as `status()`."""
        return progress_of(
            self._lifecycle.state,
            failure_text(self._lifecycle.failure),
            self._task_manager.tasks(),
            self._parts.polling if self._parts is not None else None,
        )

    def status(self) -> AppStatus:
        """A typed snapshot for metrics, the autoscaler, the admin socket, the
        demo and tests (any thread; see runtime.status and runtime.app_status)."""
        parts = self._parts
        polling = parts.polling if parts is not None else None
        restoration = parts.restoration if parts is not None else None
        live_tasks = sorted(self._task_manager.tasks(), key=lambda t: t.id)
        tasks = task_statuses(self._task_manager, live_tasks, polling, restoration)
        base = AppStatus(
            application_id=self.config.application_id,
            client_id=self.config.client_id,
            instance_id=self.instance_id,
            state=str(self._lifecycle.state),
            started_at=self._started_at,
            processing_guarantee=self.config.processing_guarantee,
            assignment_strategy=polling.assignment_strategy if polling else None,
            threads=thread_statuses(self._pool.threads()),
            tasks=tasks,
            failed_threads=self.failed_threads,
            failure=failure_text(self._lifecycle.failure),
            restored=restoration.restored_total if restoration else 0,
            restores=dict(restoration.restores) if restoration else {},
            remote_state=remote_state_figures(restoration, parts.capture if parts else None),
            state_memory=state_memory_figures(parts.rocksdb_metrics if parts else None),
            standbys=dict(restoration.standby_positions) if restoration else {},
            processed=sum(t.processed_count for t in live_tasks),
            skipped=sum(t.skipped_count for t in live_tasks),
            dead_lettered=sum(t.dead_lettered for t in tasks),
            dropped=sum_dicts(t.dropped for t in live_tasks),
            queries=self._query_statuses(live_tasks),
            global_stores=parts.global_thread.figures()
            if parts is not None and parts.global_thread is not None
            else {},
        )
        if polling is None or parts is None:
            return with_thread_warning(base, self._pool.names())
        status = with_polling_figures(base, polling, parts.layout)
        return with_thread_warning(status, self._pool.names())
