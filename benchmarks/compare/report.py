"""Summaries, JSON, markdown and PNG plots of a comparison session.

``summarize(result)``: one row per (workload, model, threads) with median,
min and max of every figure over the counted runs (not discarded, correct),
and the runtime/baseline ratio at equal thread count (medians, and paired per
repeat). ``write`` puts ``<name>.json``, ``<name>.md`` and
``<name>-<workload>.png`` (if matplotlib imports) into the output directory.
"""

from __future__ import annotations

import math
import os
import statistics
from typing import Any

from benchmarks.report import pyplot, write_files

FIGURES = {
    "records_per_s": "records/s",
    "records_per_s_first_to_last": "records/s from the first to the last output record",
    "first_output_s": "go to first output record s",
    "records_per_s_processed": "records/s processed (no output wait)",
    "cpu_s_per_million": "CPU s per million records",
    "peak_rss_mb": "peak RSS MB",
    "connections_at_ready": "broker connections",
    "connections_max": "broker connections (max)",
    "join_s": "start to stable assignment s",
    "restore_s": "restore s",
    "p50_ms": "p50 latency ms",
    "p99_ms": "p99 latency ms",
    "cpu_s": "CPU s in window",
    "processed_all_s": "go to all processed s",
    "cold_done_s": "go to cold partitions' output complete s (skew)",
}


def _stats(values: list[float]) -> dict[str, float]:
    finite = [v for v in values if v is not None and v == v and not math.isinf(v)]
    if not finite:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {
        "median": statistics.median(finite),
        "min": min(finite),
        "max": max(finite),
        "n": len(finite),
    }


def _figure(run: dict[str, Any], key: str) -> float | None:
    if key == "cold_done_s":
        value = (run.get("group_done_s") or {}).get("1")
        return float(value) if isinstance(value, int | float) else None
    value = (run.get("latency") or {}).get(key) if key in ("p50_ms", "p99_ms") else run.get(key)
    return float(value) if isinstance(value, int | float) else None


def counted(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in runs if not r.get("discarded") and r.get("correct") and "error" not in r]


# The measured side of every suite; every other model is a reference it is compared with.
MEASURED_MODELS = ("runtime", "keypar")


