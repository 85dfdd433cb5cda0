"""Workload "scale": scale out 1 -> 3 and in 3 -> 2 under load, a large store,
runtime-owned placement (learners) against the group's assignor.

One invocation runs both modes, `task.assignment=runtime` then `group`, each
on fresh topics and a fresh application.id, on ONE Apache Kafka node started
by the harness:

1. A stateful count (`tests.apps.count_app`, `cache.max.bytes=0`: every
   update reaches the changelog) over ``--partitions`` (6) partitions. Its
   changelog is written first, directly: ``--records`` (1,000,000) keys
   ``k<i>`` with count 1, each on the partition murmur2 gives it (the one the
   input uses), so the store is large before any input flows.
2. Instance 1 (a daemon process, `python -m runtime run`, its own GIL)
   starts, restores the whole store and runs every task; a feeder produces
   ``--rate`` records/s over the same keys.
3. Scale-out: instances 2 and 3 start together. *Balanced* when every
   instance runs ``partitions/3`` tasks (read over the admin sockets, every
   0.25 s).
4. Scale-in: instance 3 leaves. `runtime`: a planned departure
   (`admin prepare-leave`: its tasks are learned elsewhere and handed over,
   then it exits 0); `group`: SIGTERM (a clean close, its tasks restore on the
   survivors). *Balanced* when it has exited and the two others run
   ``partitions/2`` tasks each.

Figures per task (= per partition; keys land on the same partition number in
input and output, both murmur2): the longest output gap in each phase, from
the sink's record timestamps (the sink topic uses LogAppendTime: the broker's
append time, so a gap is a stretch with no output appended; the broker is on
this machine, same clock as the events); before the scale-out (baseline),
during scale-out (from the start of instances 2 and 3 until balanced + 5 s),
during scale-in (from the leave request until balanced + 5 s). Per instance:
records restored as an active task (blocking: the task waits), the largest
changelog position a learner/standby copy reached (not blocking), hand-overs
taken (runtime mode). Final counts are checked against what was fed.

Writes ``<out>/scale[-TAG].json``, ``.md`` and ``.png`` (per-task output rate
over time, 0.5 s bins, the scale events marked, one panel per mode; needs
matplotlib, the `bench` extra). Daemon and broker logs go to
``<out>/logs/scale[-TAG]/``. ``--quick``: 20,000 records, short holds (a
smoke run, about 1.5 minutes here).

Threads: only the main thread drives the daemons and samples; the feeder has
its own thread.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import signal
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.report import pyplot

NAME = "scale"
MODES = ("runtime", "group")
SAMPLE_S = 0.25
BIN_S = 0.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records", type=int, default=1_000_000, help="changelog records before start (1e6)"
    )
    parser.add_argument("--partitions", type=int, default=6, help="input partitions (6)")
    parser.add_argument("--rate", type=float, default=600.0, help="input records/s (600)")
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument("--acceptable-lag", type=int, default=1000, help="acceptable.recovery.lag")
    parser.add_argument("--warmups", type=int, default=2, help="max.warmup.replicas (2)")
    parser.add_argument("--hold-s", type=float, default=10.0, help="steady time between events")
    parser.add_argument(
        "--modes", default=",".join(MODES), help="task.assignment modes to run (runtime,group)"
    )
    parser.add_argument("--quick", action="store_true", help="smoke run (20,000 records)")
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")


class Instance:
    """One daemon process of the app, with its admin socket (main thread only)."""

    def __init__(
        self, name: str, log_dir: Path, sock_dir: Path, sets: dict[str, Any], env: dict[str, str]
    ) -> None:
        from tests.harness import Daemon

        self.name = name
        self.socket = str(sock_dir / f"{name}.sock")
        self.daemon = Daemon(
            log_dir / f"{name}.log",
            "tests.apps.count_app:topology",
            {**sets, "admin.socket": self.socket, "state.dir": str(sock_dir / f"state-{name}")},
            env,
        )
        self.last: dict[str, Any] | None = None
        self.learned: dict[str, int] = {}  # task -> largest learner/standby position seen
        self.exit_code: int | None = None

    def start(self) -> None:
        self.daemon.start()

    def status(self) -> dict[str, Any] | None:
        """The daemon's status, or None while its socket does not answer."""
        from runtime.admin.client import AdminUnavailable, request

        if not self.daemon.alive():
            return None
        try:
            status = request(self.socket, "status", timeout=5)
        except (AdminUnavailable, OSError, ValueError):
            return None
        self.last = status
        for task, positions in (status.get("standbys") or {}).items():
            position = sum(positions.values())
            self.learned[task] = max(self.learned.get(task, 0), position)
        return status

    def running(self) -> set[str]:
        status = self.last
        if status is None or not self.daemon.alive():
            return set()
        return {t["id"] for t in status["tasks"] if t["state"] == "RUNNING"}


