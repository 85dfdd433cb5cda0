"""Processing threads and the resizable pool that owns them.

A processing thread loops: lock the next task from the scheduler, process it
for one time slice, hand its output to the record collector, release it. The
hand-over comes before the release, so a commit (which locks every task) sees
every processed record's output in the collector. A key-parallel task is held
shared and hands its output over grab by grab (`KeyParallelTask.process_shared`).
It never calls a Kafka client. The pool keeps thread names `<client.id>-ProcessingThread-<n>`
with the lowest free index, as Kafka Streams does for stream threads.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from runtime.logging import get_logger
from runtime.processing.errors import TaskFailedError
from runtime.processing.key_parallel import is_key_parallel
from runtime.processing.os_scheduling import ThreadSchedClass
from runtime.processing.record_context import OutputSink
from runtime.processing.task_manager import TaskManager

log = get_logger("runtime.processing")


class _Discard:
    """For pools whose tasks' output nobody reads (scheduler tests)."""

    def hand_over(self, batch: Any) -> None:
        pass


class ProcessingThread(threading.Thread):
    """One worker of the pool. Created and stopped by ProcessingThreadPool."""

    def __init__(
        self,
        name: str,
        index: int,
        task_manager: TaskManager,
        collector: OutputSink,
        timeslice_s: float,
        sched_idle: bool = False,
    ):
        super().__init__(name=name, daemon=True)
        self.index = index
        # SCHED_IDLE while it runs a lower-priority query's task (os_scheduling).
        self.sched_class = ThreadSchedClass() if sched_idle else None
        self._task_manager = task_manager
        self._collector = collector
        self._timeslice_s = timeslice_s
        self._stop_requested = threading.Event()
        self.batches = 0
        self.busy_seconds = 0.0
        self.current_task: str | None = None
        # The task of the latest batch, for status: a batch lasts at most a
        # time slice, so `current_task` alone is mostly None in a snapshot.
        self.last_task: str | None = None

    def _contenders(self) -> int:
        """Threads competing for the GIL now: the busy processing threads and
        the polling thread (a key-parallel task tells GIL waits from I/O waits
        with it; read per grab, since threads come and go within a batch)."""
        return self._task_manager.busy_threads + 1

    def request_stop(self) -> None:
        """Finish the current batch, release the task, exit. Any thread may call."""
        self._stop_requested.set()
        self._task_manager.notify_work()

    @property
    def stopping(self) -> bool:
        return self._stop_requested.is_set()

    @property
    def state(self) -> str:
        """`processing` (holds a task now), `idle` (waiting for work), `stopping`
        (asked to stop, finishing its batch) or `stopped`. Read racily."""
        if not self.is_alive():
            return "stopped"
        if self.stopping:
            return "stopping"
        return "processing" if self.current_task is not None else "idle"

    def run(self) -> None:
        log.info("processing_thread_started")
        manager = self._task_manager
        should_stop = self._stop_requested.is_set
        sched_class = self.sched_class
        try:
            while not should_stop():
                task = manager.acquire_next(self.name, 0.5, should_stop)
                if task is None:
                    continue
                self.current_task = self.last_task = task.id
                if sched_class is not None:
                    sched_class.set_idle(manager.below_top_priority(task.id))
                error: TaskFailedError | None = None
                started = time.monotonic()
                try:
                    if is_key_parallel(task):
                        # Shared with other threads: each grab's output goes
                        # to the collector before its keys are released.
                        # The polling thread competes for the GIL too.
                        task.process_shared(
                            started + self._timeslice_s, self._collector, self._contenders
                        )
                    else:
                        task.process(started + self._timeslice_s)
                except TaskFailedError as exc:
                    error = exc
                except Exception as exc:  # a bug outside the handlers: park it too
                    error = TaskFailedError(task.id, "processing", exc)
                finally:
                    self.current_task = None
                    self.busy_seconds += time.monotonic() - started
                    self.batches += 1
                    output = task.take_output()
                    if output:
                        self._collector.hand_over(output)
                    manager.release(task, self.name, error)
        finally:
            log.info("processing_thread_stopped")


class ProcessingThreadPool:
    """The live set of processing threads. Thread-safe; any thread may call."""

    def __init__(
        self,
        client_id: str,
        task_manager: TaskManager,
        timeslice_ms: int,
        collector: OutputSink | None = None,
        sched_idle: bool = False,
    ) -> None:
        """`sched_idle`: threads run lower-priority queries' tasks in SCHED_IDLE
        (`sched.idle.lower.priorities`, where the OS allows it)."""
        self._prefix = f"{client_id}-ProcessingThread-"
        self._sched_idle = sched_idle
        self._task_manager = task_manager
        self._collector: OutputSink = collector if collector is not None else _Discard()
        self._timeslice_s = timeslice_ms / 1000.0
        self._lock = threading.Lock()
        self._threads: list[ProcessingThread] = []

    def add(self) -> str:
        """Start a thread with the lowest free index; returns its name."""
        with self._lock:
            self._reap()
            used = {t.index for t in self._threads}
            index = 1
            while index in used:
                index += 1
            thread = ProcessingThread(
                f"{self._prefix}{index}",
                index,
                self._task_manager,
                self._collector,
                self._timeslice_s,
                self._sched_idle,
            )
            self._threads.append(thread)
            thread.start()
        log.info("processing_thread_added", name=thread.name)
        return thread.name

    def remove(self, timeout: float | None = None) -> str | None:
        """Stop the highest-index live thread after its batch; None if none alive.

        Raises TimeoutError if it has not exited within `timeout` seconds (it
        still exits once its batch ends).
        """
        with self._lock:
            self._reap()
            alive = [t for t in self._threads if not t.stopping]
            if not alive:
                return None
            thread = max(alive, key=lambda t: t.index)
            thread.request_stop()
        thread.join(timeout)
        if thread.is_alive():
            raise TimeoutError(f"{thread.name} did not finish its batch within {timeout} s")
        with self._lock:
            if thread in self._threads:
                self._threads.remove(thread)
        log.info("processing_thread_removed", name=thread.name)
        return thread.name

    def replace(self, name: str) -> str | None:
        """Stop the named thread (after its batch) and start one in its place.

        Returns the new thread's name (the same index, so the same name), or
        None if no such thread is alive. Does not wait for the old thread.
        """
        with self._lock:
            old = next((t for t in self._threads if t.name == name and not t.stopping), None)
            if old is None:
                return None
            old.request_stop()
            self._threads.remove(old)
            thread = ProcessingThread(
                name, old.index, self._task_manager, self._collector, self._timeslice_s
            )
            self._threads.append(thread)
            thread.start()
        log.info("processing_thread_replaced", name=name)
        return name

    def set_count(self, count: int, timeout: float | None = None) -> list[str]:
        """Add or remove threads until `count` are alive; returns the live names."""
        while len(self.names()) < count:
            self.add()
        while len(self.names()) > count:
            if self.remove(timeout) is None:
                break
        return self.names()

    def stop_all(self, timeout: float) -> None:
        with self._lock:
            threads = list(self._threads)
        for thread in threads:
            thread.request_stop()
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        with self._lock:
            self._threads = [t for t in self._threads if t.is_alive()]

    def names(self) -> list[str]:
        with self._lock:
            self._reap()
            return [t.name for t in sorted(self._threads, key=lambda t: t.index) if not t.stopping]

    def threads(self) -> list[ProcessingThread]:
        with self._lock:
            return sorted(self._threads, key=lambda t: t.index)

    def _reap(self) -> None:
        self._threads = [t for t in self._threads if t.is_alive() or not t.ident]
