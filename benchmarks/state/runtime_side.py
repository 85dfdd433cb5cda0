"""The runtime's side of the state benchmark: one App in a fresh child process.

``benchmarks.child`` runner ``state_runtime`` (spec in, figures out; the
child adds the process's CPU seconds and peak RSS). Two modes:

- ``process``: a fresh ``state.dir``. The app starts paused (``App.pause()``:
  it joins the group, opens every task's stores and buffers input, but
  processes nothing); ``open_s`` is from ``start()`` until every task is
  RUNNING. Then it resumes, and ``records_per_s`` runs from the resume until
  every backlog record is processed; the app waits for one more commit (the
  last counts on disk and in the changelogs). Then, with ``feed_s`` > 0, the
  steady phase (``benchmarks.state.feed`` in its own process): the commits
  that end while it feeds give the ``steady_commit_*`` figures; the app
  waits for the fed records and one more commit, and closes.
- ``restore``: the same ``application.id`` on an empty ``state.dir`` (the
  local state wiped): every store restores from its changelog, and
  ``restore_s`` is from ``start()`` until every task is RUNNING. The count
  store is then read back: its counts must add up to the backlog.

Commit time: ``Committer.commit`` (steps 2-6 of the commit protocol: prepare,
flush the output, commit the offsets, changelog positions, every task's
``post_commit``, which writes its stores' batches and checkpoint) is wrapped,
in this process only, to time every commit that committed offsets; the
stores' share (every ``StreamTask.post_commit`` of the commit, and with the
consolidated layout ``ConsolidatedStores.write_commit``, the one batch the
post-commits only staged) is timed too.
Read-only: the runtime keeps only the last commit's duration
(``last_commit_duration_s``), and a benchmark needs each one. Only commits
that end between the resume and the end of the measured window count.
"""

from __future__ import annotations

import json
import math
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.state.workload import (
    COUNT_STORE,
    WINDOW_STORE,
    build_topology,
    event_end_ms,
    key_of,
    layout_config,
)


class CommitTimes:
    """Every commit's duration, its stores' share and where the rest went,
    from wrapped methods: ``commits`` holds (end, seconds, stores s,
    partitions, {step: seconds}) with the steps ``flush`` (the output
    acknowledged, or the transaction committed), ``offsets`` (at_least_once's
    offset commit), ``positions`` (the changelogs' end offsets) and
    ``stores``."""

    def __init__(self) -> None:
        self.commits: list[tuple[float, float, float, int, dict[str, float]]] = []
        self._steps: dict[str, float] = {}
        # Records processed when each commit began (same order as `commits`):
        # a commit that began with every record processed made them durable.
        self.processed_at_start: list[int] = []
        self.processed: Any = lambda: 0  # the app's processed total, set once it exists

    def _timed(self, owner: Any, name: str, step: str) -> None:
        original = getattr(owner, name)
        steps = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.monotonic()
            try:
                return original(*args, **kwargs)
            finally:
                elapsed = time.monotonic() - started
                steps._steps[step] = steps._steps.get(step, 0.0) + elapsed

        setattr(owner, name, timed)

    def install(self) -> None:
        from runtime.collector.output import OutputChannel
        from runtime.collector.transactions import Transactions
        from runtime.polling.committer import Committer
        from runtime.processing.task import StreamTask
        from runtime.state.consolidated import ConsolidatedStores

        commit = Committer.commit
        times = self

        def timed_commit(committer: Any, tasks: Any, reason: str) -> Any:
            times._steps = {}
            processed = times.processed()
            started = time.monotonic()
            result = commit(committer, tasks, reason)
            ended = time.monotonic()
            if result.committed and result.partitions:
                steps = dict(times._steps)
                times.processed_at_start.append(processed)
                times.commits.append(
                    (ended, ended - started, steps.get("stores", 0.0), result.partitions, steps)
                )
            return result

        self._timed(StreamTask, "post_commit", "stores")
        self._timed(ConsolidatedStores, "write_commit", "stores")
        self._timed(OutputChannel, "flush", "flush")
        self._timed(Transactions, "commit", "flush")
        self._timed(Committer, "_commit_offsets", "offsets")
        self._timed(Committer, "_changelog_positions", "positions")
        Committer.commit = timed_commit  # type: ignore[method-assign]

    def between(
        self, start: float, end: float
    ) -> list[tuple[float, float, float, int, dict[str, float]]]:
        return [c for c in self.commits if start <= c[0] <= end]


