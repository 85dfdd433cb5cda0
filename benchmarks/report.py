"""Reports: ``<out>/<workload>.json`` (everything), ``.md`` (the table), ``.png`` (optional).

The markdown table has one row per model x threads: records/s median (min-max),
the ratio to the raw loop, CPU seconds per million records, and the figures
that qualify them (whole-run records/s, group join time, peak RSS, broker CPU).
The PNG is drawn only if matplotlib imports. ``python -m benchmarks.report
RESULT.json`` re-renders both from a result file.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Iterable
from typing import Any


def write_files(
    out_dir: str,
    name: str,
    result: dict[str, Any],
    render: Callable[[dict[str, Any]], str],
    draw: Callable[[], list[str]],
) -> list[str]:
    """``<out>/<name>.json`` (everything) and ``.md`` (``render(result)``), then
    whatever ``draw()`` plots; the paths written. Shared by every benchmark's report."""
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, f"{name}.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=1, default=str)
        f.write("\n")
    md_path = os.path.join(out_dir, f"{name}.md")
    with open(md_path, "w") as f:
        f.write(render(result))
    return [json_path, md_path, *draw()]


def rerender(
    path: str,
    summarize: Callable[[dict[str, Any]], Any],
    write: Callable[[str, str, dict[str, Any]], list[str]],
) -> int:
    """``--report FILE.json``: the markdown and plots again from a result file; exit code."""
    with open(path) as f:
        result = json.load(f)
    result["summary"] = summarize(result)
    out_dir = os.path.dirname(path) or "."
    name = os.path.splitext(os.path.basename(path))[0]
    print("wrote " + ", ".join(write(out_dir, name, result)))
    return 0


def choose(csv: str, allowed: Iterable[str], what: str) -> list[str]:
    """The comma-separated names in ``csv``; SystemExit naming ``what`` on an unknown one."""
    known = list(allowed)
    names = [n.strip() for n in csv.split(",") if n.strip()]
    for n in names:
        if n not in known:
            raise SystemExit(f"unknown {what} {n!r}; choose from {', '.join(known)}")
    return names


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    def draw() -> list[str]:
        png = plot(out_dir, name, result)
        return [png] if png else []

    return write_files(out_dir, name, result, markdown, draw)


def _rate(s: dict[str, float] | None) -> str:
    if not s or not s.get("n"):
        return "n/a"
    if s["n"] == 1:
        return f"{s['median']:,.0f}"
    return f"{s['median']:,.0f} ({s['min']:,.0f}-{s['max']:,.0f})"


def _num(s: dict[str, float] | None, digits: int = 2) -> str:
    if not s or not s.get("n") or s["median"] != s["median"]:
        return "n/a"
    return f"{s['median']:.{digits}f}"


def _pct(s: dict[str, float] | None) -> str:
    if not s or not s.get("n") or s["median"] != s["median"]:
        return "n/a"
    return f"{s['median']:.0%}"


