"""One measured run in a fresh process: the runtime or the baseline on one workload.

``python -m benchmarks.compare.child SPEC_JSON``, started by the harness
(``benchmarks.compare.session``). Protocol:

- events go to the file descriptor ``spec["event_fd"]`` as JSON lines
  (``ready``, ``go``, ``processed_all``, ``restore_done``, ``result``,
  ``failed``), each with ``t`` = ``time.monotonic()`` (one clock for every
  process on the machine);
- commands come on stdin, one per line: ``go`` (start processing; the
  restore workload also starts restoring), ``stop`` (close and report).

Both models start gated: they join the group, create their tasks and buffer
input up to ``buffered.records.per.partition``, but process nothing until
``go``; the harness sends ``go`` once the child reports ``ready`` (every
partition assigned, the assignment balanced and unchanged for ``settle_s``).
The runtime is gated with its public ``App.pause()``/``App.resume()``; its
restoration (restore workload only) with a subclass of ``RestorationThread``
that holds ``add_task`` calls until ``go`` (installed as
``runtime.assembly.RestorationThread`` in this process only: a benchmark hook, the
runtime has no public one). The baseline has gates of its own.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.compare.child_protocol import Commands, Events, run_and_exit
from benchmarks.compare.workloads import build_topology
from runtime.gc_tuning import tune_for_app_process


def _gated_restoration_class() -> Any:
    from runtime.state.restoration import RestorationThread

    class GatedRestorationThread(RestorationThread):  # type: ignore[misc]
        """Holds tasks handed over for restoration until ``open_gate()``."""

        instances: list[GatedRestorationThread] = []
        on_restored: Any = None

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self._gate = threading.Lock()
            self._held: list[Any] = []
            self._open = False
            GatedRestorationThread.instances.append(self)

        def add_task(self, task: Any) -> None:
            with self._gate:
                if not self._open:
                    self._held.append(task)
                    return
            super().add_task(task)

        def remove_task(self, task_id: str) -> Any:
            with self._gate:
                self._held = [t for t in self._held if t.id != task_id]
            return super().remove_task(task_id)

        def drain_restored(self) -> list[Any]:
            # Called by the polling thread, which gives these tasks to the
            # task manager right after: the moment a task becomes processable.
            tasks: list[Any] = super().drain_restored()
            hook = GatedRestorationThread.on_restored
            if hook is not None:
                for task in tasks:
                    hook(task.id)
            return tasks

        def open_gate(self) -> None:
            with self._gate:
                self._open = True
                held, self._held = self._held, []
            for task in held:
                super().add_task(task)

    return GatedRestorationThread


# Models that are `runtime.App` (keypar: with num.threads.per.task > 1), and
# the runtime in several processes (`processes`): a `WorkerPool`, the
# daemon's supervisor, which answers the same calls for all its processes.
PROCESS_MODELS = {"runtime-p2": 2}
RUNTIME_MODELS = ("runtime", "keypar", *PROCESS_MODELS)
# The raw consume-transform-produce loop (benchmarks/raw_loop.py), one thread.
RAW_MODEL = "raw"


class _Model:
    """The models behind one small interface.

    Each model's own status type stays behind it: ``runtime.App.status()`` is a
    typed ``AppStatus``, ``BaselineApp.status()`` and ``RawLoop.status()`` are
    plain dicts. (Reading ``.tasks`` of every model's status here is what broke
    every baseline run once key-parallel figures were added, issue 32.)
    """

    def __init__(self, spec: dict[str, Any], topology: Any, config: dict[str, Any]) -> None:
        self.kind = spec["model"]
        self.partitions = int(spec["partitions"])
        # Input topics (the join reads two): the baseline's assignment counts
        # topic-partitions, partitions of each.
        self.inputs = int(spec.get("inputs", 1))
        self.threads = int(spec["threads"])
        self.gate_restore = bool(spec.get("gate_restore"))
        self.expected_tasks = {f"0_{p}" for p in range(self.partitions)}
        self._gated_cls: Any = None
        # runtime.App, BaselineApp or RawLoop: each branch below uses its own API.
        self.app: Any
        if self.kind == RAW_MODEL:
            from benchmarks.raw_loop import RawLoop, operation_for

            if self.gate_restore:
                raise ValueError("the raw loop has no state to restore")
            self.app = RawLoop(
                spec["bootstrap"],
                spec["input_topic"],
                spec["output_topic"],
                self.partitions,
                operation_for(spec["topology"]),
                float(config.get("commit.interval.ms", 1000)) / 1000.0,
            )
        elif self.kind in PROCESS_MODELS:
            from benchmarks.compare import pool_topology
            from runtime.config import StreamsConfig
            from runtime.isolation.workers import WorkerPool

            if self.gate_restore:
                raise ValueError(
                    f"{self.kind}: the restore workload gates one process's restoration"
                )
            os.environ.update(
                pool_topology.environment(
                    spec["topology"], spec["input_topic"], spec["output_topic"], spec.get("echo")
                )
            )
            pool_config = dict(config, processes=PROCESS_MODELS[self.kind])
            self.app = WorkerPool(
                StreamsConfig.from_dict(pool_config), "benchmarks.compare.pool_topology:topology"
            )
            self.app.pause()  # every process starts paused (runtime.isolation.plan.ChildSpec)
        elif self.kind in RUNTIME_MODELS:
            from runtime import App

            if self.gate_restore:
                import runtime.assembly

                self._gated_cls = _gated_restoration_class()
                runtime.assembly.RestorationThread = self._gated_cls  # type: ignore[attr-defined]
            self.app = App(topology, config)
            self.app.pause()
        else:
            from benchmarks.baseline import BaselineApp

            self.app = BaselineApp(topology, config, spec.get("restore_mode", "blocking"))
            self.app.hold_processing()
            if self.gate_restore:
                self.app.hold_restoration()

    def on_restored(self, hook: Any) -> None:
        """``hook(task_id)`` the moment a restored task becomes processable."""
        if self.kind == RAW_MODEL:
            return
        if self.kind in RUNTIME_MODELS:
            if self._gated_cls is not None:
                self._gated_cls.on_restored = hook
        else:
            self.app.on_task_restored = hook

    def start(self) -> None:
        self.app.start()
        # The GC settings `streams-runtime run` gives the daemon once started
        # (runtime.gc_tuning), for every model alike: ratios stay like for like.
        tune_for_app_process()

    def release(self) -> None:
        if self.kind == RAW_MODEL:
            self.app.release()
        elif self.kind in RUNTIME_MODELS:
            if self._gated_cls is not None:
                for restoration in self._gated_cls.instances:
                    restoration.open_gate()
            self.app.resume()
        else:
            self.app.release()

    def failure(self) -> str | None:
        if self.kind == RAW_MODEL:
            return repr(self.app.failure) if self.app.failure is not None else None
        if self.kind in RUNTIME_MODELS:
            failure = self.app.failure
            if failure is None and str(self.app.state) in ("ERROR", "NOT_RUNNING"):
                return f"app state {self.app.state}"
            return repr(failure) if failure is not None else None
        failure = self.app.failure
        return repr(failure) if failure is not None else None

    def task_states(self) -> dict[str, str]:
        if self.kind == RAW_MODEL:
            return {}
        if self.kind in RUNTIME_MODELS:
            return {t.id: t.state for t in self.app.status().tasks}
        return dict(self.app.task_states())

    def task_processed(self) -> dict[str, int]:
        if self.kind == RAW_MODEL:
            return {}
        if self.kind in RUNTIME_MODELS:
            return {t.id: t.processed for t in self.app.status().tasks}
        return dict(self.app.task_processed())

    def processed(self) -> int:
        if self.kind == RAW_MODEL:
            return int(self.app.processed)
        if self.kind in RUNTIME_MODELS:
            # progress(), not status(): polled every 20-50 ms during the run.
            return self.app.progress().processed
        return int(sum(t.processed_total for t in self.app.threads))

    def signature(self) -> tuple[Any, ...] | None:
        """What must stay unchanged for ``settle_s`` before the run may go; None: not ready."""
        if self.kind == RAW_MODEL:
            # assign()-ed to every partition: no group, nothing to settle but the fetch.
            return ("assigned",) if self.app.assigned else None
        states = self.task_states()
        if set(states) != self.expected_tasks:
            return None
        if not self.gate_restore and any(s == "RESTORING" for s in states.values()):
            return None
        if self.kind in RUNTIME_MODELS:
            if str(self.app.state) != "RUNNING":
                return None
            return tuple(sorted(states.items()))
        assignment = self.app.assignment()
        everything = [tp for a in assignment for tp in a]
        expected = self.partitions * self.inputs
        if len(everything) != expected or len(set(everything)) != expected:
            return None
        sizes = [len(a) for a in assignment]
        if max(sizes) - min(sizes) > 1:
            return None  # librdkafka will move partitions once more
        return tuple(sorted(tuple(sorted(a)) for a in assignment)) + tuple(sorted(states.items()))

    def status(self) -> dict[str, Any]:
        """The model's final status for the run's record (JSON-friendly, per-task detail
        left out)."""
        if self.kind not in RUNTIME_MODELS:
            return dict(self.app.status())
        snapshot = self.app.status()
        status = dict(snapshot)
        # Key-parallel tasks' figures (parallelism, CPU-bound or not, probes)
        # explain a keypar run's throughput; other tasks' are left out.
        status["key_parallel_tasks"] = [
            {k: v for k, v in dataclasses.asdict(t).items() if k not in ("partitions", "restore")}
            for t in snapshot.tasks
            if t.key_parallel
        ]
        status.pop("tasks", None)
        status.pop("lag", None)
        return status

    def close(self, timeout: float) -> bool:
        return bool(self.app.close(timeout))


def run(spec: dict[str, Any], events: Events) -> dict[str, Any]:
    if spec.get("echo"):
        from benchmarks.compare import echo

        echo.ADDRESS = (spec["echo"][0], int(spec["echo"][1]))
    state_dir = tempfile.mkdtemp(prefix="bench-compare-state-")
    config = {
        "application.id": spec["application_id"],
        "bootstrap.servers": spec["bootstrap"],
        "processing.threads": int(spec["threads"]),
        "state.dir": state_dir,
        **spec["config"],
    }
    if spec["model"] == "keypar":
        # Key-parallel: up to this many threads share one task (0: all of them).
        config["num.threads.per.task"] = int(spec.get("threads_per_task") or spec["threads"])
    topology = build_topology(spec["topology"], spec["input_topic"], spec["output_topic"])
    commands = Commands()
    commands.start()
    model = _Model(spec, topology, config)
    settle_s = float(spec.get("settle_s", 0.5))
    ready_timeout = float(spec.get("ready_timeout_s", 120))
    backlog = int(spec.get("backlog", 0))
    restore_task = spec.get("restore_task")
    boundary: dict[str, Any] = {}

    def restored(task_id: str) -> None:
        if task_id == restore_task and "t" not in boundary:
            boundary["processed"] = model.task_processed()
            boundary["t"] = time.monotonic()

    if restore_task:
        model.on_restored(restored)
    started = time.monotonic()
    model.start()
    try:
        # -- gated: wait for a stable, balanced assignment ---------------------------
        last_signature: Any = None
        since = time.monotonic()
        while True:
            failure = model.failure()
            if failure:
                raise RuntimeError(f"{model.kind} failed before ready: {failure}")
            signature = model.signature()
            now = time.monotonic()
            if signature != last_signature:
                last_signature, since = signature, now
            elif signature is not None and now - since >= settle_s:
                break
            if now - started > ready_timeout:
                raise TimeoutError(
                    f"{model.kind}: no stable assignment after {ready_timeout:.0f} s "
                    f"(last: {last_signature})"
                )
            time.sleep(0.05)
        events.emit(
            "ready",
            join_s=since - started,
            ready_s=time.monotonic() - started,
            assignment=[sorted(f"{t}-{p}" for t, p in a) for a in model.app.assignment()]
            if model.kind == "baseline"
            else None,
        )
        commands.go.wait()
        processed_at_go = model.task_processed()
        go = time.monotonic()
        model.release()
        events.emit("go", processed_at_go=processed_at_go)

        # -- running: watch until stop ------------------------------------------------
        interval = 0.02 if restore_task else 0.05
        processed_all_sent = backlog <= 0
        restore_done_sent = restore_task is None
        while not commands.stop.is_set():
            failure = model.failure()
            if failure:
                raise RuntimeError(f"{model.kind} failed: {failure}")
            if not processed_all_sent and model.processed() >= backlog:
                processed_all_sent = True
                events.emit("processed_all")
            if not restore_done_sent and "t" in boundary:
                restore_done_sent = True
                events.emit(
                    "restore_done",
                    processed=boundary["processed"],
                    processed_at_go=processed_at_go,
                    restore_s=boundary["t"] - go,
                    restore_times=model.app.restore_times() if model.kind == "baseline" else None,
                )
            commands.stop.wait(interval)
        final = model.status()
    finally:
        close_started = time.monotonic()
        closed = model.close(30)
        close_s = time.monotonic() - close_started
        shutil.rmtree(state_dir, ignore_errors=True)
    return {"status": final, "close_s": close_s, "closed_cleanly": closed}


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[0])
    events = Events(int(spec["event_fd"]))
    switch_interval = os.environ.get("BENCH_SWITCH_INTERVAL")
    if switch_interval:
        sys.setswitchinterval(float(switch_interval))
    run_and_exit(events, lambda: run(spec, events))


if __name__ == "__main__":
    main(sys.argv[1:])