def commit_figures(
    window: list[tuple[float, float, float, int, dict[str, float]]], prefix: str
) -> dict[str, float]:
    """Median, p99 and max of the commits in `window`, and their stores' share."""
    seconds = [c[1] for c in window]
    stores = [c[2] for c in window]
    return {
        f"{prefix}median_ms": 1000 * statistics.median(seconds),
        f"{prefix}p99_ms": 1000 * percentile(seconds, 0.99),
        f"{prefix}max_ms": 1000 * max(seconds),
        f"{prefix}stores_median_ms": 1000 * statistics.median(stores),
        f"{prefix}stores_p99_ms": 1000 * percentile(stores, 0.99),
    }


def steps_figures(
    window: list[tuple[float, float, float, int, dict[str, float]]], prefix: str
) -> dict[str, Any]:
    """Median and p99 of each step of the commits in `window`, and the slowest
    commit's steps (what its time went to)."""
    figures: dict[str, Any] = {}
    if not window:
        return figures
    for step in ("flush", "offsets", "positions", "stores"):
        values = [c[4].get(step, 0.0) for c in window]
        figures[f"{prefix}{step}_median_ms"] = 1000 * statistics.median(values)
        figures[f"{prefix}{step}_p99_ms"] = 1000 * percentile(values, 0.99)
    slowest = max(window, key=lambda c: c[1])
    figures[f"{prefix}slowest_ms"] = 1000 * slowest[1]
    figures[f"{prefix}slowest_steps_ms"] = {k: round(1000 * v, 1) for k, v in slowest[4].items()}
    return figures


