"""The supervisor of a daemon with `processes` > 1: `WorkerPool`.

`streams-runtime run` with `processes=N` (or `auto`, or
`processes.resizable`) starts this instead of an `App`: N processing
processes (`ChildProcess`es in the `worker` role, runtime.isolation.child),
each a full runtime in the application's one consumer group, with slot i's
identity (`worker_spec`: client.id `-p<i>`, its own transactional id). The
supervisor owns no Kafka client. The pool looks like an `App` to the admin
loop (runtime.admin.daemon): `state`, `wait`, `close`, `status` (its
processes' statuses merged, runtime.isolation.merge), the thread calls
(forwarded to every process), the named-query calls (carried to every
process and remembered for the ones started later,
runtime.isolation.pool_queries), `failure`; and adds the process calls
(`add_process`, `remove_process`, `set_processes`).

The gunicorn arbiter's shape: the wanted count is one number, and one
`reconcile` step moves the live set toward it. Starting a new slot,
stopping the highest ones (each closes gracefully: final commit, its tasks
released, it leaves the group) and restarting a slot whose process died are
the same step. A death is restarted at once the first time, then after
`process.restart.backoff.ms` doubling to `process.restart.backoff.max.ms`
while the slot keeps dying within a minute of its start.

Threads: any thread may call the public methods (one lock for the slots);
the reconcile thread runs `reconcile` every `_RECONCILE_S`; each child's
reader thread reports its events and exit.
"""

from __future__ import annotations

import dataclasses
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from runtime.config import StreamsConfig
from runtime.isolation.merge import merge_statuses
from runtime.isolation.plan import isolation_of, worker_spec
from runtime.isolation.pool_queries import AddedQuery, PoolQueries, worker_config
from runtime.isolation.process import ChildProcess
from runtime.isolation.slots import STABLE_UPTIME_S, Slot, exit_reason, restart_delay_ms
from runtime.lifecycle import AppState, IllegalStateError
from runtime.logging import get_logger
from runtime.status import AppStatus, ProcessStatus, Progress

log = get_logger("runtime.isolation")

ChildFactory = Callable[..., ChildProcess]

_RECONCILE_S = 0.2


# The pool's states in which its processes run (and may be started, resized
# or asked to leave).
_LIVE = (AppState.REBALANCING, AppState.RUNNING)


def _now() -> float:
    """The clock of restart backoff and uptime (monotonic); a module function so
    that a test can move it without touching `time.monotonic` for every
    thread of its process."""
    return time.monotonic()


START_TIMEOUT_S = 120.0  # a process's start: cluster wait, topic checks, the group join
_REQUEST_TIMEOUT_S = 10.0


