"""Workload "quick": every headline ratio at reduced size, in one invocation of a few minutes.

The headline ratios, stateless (the JSON map) and stateful (the count), at 1
and 2 processing threads:

- runtime / thread-per-client baseline (``benchmarks/baseline/``, as ``compare``);
- runtime / raw consume-then-produce loop (``benchmarks/raw_loop.py``: one
  consumer, one producer, no framework; one thread, so it runs once per round
  and both thread counts are divided by that run).

All three models run in the compare harness (``benchmarks/compare/``): one
broker per workload, identical input for every run, a fresh child process
per run, models rotated, records/s = backlog / (``go`` to the moment a
separate reader has seen the whole output). No latency phase. Writes
``<out>/quick[-TAG].json``, ``.md`` and ``.png`` (ratios and records/s, noisy
runs marked). Under 5 minutes on a 2-core machine (50,000 records per
workload, 2 repeats).

The figures are indicative: reduced sizes, and short quiet waits so that the
whole check stays short. Runs during which other processes were busy are
marked noisy, in the table, the plot and the last lines printed. For quieter
figures: nothing else on the machine, ``--quiet-wait 60 --redo-noisy 2``, or
the full benchmarks (``compare``, ``stateless``).
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.report import pyplot, rerender, write_files

NAME = "quick"
WORKLOADS = ("stateless", "stateful")
MODELS = ("runtime", "baseline", "raw")
REFERENCES = ("baseline", "raw")
DEFAULT_THREADS = "1,2"
DEFAULT_REPEATS = 2
DEFAULT_RECORDS = {"stateless": 50_000, "stateful": 50_000}
# Short on purpose (the point is a check in minutes); the help says how to get quieter runs.
DEFAULT_QUIET_WAIT = 5.0
DEFAULT_REDO_NOISY = 0
# The targets of the full benchmarks: compare's (>= the baseline, 0.97x counted as
# matching) and the stateless benchmark's (>= 0.7x the raw loop). No target was set
# for the count against the raw loop.
TARGETS: dict[tuple[str, str], float] = {
    ("stateless", "baseline"): 0.97,
    ("stateful", "baseline"): 0.97,
    ("stateless", "raw"): 0.7,
}
TITLES = {"runtime": "runtime", "baseline": "thread-per-client baseline", "raw": "raw loop"}
COLORS = {"runtime": "#3b75af", "baseline": "#d9822b", "raw": "#888888"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from benchmarks.harness import add_broker_argument

    parser.add_argument(
        "--threads",
        default=DEFAULT_THREADS,
        help=f"processing threads of the runtime and the baseline (default {DEFAULT_THREADS}; "
        "the raw loop runs once, at the lowest)",
    )
    parser.add_argument(
        "--repeats", type=int, default=DEFAULT_REPEATS, help=f"rounds (default {DEFAULT_REPEATS})"
    )
    parser.add_argument(
        "--records",
        action="append",
        default=[],
        metavar="WORKLOAD=N",
        help="backlog of a workload (defaults: stateless 50000, stateful 50000)",
    )
    parser.add_argument("--partitions", type=int, default=8, help="input partitions (default 8)")
    parser.add_argument(
        "--set",
        dest="settings",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra config for the runtime and the baseline (repeatable)",
    )
    parser.add_argument(
        "--quiet-wait",
        type=float,
        default=DEFAULT_QUIET_WAIT,
        metavar="SECONDS",
        help="before each run, wait up to this long for other processes to go quiet "
        f"(default {DEFAULT_QUIET_WAIT:g}: short, so the check stays short; 60 for quieter "
        "figures; 0: off)",
    )
    parser.add_argument(
        "--redo-noisy",
        type=int,
        default=DEFAULT_REDO_NOISY,
        metavar="N",
        help=f"run a noisy run again up to N times (default {DEFAULT_REDO_NOISY}: noisy runs "
        "are kept and marked; 2 for quieter figures, each redo costs a run)",
    )
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")
    parser.add_argument(
        "--report", metavar="FILE.json", help="only re-render markdown and plot from a result file"
    )
    add_broker_argument(parser)


def noise_explanation(quiet_wait: float, redo_noisy: int) -> str:
    """What the noise settings do and how to get quieter figures (printed at the start)."""
    from benchmarks.compare.session import NOISY_OTHER_CORES

    wait = (
        f"Before each run the harness waits up to {quiet_wait:g} s (--quiet-wait) for the "
        f"other processes on the machine to use less than {NOISY_OTHER_CORES:g} cores, then "
        "runs anyway"
        if quiet_wait > 0
        else "The harness does not wait for the machine to go quiet (--quiet-wait 0)"
    )
    redo = (
        f"runs again up to {redo_noisy} time(s) (--redo-noisy) and marks it if it stays so"
        if redo_noisy > 0
        else "keeps and marks (--redo-noisy 0)"
    )
    return (
        f"Noise: the machine is shared. {wait}. A run during whose timed window other "
        f"processes used more than {NOISY_OTHER_CORES:g} cores on average is 'noisy': the "
        f"harness {redo}. Noisy runs are marked NOISY in the table, hatched and crossed in "
        "the plot, and listed at the end. For quieter figures: stop other work on the "
        "machine, or raise --quiet-wait (60) and --redo-noisy (2), or run the full "
        "benchmarks (./dev bench compare, ./dev bench stateless)."
    )


def main(args: argparse.Namespace) -> int:
    if args.report:
        return rerender(args.report, summarize, write)

    from benchmarks.compare.main import (
        BASE_CONFIG,
        Suite,
        argv_echo,
        lowest_threads_only,
        parse_pairs,
        run_suite,
    )
    from benchmarks.compare.report import exit_code
    from benchmarks.workloads.stateless import parse_settings

    threads = [int(t) for t in args.threads.split(",") if t.strip()]
    records = {**DEFAULT_RECORDS, **parse_pairs(args.records, int)}
    unknown = sorted(set(records) - set(WORKLOADS))
    if unknown:
        raise SystemExit(f"--records: unknown workload(s) {unknown}; quick runs {WORKLOADS}")
    print(f"[{NAME}] {noise_explanation(args.quiet_wait, args.redo_noisy)}", flush=True)
    suite = Suite(
        name=f"{NAME}-{args.tag}" if args.tag else NAME,
        command=" ".join(["python -m benchmarks quick", *argv_echo(args, NAME)]),
        workloads=list(WORKLOADS),
        models=list(MODELS),
        threads=threads,
        repeats=args.repeats,
        partitions=args.partitions,
        records=records,
        rates={},
        # Throughput only: the headline ratios are records/s; no latency phase.
        feed_seconds=0.0,
        restore_records=0,
        echo_delay_ms=0.0,
        config={**BASE_CONFIG, **parse_settings(args.settings)},
        out_dir=output_dir(args),
        quiet_wait=args.quiet_wait,
        redo_noisy=args.redo_noisy,
        report=_Report(),
        broker=args.broker,
        runs_model=lowest_threads_only(("raw",), threads),
        extra={"quiet_wait": args.quiet_wait, "redo_noisy": args.redo_noisy},
        tag=NAME,
    )
    result: dict[str, Any] = run_suite(suite)
    for line in closing_lines(result):
        print(f"[{NAME}] {line}", flush=True)
    return exit_code(result)


class _Report:
    """The ``report`` interface ``run_suite`` calls."""

    summarize = staticmethod(lambda result: summarize(result))
    write = staticmethod(lambda out_dir, name, result: write(out_dir, name, result))


# -- figures ------------------------------------------------------------------------------


def _median(values: list[float]) -> float | None:
    finite = [v for v in values if v is not None and not math.isnan(v)]
    return statistics.median(finite) if finite else None


def _label(run: dict[str, Any]) -> str:
    return f"{run['workload']} {run['model']} t={run['threads']} r{run['repeat']}"


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """``rows``: compare's per (workload, model, threads) figures; ``ratios``: runtime against
    each reference at each thread count, with the noisy runs behind each."""
    from benchmarks.compare.report import counted
    from benchmarks.compare.report import summarize as compare_rows

    rows = compare_rows(result)
    good = counted(result["runs"])
    threads = result["threads"]
    lowest = min(threads) if threads else 1
    ratios = []
    for wl in result["workloads"]:
        for n in threads:
            mine = [r for r in good if r["workload"] == wl and r["model"] == "runtime"]
            mine = [r for r in mine if r["threads"] == n]
            for ref in REFERENCES:
                ref_threads = lowest if ref == "raw" else n
                theirs = [
                    r
                    for r in good
                    if r["workload"] == wl and r["model"] == ref and r["threads"] == ref_threads
                ]
                row: dict[str, Any] = {
                    "workload": wl,
                    "threads": n,
                    "reference": ref,
                    "reference_threads": ref_threads,
                    "target": TARGETS.get((wl, ref)),
                }
                for key in ("records_per_s", "records_per_s_processed"):
                    a = _median([r.get(key, float("nan")) for r in mine])
                    b = _median([r.get(key, float("nan")) for r in theirs])
                    row[key] = a / b if a is not None and b else None
                by_repeat = {r["repeat"]: r["records_per_s"] for r in theirs}
                row["paired"] = [
                    r["records_per_s"] / by_repeat[r["repeat"]]
                    for r in mine
                    if by_repeat.get(r["repeat"])
                ]
                row["noisy_runs"] = [_label(r) for r in mine + theirs if r.get("noisy")]
                row["runs"] = (len(mine), len(theirs))
                ratios.append(row)
    return {"rows": rows, "ratios": ratios}


def noisy_runs(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Counted runs (not discarded) that were noisy."""
    return [r for r in result["runs"] if not r.get("discarded") and r.get("noisy")]