def failed_runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Runs that count against the session: not discarded, and failed or incomplete."""
    return [
        r
        for r in result.get("runs", [])
        if not r.get("discarded") and ("error" in r or not r.get("correct"))
    ]


def failure_lines(result: dict[str, Any]) -> list[str]:
    """One line per failed run: which side (the runtime, or the reference it is compared
    with), where, and the first line of why."""
    lines = []
    for run in failed_runs(result):
        model = run.get("model", "?")
        side = "measured side" if model in MEASURED_MODELS else "reference side"
        error = str(run.get("error") or "output incomplete").strip()
        first = error.splitlines()[0] if error else "?"
        lines.append(
            f"{model} ({side}) failed: {run.get('workload', '?')} t={run.get('threads', '?')} "
            f"r{run.get('repeat', '?')}: {first[:300]}"
        )
    return lines


def no_verdict_reason(result: dict[str, Any]) -> str | None:
    """Why the session gives no verdict (None: it may give them).

    A ratio against a side that failed is no measurement: the median of the
    runs that did finish (or none at all) once read "met everywhere" while
    every baseline run had failed (issue 32). Any failed run, on either side,
    or an interrupted session withholds every verdict.
    """
    partial = result.get("partial")
    failed = failed_runs(result)
    reasons = []
    if partial:
        reasons.append(f"the session was interrupted ({partial.get('reason', 'partial')})")
    if failed:
        models = sorted({str(r.get("model")) for r in failed})
        reasons.append(f"{len(failed)} run(s) failed ({', '.join(models)}; listed above)")
    return "; ".join(reasons) if reasons else None


def exit_code(result: dict[str, Any]) -> int:
    """130 for an interrupted session, 1 if any counted run failed, else 0."""
    from benchmarks.interrupt import EXIT_INTERRUPTED

    if result.get("partial"):
        return EXIT_INTERRUPTED
    return 1 if failed_runs(result) else 0


def status_lines(result: dict[str, Any]) -> list[str]:
    """The markdown block at the top of a report that failed or was interrupted: what
    happened, before any figure (empty when all went well)."""
    lines: list[str] = []
    partial = result.get("partial")
    if partial:
        lines += [
            "**PARTIAL RESULTS: "
            + str(partial.get("reason", "interrupted"))
            + f" during {partial.get('during') or 'the set-up'}, after "
            f"{partial.get('runs_done', 0)} run(s).** The figures below are those of the "
            "runs that finished; no verdict.",
            "",
        ]
    failures = failure_lines(result)
    if failures:
        lines += [
            "**FAILED: no verdict.** A ratio needs both sides; these runs failed:",
            "",
            *(f"- {line}" for line in failures),
            "",
        ]
    return lines


def summarize(result: dict[str, Any]) -> list[dict[str, Any]]:
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for run in result["runs"]:
        if run.get("discarded"):
            continue
        groups.setdefault((run["workload"], run["model"], run["threads"]), []).append(run)
    rows: list[dict[str, Any]] = []
    for (workload, model, threads), group in groups.items():
        good = counted(group)
        row: dict[str, Any] = {
            "workload": workload,
            "model": model,
            "threads": threads,
            "runs_ok": len(good),
            "runs_failed": len(group) - len(good),
            "errors": [str(r.get("error", ""))[:300] for r in group if r not in good],
        }
        for key in FIGURES:
            row[key] = _stats([v for v in (_figure(r, key) for r in good) if v is not None])
        row["noisy_runs"] = sum(1 for r in good if r.get("noisy"))
        rows.append(row)
    by_key = {(r["workload"], r["model"], r["threads"]): r for r in rows}
    for row in rows:
        if row["model"] != "runtime":
            continue
        base = by_key.get((row["workload"], "baseline", row["threads"]))
        if base is None:
            continue
        rt, bl = row["records_per_s"], base["records_per_s"]
        row["ratio_to_baseline"] = (
            rt["median"] / bl["median"] if rt["n"] and bl["n"] and bl["median"] > 0 else None
        )
        paired = []
        base_by_repeat = {
            r["repeat"]: r["records_per_s"]
            for r in counted(result["runs"])
            if r["workload"] == row["workload"]
            and r["model"] == "baseline"
            and r["threads"] == row["threads"]
        }
        for r in counted(result["runs"]):
            if (
                r["workload"] == row["workload"]
                and r["model"] == "runtime"
                and r["threads"] == row["threads"]
                and base_by_repeat.get(r["repeat"])
            ):
                paired.append(r["records_per_s"] / base_by_repeat[r["repeat"]])
        row["paired_ratio"] = _stats(paired)
    order = {"stateless": 0, "stateful": 1, "io": 2, "skew": 3, "restore": 4}
    rows.sort(key=lambda r: (order.get(r["workload"], 9), r["threads"], r["model"] != "runtime"))
    return rows


# -- formatting -----------------------------------------------------------------------


def _med(s: dict[str, float] | None, digits: int = 0) -> str:
    if not s or not s.get("n") or s["median"] != s["median"]:
        return "n/a"
    return f"{s['median']:,.{digits}f}"


def _range(s: dict[str, float] | None, digits: int = 0) -> str:
    if not s or not s.get("n") or s["median"] != s["median"]:
        return "n/a"
    if s["n"] == 1 or s["min"] == s["max"]:
        return f"{s['median']:,.{digits}f}"
    return f"{s['median']:,.{digits}f} ({s['min']:,.{digits}f}-{s['max']:,.{digits}f})"


def _ratio(x: float | None) -> str:
    if x is None or x != x:
        return "n/a"
    if math.isinf(x):
        return "no baseline progress"
    return f"{x:.2f}x"


def _ratio_of(a: dict[str, float], b: dict[str, float]) -> float | None:
    if not a.get("n") or not b.get("n"):
        return None
    if b["median"] == 0:
        return float("inf") if a["median"] > 0 else None
    return float(a["median"] / b["median"])


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    rows = result.get("summary") or summarize(result)
    by_key = {(r["workload"], r["model"], r["threads"]): r for r in rows}
    lines = [
        "# Runtime (shared clients) vs thread-per-client baseline",
        "",
        f"`{result['command']}`: {result['repeats']} repeat(s) per workload, thread counts "
        f"{', '.join(map(str, result['threads']))}, models alternated within each pair; one "
        f"broker ({result.get('machine', {}).get('broker', 'tansu')}) per workload; every run in a fresh process on identical input. Config "
        f"for both models: `{', '.join(f'{k}={v}' for k, v in result['config'].items())}` "
        f"(everything else the runtime's defaults); baseline restoration: "
        f"{result.get('baseline_restore', 'blocking')}. Suite time "
        f"{result.get('suite_s', 0) / 60:.1f} min.",
        "",
        f"Machine: nproc={m.get('nproc')}, {m.get('cpu', '?')}, Python {m.get('python')}, "
        f"confluent-kafka {m.get('confluent_kafka')} / librdkafka {m.get('librdkafka')}, "
        f"broker {m.get('broker', 'tansu')} on the same machine; git {m.get('git_head', '?')}; "
        f"{m.get('date')}.",
        "",
        "## Summary at equal thread count",
        "",
        "records/s: medians; ratio = runtime / baseline. Connections: ESTABLISHED TCP "
        "connections of the process to the broker. Restore workload: records/s is the "
        "processing rate of the other tasks while task 0_0 restores, latency that of the "
        "records fed meanwhile.",
        "",
        "| workload | threads | runtime rec/s | baseline rec/s | ratio | conns rt / bl | "
        "peak RSS MB rt / bl | p99 ms rt / bl |",
        "|---|---|---|---|---|---|---|---|",
    ]
    status = status_lines(result)
    if status:
        at = lines.index("## Summary at equal thread count")
        lines[at:at] = status
    for wl_name in result["workloads"]:
        for n in result["threads"]:
            rt = by_key.get((wl_name, "runtime", n))
            bl = by_key.get((wl_name, "baseline", n))
            if rt is None and bl is None:
                continue
            lines.append(
                f"| {wl_name} | {n} | {_med(rt and rt['records_per_s'])} | "
                f"{_med(bl and bl['records_per_s'])} | "
                f"{_ratio(_ratio_of(rt['records_per_s'], bl['records_per_s']) if rt and bl else None)} | "
                f"{_med(rt and rt['connections_at_ready'])} / {_med(bl and bl['connections_at_ready'])} | "
                f"{_med(rt and rt['peak_rss_mb'])} / {_med(bl and bl['peak_rss_mb'])} | "
                f"{_med(rt and rt['p99_ms'])} / {_med(bl and bl['p99_ms'])} |"
            )
    if "keypar" in result.get("models", ()):
        lines += ["", *_key_parallel(result, by_key)]
    lines += ["", "## Targets", ""] + _verdicts(result, by_key)
    lines += ["", "### Why a target is missed", ""] + _WHY
    for wl_name, wl in result["workloads"].items():
        lines += ["", f"## {wl_name}: {wl['title']}", "", wl["description"] + "."]
        if wl.get("restore_records"):
            lines.append(
                f"Task 0_0 restores {wl['restore_records']:,} changelog records; records arrive "
                f"at {wl['feed_rate']:,.0f}/s for partitions 1-7 from `go` until 1 s after the "
                "restore ended (the rate bounds the records/s column)."
            )
        else:
            lines.append(backlog_line(wl))
        floor = wl.get("latency_floor")
        if floor:
            lines.append(
                f"Latency floor of the measuring path alone (feeder -> broker -> reader, no "
                f"model, same rate): p50 {floor['p50_ms']:.1f} ms, p99 {floor['p99_ms']:.1f} ms."
            )
        lines += [
            "",
            "| model | threads | records/s median (min-max) | processed/s | CPU s / M records | "
            "peak RSS MB | conns ready (max) | p50 ms | p99 ms | start to stable s |"
            + (" restore s |" if wl.get("restore_records") else "")
            + " runs ok |",
            "|---|---|---|---|---|---|---|---|---|---|"
            + ("---|" if wl.get("restore_records") else "")
            + "---|",
        ]
        for row in [r for r in rows if r["workload"] == wl_name]:
            lines.append(
                f"| {row['model']} | {row['threads']} | {_range(row['records_per_s'])} | "
                f"{_med(row['records_per_s_processed'])} | "
                f"{_med(row['cpu_s_per_million'], 1) if not wl.get('restore_records') else 'n/a'} | "
                f"{_range(row['peak_rss_mb'])} | {_med(row['connections_at_ready'])} "
                f"({_med(row['connections_max'])}) | {_range(row['p50_ms'])} | "
                f"{_range(row['p99_ms'])} | {_med(row['join_s'], 1)} |"
                + (f" {_range(row['restore_s'], 2)} |" if wl.get("restore_records") else "")
                + f" {row['runs_ok']}/{row['runs_ok'] + row['runs_failed']}"
                + (f" ({row['noisy_runs']} noisy)" if row["noisy_runs"] else "")
                + " |"
            )
        for row in [r for r in rows if r["workload"] == wl_name and r["runs_failed"]]:
            for error in row["errors"]:
                first = error.strip().splitlines()[0] if error.strip() else "?"
                lines.append(f"- FAILED {row['model']} t={row['threads']}: {first[:300]}")
    lines += ["", "## How it is measured", "", *_method(result), ""]
    return "\n".join(lines)


def _key_parallel(result: dict[str, Any], by_key: dict[tuple[str, str, int], Any]) -> list[str]:
    """Model keypar (num.threads.per.task) against the runtime's default mode,
    and the issue's three key-parallel targets where the runs are there."""
    per_task = result.get("threads_per_task") or "the thread count"
    lines = [
        "## Key-parallel mode",
        "",
        f"keypar: the runtime with `num.threads.per.task` = {per_task}; runtime: the "
        "default (one thread per task). records/s medians, same session.",
        "",
        "| workload | threads | keypar rec/s | runtime rec/s | keypar / runtime |",
        "|---|---|---|---|---|",
    ]
    for wl in result["workloads"]:
        for n in result["threads"]:
            kp, rt = by_key.get((wl, "keypar", n)), by_key.get((wl, "runtime", n))
            if kp is None:
                continue
            ratio = _ratio_of(kp["records_per_s"], rt["records_per_s"]) if rt else None
            lines.append(
                f"| {wl} | {n} | {_med(kp['records_per_s'])} | "
                f"{_med(rt and rt['records_per_s'])} | {_ratio(ratio)} |"
            )
    lines += ["", "Targets (issue 14):", ""]
    threads = result["threads"]
    io1_base = by_key.get(("io1", "keypar", 1)) or by_key.get(("io1", "runtime", 1))
    if io1_base is not None:
        base = io1_base["records_per_s"]["median"]
        for n in threads:
            kp = by_key.get(("io1", "keypar", n))
            if kp is None or n == 1 or not base:
                continue
            scale = kp["records_per_s"]["median"] / (base * n)
            verdict = "met" if n != 8 or scale >= 0.8 else "missed"
            lines.append(
                f"- io1 (one partition) at {n} threads: {scale:.2f} x linear"
                + (f" (target >= 0.8 at 8: {verdict})" if n == 8 else "")
            )
    kp4, rt4 = by_key.get(("skew", "keypar", 4)), by_key.get(("skew", "runtime", 4))
    if kp4 and rt4:
        ratio = _ratio_of(kp4["records_per_s"], rt4["records_per_s"])
        met = ratio is not None and ratio >= 2.0
        lines.append(
            f"- skew at 4 threads: keypar / runtime = {_ratio(ratio)} "
            f"(target >= 2: {'met' if met else 'missed'})"
        )
    for n in threads:
        kp, rt = by_key.get(("stateless", "keypar", n)), by_key.get(("stateless", "runtime", n))
        if kp and rt:
            ratio = _ratio_of(kp["records_per_s"], rt["records_per_s"])
            met = ratio is not None and ratio >= 0.9
            lines.append(
                f"- stateless (CPU-bound) at {n} threads: keypar / runtime = {_ratio(ratio)} "
                f"(target >= 0.90: {'met' if met else 'missed'})"
            )
    return lines


