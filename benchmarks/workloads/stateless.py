"""Workload "stateless": a JSON map_values over N records of about 100 bytes.

The question it answers (the core issue): how close does the runtime come to a
raw confluent-kafka consume-then-produce loop on the same data, in the same
session? Target: at least 0.7x the raw loop's records/s.

Session: one broker (``--broker``, Kafka by default), one input topic (``--partitions``, default 8) loaded
once with ``--records`` JSON values (string keys), then ``--repeats`` rounds of
[raw loop, runtime with each ``--threads`` count], each run writing to its own
fresh output topic with its own consumer group / ``application.id``.

The runtime's figure for the ratio is records/s from the first processed record
to the producer having acknowledged everything (the consumer-group join, about
``session.timeout.ms / 2`` on Tansu, is reported separately); the whole-run
figure from ``app.start()`` is shown too.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
import uuid
from typing import Any

from benchmarks import interrupt, report
from benchmarks.child import OtherLoad, cpu_seconds, usage, usage_since
from benchmarks.harness import (
    BenchSession,
    add_broker_argument,
    count_records,
    load_records,
    machine_info,
    run_child,
    summarize,
    wait_for_quiet,
)
from benchmarks.outputs import add_output_arguments, output_dir
from runtime.gc_tuning import tune_for_app_process
from runtime.topology.serdes import JSON as _JSON

NAME = "stateless"
TARGET_RATIO = 0.7
NOISY_OTHER_CORES = 0.15

_ACTIONS = ("view", "click", "cart", "buy")


# -- data and transform (shared by the raw loop and the runtime) ---------------------


def make_record(i: int) -> tuple[bytes, bytes]:
    """The i-th input record: a string key and a JSON value of about 100 bytes."""
    key = f"user-{(i * 7919) % 100_000:05d}"
    value = {
        "id": i,
        "user": key,
        "action": _ACTIONS[i % 4],
        "amount": (i * 37) % 10_000 / 100,
        "ts": 1_700_000_000_000 + i,
        "note": "x" * (12 + i % 8),
    }
    return key.encode(), json.dumps(value, separators=(",", ":")).encode()


def enrich(value: dict[str, Any]) -> dict[str, Any]:
    """The map function: add one field."""
    value["seen"] = True
    return value


def raw_transform(data: bytes) -> bytes:
    """The raw loop's per-record work: the runtime's JSON serde, enrich, the serde again
    (the same per-record work as the runtime's topology, so the ratio measures the rest)."""
    return _JSON.serialize(enrich(_JSON.deserialize(data)))  # type: ignore[return-value]


# -- the runtime run (in a child process) -------------------------------------------


def build_topology(input_topic: str, output_topic: str) -> Any:
    from runtime import StreamsBuilder, serdes

    builder = StreamsBuilder()
    (
        builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.JSON)
        .map_values(enrich)
        .to(output_topic, value_serde=serdes.JSON)
    )
    return builder.build()


def _unacknowledged(app: Any) -> int | None:
    """Records the runtime's producer has not had acknowledged yet, if we can see it.

    ``status()`` does not report this (yet), so this reads the polling thread's
    producer: ``len(Producer)`` is librdkafka's ``rd_kafka_outq_len``, which is
    safe from any thread. None if the internals moved.
    """
    status_value = None
    polling = getattr(app, "_polling", None)
    producer = getattr(polling, "_producer", None)
    if producer is not None:
        try:
            status_value = len(producer)
        except Exception:  # noqa: BLE001
            status_value = None
    return status_value