def _ratio(x: float | None) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.2f}x"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    lines = [
        f"# Benchmark: {result['workload']}",
        "",
        f"{result['description']}; {result['records']:,} records "
        f"(values ~{result.get('value_bytes_mean', 0):.0f} B, string keys) on "
        f"{result['partitions']} partitions; {result['repeats']} repeat(s), runs alternated "
        f"(raw, runtime per thread count) within one broker session.",
        "",
        f"Machine: nproc={m.get('nproc')}, {m.get('cpu', '?')}, Python {m.get('python')} "
        f"({m.get('implementation')}), confluent-kafka {m.get('confluent_kafka')} / librdkafka "
        f"{m.get('librdkafka')}, broker: {m.get('broker', 'tansu')} on the same machine; "
        f"git {m.get('git_head', '?')}; date {m.get('date')}.",
        "",
        (
            "Runtime config overrides: `"
            + ", ".join(f"{k}={v}" for k, v in result["runtime_config_overrides"].items())
            + "` (not the defaults)."
            if result.get("runtime_config_overrides")
            else "Runtime config: defaults, plus processing.threads as shown, "
            "commit.interval.ms=1000, consumer.session.timeout.ms=6000."
        ),
        "",
        "| model | threads | records/s median (min-max) | ratio to raw loop | "
        "CPU s per million records | whole-run records/s | group join s | peak RSS MB | "
        "broker CPU s per million |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in result["summary"]:
        is_raw = row["model"] == "raw"
        lines.append(
            "| {model} | {threads} | {rate} | {ratio} | {cpu} | {whole} | {join} | {rss} | {bcpu} |".format(
                model="raw confluent-kafka loop" if is_raw else "streams-runtime",
                threads="-" if is_raw else row["threads"],
                rate=_rate(row["records_per_s"]),
                ratio="1.00x (baseline)" if is_raw else _ratio(row.get("ratio_to_raw")),
                cpu=_num(row["cpu_s_per_million"]),
                whole=_rate(row["records_per_s_whole_run"]),
                join="-" if is_raw else _num(row.get("join_s")),
                rss=_num(row["peak_rss_mb"], 0),
                bcpu=_num(row["broker_cpu_s_per_million"]),
            )
        )
    lines += [
        "",
        f"**Ratio basis:** {result['ratio_basis']}. The runtime's records/s column is measured "
        "from the first processed record (status()['processed'] > 0) to the producer having "
        "every record acknowledged; the whole-run column is from app.start() and includes the "
        "consumer-group join (on Tansu about session.timeout.ms/2 = 3 s for the first join; "
        "on Kafka well under a second with group.initial.rebalance.delay.ms=0). "
        "The raw loop is assign()-ed (no group join), timed from its first consume() call to "
        "flush() returning; its two columns are the same figure. "
        f"Target: >= {result['target_ratio']:.2f}x.",
        "",
    ]
    runtime_rows = [r for r in result["summary"] if r["model"] == "runtime"]
    withheld = _no_verdict(result)
    if withheld:
        lines.append(f"**No verdict: {withheld}.**")
        runtime_rows = []
    for row in runtime_rows:
        verdict = "meets" if (row.get("ratio_to_raw") or 0) >= result["target_ratio"] else "misses"
        lines.append(
            f"- runtime, {row['threads']} thread(s): {_ratio(row.get('ratio_to_raw'))} of the raw "
            f"loop ({verdict} the {result['target_ratio']:.1f}x target); paired per-round ratio "
            f"{_num(row.get('paired_ratio'))} (min {_num({'n': 1, 'median': (row.get('paired_ratio') or {}).get('min', float('nan'))})}); "
            f"from first consumed record {_ratio(row.get('ratio_from_first_consumed_to_raw'))}; "
            f"whole run {_ratio(row.get('ratio_whole_run_to_raw'))}; "
            f"time to first record {_num(row.get('first_record_s'))} s; "
            f"flush after last produce {_num(row.get('flush_s'), 3)} s; "
            f"commits stood still for {_num(row.get('commit_seconds_in_window'))} s per run; "
            f"processing threads busy {_pct(row.get('processing_busy_share'))} of the window."
        )
    discarded = [r for r in result["runs"] if r.get("discarded")]
    kept = [r for r in result["runs"] if not r.get("discarded")]
    if discarded:
        lines += [
            "",
            f"Noise: {len(discarded)} run(s) overlapped other processes using more than "
            "0.15 cores on average (the machine is shared) and were run again; they are "
            "kept in the JSON, marked discarded, and left out of the table.",
        ]
    versions = sorted({r.get("git", "") for r in kept if r.get("git")})
    if len(versions) > 1:
        lines += [
            "",
            "Runtime code changed during the session (runs imported: "
            + ", ".join(versions)
            + "); see `git` per run in the JSON.",
        ]
    noisy = [r for r in kept if r.get("noisy")]
    if noisy:
        lines += [
            "",
            f"Still noisy after re-runs ({len(noisy)} of {len(kept)} counted runs): "
            + ", ".join(
                f"{r['model']} t={r['threads']} r{r['repeat']} "
                f"(others {r.get('other_cores_in_window', 0):.2f} cores)"
                for r in noisy
            )
            + ". Their figures are in the table; treat them with care.",
        ]
    failed = [r for r in kept if "error" in r]
    ok_runs = [r for r in kept if r.get("correct")]
    lines += [
        "",
        f"Correctness: {len(ok_runs)} of {len(kept)} counted runs wrote exactly "
        f"{result['records']:,} records to their output topic (counted by reading it back; "
        "sampled values carry the added field).",
    ]
    for run in failed:
        first_line = str(run["error"]).strip().splitlines()[0] if run["error"] else ""
        lines.append(
            f"- FAILED {run['model']} threads={run['threads']} repeat={run['repeat']}: "
            f"{first_line[:300]}"
        )
    lines += [
        "",
        "Caveats: CPython's GIL serializes the pure-Python per-record work, so more "
        "processing threads cannot add throughput to this workload; the raw loop has no "
        "framework overhead at all (no tasks, scheduling, offsets bookkeeping, serdes objects "
        "or commits); the broker ("
        + str(result.get("machine", {}).get("broker", "tansu"))
        + ") runs on the same 2 cores and its CPU time competes with the client. "
        "See benchmarks/README.md.",
        "",
    ]
    return "\n".join(lines)