def _verdicts(result: dict[str, Any], by_key: dict[tuple[str, str, int], Any]) -> list[str]:
    withheld = no_verdict_reason(result)
    if withheld:
        return [f"- No verdict: {withheld}."]
    out = []
    threads = result["threads"]

    def ratio(wl: str, n: int) -> float | None:
        rt, bl = by_key.get((wl, "runtime", n)), by_key.get((wl, "baseline", n))
        if rt is None or bl is None:
            return None
        return _ratio_of(rt["records_per_s"], bl["records_per_s"])

    misses, compared = [], 0
    for wl in result["workloads"]:
        for n in threads:
            r = ratio(wl, n)
            if r is not None:
                compared += 1
            if r is not None and r < 0.97:
                misses.append(f"{wl} t={n} ({r:.2f}x)")
    if compared:
        out.append(
            "- Throughput, runtime >= baseline at equal threads on every workload (>= 0.97x "
            "counted as matching): "
            + ("met everywhere." if not misses else "missed at " + ", ".join(misses) + ".")
        )
    else:
        out.append("- Throughput, runtime >= baseline: no verdict (no thread count ran both).")
    conn = []
    for n in threads:
        rts = [
            by_key[(w, "runtime", n)]["connections_at_ready"]["median"]
            for w in result["workloads"]
            if (w, "runtime", n) in by_key
        ]
        bls = [
            by_key[(w, "baseline", n)]["connections_at_ready"]["median"]
            for w in result["workloads"]
            if (w, "baseline", n) in by_key
        ]
        if rts and bls:
            conn.append(f"t={n}: {_fmt_set(rts)} vs {_fmt_set(bls)}")
    out.append("- Broker connections, runtime vs baseline: " + "; ".join(conn) + ".")
    mem = []
    for n in threads:
        if n < 4:
            continue
        for wl in result["workloads"]:
            rt, bl = by_key.get((wl, "runtime", n)), by_key.get((wl, "baseline", n))
            if rt and bl and rt["peak_rss_mb"]["n"] and bl["peak_rss_mb"]["n"]:
                mem.append((wl, n, rt["peak_rss_mb"]["median"], bl["peak_rss_mb"]["median"]))
    if mem:
        lost = [f"{w} t={n} ({a:.0f} vs {b:.0f} MB)" for w, n, a, b in mem if a >= b]
        out.append(
            "- Less memory from 4 threads up: "
            + ("met everywhere." if not lost else "missed at " + ", ".join(lost) + ".")
        )
    for wl in ("skew", "restore"):
        if wl in result["workloads"]:
            parts = [f"t={n}: {_ratio(ratio(wl, n))}" for n in threads]
            out.append(f"- {wl}: runtime/baseline >= 2x? " + ", ".join(parts) + ".")
    if "skew" in result["workloads"]:
        parts = []
        for n in threads:
            rt, bl = by_key.get(("skew", "runtime", n)), by_key.get(("skew", "baseline", n))
            if rt and bl and rt["cold_done_s"]["n"] and bl["cold_done_s"]["n"]:
                a, b = rt["cold_done_s"]["median"], bl["cold_done_s"]["median"]
                parts.append(f"t={n}: {a:.2f} s vs {b:.2f} s ({b / a:.1f}x sooner)")
        if parts:
            out.append(
                "- skew, the 20% of records on the 7 cold partitions: all their output seen "
                "after (runtime vs baseline) " + "; ".join(parts) + "."
            )
    if "io" in result["workloads"] and (("io", "runtime", threads[0]) in by_key):
        base = by_key[("io", "runtime", threads[0])]["records_per_s"]["median"]
        parts = []
        for n in threads:
            row = by_key.get(("io", "runtime", n))
            if row and base == base and base > 0:
                speedup = row["records_per_s"]["median"] / base
                parts.append(
                    f"t={n}: {speedup:.2f}x ({speedup / (n / threads[0]) * 100:.0f}% of linear)"
                )
        out.append(
            f"- I/O-bound scaling of the runtime against t={threads[0]}: " + ", ".join(parts) + "."
        )
    return out