def run_runtime(spec: dict[str, Any]) -> dict[str, Any]:
    """One App run: start, wait until every record is produced and acknowledged.

    Polls ``progress()`` every 20 ms (every 2 ms once all records are produced,
    to see the flush finish): the cheap running totals, not ``status()``, whose
    full snapshot at that rate cost the runtime several percent of its GIL time. Reports the join time (start -> first record
    consumed / processed) and records/s over the whole run and from the first
    processed record.
    """
    from runtime import App

    records = int(spec["records"])
    state_dir = tempfile.mkdtemp(prefix="bench-state-")
    config = {
        "application.id": spec["application_id"],
        "bootstrap.servers": spec["bootstrap"],
        "processing.threads": int(spec["threads"]),
        "commit.interval.ms": 1000,
        "consumer.session.timeout.ms": 6000,
        "state.dir": state_dir,
        **spec.get("extra_config", {}),
    }
    app = App(build_topology(spec["input_topic"], spec["output_topic"]), config)
    deadline_s = float(spec.get("deadline_s", 600))
    poll_s = 0.020

    first_consumed = first_processed = running_at = produced_at = flushed_at = None
    flush_seen = "producer_queue"
    commit_mark: tuple[Any, Any] = (None, None)
    commit_durations: list[float] = []
    commits_seen = 0
    other = OtherLoad(spec.get("broker_pid"))
    cpu0 = cpu_seconds()
    usage0 = usage()
    started = time.perf_counter()
    app.start()
    # The GC settings `streams-runtime run` gives the daemon once started
    # (runtime.gc_tuning), for every model alike: ratios stay like for like.
    tune_for_app_process()
    try:
        deadline = started + deadline_s
        while True:
            now = time.perf_counter()
            progress = app.progress()
            if progress.failure or progress.state in ("ERROR", "NOT_RUNNING"):
                raise RuntimeError(f"app stopped in state {progress.state}: {progress.failure}")
            if running_at is None and progress.state == "RUNNING":
                running_at = now
            if first_consumed is None and progress.consumed > 0:
                first_consumed = now
            if first_processed is None and progress.processed > 0:
                first_processed = now
                other.start()
            commits = progress.commits
            if commits != commits_seen:
                # The commit protocol stops processing while it flushes the
                # producer: the sum of these is time the pipeline stood still.
                duration = progress.last_commit_duration_s
                if first_processed is not None and duration is not None:
                    commit_durations.append(float(duration))
                commits_seen = commits
            if produced_at is None and progress.produced >= records:
                produced_at = now
                commit_mark = (progress.commits, progress.last_commit)
            if produced_at is not None:
                pending = _unacknowledged(app)
                if pending is None:
                    # Fall back to the next commit, which flushes the producer
                    # before it completes: an upper bound on the flush time.
                    flush_seen = "next_commit_upper_bound"
                    if (progress.commits, progress.last_commit) != commit_mark:
                        flushed_at = time.perf_counter()
                elif pending == 0:
                    flushed_at = time.perf_counter()
                if flushed_at is not None:
                    break
            if now > deadline:
                status = app.status()
                raise TimeoutError(
                    f"runtime: {status.produced} of {records} produced after "
                    f"{deadline_s:.0f} s (state {status.state}, "
                    f"processed {status.processed}, lag {status.total_lag})"
                )
            time.sleep(0.002 if produced_at is not None else poll_s)
        cpu = cpu_seconds() - cpu0
        window_usage = usage_since(usage0)
        other_cpu = other.stop()
        final = app.status()
    finally:
        close_started = time.perf_counter()
        closed = app.close(30)
        close_s = time.perf_counter() - close_started
        shutil.rmtree(state_dir, ignore_errors=True)

    assert first_processed is not None and flushed_at is not None
    total = flushed_at - started
    from_first = flushed_at - first_processed
    from_consumed = flushed_at - (first_consumed or first_processed)
    return {
        "records": records,
        "seconds": total,
        "seconds_from_first_record": from_first,
        "join_s": (running_at - started) if running_at else None,
        "first_consumed_s": (first_consumed - started) if first_consumed else None,
        "first_record_s": first_processed - started,
        "flush_s": flushed_at - (produced_at or flushed_at),
        "flush_seen_via": flush_seen,
        "records_per_s": records / total,
        "records_per_s_from_first_record": records / from_first,
        "records_per_s_from_first_consumed": records / from_consumed,
        "cpu_s": cpu,
        **window_usage,
        # Other processes' CPU seconds from the first processed record to the end (noise check).
        "other_cpu_window_s": other_cpu,
        "commits_in_window": len(commit_durations),
        "commit_seconds_in_window": sum(commit_durations),
        "commit_max_s": max(commit_durations, default=0.0),
        "processing_busy_s": sum(t.get("busy_seconds", 0.0) for t in (final.get("threads") or [])),
        "close_s": close_s,
        "closed_cleanly": bool(closed),
        "status_processed": final.get("processed"),
        "status_produced": final.get("produced"),
        "status_skipped": final.get("skipped"),
        "status_commits": final.get("commits"),
        "threads_status": final.get("threads"),
    }