def closing_lines(result: dict[str, Any]) -> list[str]:
    """The last lines printed: noisy or not, plainly, and where the results are."""
    from benchmarks.compare.session import NOISY_OTHER_CORES

    kept = [r for r in result["runs"] if not r.get("discarded")]
    noisy = noisy_runs(result)
    lines = []
    if noisy:
        summary = result.get("summary") or summarize(result)
        hit = [
            f"{q['workload']} t={q['threads']} vs {q['reference']}"
            for q in summary["ratios"]
            if q["noisy_runs"]
        ]
        lines.append(
            f"NOISY: {len(noisy)} of {len(kept)} runs ran while other processes used more "
            f"than {NOISY_OTHER_CORES:g} cores ({', '.join(_label(r) for r in noisy)}); "
            f"ratios resting on them: {', '.join(hit)}. Treat those figures with care; "
            "for quieter ones see the note at the start."
        )
    elif kept:
        lines.append(f"Quiet: none of the {len(kept)} runs was noisy.")
    return lines


# -- markdown -----------------------------------------------------------------------------


def _x(value: float | None) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.2f}x"


def _rate(stats: dict[str, float] | None) -> str:
    if not stats or not stats.get("n"):
        return "n/a"
    if stats["n"] == 1 or stats["min"] == stats["max"]:
        return f"{stats['median']:,.0f}"
    return f"{stats['median']:,.0f} ({stats['min']:,.0f}-{stats['max']:,.0f})"