class WorkerPool:
    """K processing processes of one daemon, looking like one `App` (see the module doc)."""

    def __init__(
        self,
        config: StreamsConfig,
        source: str,
        processes: int | None = None,
        child_factory: ChildFactory = ChildProcess,
    ) -> None:
        """`source`: 'module:attr' of the topology (each process imports it);
        `processes`: how many to start (default `config.processes`);
        `child_factory`: makes a slot's `ChildProcess` (a test's fake)."""
        worker_spec(config, source, 0)  # a config that cannot be passed on fails here
        self.config = config
        self._source = source
        self._child_factory = child_factory
        self._wanted = processes if processes is not None else config.processes
        self._threads = config.processing_threads  # a new slot's, follows `threads set`
        # What `pause`/`resume` left paused, for slots started later (the
        # task manager's own semantics: resume(None) resumes everything).
        self._paused_all = False
        self._paused_tasks: set[str] = set()
        self._slots: dict[int, Slot] = {}
        self._lock = threading.RLock()
        self._state = AppState.CREATED
        self._done = threading.Event()
        self._closing = threading.Event()
        # `admin prepare-leave`: every process hands its tasks over and exits
        # 0; none is restarted, and the pool ends once all have left.
        self._leaving = False
        self.failure: BaseException | None = None
        self.instance_id = f"{config.client_id}-{uuid.uuid4().hex[:12]}"
        self._started_at: float | None = None
        self._asker = ThreadPoolExecutor(max_workers=8, thread_name_prefix="pool-ask")
        # Imports the topology here if a query runs in a process of its own.
        self._queries = PoolQueries(config, source, self._ask_each, self._running_slot_names)

    # --- lifecycle ------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_S) -> None:
        """Start the processes and wait until each has started its app.
        Raises RuntimeError with the first one's reason if one could not
        (the others are stopped then)."""
        with self._lock:
            if self._state is not AppState.CREATED:
                raise RuntimeError(f"start() needs state CREATED, the pool is {self._state}")
            self._state = AppState.REBALANCING
            self._started_at = time.time()
            slots = [self._launch(self._slot(i)) for i in range(self._wanted)]
        for slot in slots:
            assert slot.child is not None
            try:
                slot.child.wait_started(timeout)
            except RuntimeError as exc:
                self._fail_start()
                raise RuntimeError(
                    f"processing process {slot.name} could not start: {exc}"
                ) from None
        log.info(
            "processes_started",
            processes=self._wanted,
            pids=[s.child.pid for s in slots if s.child],
        )
        self._queries.start_isolated(START_TIMEOUT_S)
        threading.Thread(target=self._reconcile_loop, name="pool-reconcile", daemon=True).start()

    def _fail_start(self) -> None:
        with self._lock:
            children = [s.child for s in self._slots.values() if s.child is not None]
        for child in children:
            child.stop(10.0)
        with self._lock:
            self._state = AppState.ERROR
        self._done.set()

    def close(self, timeout: float | None = None) -> bool:
        """Stop every process gracefully (each commits and leaves the group)
        at once; kill those still running after `timeout` (default
        `shutdown.timeout.ms`). True if all stopped in time."""
        timeout = self.config.shutdown_timeout_ms / 1000.0 if timeout is None else timeout
        with self._lock:
            if self._state in (AppState.NOT_RUNNING, AppState.ERROR) and self._done.is_set():
                return True
            self._state = AppState.PENDING_SHUTDOWN
            self._closing.set()
            children = [s.child for s in self._slots.values() if s.child is not None]
        for child in children:
            child.request_stop()
        deadline = time.monotonic() + timeout
        self._queries.stop_isolated(timeout)
        stopped = True
        for child in children:
            if not child.wait(max(0.0, deadline - time.monotonic())):
                child.kill()
                stopped = False
        with self._lock:
            self._state = AppState.NOT_RUNNING
        self._done.set()
        self._asker.shutdown(wait=False, cancel_futures=True)
        log.info("processes_stopped", graceful=stopped)
        return stopped

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    @property
    def state(self) -> AppState:
        with self._lock:
            if self._state is not AppState.REBALANCING and self._state is not AppState.RUNNING:
                return self._state
            slots = [s for s in self._slots.values() if s.index < self._wanted]
        running = len(slots) == self._wanted and all(
            s.up and s.figures.get("state") == "RUNNING" for s in slots
        )
        return AppState.RUNNING if running else AppState.REBALANCING

    # --- slots (under the lock) -----------------------------------------------

    def _slot(self, index: int) -> Slot:
        slot = self._slots.get(index)
        if slot is None:
            slot = self._slots[index] = Slot(index)
        return slot

    def _launch(self, slot: Slot) -> Slot:
        queries = self._queries.spec_fields()
        spec = dataclasses.replace(
            worker_spec(self.config, self._source, slot.index, self.instance_id),
            paused_all=self._paused_all,
            paused_tasks=tuple(sorted(self._paused_tasks)),
            **queries,
        )
        spec.config["processing.threads"] = self._threads
        worker_config(spec.config, queries)
        # The handlers get the child too: a slot started again has a new
        # one, and the old one's last lines must not count as the new one's.
        holder: list[ChildProcess] = []
        child = self._child_factory(
            f"process-{slot.name}",
            spec.to_line(),
            on_event=lambda event: self._on_event(slot, holder[0], event),
            on_exit=lambda *why: self._on_exit(slot, holder[0], *why),
        )
        holder.append(child)
        slot.child = child
        slot.figures = {}
        slot.removing = False
        slot.started_at = time.time()
        slot.started_mono = _now()
        pid = child.launch()
        log.info("process_starting", slot=slot.name, pid=pid, restarts=slot.restarts)
        return slot

    def _on_event(self, slot: Slot, child: ChildProcess, event: dict[str, Any]) -> None:
        if event.get("event") == "status" and slot.child is child:
            slot.figures = event

    def _on_exit(
        self,
        slot: Slot,
        child: ChildProcess,
        code: int,
        failure: str | None,
        stopping: bool,
        started: bool,
    ) -> None:
        reason = exit_reason(code, failure)
        with self._lock:
            if slot.child is not child:
                return
            slot.figures = {}
            if self._leaving:
                self._left(slot, reason, code)
                return
            if stopping or self._closing.is_set():
                log.info("process_stopped", slot=slot.name, reason=reason)
                if slot.index >= self._wanted and self._slots.get(slot.index) is slot:
                    del self._slots[slot.index]
                return
            slot.restarts += 1
            slot.last_exit = reason
            now = _now()
            if now - slot.started_mono >= STABLE_UPTIME_S:
                slot.early_deaths = 0
            delay_ms = restart_delay_ms(
                slot.early_deaths,
                self.config.process_restart_backoff_ms,
                self.config.process_restart_backoff_max_ms,
            )
            slot.early_deaths += 1
            slot.next_start = now + delay_ms / 1000.0
        log.warning(
            "process_died", slot=slot.name, reason=reason, started=started,
            restart_in_ms=delay_ms, restarts=slot.restarts,
        )  # fmt: skip

    def _left(self, slot: Slot, reason: str, code: int) -> None:
        """A process ended while the daemon leaves (under the lock): it is
        not restarted; once none is left the pool has ended (the daemon
        exits 0, as one process does after its leave). A process that died
        instead of leaving is only logged: its tasks move as after a crash."""
        if code == 0:
            log.info("process_left", slot=slot.name)
        else:
            log.warning("process_died_while_leaving", slot=slot.name, reason=reason)
        del self._slots[slot.index]
        if not any(s.up for s in self._slots.values()):
            self._state = AppState.NOT_RUNNING
            self._closing.set()
            self._done.set()
            # close() returns at once now; its executor is released here.
            self._asker.shutdown(wait=False, cancel_futures=True)
            log.info("processes_left")

    def reconcile(self) -> None:
        """One step toward the wanted count: start the missing slots (a dead
        one once its backoff has passed), stop the ones above it."""
        stopping: list[ChildProcess] = []
        with self._lock:
            if self._leaving or self._closing.is_set() or self._state not in _LIVE:
                return
            now = _now()
            for index in range(self._wanted):
                slot = self._slot(index)
                dead = slot.child is None or (not slot.child.alive and slot.child.wait(0))
                if dead and now >= slot.next_start:
                    self._launch(slot)
            for slot in self._slots.values():
                if slot.index >= self._wanted and not slot.removing:
                    slot.removing = True
                    if slot.child is not None:
                        stopping.append(slot.child)
            # Slots above the count whose process has exited (and been
            # reported) are forgotten; the others are still closing.
            gone = [
                i
                for i, s in self._slots.items()
                if i >= self._wanted and (s.child is None or (not s.up and s.child.wait(0)))
            ]
            for index in gone:
                del self._slots[index]
        for child in stopping:
            log.info("process_removing", slot=child.name.removeprefix("process-"), pid=child.pid)
            child.request_stop()

    def _reconcile_loop(self) -> None:
        while not self._closing.wait(_RECONCILE_S):
            try:
                self.reconcile()
            except Exception as exc:  # never fatal: next round
                log.warning("process_reconcile_failed", error=repr(exc))

    # --- processes -------------------------------------------------------------

    @property
    def processes(self) -> int:
        """The wanted count."""
        return self._wanted

    def set_processes(self, count: int, timeout: float | None = None) -> list[ProcessStatus]:
        """Run `count` processes: new slots start together (their joins fall
        into one rebalance), the highest ones above it stop gracefully (commit,
        release, leave: one rebalance). With `timeout`, wait until the live set
        is that (new ones started, removed ones exited); raises TimeoutError."""
        if count < 1:
            raise ValueError(f"processes must be at least 1, got {count}")
        if count > 256:
            raise ValueError(f"processes must be at most 256, got {count}")
        with self._lock:
            if self._closing.is_set():
                raise RuntimeError(f"the daemon is {self._state}")
            if self._leaving:
                raise RuntimeError("the daemon is leaving (prepare-leave): its processes stay")
            before, self._wanted = self._wanted, count
        log.info("processes_set", before=before, processes=count)
        self.reconcile()
        if timeout is not None:
            deadline = time.monotonic() + timeout
            while not self._settled():
                if self._closing.is_set():
                    raise RuntimeError("the daemon is shutting down")
                if time.monotonic() >= deadline:
                    raise TimeoutError(
                        f"the processes did not reach {count} within {timeout:.0f} s"
                    )
                time.sleep(0.05)
        return self.process_rows()

    def add_process(self, timeout: float | None = None) -> list[ProcessStatus]:
        return self.set_processes(self._wanted + 1, timeout)

    def remove_process(self, timeout: float | None = None) -> list[ProcessStatus]:
        return self.set_processes(self._wanted - 1, timeout)

    def _settled(self) -> bool:
        with self._lock:
            slots = dict(self._slots)
        return set(slots) == set(range(self._wanted)) and all(
            s.up and s.figures.get("state") in ("RUNNING", "REBALANCING") for s in slots.values()
        )

    def process_rows(self) -> list[ProcessStatus]:
        with self._lock:
            slots = sorted(self._slots.values(), key=lambda s: s.index)
        rows = []
        for slot in slots:
            figures = slot.figures
            child = slot.child
            up = slot.up
            rows.append(
                ProcessStatus(
                    name=slot.name,
                    slot=slot.index,
                    pid=child.pid if child is not None else None,
                    state=str(figures.get("state", "STARTING" if up else "DEAD")),
                    up=up,
                    restarts=slot.restarts,
                    last_exit=slot.last_exit,
                    started_at=slot.started_at if up else None,
                    tasks=int(figures.get("tasks", 0)),
                    threads=int(figures.get("threads", 0)),
                    processed=int(figures.get("processed", 0)),
                    lag=int(figures.get("lag", 0)),
                )
            )
        return rows

    def progress(self) -> Progress:
        """`App.progress()`'s totals over the running processes, from their
        last status lines (at most `STATUS_INTERVAL_S` old; a dead process's
        counts go with it): no request to any process, so a benchmark may
        poll it as it polls an App."""
        with self._lock:
            figures = [s.figures for s in self._slots.values()]
        commits = [f["last_commit"] for f in figures if f.get("last_commit") is not None]
        return Progress(
            state=str(self.state),
            failure=None if self.failure is None else str(self.failure),
            consumed=sum(int(f.get("consumed", 0)) for f in figures),
            processed=sum(int(f.get("processed", 0)) for f in figures),
            produced=sum(int(f.get("produced", 0)) for f in figures),
            commits=sum(int(f.get("commits", 0)) for f in figures),
            last_commit=max(commits) if commits else None,
            last_commit_duration_s=None,
        )

    # --- what an App answers ---------------------------------------------------

    def _ask_all(
        self, op: str, wait_s: float = _REQUEST_TIMEOUT_S, **fields: Any
    ) -> dict[str, Any]:
        """Ask every running process `op` at once; slot name -> its result
        (the ones that did not answer are left out, logged)."""
        answers, failures = self._ask(op, wait_s, None, fields)
        for name, error in failures.items():
            log.info("process_request_failed", slot=name, op=op, error=error)
        return answers

    def _ask_each(
        self, op: str, wait_s: float, names: list[str] | None, **fields: Any
    ) -> dict[str, Any]:
        """`_ask_all` of the named processes (None: all) that fails when one
        did: RuntimeError naming each that failed."""
        answers, failures = self._ask(op, wait_s, names, fields)
        if failures:
            raise RuntimeError("; ".join(f"{name}: {error}" for name, error in failures.items()))
        return answers

    def _ask(
        self, op: str, wait_s: float, names: list[str] | None, fields: dict[str, Any]
    ) -> tuple[dict[str, Any], dict[str, str]]:
        """Ask the running processes (`names`, None: all) at once; their
        answers and their failures, by slot name."""
        with self._lock:
            children = {
                s.name: s.child
                for s in self._slots.values()
                if s.up and s.child is not None and (names is None or s.name in names)
            }
        try:
            futures = {
                name: self._asker.submit(child.request, op, wait_s, **fields)
                for name, child in sorted(children.items())
            }
        except RuntimeError:  # closed: its executor takes no more work
            return {}, {}
        answers: dict[str, Any] = {}
        failures: dict[str, str] = {}
        for name, future in futures.items():
            try:
                answers[name] = future.result()
            except Exception as exc:
                failures[name] = str(exc)
        return answers, failures

    def status(self) -> AppStatus:
        answers = self._ask_all("status")
        statuses = {name: AppStatus.from_dict(data) for name, data in sorted(answers.items())}
        base = {
            "application_id": self.config.application_id,
            "client_id": self.config.client_id,
            "instance_id": self.instance_id,
            "state": str(self.state),
            "started_at": self._started_at,
            "processing_guarantee": self.config.processing_guarantee,
            "failure": None if self.failure is None else str(self.failure),
        }
        merged = merge_statuses(base, self.process_rows(), statuses)
        isolated = self._queries.isolated_statuses()
        return (
            dataclasses.replace(merged, queries=merged.queries + isolated) if isolated else merged
        )

    def expositions(self) -> dict[str, str]:
        """Each running process's `/metrics` text (runtime.isolation.pool_metrics)."""
        return {name: str(text) for name, text in self._ask_all("metrics").items()}

    def metrics_registry(self) -> Any:
        """The registry the daemon's metrics endpoint serves: the processes'
        families merged with a `process` label, and the pool's own."""
        from runtime.isolation.pool_metrics import pool_registry

        return pool_registry(self)

    @property
    def processing_threads(self) -> list[str]:
        answers = self._ask_all("threads")
        return [name for _, names in sorted(answers.items()) for name in names]

    def add_processing_thread(self) -> str | None:
        """One more processing thread in every process; their names joined
        by commas, None if none was added."""
        added = [n for n in self._ask_all("threads.add").values() if n]
        if added:
            self._threads += 1
        return ",".join(added) or None

    def remove_processing_thread(self, timeout: float | None = None) -> str | None:
        wait = (timeout or 30.0) + 5.0
        removed = [n for n in self._ask_all("threads.remove", wait, timeout=timeout).values() if n]
        if removed:
            self._threads = max(0, self._threads - 1)
        return ",".join(removed) or None

    def set_processing_threads(self, count: int, timeout: float | None = None) -> list[str]:
        wait = (timeout or 30.0) + 5.0
        answers = self._ask_all("threads.set", wait, count=count, timeout=timeout)
        self._threads = count
        return [name for _, names in sorted(answers.items()) for name in names]

    def pause(self, task_id: str | None = None) -> None:
        """Pause one task (wherever it runs) or all, in every process, and in
        every process started later (a new or restarted slot)."""
        with self._lock:
            if task_id is None:
                self._paused_all = True
            else:
                self._paused_tasks.add(task_id)
        self._ask_all("pause", task=task_id)

    def resume(self, task_id: str | None = None) -> None:
        with self._lock:
            if task_id is None:
                self._paused_all = False
                self._paused_tasks.clear()
            else:
                self._paused_tasks.discard(task_id)
        self._ask_all("resume", task=task_id)

    def prepare_leave(self) -> None:
        """Planned departure of the whole daemon (`task.assignment=runtime`):
        every process is asked to leave as one instance does (its tasks are
        learned by other instances and handed over; it never takes a task
        of another leaving process: the placer skips leaving members), then
        exits 0; none is restarted and the daemon exits 0 after the last.
        Returns at once.

        Raises IllegalStateError unless task.assignment=runtime and the
        daemon runs."""
        if self.config.task_assignment != "runtime":
            raise IllegalStateError("prepare-leave needs task.assignment=runtime")
        with self._lock:
            if self._closing.is_set() or self._state not in _LIVE:
                raise IllegalStateError(f"cannot prepare to leave in state {self.state}")
            self._leaving = True
        answers = self._ask_all("prepare_leave")
        log.info("prepare_leave_requested", processes=sorted(answers))

    # --- named queries (runtime.isolation.pool_queries) --------------------------

    def add_query(
        self,
        name: str,
        topology: Any = None,
        *,
        priority: int | None = None,
        weight: int | None = None,
        max_threads: int | None = None,
        timeout: float = 60.0,
        source: str | None = None,
        isolation: str | None = None,
    ) -> None:
        """`App.add_query` in every process: each imports `source`
        ('module:attr', required here: a Topology object cannot cross
        processes; `topology`, if given, is what the supervisor checks a
        process-isolated query with). Raises RuntimeError with the reason of
        the process that refused it (QueryError and the like for a query in
        a process of its own, as `App.add_query`)."""
        if source is None:
            raise IllegalStateError(
                f"add_query({name!r}) in a daemon with processes > 1 needs source="
                "'module:attr': each processing process imports the query from it"
            )
        self._require_live("add_query()")
        query = AddedQuery(name, source, priority, weight, max_threads)
        self._queries.add(query, topology, isolation or isolation_of(self.config, name), timeout)

    def remove_query(self, name: str, reset: bool = False, timeout: float = 60.0) -> None:
        """`App.remove_query` in every process (with `reset`, the last one resets)."""
        self._require_live("remove_query()")
        self._queries.remove(name, reset, timeout)

    def pause_query(self, name: str) -> None:
        self._require_live("pause_query()")
        self._queries.pause(name)

    def resume_query(self, name: str) -> None:
        self._require_live("resume_query()")
        self._queries.resume(name)

    def _require_live(self, call: str) -> None:
        with self._lock:
            if self._closing.is_set() or self._state not in _LIVE:
                raise IllegalStateError(f"{call} needs a running daemon, it is {self.state}")

    def _running_slot_names(self) -> list[str]:
        with self._lock:
            slots = sorted(self._slots.values(), key=lambda s: s.index)
            return [s.name for s in slots if s.up and s.child is not None and not s.removing]