# -- the session (parent process) -----------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--records", type=int, default=500_000, help="input records (default 500000)"
    )
    parser.add_argument(
        "--partitions",
        type=int,
        default=8,
        help="partitions of the input and output topics (default 8)",
    )
    parser.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="rounds of [raw loop, runtime per thread count] (default 3)",
    )
    parser.add_argument(
        "--threads", default="1,2", help="comma-separated processing.threads values (default 1,2)"
    )
    add_output_arguments(parser)
    parser.add_argument(
        "--tag",
        default="",
        help="suffix for the result files (stateless-TAG.json/.md), e.g. for a run with --set",
    )
    parser.add_argument(
        "--skip-runtime", action="store_true", help="raw loop only (debugging the harness)"
    )
    parser.add_argument(
        "--profile",
        action="store_true",
        help="after the measured runs, one extra runtime run under py-spy (not counted)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=120.0,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes on the machine to "
        "use < 0.15 cores (default 120; 0 disables). Runs measured while others were busy "
        "are flagged 'noisy' in the report",
    )
    parser.add_argument(
        "--redo-noisy",
        type=int,
        default=2,
        metavar="N",
        help="run a noisy run (others used > 0.15 cores during its timed window) again, up to N times "
        "(default 2); discarded runs stay in the JSON, marked 'discarded'",
    )
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra runtime config for the runtime runs (repeatable), e.g. "
        "--set buffered.records.per.partition=5000; recorded in the results",
    )
    parser.add_argument(
        "--profile-mode",
        choices=("gil", "busy", "wall"),
        default="gil",
        help="py-spy sampling: 'gil' samples only the thread holding the GIL (where the "
        "serialized Python time goes), 'busy' samples every non-idle thread, 'wall' every "
        "thread including waits (where each thread's time goes)",
    )
    parser.add_argument(
        "--runtime-retry-minutes",
        type=float,
        default=0.0,
        help="if a runtime run fails, retry it every 3 minutes for this long (runtime still in flux)",
    )
    add_broker_argument(parser)