def _verdict(row: dict[str, Any], withheld: bool) -> str:
    target, ratio = row["target"], row["records_per_s"]
    if withheld:
        return "no verdict"
    if target is None:
        return "no target"
    if ratio is None:
        return "n/a"
    return f"{'meets' if ratio >= target else 'below'} {target:.2f}x"


def markdown(result: dict[str, Any]) -> str:
    from benchmarks.compare.report import no_verdict_reason, status_lines

    m = result["machine"]
    summary = result.get("summary") or summarize(result)
    noisy = noisy_runs(result)
    kept = [r for r in result["runs"] if not r.get("discarded")]
    withheld = no_verdict_reason(result)
    lines = [
        "# Quick check: the headline ratios at reduced size",
        "",
        *status_lines(result),
        (
            f"**NOISY: {len(noisy)} of {len(kept)} runs** ran while other processes were busy "
            "(marked below and in the plot); their ratios are indicative at best."
            if noisy
            else f"Quiet: none of the {len(kept)} runs was noisy."
        ),
        "",
        f"`{result['command']}`: {result['repeats']} repeat(s), thread counts "
        f"{', '.join(map(str, result['threads']))}, models rotated; broker "
        f"{m.get('broker', result.get('broker'))} on the same machine; suite time "
        f"{result.get('suite_s', 0) / 60:.1f} min. Machine: nproc={m.get('nproc')}, "
        f"{m.get('cpu', '?')}, Python {m.get('python')}, librdkafka {m.get('librdkafka')}; "
        f"git {m.get('git_head', '?')}; {m.get('date')}.",
        "",
        "## Ratios",
        "",
        "runtime / reference, records/s medians (go to the whole output seen by a separate "
        "reader); paired: per round; processed/s: the same without waiting for the output. "
        "The raw loop runs one thread once per round; both thread counts are divided by it.",
        "",
        "| workload | threads | runtime / | ratio | paired per round | processed/s ratio "
        "| target | noisy runs |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for q in summary["ratios"]:
        paired = ", ".join(f"{p:.2f}" for p in q["paired"]) or "n/a"
        lines.append(
            f"| {q['workload']} | {q['threads']} | {TITLES[q['reference']]} | "
            f"{_x(q['records_per_s'])} | {paired} | {_x(q['records_per_s_processed'])} | "
            f"{_verdict(q, bool(withheld))} | "
            + (f"NOISY: {len(q['noisy_runs'])}" if q["noisy_runs"] else "-")
            + " |"
        )
    if withheld:
        lines += ["", f"No verdict: {withheld}."]
    lines += [
        "",
        "## Noise",
        "",
        noise_explanation(result.get("quiet_wait", 0.0), result.get("redo_noisy", 0)),
        "",
    ]
    if noisy:
        lines.append(
            "Noisy runs (others' cores during the timed window): "
            + ", ".join(f"{_label(r)} ({_other_cores(r)})" for r in noisy)
            + "."
        )
    gave_up = [
        r
        for r in kept
        if result.get("quiet_wait") and r.get("quiet_wait_s", 0) >= result["quiet_wait"] - 0.6
    ]
    if gave_up:
        lines.append(
            f"The quiet wait gave up before {len(gave_up)} of {len(kept)} runs (the machine "
            "did not go quiet within --quiet-wait)."
        )
    discarded = [r for r in result["runs"] if str(r.get("discarded", "")).startswith("noisy")]
    if discarded:
        lines.append(f"{len(discarded)} noisy run(s) were run again (kept in the JSON).")
    lines += [
        "",
        "## Records/s per model",
        "",
        "| workload | model | threads | records/s median (min-max) | processed/s | "
        "CPU s / M records | runs ok |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in summary["rows"]:
        lines.append(
            f"| {row['workload']} | {row['model']} | {row['threads']} | "
            f"{_rate(row['records_per_s'])} | {_rate(row['records_per_s_processed'])} | "
            + (
                f"{row['cpu_s_per_million']['median']:.1f}"
                if row["cpu_s_per_million"]["n"]
                else "n/a"
            )
            + f" | {row['runs_ok']}/{row['runs_ok'] + row['runs_failed']}"
            + (f" ({row['noisy_runs']} NOISY)" if row["noisy_runs"] else "")
            + " |"
        )
    backlogs = ", ".join(f"{w} {d['backlog']:,}" for w, d in result["workloads"].items())
    lines += [
        "",
        "## What this is, and is not",
        "",
        f"- Backlogs: {backlogs} records on {result['partitions']} partitions; config of the "
        f"runtime and the baseline `{', '.join(f'{k}={v}' for k, v in result['config'].items())}`.",
        "- Measured like `compare` (benchmarks/compare/README.md) for all three models. The raw "
        "ratio is therefore not the one in `results/stateless.md` (that one times the "
        "runtime from its first processed record to the last acknowledgement, and the raw "
        "loop from its first consume() to flush()): compare quick runs with quick runs.",
        "- Stateful: output is folded per key per commit (commit.interval.ms, 1 s) by the "
        "runtime's and the baseline's cache; the raw loop (a dict) folds its output on the same "
        "interval, so every model waits for a tick, which at this size is a large share of a "
        "run. The processed/s ratio leaves that wait out.",
        "- Reduced sizes and short quiet waits: a check that nothing moved a lot, not a "
        "measurement to quote. The full benchmarks are `./dev bench compare` and "
        "`./dev bench stateless`.",
        "",
    ]
    return "\n".join(lines)


def _other_cores(run: dict[str, Any]) -> str:
    window = run.get("seconds") or 0.0
    other = run.get("other_cpu_s")
    if not window or other is None:
        return "?"
    return f"{other / window:.2f} cores"


# -- files and plot ------------------------------------------------------------------------


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    if "summary" not in result:
        result["summary"] = summarize(result)

    def draw() -> list[str]:
        path = plot(out_dir, name, result)
        return [path] if path else []

    return write_files(out_dir, name, result, markdown, draw)


def plot(out_dir: str, name: str, result: dict[str, Any]) -> str | None:
    """Top: the ratios per workload and thread count (bars: medians; marks: per round);
    bottom: records/s of every counted run, coloured per model.

    Noisy is shown the same way everywhere: a ratio resting on a noisy run has a
    hatched bar with a red edge and the word "noisy"; a noisy run is a cross
    (a quiet one a dot), in its model's colour.
    """
    plt = pyplot()
    if plt is None:
        return None
    from matplotlib.lines import Line2D

    summary = result.get("summary") or summarize(result)
    workloads = list(result["workloads"])
    if not workloads:
        return None
    threads = result["threads"]
    fig, axes = plt.subplots(2, len(workloads), figsize=(6.5 * len(workloads), 8), squeeze=False)
    width = 0.38
    for col, wl in enumerate(workloads):
        ax = axes[0][col]
        for j, ref in enumerate(REFERENCES):
            for i, n in enumerate(threads):
                q = next(
                    (
                        r
                        for r in summary["ratios"]
                        if r["workload"] == wl and r["threads"] == n and r["reference"] == ref
                    ),
                    None,
                )
                x = i + (j - 0.5) * width
                if q is None or q["records_per_s"] is None:
                    ax.text(x, 0.05, "failed\nor n/a", ha="center", fontsize=8, color="#c44")
                    continue
                noisy = bool(q["noisy_runs"])
                ax.bar(
                    x,
                    q["records_per_s"],
                    width * 0.9,
                    color=COLORS[ref],
                    alpha=0.55 if noisy else 0.9,
                    hatch="//" if noisy else None,
                    edgecolor="#c44" if noisy else "none",
                    label=f"vs {TITLES[ref]}" if i == 0 else None,
                )
                ax.scatter(
                    [x] * len(q["paired"]),
                    q["paired"],
                    color="black",
                    marker="x" if noisy else "o",
                    s=18,
                    zorder=3,
                )
                top = max([q["records_per_s"], *q["paired"]])
                ax.text(
                    x,
                    top + 0.03,
                    f"{q['records_per_s']:.2f}x" + ("\nnoisy" if noisy else ""),
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color="#c44" if noisy else "black",
                )
        ax.axhline(1.0, color="#555", linestyle="--", linewidth=1)
        target = TARGETS.get((wl, "raw"))
        if target is not None:
            ax.axhline(target, color=COLORS["raw"], linestyle=":", linewidth=1)
            ax.text(-0.48, target, f"raw loop target {target:.1f}x", fontsize=7, va="bottom")
        ax.set_xticks(range(len(threads)))
        ax.set_xticklabels([f"{n} thread(s)" for n in threads])
        ax.set_xlim(-0.5, len(threads) - 0.5)
        ax.set_ylim(0, ax.get_ylim()[1] * 1.1)
        ax.set_ylabel("runtime / reference (records/s)")
        ax.set_title(f"{wl}: {result['workloads'][wl].get('title', '')}", fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=8, loc="lower right")

        ax = axes[1][col]
        for k, model in enumerate(MODELS):
            for i, n in enumerate(threads):
                runs = [
                    r
                    for r in result["runs"]
                    if r["workload"] == wl
                    and r["model"] == model
                    and r["threads"] == n
                    and not r.get("discarded")
                    and r.get("correct")
                    and "records_per_s" in r
                ]
                x = i + (k - 1) * 0.25
                for noisy in (False, True):
                    ys = [r["records_per_s"] for r in runs if bool(r.get("noisy")) == noisy]
                    ax.scatter(
                        [x] * len(ys),
                        ys,
                        color=COLORS[model],
                        marker="x" if noisy else "o",
                        s=40 if noisy else 28,
                    )
        ax.set_xticks(range(len(threads)))
        ax.set_xticklabels([f"{n} thread(s)" for n in threads])
        ax.set_xlim(-0.5, len(threads) - 0.5)
        ax.set_ylim(bottom=0)
        ax.set_ylabel("records/s (each run)")
        ax.grid(alpha=0.3, axis="y")
        handles = [
            Line2D([], [], color=COLORS[m], marker="o", linestyle="", label=TITLES[m])
            for m in MODELS
        ] + [Line2D([], [], color="black", marker="x", linestyle="", label="noisy run")]
        ax.legend(handles=handles, fontsize=8, loc="best")
    noisy_all = noisy_runs(result)
    kept = [r for r in result["runs"] if not r.get("discarded")]
    sizes = ", ".join(f"{w} {d['backlog']:,}" for w, d in result["workloads"].items())
    head = f"quick check at reduced size ({sizes} records)"
    fig.suptitle(
        head
        + (
            f"\nNOISY: {len(noisy_all)} of {len(kept)} runs (crosses, hatched bars)"
            if noisy_all
            else "\nno noisy run"
        )
        + (" - PARTIAL" if result.get("partial") else ""),
        color="#c44" if noisy_all or result.get("partial") else "black",
    )
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