def stop_all(instances: list[Instance]) -> None:
    """SIGTERM every live daemon at once, then wait for each (SIGKILL after 30 s)."""
    for instance in instances:
        if instance.daemon.alive():
            instance.daemon.send(signal.SIGTERM)
    for instance in instances:
        if instance.daemon.alive() and instance.daemon.wait(30) is None:
            instance.daemon.kill()


def _deadline_loop(timeout: float, what: str, step: Any) -> float:
    """Call `step()` every SAMPLE_S until it returns True; the wall time then."""
    deadline = time.monotonic() + timeout
    while True:
        if step():
            return time.time()
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(SAMPLE_S)


def run_mode(session: Any, mode: str, args: argparse.Namespace, log_root: Path) -> dict[str, Any]:
    from benchmarks.harness import load_records
    from runtime import serdes
    from tests.harness import Feeder, clean_env
    from tests.kafka_helpers import create_topic

    bootstrap = session.bootstrap
    parts = args.partitions
    app_id = f"scale-{mode}-{uuid.uuid4().hex[:6]}"
    source, sink = f"{app_id}-in", f"{app_id}-out"
    create_topic(bootstrap, source, parts)
    create_topic(bootstrap, sink, parts, {"message.timestamp.type": "LogAppendTime"})
    create_topic(bootstrap, f"{app_id}-counts-changelog", parts, {"cleanup.policy": "compact"})
    one = serdes.INT64.serialize(1)
    load_s = load_records(
        bootstrap, f"{app_id}-counts-changelog", args.records, lambda i: (f"k{i}".encode(), one)
    )
    print(f"[{mode}] changelog of {args.records:,} records loaded in {load_s:.1f} s", flush=True)
    log_dir = log_root / mode
    log_dir.mkdir(parents=True, exist_ok=True)
    # AF_UNIX paths are <= 107 bytes: sockets (and state) in a short directory.
    sock_dir = Path(tempfile.mkdtemp(prefix="scl"))
    sets: dict[str, Any] = {
        "application.id": app_id,
        "bootstrap.servers": bootstrap,
        "task.assignment": mode,
        "processing.threads": 1,
        "commit.interval.ms": args.commit_interval_ms,
        "cache.max.bytes": 0,
        "acceptable.recovery.lag": args.acceptable_lag,
        "max.warmup.replicas": args.warmups,
        "consumer.session.timeout.ms": 6000,
        "consumer.heartbeat.interval.ms": 500,
    }
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    instances = [Instance(f"i{n}", log_dir, sock_dir, sets, env) for n in (1, 2, 3)]
    i1, i2, i3 = instances
    feeder = Feeder(bootstrap, source, rate=args.rate, keys=args.records)
    events: dict[str, float] = {}
    samples: list[dict[str, Any]] = []
    everything = {f"0_{p}" for p in range(parts)}

    def sample(group: list[Instance]) -> None:
        row: dict[str, Any] = {"t": time.time()}
        for inst in group:
            status = inst.status()
            row[inst.name] = sorted(inst.running()) if status is not None else None
        samples.append(row)

    try:
        i1.start()
        events["i1_start"] = time.time()

        def i1_runs_all() -> bool:
            i1.daemon.assert_alive()
            sample([i1])
            return i1.running() == everything

        events["i1_running"] = _deadline_loop(600, "instance 1 running every task", i1_runs_all)
        initial_restore = int((i1.last or {}).get("restored", 0))
        feeder.start()
        events["feed_start"] = time.time()

        def caught_up() -> bool:
            sample([i1])
            return i1.last is not None and i1.last.get("total_lag", 1 << 30) < args.rate

        _deadline_loop(300, "instance 1 catching up", caught_up)
        hold_until = time.time() + args.hold_s
        _deadline_loop(args.hold_s + 10, "hold", lambda: sample([i1]) or time.time() >= hold_until)

        events["scale_out"] = time.time()
        i2.start()
        i3.start()
        third = parts // 3

        def balanced_out() -> bool:
            for inst in instances:
                inst.daemon.assert_alive()
            sample(instances)
            sets_ = [inst.running() for inst in instances]
            return all(len(s) == third for s in sets_) and set().union(*sets_) == everything

        events["balanced_out"] = _deadline_loop(600, "balance after scale-out", balanced_out)
        hold_until = time.time() + args.hold_s
        _deadline_loop(
            args.hold_s + 10, "hold", lambda: sample(instances) or time.time() >= hold_until
        )

        events["scale_in"] = time.time()
        if mode == "runtime":
            from runtime.admin.client import request

            request(i3.socket, "prepare-leave", timeout=10)
        else:
            i3.daemon.send(signal.SIGTERM)
        stay = [i1, i2]
        half = parts // 2

        def balanced_in() -> bool:
            for inst in stay:
                inst.daemon.assert_alive()
            sample(instances)
            if i3.daemon.alive():
                return False
            sets_ = [inst.running() for inst in stay]
            return all(len(s) == half for s in sets_) and set().union(*sets_) == everything

        events["balanced_in"] = _deadline_loop(600, "balance after scale-in", balanced_in)
        i3.exit_code = i3.daemon.wait(0)
        hold_until = time.time() + args.hold_s
        _deadline_loop(args.hold_s + 10, "hold", lambda: sample(stay) or time.time() >= hold_until)
        events["end"] = time.time()
        feeder.stop()
        fed = Counter(f"k{i % args.records}" for i in range(feeder.sent))
        for inst in stay:
            inst.status()
        # Let the last records come out before reading the sink.
        time.sleep(args.commit_interval_ms / 1000 + 1)
    finally:
        if feeder.is_alive():
            feeder.stop()
        stop_all(instances)
        shutil.rmtree(sock_dir, ignore_errors=True)
    run = analyse(mode, bootstrap, sink, parts, events, samples, instances, fed, args, load_s)
    run["initial_restore_records"] = initial_restore
    run["restored_after_start"] = (
        sum(int((inst.last or {}).get("restored", 0)) for inst in instances) - initial_restore
    )
    return run