def _no_verdict(result: dict[str, Any]) -> str | None:
    """Why the report gives no verdict: a failed run (on either side: a ratio against a
    raw loop that failed is no ratio), or an interrupted session. None: it may."""
    reasons = []
    partial = result.get("partial")
    if partial:
        reasons.append(
            f"the session was {partial.get('reason', 'interrupted')} during "
            f"{partial.get('during', '?')}, after {partial.get('runs_done', 0)} run(s)"
        )
    failed = [r for r in result["runs"] if not r.get("discarded") and "error" in r]
    if failed:
        sides = sorted(
            {"raw loop (reference)" if r["model"] == "raw" else "runtime" for r in failed}
        )
        reasons.append(f"{len(failed)} run(s) failed ({', '.join(sides)}; listed below)")
    return "; ".join(reasons) if reasons else None


def pyplot() -> Any:
    """matplotlib's pyplot on the file-only Agg backend, or None when matplotlib
    is missing (the plots are optional; the JSON and markdown are not)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - a broken install is as good as none here
        return None
    return plt


def plot(out_dir: str, name: str, result: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    rows = [r for r in result["summary"] if r["records_per_s"].get("n")]
    if not rows:
        return None
    labels = [
        "raw loop" if r["model"] == "raw" else f"runtime\n{r['threads']} thread(s)" for r in rows
    ]
    med = [r["records_per_s"]["median"] for r in rows]
    lo = [r["records_per_s"]["median"] - r["records_per_s"]["min"] for r in rows]
    hi = [r["records_per_s"]["max"] - r["records_per_s"]["median"] for r in rows]
    fig, ax = plt.subplots(figsize=(6, 4))
    colors = ["#888888" if r["model"] == "raw" else "#3b75af" for r in rows]
    ax.bar(labels, med, yerr=[lo, hi], capsize=4, color=colors)
    raw = next((r for r in rows if r["model"] == "raw"), None)
    if raw:
        ax.axhline(
            raw["records_per_s"]["median"] * result["target_ratio"],
            color="#c44",
            linestyle="--",
            label=f"{result['target_ratio']:.1f}x raw loop",
        )
        ax.legend()
    for i, r in enumerate(rows):
        if r["model"] != "raw" and r.get("ratio_to_raw"):
            ax.text(
                i,
                r["records_per_s"]["max"] * 1.01,
                f"{r['ratio_to_raw']:.2f}x",
                ha="center",
                va="bottom",
            )
    ax.set_ylabel("records/s (median, min-max)")
    ax.set_title(f"{name}: {result['records']:,} records, {result['partitions']} partitions")
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main(argv: list[str]) -> int:
    """``python -m benchmarks.report RESULT.json ...``: re-render the .md and .png."""
    for path in argv:
        with open(path) as f:
            result = json.load(f)
        name = os.path.splitext(os.path.basename(path))[0]
        print(", ".join(write(os.path.dirname(path) or ".", name, result)))
    return 0


if __name__ == "__main__":
    import sys

    sys.exit(main(sys.argv[1:]))
