"""What a failed task leads to: replace the thread, stop this instance, stop
the whole application, or (a named query's task) stop that query only.

Errors raised on a processing thread are parked per task and drained by the
polling thread (runtime.processing.errors), which hands them here through its
`on_task_failures` hook; another instance's SHUTDOWN_APPLICATION request
arrives through `on_application_shutdown`. The user's uncaught exception
handler (`App.set_uncaught_exception_handler`) decides; without one a plain
topology stops the instance and a named query stops alone.

Both hooks run on the polling thread; `set_handler` and `failed_threads` any
thread.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum

from runtime import query_control
from runtime.config import StreamsConfig
from runtime.lifecycle import ACTIVE, AppState, Lifecycle
from runtime.logging import get_logger
from runtime.placement.records import ShutdownRequest
from runtime.polling.polling_thread import PollingThread
from runtime.processing.errors import ErrorPolicy, TaskFailedError
from runtime.processing.task_manager import TaskManager
from runtime.processing.threads import ProcessingThreadPool
from runtime.query_control import NamedQueries

log = get_logger("runtime.app")


class ExceptionHandlerResponse(Enum):
    """What the uncaught exception handler asks for (Kafka Streams' names)."""

    REPLACE_THREAD = "REPLACE_THREAD"
    SHUTDOWN_CLIENT = "SHUTDOWN_CLIENT"
    SHUTDOWN_APPLICATION = "SHUTDOWN_APPLICATION"


REPLACE_THREAD = ExceptionHandlerResponse.REPLACE_THREAD
SHUTDOWN_CLIENT = ExceptionHandlerResponse.SHUTDOWN_CLIENT
SHUTDOWN_APPLICATION = ExceptionHandlerResponse.SHUTDOWN_APPLICATION

UncaughtExceptionHandler = Callable[[BaseException], ExceptionHandlerResponse]


class FailurePolicy:
    """Applies the uncaught exception handler's answer to failed tasks."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        config: StreamsConfig,
        error_policy: ErrorPolicy,
        pool: ProcessingThreadPool,
        task_manager: TaskManager,
        named: NamedQueries,
    ) -> None:
        self._lifecycle = lifecycle
        self._config = config
        self._error_policy = error_policy
        self._pool = pool
        self._task_manager = task_manager
        self._named = named
        self.handler: UncaughtExceptionHandler | None = None
        # Processing-thread failures so far (status `failed_threads`).
        self.failed_threads = 0
        self._polling: PollingThread | None = None

    def attach(self, polling: PollingThread) -> None:
        """The polling thread the hooks stop and rewind (`App.start`, before
        that thread starts)."""
        self._polling = polling

    def decide(self, failure: TaskFailedError) -> ExceptionHandlerResponse:
        """The handler's answer; SHUTDOWN_CLIENT without a handler, or when it
        raises or answers something else."""
        handler = self.handler
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

    def on_task_failures(self, failures: list[TaskFailedError]) -> None:
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
            if query is not None and self.handler is None:
                self._stop_failed_query(query, failure)
                continue
            response = self.decide(failure)
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
        lifecycle = self._lifecycle
        with lifecycle.lock:
            if lifecycle.failure is None:
                lifecycle.failure = failures[0]
            if lifecycle.state in (*ACTIVE, AppState.PENDING_SHUTDOWN):
                lifecycle.force_state(AppState.PENDING_ERROR)
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
        self._pool.stop_all(timeout=self._config.shutdown_timeout_ms / 1000.0)
        stuck = [t.name for t in self._pool.threads() if t.is_alive()]
        commit = not self._config.exactly_once and not stuck
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

    def on_application_shutdown(self, request: ShutdownRequest) -> None:
        """Another instance (or this one) asked the whole application to stop
        (polling thread)."""
        lifecycle = self._lifecycle
        with lifecycle.lock:
            if lifecycle.failure is not None or lifecycle.state not in ACTIVE:
                return
            lifecycle.failure = RuntimeError(
                f"application shutdown requested by {request.requested_by}: {request.reason}"
            )
            lifecycle.force_state(AppState.PENDING_ERROR)
        log.error("application_shutdown", requested_by=request.requested_by, reason=request.reason)
        self._pool.stop_all(timeout=self._config.shutdown_timeout_ms / 1000.0)
        assert self._polling is not None
        # Nothing failed here: commit what was processed, then stop.
        self._polling.request_stop(commit=True)