def analyse(
    mode: str,
    bootstrap: str,
    sink: str,
    parts: int,
    events: dict[str, float],
    samples: list[dict[str, Any]],
    instances: list[Instance],
    fed: Counter[str],
    args: argparse.Namespace,
    load_s: float,
) -> dict[str, Any]:
    from runtime import serdes
    from tests.kafka_helpers import consume_all

    stamps: dict[int, list[float]] = {p: [] for p in range(parts)}
    latest: dict[str, int] = {}
    for m in consume_all(bootstrap, sink, idle=1.0, timeout=120):
        stamps[m.partition].append(m.timestamp / 1000)
        if m.key is not None and m.value is not None:
            latest[m.key.decode()] = serdes.INT64.deserialize(m.value)
    wrong = [k for k, n in fed.items() if latest.get(k) != n + 1]
    t0 = events["feed_start"]
    phases = {
        "baseline": (t0 + 2, events["scale_out"]),
        "scale_out": (events["scale_out"], events["balanced_out"] + 5),
        "scale_in": (events["scale_in"], events["balanced_in"] + 5),
    }
    tasks: dict[str, Any] = {}
    for p in range(parts):
        ts = sorted(stamps[p])
        row: dict[str, Any] = {"output_records": len(ts)}
        for phase, (lo, hi) in phases.items():
            gap, at = longest_gap(ts, lo, hi)
            row[f"gap_{phase}_s"] = round(gap, 3)
            row[f"gap_{phase}_at_s"] = round(at - events["scale_out"], 2)
        owners: list[str] = []
        for s in samples:
            for inst in instances:
                if f"0_{p}" in (s.get(inst.name) or []) and (not owners or owners[-1] != inst.name):
                    owners.append(inst.name)
        row["owners"] = owners
        row["restored_as_active"] = {
            inst.name: inst.last["restores"][f"0_{p}"]["records"]
            for inst in instances
            if inst.last and f"0_{p}" in (inst.last.get("restores") or {})
        }
        row["learned_up_to"] = {
            inst.name: inst.learned[f"0_{p}"] for inst in instances if f"0_{p}" in inst.learned
        }
        tasks[f"0_{p}"] = row
    per_instance = {}
    for inst in instances:
        last = inst.last or {}
        placement = last.get("placement") or {}
        per_instance[inst.name] = {
            "restored_as_active": last.get("restored"),
            "handovers_taken": placement.get("handovers"),
            "max_handover_pause_s": placement.get("max_handover_pause_s"),
            "exit_code": inst.exit_code,
        }
    rel = {k: round(v - events["scale_out"], 2) for k, v in events.items()}
    rates = rate_series(stamps, events["feed_start"] - 1, events["end"] + 1)
    return {
        "mode": mode,
        "changelog_records": args.records,
        "changelog_load_s": round(load_s, 1),
        "events_wall": events,
        "events_from_scale_out_s": rel,
        "time_to_balance_out_s": round(events["balanced_out"] - events["scale_out"], 2),
        "time_to_balance_in_s": round(events["balanced_in"] - events["scale_in"], 2),
        "initial_restore_s": round(events["i1_running"] - events["i1_start"], 2),
        "tasks": tasks,
        "instances": per_instance,
        "fed": sum(fed.values()),
        "counts_exact": not wrong,
        "counts_wrong": len(wrong),
        "rates": rates,
    }