# Reasons that hold for every run of this suite on this machine class; the
# verdicts above say where they bite.
_WHY = [
    "- **Throughput at 1 thread (CPU-bound workloads).** The runtime runs a polling thread "
    "beside its processing thread; the baseline's single stream thread does both jobs. Two "
    "Python threads contending for the GIL on the same work cost more CPU (stateless, 1 "
    "thread: 1.14x the baseline's CPU seconds per million records in the committed run). From "
    "2 threads up both "
    "models contend, and the runtime's fewer clients and threads win it back.",
    "- **Connections: 5, not 3.** librdkafka opens a bootstrap connection and, for the group "
    "consumer, a separate group-coordinator connection besides the broker connection; the "
    "restore consumer holds one while idle. On a B-broker cluster both columns scale by up "
    "to B; the runtime's stays constant in threads, the baseline's grows 5 per thread.",
    "- **Skew 2x.** Records of one partition are processed in order by one thread at a time "
    "(rule 1), so the hot partition (80% of the records) bounds both models: the best "
    "possible throughput ratio is 1.11x at 2 threads, 1.04x at 4, 1.00x at 1 and 8. Dynamic "
    "scheduling shows in when the cold partitions' records are through (the line above); "
    "lifting the hot partition's bound needs key-parallel processing inside a task "
    "(`num.threads.per.task`: model keypar, its own section when it ran).",
    "- **Restore 2x.** The runtime keeps up with the offered rate at every thread count while "
    "the restore runs; the baseline falls behind only where a thread that restores also owns "
    "processing tasks (1 thread: everything stops; 2: half; 4: a quarter; 8: none), so the "
    "ratio is unbounded at 1 thread and 1.00x at 8. The offered rate caps the runtime's "
    "figure; the p99 latency of records fed during the restore shows the same.",
]