def main(args: argparse.Namespace) -> int:
    threads = [int(t) for t in str(args.threads).split(",") if t.strip()]
    extra_config = parse_settings(args.settings)
    records, partitions = args.records, args.partitions
    out_dir = output_dir(args)
    result_name = f"{NAME}-{args.tag}" if args.tag else NAME
    log_dir = os.path.join(out_dir, "logs", result_name)
    os.makedirs(log_dir, exist_ok=True)
    session_id = uuid.uuid4().hex[:8]
    deadline_s = max(120.0, records / 2000.0)
    runs: list[dict[str, Any]] = []
    errors: list[str] = []

    print(
        f"[{NAME}] {records} records, {partitions} partitions, repeats {args.repeats}, "
        f"threads {threads}",
        flush=True,
    )
    # Set as the session goes; what an interrupt leaves is written as partial results.
    sizes: list[int] = []
    load_s = float("nan")
    profile_info = None
    partial: dict[str, Any] | None = None
    try:
        with BenchSession(log_dir, args.broker) as session:
            input_topic = f"bench-{NAME}-in-{session_id}"
            session.create_topic(input_topic, partitions)
            load_s = load_records(session.bootstrap, input_topic, records, make_record)
            loaded = count_records(session.bootstrap, input_topic, partitions, expected=records)
            if loaded.total != records:
                raise RuntimeError(f"input topic holds {loaded.total} records, expected {records}")
            sizes = [len(make_record(i)[1]) for i in range(0, records, max(1, records // 1000))]
            print(
                f"[{NAME}] loaded {records} records into {input_topic} in {load_s:.1f} s "
                f"(mean value {sum(sizes) / len(sizes):.0f} B; per partition "
                f"{sorted(loaded.per_partition.values())})",
                flush=True,
            )

            models = [("raw", 1)] + [("runtime", t) for t in ([] if args.skip_runtime else threads)]
            for repeat in range(1, args.repeats + 1):
                for model, n_threads in models:
                    for redo in range(args.redo_noisy + 1):
                        run = _one_run(
                            session,
                            model,
                            n_threads,
                            repeat,
                            input_topic,
                            partitions,
                            records,
                            deadline_s,
                            log_dir,
                            session_id,
                            args,
                            redo,
                        )
                        if interrupt.interrupted():
                            # Ended by the same Ctrl-C (the child got it too): not a result.
                            run["discarded"] = "interrupted"
                            runs.append(run)
                            raise KeyboardInterrupt
                        runs.append(run)
                        if run.get("noisy") and "error" not in run and redo < args.redo_noisy:
                            run["discarded"] = "noisy: other processes were busy; run again"
                            _print_run(run)
                            continue
                        if "error" in run:
                            errors.append(run["error"])
                        _print_run(run)
                        break

            profile_info = None
            if args.profile and not args.skip_runtime:
                from benchmarks import profile

                profile_info = profile.profile_runtime_run(
                    session,
                    input_topic,
                    partitions,
                    records,
                    threads[0],
                    deadline_s,
                    out_dir,
                    session_id,
                    mode=args.profile_mode,
                    extra_config=extra_config,
                    name=result_name,
                )
    except KeyboardInterrupt:
        # Ctrl-C (benchmarks/interrupt.py): the running child was killed by
        # subprocess.run and the broker stopped on the way out of the session.
        interrupt.mark()
        partial = {
            "reason": "interrupted (SIGINT)",
            "during": "the runs" if sizes else "the set-up",
            "runs_done": sum(1 for r in runs if not r.get("discarded")),
        }

    result = {
        "workload": NAME,
        "description": "stateless JSON map_values (json.loads -> add field -> json.dumps)",
        "records": records,
        "partitions": partitions,
        "repeats": args.repeats,
        "threads": threads,
        "tag": args.tag,
        "runtime_config_overrides": extra_config,
        "target_ratio": TARGET_RATIO,
        "ratio_basis": "runtime records/s from first processed record / raw loop records/s "
        "(first consume call to flush complete)",
        "value_bytes_mean": sum(sizes) / len(sizes) if sizes else float("nan"),
        "input_load_s": load_s,
        "machine": machine_info(args.broker),
        "runs": runs,
        "summary": summarize_runs(runs),
        "errors": errors,
        "profile": profile_info,
        "partial": partial,
    }
    paths = report.write(out_dir, result_name, result)
    print(f"[{NAME}] wrote {', '.join(paths)}", flush=True)
    with open(os.path.join(out_dir, f"{result_name}.md")) as f:
        print(f.read(), flush=True)
    if partial:
        print(f"[{NAME}] PARTIAL: interrupted; no verdict", flush=True)
        return interrupt.EXIT_INTERRUPTED
    return 1 if errors else 0


def parse_settings(settings: list[str]) -> dict[str, Any]:
    """``["a.b=1", "c=x"]`` -> ``{"a.b": 1, "c": "x"}`` (integers and true/false typed)."""
    out: dict[str, Any] = {}
    for item in settings:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SystemExit(f"--set expects KEY=VALUE, got {item!r}")
        text = value.strip()
        typed: Any = text
        if text.lstrip("-").isdigit():
            typed = int(text)
        elif text.lower() in ("true", "false"):
            typed = text.lower() == "true"
        out[key.strip()] = typed
    return out


def _one_run(
    session: BenchSession,
    model: str,
    n_threads: int,
    repeat: int,
    input_topic: str,
    partitions: int,
    records: int,
    deadline_s: float,
    log_dir: str,
    session_id: str,
    args: argparse.Namespace,
    redo: int = 0,
) -> dict[str, Any]:
    label = "raw" if model == "raw" else f"runtime-t{n_threads}"
    if redo:
        label += f"-redo{redo}"
    retry_until = time.monotonic() + 60 * getattr(args, "runtime_retry_minutes", 0.0)
    attempt = 0
    while True:
        attempt += 1
        output_topic = f"bench-{NAME}-out-{session_id}-{label}-r{repeat}-a{attempt}"
        session.create_topic(output_topic, partitions)
        spec = {
            "bootstrap": session.bootstrap,
            "input_topic": input_topic,
            "output_topic": output_topic,
            "partitions": partitions,
            "records": records,
            "deadline_s": deadline_s,
            "broker_pid": session.broker_pid,
        }
        log_path = os.path.join(log_dir, f"{label}-r{repeat}.log")
        run: dict[str, Any] = {
            "model": model,
            "threads": n_threads,
            "repeat": repeat,
            "output_topic": output_topic,
            "log": log_path,
        }
        if args.quiet_wait > 0:
            waited, busy = wait_for_quiet(session, args.quiet_wait)
            run["quiet_wait_s"] = round(waited, 1)
            run["other_cores_before"] = round(busy, 2)
        try:
            if model == "raw":
                spec.update(
                    transform="benchmarks.workloads.stateless:raw_transform",
                    group_id=f"bench-raw-{session_id}-r{repeat}",
                )
                run.update(run_child("raw_loop", spec, log_path, deadline_s + 60, session))
            else:
                spec.update(
                    threads=n_threads,
                    application_id=f"bench-{NAME}-{session_id}-{label}-r{repeat}-a{attempt}",
                    extra_config=parse_settings(args.settings),
                )
                run.update(run_child("runtime_stateless", spec, log_path, deadline_s + 90, session))
        except RuntimeError as exc:
            session.check_broker()
            session.delete_topic(output_topic)
            if model == "runtime" and time.monotonic() < retry_until:
                print(
                    f"[{NAME}] {label} r{repeat} failed (attempt {attempt}), retrying in 3 min:"
                    f"\n{exc}",
                    flush=True,
                )
                time.sleep(180)
                continue
            run["error"] = str(exc)
            return run
        break
    count = count_records(
        session.bootstrap,
        output_topic,
        partitions,
        expected=records,
        sample_every=max(1, records // 10),
    )
    run["output_count"] = count.total
    run["output_list_offsets_total"] = count.list_offsets_total
    run["output_per_partition"] = count.per_partition
    run["correct"] = count.total == records and _sample_ok(count.sample)
    if not run["correct"]:
        run["error"] = (
            f"{label} r{repeat}: output topic holds {count.total} records "
            f"(expected {records}); sample ok: {_sample_ok(count.sample)}"
        )
    run["broker_rss_mb_after"] = session.broker_rss_mb()
    # Another process used more than NOISY_OTHER_CORES of a core on average during
    # the timed window (from the first record for the runtime), or during the
    # child's whole life if the window figure is missing.
    window = run.get("seconds_from_first_record", 0.0)
    if run.get("other_cpu_window_s") is not None and window:
        run["other_cores_in_window"] = run["other_cpu_window_s"] / window
    else:
        run["other_cores_in_window"] = run.get("other_cpu_s", 0.0) / max(
            run.get("child_wall_s", 0.0), 1e-9
        )
    run["noisy"] = run["other_cores_in_window"] > NOISY_OTHER_CORES
    session.delete_topic(output_topic)
    return run


def _sample_ok(sample: list[bytes]) -> bool:
    try:
        return all(json.loads(v).get("seen") is True for v in sample)
    except ValueError:
        return False


def _print_run(run: dict[str, Any]) -> None:
    label = "raw" if run["model"] == "raw" else f"runtime t={run['threads']}"
    if run.get("discarded"):
        label += " (discarded)"
    if "records_per_s" not in run:
        print(f"  r{run['repeat']} {label:<24} FAILED: {run.get('error', '')[:2000]}", flush=True)
        return
    extra = ""
    if run["model"] == "runtime":
        extra = (
            f" join {run.get('join_s') or float('nan'):.2f}s first-record "
            f"{run['first_record_s']:.2f}s whole-run {run['records_per_s']:,.0f}/s "
            f"commits {run.get('commits_in_window', 0)}x={run.get('commit_seconds_in_window', 0):.2f}s "
            f"proc-busy {run.get('processing_busy_s', 0):.2f}s"
        )
    print(
        f"  r{run['repeat']} {label:<24} {run['records_per_s_from_first_record']:>10,.0f} rec/s "
        f"({run['seconds_from_first_record']:.2f}s) cpu {run['cpu_s']:.2f}s "
        f"rss {run['peak_rss_mb']:.0f}MB broker-cpu {run['broker_cpu_s']:.2f}s "
        f"others {run.get('other_cores_in_window', float('nan')):.2f} cores "
        f"out {run.get('output_count')} {'ok' if run.get('correct') else 'WRONG'}{extra}"
        f"{' NOISY' if run.get('noisy') else ''}",
        flush=True,
    )


def summarize_runs(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (model, threads): medians and ranges; the ratio to the raw loop."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in runs:
        if run.get("discarded"):
            continue
        groups.setdefault((run["model"], run["threads"]), []).append(run)
    ok = lambda rs: [r for r in rs if "records_per_s" in r and r.get("correct")]  # noqa: E731
    raw_runs = ok(groups.get(("raw", 1), []))
    raw = summarize([r["records_per_s"] for r in raw_runs])
    rows = []
    for (model, n_threads), group in sorted(
        groups.items(), key=lambda kv: (kv[0][0] != "raw", kv[0][1])
    ):
        good = ok(group)
        rate_key = "records_per_s" if model == "raw" else "records_per_s_from_first_record"
        rate = summarize([r[rate_key] for r in good])
        row: dict[str, Any] = {
            "model": model,
            "threads": n_threads,
            "runs_ok": len(good),
            "runs_failed": len(group) - len(good),
            "records_per_s": rate,
            "records_per_s_whole_run": summarize([r["records_per_s"] for r in good]),
            "cpu_s_per_million": summarize([r["cpu_s"] / r["records"] * 1e6 for r in good]),
            "broker_cpu_s_per_million": summarize(
                [r["broker_cpu_s"] / r["records"] * 1e6 for r in good]
            ),
            "peak_rss_mb": summarize([r["peak_rss_mb"] for r in good]),
            "ratio_to_raw": rate["median"] / raw["median"] if raw["n"] and rate["n"] else None,
        }
        if model == "runtime":
            row["join_s"] = summarize([r["join_s"] for r in good if r.get("join_s") is not None])
            row["first_record_s"] = summarize([r["first_record_s"] for r in good])
            row["flush_s"] = summarize([r["flush_s"] for r in good])
            row["commit_seconds_in_window"] = summarize(
                [r.get("commit_seconds_in_window", float("nan")) for r in good]
            )
            row["processing_busy_share"] = summarize(
                [
                    r.get("processing_busy_s", float("nan"))
                    / r["seconds_from_first_record"]
                    / max(1, r["threads"])
                    for r in good
                ]
            )
            row["ratio_whole_run_to_raw"] = (
                row["records_per_s_whole_run"]["median"] / raw["median"]
                if raw["n"] and good
                else None
            )
            consumed = summarize([r["records_per_s_from_first_consumed"] for r in good])
            row["records_per_s_from_first_consumed"] = consumed
            row["ratio_from_first_consumed_to_raw"] = (
                consumed["median"] / raw["median"] if raw["n"] and good else None
            )
            # Paired ratios: each runtime run against the raw run of the same round.
            raw_by_repeat = {r["repeat"]: r["records_per_s"] for r in raw_runs}
            paired = [
                r[rate_key] / raw_by_repeat[r["repeat"]]
                for r in good
                if r["repeat"] in raw_by_repeat
            ]
            row["paired_ratio"] = summarize(paired)
        rows.append(row)
    return rows