def longest_gap(ts: list[float], lo: float, hi: float) -> tuple[float, float]:
    """The longest stretch in [lo, hi] with no timestamp, and where it starts."""
    inside = [lo] + [t for t in ts if lo <= t <= hi] + [hi]
    gap, at = max((b - a, a) for a, b in zip(inside, inside[1:], strict=False))
    return gap, at


def rate_series(stamps: dict[int, list[float]], lo: float, hi: float) -> dict[str, Any]:
    bins = int((hi - lo) / BIN_S) + 1
    series = {}
    for p, ts in stamps.items():
        counts = [0] * bins
        for t in ts:
            if lo <= t < hi:
                counts[int((t - lo) / BIN_S)] += 1
        series[f"0_{p}"] = [round(c / BIN_S, 1) for c in counts]
    return {"start_wall": lo, "bin_s": BIN_S, "per_task": series}


def main(args: argparse.Namespace) -> int:
    from benchmarks.harness import BenchSession, machine_info

    # benchmarks/results/local/ unless --update-results or --out (benchmarks/outputs.py).
    args.out = output_dir(args)

    if args.quick:
        args.records, args.hold_s = min(args.records, 20_000), min(args.hold_s, 5.0)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: unknown mode {m!r} (use {','.join(MODES)})")
    if args.partitions % 6:
        raise SystemExit("--partitions must be a multiple of 6 (balanced on 3 and on 2 instances)")
    name = f"{NAME}-{args.tag}" if args.tag else (f"{NAME}-quick" if args.quick else NAME)
    log_root = Path(args.out) / "logs" / name
    result: dict[str, Any] = {
        "name": name,
        "records": args.records,
        "partitions": args.partitions,
        "rate": args.rate,
        "commit_interval_ms": args.commit_interval_ms,
        "acceptable_recovery_lag": args.acceptable_lag,
        "max_warmup_replicas": args.warmups,
        "hold_s": args.hold_s,
        "machine": machine_info("kafka"),
        "load_average_start": os.getloadavg()[0],
        "runs": {},
    }
    started = time.monotonic()
    failed = False
    with BenchSession(str(log_root), "kafka") as session:
        for mode in modes:
            try:
                run = run_mode(session, mode, args, log_root)
            except Exception as exc:  # noqa: BLE001 - recorded, the other mode still runs
                run = {"mode": mode, "error": f"{type(exc).__name__}: {exc}"}
                failed = True
            result["runs"][mode] = run
            print(summary_line(run), flush=True)
    result["session_s"] = round(time.monotonic() - started, 1)
    result["load_average_end"] = os.getloadavg()[0]
    for path in write(args.out, name, result):
        print(f"wrote {path}")
    return 1 if failed else 0