def backlog_line(wl: dict[str, Any]) -> str:
    """The sentence under a workload's heading: its backlog, its output check, its
    latency phase (the timed workloads, join and session, have none)."""
    inputs = wl.get("inputs", 1)
    line = (
        f"Backlog {wl['backlog']:,} records"
        + (" (both input topics together)" if inputs > 1 else "")
        + f" (per partition {wl['backlog_per_partition']}"
        + (", both topics" if inputs > 1 else "")
        + ")"
    )
    if wl.get("output_target") is not None:
        line += f"; complete at {wl['output_target']:,} output records"
    if wl.get("feed_seconds"):
        line += f"; latency phase {wl['feed_rate']:,.0f} records/s for {wl['feed_seconds']:g} s."
    else:
        line += "; no latency phase (throughput only)."
    return line


def _fmt_set(values: list[float]) -> str:
    unique = sorted({int(v) for v in values if v == v})
    return "/".join(str(v) for v in unique) if unique else "n/a"


def _method(result: dict[str, Any]) -> list[str]:
    return [
        "- Each run: fresh input topic loaded with the workload's records (same bytes, same "
        "partitions every run), fresh output topic and application.id; the child joins the "
        "group and buffers input but processes nothing until its assignment is complete, "
        "balanced and unchanged for 0.5 s ('start to stable' column); then `go`.",
        "- records/s = backlog / (time the harness's reader has seen the whole backlog's output "
        "- go). The reader consumes the output topic from the harness process "
        "(fetch.wait.max.ms=2, consume() every 2 ms); for the count workloads the output is folded per key per "
        "commit, so completion is when the latest counts add up to the input, which waits for "
        "the next commit (commit.interval.ms=1000, both models).",
        "- CPU s / M records: the child's user+system CPU (all threads, librdkafka's included) "
        "from /proc over the same window. Peak RSS: the child's VmHWM at the end of the run "
        "(start-up included). Connections: the child's ESTABLISHED TCP sockets to the broker "
        "port (/proc/<pid>/net/tcp matched with /proc/<pid>/fd) when it reported ready; "
        "(max) is the maximum of samples every 0.25 s.",
        "- Latency: after the backlog, a feeder in the harness produces records at a fixed "
        "rate, each stamped with the wall clock at produce time; latency = the reader's wall "
        "clock when it receives the output record - that timestamp (outputs keep the input "
        "timestamp). It includes the feeder's produce path (linger.ms=0), the model, the "
        "producer's acknowledgement path and the reader's fetch; the per-workload 'latency "
        "floor' is that path without a model. For count workloads one output per "
        "key per commit is sampled (cached writes are folded), so latency there is dominated "
        "by the commit interval.",
        "- Noise: before each run the harness waits for other processes to use < 0.25 cores; "
        "a run during which they used more is run again once and marked noisy if it stays so.",
    ]