def percentile(values: list[float], q: float) -> float:
    """The ``q``-quantile (0..1) by the nearest-rank method (a p99 of 40 commits is the max)."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = min(len(ordered), max(1, math.ceil(q * len(ordered))))
    return ordered[rank - 1]


def _wait(predicate: Any, timeout: float, what: str, app: Any, interval: float = 0.05) -> float:
    deadline = time.monotonic() + timeout
    while True:
        failure = app.failure
        if failure is not None:
            raise RuntimeError(f"the app failed while waiting for {what}: {failure!r}")
        if predicate():
            return time.monotonic()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what}: not within {timeout:.0f} s")
        time.sleep(interval)


def _all_running(app: Any, partitions: int, phases: dict[str, float], started: float) -> bool:
    status = app.status()
    phase = status.startup_phase
    if phase is not None and phase not in phases:
        phases[phase] = round(time.monotonic() - started, 3)
    tasks = status.tasks
    return len(tasks) == partitions and all(t.state in ("RUNNING", "PAUSED") for t in tasks)


def run(spec: dict[str, Any]) -> dict[str, Any]:
    from runtime import App
    from runtime.gc_tuning import tune_for_app_process

    mode = spec["mode"]
    partitions = int(spec["partitions"])
    timeout = float(spec.get("timeout_s", 600))
    times = CommitTimes()
    times.install()
    config: dict[str, Any] = {
        "application.id": spec["application_id"],
        "bootstrap.servers": spec["bootstrap"],
        "state.dir": spec["state_dir"],
        "processing.threads": int(spec["threads"]),
        "commit.interval.ms": int(spec["commit_interval_ms"]),
        "consumer.session.timeout.ms": 6000,
        "log.level": "warning",
        **layout_config(spec["layout"]),
        **spec.get("config", {}),
    }
    app = App(build_topology(spec["input_topic"], int(spec["window_ms"])), config)
    times.processed = lambda: app.progress().processed
    result: dict[str, Any] = {"mode": mode, "layout": spec["layout"], "partitions": partitions}
    if mode == "process":
        app.pause()
    phases: dict[str, float] = {}
    started = time.monotonic()
    app.start()
    tune_for_app_process()
    try:
        running = _wait(
            lambda: _all_running(app, partitions, phases, started),
            timeout,
            "every task RUNNING",
            app,
        )
        result["startup_phases_s"] = phases
        status = app.status()
        result["restored_records"] = status.restored
        restores = status.restores.values()
        result["task_restore_max_s"] = max((r.get("seconds", 0.0) for r in restores), default=0.0)
        if mode == "restore":
            result["restore_s"] = running - started
            result.update(_read_back(app, spec))
        else:
            result["open_s"] = running - started
            result.update(_process(app, times, spec, timeout, started))
        result["rss_before_close_mb"] = _rss_mb()
        state = app.status().state_memory or {}
        result["rocksdb_memory_bytes"] = state.get("memory_bytes")
        result["block_cache_usage_bytes"] = state.get("block_cache_usage_bytes")
        result["write_buffer_usage_bytes"] = state.get("write_buffer_usage_bytes")
    finally:
        closed_started = time.monotonic()
        result["closed_cleanly"] = bool(app.close(60))
        result["close_s"] = time.monotonic() - closed_started
    return result


def _read_back(app: Any, spec: dict[str, Any]) -> dict[str, int]:
    """What the restored stores hold: the counts of both must add up to the backlog."""
    counted = sum(int(v) for _k, v in app.store(COUNT_STORE, timeout=60).all())
    windows = app.store(WINDOW_STORE, timeout=60)
    backlog, keys = int(spec["records"]), int(spec["keys"])
    total = backlog + fed_records(spec)
    lo = int(spec["base_ms"]) - int(spec["window_ms"])
    hi = event_end_ms(
        total - backlog, float(spec.get("feed_rate", 0)), int(spec["base_ms"]), int(spec["span_ms"])
    )
    used = {key_of(i, keys).decode() for i in range(total)}
    windowed = sum(int(v) for key in used for _start, v in windows.fetch(key, lo, hi))
    return {"counted": counted, "windowed_counted": windowed}


def _processed_and_committed(
    app: Any, times: CommitTimes, count: int, timeout: float, what: str
) -> float:
    """Wait until `count` records are processed, then for a commit that began
    with all of them processed (their counts durable: the last commit may
    have begun before the wait saw the count, and an idle app commits no
    more); when the count was seen."""
    done = _wait(lambda: app.progress().processed >= count, timeout, what, app, 0.02)
    _wait(
        lambda: any(n >= count for n in times.processed_at_start),
        timeout,
        f"the commit after {what}",
        app,
    )
    return done


def _process(
    app: Any, times: CommitTimes, spec: dict[str, Any], timeout: float, started: float
) -> dict[str, Any]:
    total = int(spec["records"])
    go = time.monotonic()
    app.resume()
    first = _wait(lambda: app.progress().processed > 0, timeout, "the first record", app, 0.01)
    done = _processed_and_committed(app, times, total, timeout, "the whole backlog")
    window = times.between(go, time.monotonic())
    steady = _steady(app, times, spec, timeout)
    return {
        "records": total,
        **steady,
        "processed": app.progress().processed,
        "first_record_s": first - go,
        "backlog_s": done - go,
        "records_per_s": total / (done - go),
        # Symmetric with Kafka Streams whatever each fetched before the resume:
        # from start(), group join and store opening included.
        "records_per_s_from_start": total / (done - started),
        "commits": len(window),
        **commit_figures(window, "commit_"),
        "commit_partitions_max": max(c[3] for c in window),
    }


def fed_records(spec: dict[str, Any]) -> int:
    """How many records the steady feed adds after the backlog."""
    return int(float(spec.get("feed_rate", 0)) * float(spec.get("feed_s", 0)))


def _steady(app: Any, times: CommitTimes, spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """The steady phase: `feed_rate` records/s for `feed_s` s from a feeder
    process; every commit that ends while it feeds (after its first second)
    counts. Returns nothing when there is no feed."""
    count = fed_records(spec)
    if count <= 0:
        return {}
    feeder_spec = {
        "bootstrap": spec["bootstrap"],
        "topic": spec["input_topic"],
        "partitions": spec["partitions"],
        "records": spec["records"],
        "keys": spec["keys"],
        "base_ms": spec["base_ms"],
        "span_ms": spec["span_ms"],
        "rate": spec["feed_rate"],
        "count": count,
    }
    target = int(spec["records"]) + count
    started = time.monotonic()
    feeder = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.state.feed", json.dumps(feeder_spec)]
    )
    try:
        code = feeder.wait(timeout=float(spec["feed_s"]) * 3 + 60)
    finally:
        if feeder.poll() is None:
            feeder.kill()
    ended = time.monotonic()
    if code != 0:
        raise RuntimeError(f"the steady feed failed (exit {code})")
    done = _processed_and_committed(app, times, target, timeout, "the fed records")
    window = times.between(started + 1.0, ended)
    if not window:
        raise RuntimeError("no commit during the steady feed (a longer --feed-s gives some)")
    return {
        "fed": count,
        "feed_s": ended - started,
        "feed_lag_s": done - ended,
        "steady_commits": len(window),
        **commit_figures(window, "steady_commit_"),
        **steps_figures(window, "steady_commit_"),
    }


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return float("nan")