def summary_line(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"[{run['mode']}] FAILED {run['error']}"
    tasks = run["tasks"].values()
    return (
        f"[{run['mode']}] balanced {run['time_to_balance_out_s']} s after the scale-out, "
        f"{run['time_to_balance_in_s']} s after the scale-in; longest output gap "
        f"{max(t['gap_scale_out_s'] for t in tasks):.2f} s (out), "
        f"{max(t['gap_scale_in_s'] for t in tasks):.2f} s (in), "
        f"{max(t['gap_baseline_s'] for t in tasks):.2f} s (baseline); "
        f"counts exact: {run['counts_exact']}"
    )


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        "# Scale out 1 -> 3 and in 3 -> 2 under load: learners vs the group's assignor",
        "",
        f"Broker: {m.get('broker', 'Apache Kafka, one KRaft node')}; {m.get('nproc')} cores "
        f"({m.get('cpu', '?')}), shared with other work (load average {result['load_average_start']:.1f} "
        f"at start, {result['load_average_end']:.1f} at end: the figures are noisy, one run each); "
        f"librdkafka {m.get('librdkafka')}, {m.get('date')}, git {m.get('git_head', '?')}.",
        "",
        f"A count over a store of {result['records']:,} changelog records (keys), "
        f"{result['partitions']} partitions, fed at {result['rate']:.0f} records/s; every instance "
        f"a daemon process with one processing thread; `commit.interval.ms` "
        f"{result['commit_interval_ms']}, `cache.max.bytes` 0, `acceptable.recovery.lag` "
        f"{result['acceptable_recovery_lag']}, `max.warmup.replicas` {result['max_warmup_replicas']}. "
        "Scale-out: instances 2 and 3 start together; scale-in: instance 3 leaves "
        "(`runtime`: `admin prepare-leave`; `group`: SIGTERM, a clean close). Gaps are from the "
        "sink's LogAppendTime timestamps (the broker's append time) per partition (= per task); "
        "a phase runs from the event until 5 s after balance. Times in seconds.",
        "",
        "| mode | balanced after scale-out | balanced after scale-in | longest gap, scale-out "
        "(task) | longest gap, scale-in (task) | baseline gap | restored as active (blocking) | "
        "hand-overs | counts exact |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for mode, run in result["runs"].items():
        if "error" in run:
            lines.append(f"| {mode} | failed: {run['error']} |||||||")
            continue
        tasks = run["tasks"]
        out = max(tasks, key=lambda t: tasks[t]["gap_scale_out_s"])
        inn = max(tasks, key=lambda t: tasks[t]["gap_scale_in_s"])
        base = max(t["gap_baseline_s"] for t in tasks.values())
        inst = run["instances"]
        restored = run["restored_after_start"]
        handovers = sum(i["handovers_taken"] or 0 for i in inst.values())
        lines.append(
            f"| `{mode}` | {run['time_to_balance_out_s']} | {run['time_to_balance_in_s']} | "
            f"{tasks[out]['gap_scale_out_s']:.2f} ({out}) | {tasks[inn]['gap_scale_in_s']:.2f} "
            f"({inn}) | {base:.2f} | {restored:,} | {handovers if mode == 'runtime' else '-'} | "
            f"{run['counts_exact']} |"
        )
    lines += [
        "",
        "Restored as active: changelog records replayed by any instance while the task waited "
        "to run, after instance 1's initial restore of the whole store (not counted). A learner's "
        "restore (runtime mode) is not in it: the task runs on its owner meanwhile. Hand-overs: "
        "taken by any instance (runtime mode).",
        "",
    ]
    for mode, run in result["runs"].items():
        if "error" in run:
            continue
        lines += [
            f"## `{mode}` per task",
            "",
            f"Instance 1 restored the store in {run['initial_restore_s']} s. Events (s from the "
            f"scale-out): {run['events_from_scale_out_s']}.",
            "",
            "| task | gap before | gap scale-out (at) | gap scale-in (at) | owners over time | "
            "restored as active | learner position reached |",
            "|---|---:|---:|---:|---|---|---|",
        ]
        for task, row in run["tasks"].items():
            lines.append(
                f"| {task} | {row['gap_baseline_s']:.2f} | {row['gap_scale_out_s']:.2f} "
                f"({row['gap_scale_out_at_s']:+.1f}) | {row['gap_scale_in_s']:.2f} "
                f"({row['gap_scale_in_at_s']:+.1f}) | {' -> '.join(row['owners'])} | "
                f"{row['restored_as_active']} | {row['learned_up_to']} |"
            )
        lines += [
            "",
            f"Instances: {run['instances']}",
            "",
        ]
    lines.append(f"Session {result['session_s']} s. Plot: `{result['name']}.png`.")
    lines.append("")
    return "\n".join(lines)


def plot(result: dict[str, Any], path: str) -> bool:
    plt = pyplot()
    if plt is None:
        return False
    runs = [r for r in result["runs"].values() if "error" not in r]
    if not runs:
        return False
    fig, axes = plt.subplots(len(runs), 1, figsize=(11, 3.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        rates = run["rates"]
        origin = run["events_wall"]["scale_out"]
        x0 = rates["start_wall"] - origin
        for task, series in rates["per_task"].items():
            xs = [x0 + i * rates["bin_s"] for i in range(len(series))]
            ax.plot(xs, series, linewidth=0.9, label=task)
        marks = {
            "scale_out": ("scale-out (i2, i3 start)", "tab:red"),
            "balanced_out": ("balanced", "tab:green"),
            "scale_in": ("scale-in (i3 leaves)", "tab:purple"),
            "balanced_in": ("balanced", "tab:olive"),
        }
        for key, (label, color) in marks.items():
            ax.axvline(run["events_wall"][key] - origin, color=color, linestyle="--", label=label)
        ax.set_title(f"task.assignment={run['mode']}: output records/s per task")
        ax.set_xlabel("seconds from the scale-out (sink LogAppendTime, 0.5 s bins)")
        ax.set_ylabel("records/s")
        ax.legend(fontsize=7, ncol=2, loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    paths = []
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
    paths.append(json_path)
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write(markdown(result))
    paths.append(md_path)
    png_path = os.path.join(out_dir, f"{name}.png")
    with contextlib.suppress(Exception):
        if plot(result, png_path):
            paths.append(png_path)
    return paths