# -- files -------------------------------------------------------------------------------


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    if "summary" not in result:
        result["summary"] = summarize(result)
    return write_files(out_dir, name, result, markdown, lambda: plot(out_dir, name, result))


def plot(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    plt = pyplot()
    if plt is None:
        return []
    rows = result.get("summary") or summarize(result)
    colors = {"runtime": "#3b75af", "baseline": "#d9822b"}
    panels = [
        ("records_per_s", "records/s (median, min-max)"),
        ("p99_ms", "p99 latency ms"),
        ("peak_rss_mb", "peak RSS MB"),
        ("connections_at_ready", "broker connections"),
    ]
    paths = []
    for wl_name, wl in result["workloads"].items():
        wl_rows = [r for r in rows if r["workload"] == wl_name]
        if not wl_rows:
            continue
        fig, axes = plt.subplots(1, 4, figsize=(16, 3.8))
        for ax, (key, label) in zip(axes, panels, strict=True):
            for model in ("runtime", "baseline"):
                pts = sorted(
                    (r["threads"], r[key]) for r in wl_rows if r["model"] == model and r[key]["n"]
                )
                if not pts:
                    continue
                xs = [p[0] for p in pts]
                med = [p[1]["median"] for p in pts]
                lo = [p[1]["median"] - p[1]["min"] for p in pts]
                hi = [p[1]["max"] - p[1]["median"] for p in pts]
                ax.errorbar(
                    xs, med, yerr=[lo, hi], marker="o", capsize=3, label=model, color=colors[model]
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(result["threads"])
            ax.set_xticklabels([str(t) for t in result["threads"]])
            ax.set_xlabel("threads")
            ax.set_title(label, fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        axes[0].legend()
        fig.suptitle(f"{wl_name}: {wl['title']}")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{name}-{wl_name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths
