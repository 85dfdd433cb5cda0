"""Child-process entry point: run one named runner, write its result as JSON.

``python -m benchmarks.child RUNNER SPEC_JSON``. The harness starts one child per
measured run (see ``harness.run_child``), so each run has a fresh interpreter:
CPU seconds and peak RSS belong to that run alone, and no thread of an earlier
run (an App that did not close in time) can steal the GIL.

A runner is ``fn(spec: dict) -> dict``; it times its own measured window and
reports ``cpu_s`` for it with ``cpu_seconds()``. This module adds the whole
process's CPU seconds and peak RSS.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import traceback
from typing import Any

# runner name -> "module:function"
RUNNERS = {
    "raw_loop": "benchmarks.raw_loop:run",
    "runtime_stateless": "benchmarks.workloads.stateless:run_runtime",
    "state_runtime": "benchmarks.state.runtime_side:run",
}


def cpu_seconds() -> float:
    """User+system CPU seconds of this whole process (all threads, librdkafka's too)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def usage() -> dict[str, float]:
    """A snapshot of this process's resource usage (all threads)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return {
        "user_s": u.ru_utime,
        "sys_s": u.ru_stime,
        "voluntary_ctx_switches": float(u.ru_nvcsw),
        "involuntary_ctx_switches": float(u.ru_nivcsw),
    }


def usage_since(before: dict[str, float]) -> dict[str, float]:
    """Usage deltas since ``before`` (a ``usage()`` snapshot), as ``cpu_*`` / ``ctx_*`` keys."""
    now = usage()
    return {
        "cpu_user_s": now["user_s"] - before["user_s"],
        "cpu_sys_s": now["sys_s"] - before["sys_s"],
        "ctx_switches_voluntary": now["voluntary_ctx_switches"] - before["voluntary_ctx_switches"],
        "ctx_switches_involuntary": (
            now["involuntary_ctx_switches"] - before["involuntary_ctx_switches"]
        ),
    }


class OtherLoad:
    """CPU seconds other processes (not this one, not the broker) use in a window.

    ``start()`` then ``stop()`` -> seconds of CPU that everything else on the
    machine used meanwhile; the harness flags runs where that exceeds a share of
    the window (the machine is shared with other people's test runs).
    """

    def __init__(self, broker_pid: int | None) -> None:
        self._broker_pid = broker_pid
        self._start: tuple[float, float, float] | None = None

    def _snapshot(self) -> tuple[float, float, float]:
        from benchmarks.harness import proc_cpu_seconds, system_busy_seconds

        broker = proc_cpu_seconds(self._broker_pid) if self._broker_pid else 0.0
        return system_busy_seconds(), cpu_seconds(), broker

    def start(self) -> None:
        self._start = self._snapshot()

    def stop(self) -> float:
        if self._start is None:
            return float("nan")
        system, own, broker = self._snapshot()
        return (system - self._start[0]) - (own - self._start[1]) - (broker - self._start[2])


def peak_rss_mb() -> float:
    """Peak resident set size of this process so far (VmHWM).

    Not ``ru_maxrss``: on Linux that survives ``exec`` and so can report the
    parent's (the harness's) peak instead of this process's.
    """
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def main(argv: list[str]) -> int:
    runner_name, spec_json = argv[0], argv[1]
    spec: dict[str, Any] = json.loads(spec_json)
    result_path = spec["result_path"]
    result: dict[str, Any] = {"runner": runner_name, "ok": False}
    # Diagnostic knob: CPython's GIL switch interval (default 0.005 s) for this run.
    switch_interval = os.environ.get("BENCH_SWITCH_INTERVAL")
    if switch_interval:
        sys.setswitchinterval(float(switch_interval))
        result["switch_interval_s"] = float(switch_interval)
    try:
        module_name, func_name = RUNNERS[runner_name].split(":")
        runner = getattr(importlib.import_module(module_name), func_name)
        result.update(runner(spec))
        result["ok"] = True
    except BaseException as exc:  # noqa: BLE001 - reported to the harness
        result["error"] = f"{type(exc).__name__}: {exc}"
        result["traceback"] = traceback.format_exc()
        traceback.print_exc()
    result["process_cpu_s"] = cpu_seconds()
    result["peak_rss_mb"] = peak_rss_mb()
    with open(result_path, "w") as f:
        json.dump(result, f)
    sys.stdout.flush()
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
