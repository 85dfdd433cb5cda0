"""Summaries, JSON, markdown and PNG plots of a peers session.

``summarize`` is the compare harness's (one row per workload, model and thread
count, medians and ranges over the counted runs); this module adds the ratios
against every peer and the targets' verdicts:

- the runtime at >= 2x quixstreams on the stateless map and the stateful count
  (quixstreams runs one thread; the ratio takes the runtime at 1 thread, and
  its best thread count is shown beside it);
- against Kafka Streams (classic and processing-threads): throughput, CPU per
  record, peak RSS and broker connections at every thread count, reported as
  they are;
- the I/O-bound workload at >= Kafka Streams' throughput at equal threads
  (>= 0.97x counted as matching, as in compare).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.compare.report import (
    _med,
    _range,
    _ratio,
    _ratio_of,
    backlog_line,
    no_verdict_reason,
    status_lines,
    summarize,
)
from benchmarks.peers.models import QUIX_NOT_RUN
from benchmarks.report import pyplot, write_files

__all__ = ["headline", "markdown", "plot", "ratios", "summarize", "write"]

PEERS = ("ks-classic", "ks-proc", "quixstreams")
TITLES = {
    "runtime": "runtime",
    "runtime-p2": "runtime, 2 processes",
    "keypar": "runtime key-parallel",
    "ks-classic": "Kafka Streams classic",
    "ks-proc": "Kafka Streams processing threads",
    "quixstreams": "quixstreams",
    "quixstreams-p2": "quixstreams, 2 processes",
}
COLORS = {
    "runtime": "#3b75af",
    "runtime-p2": "#7fb3e0",
    "keypar": "#1f3f66",
    "ks-classic": "#d9822b",
    "ks-proc": "#9b59b6",
    "quixstreams": "#2ca02c",
    "quixstreams-p2": "#98df8a",
}
# Issue 36's targets for the runtime in 2 processes (stateful count).
PROCESSES_SPEEDUP = 1.4
MATCH = 0.97  # a throughput ratio counted as "at least equal"


def headline(result: dict[str, Any], workload: str) -> str:
    """The throughput figure a workload is judged by.

    One output per input record (stateless, io, skew): records/s from the first to the
    last output record the reader saw, as the issue defines it (it leaves out each
    model's start-up after ``go``). The count: from ``go`` until the latest counts add
    up to the input, because folded counts arrive per commit and the first of them says
    nothing about when processing started.
    """
    output = result["workloads"].get(workload, {}).get("output_check", "count")
    return "records_per_s_first_to_last" if output == "count" else "records_per_s"


def _rows(result: dict[str, Any]) -> dict[tuple[str, str, int], dict[str, Any]]:
    rows = result.get("summary") or summarize(result)
    return {(r["workload"], r["model"], r["threads"]): r for r in rows}


def _figure_ratio(
    by_key: dict[tuple[str, str, int], Any],
    wl: str,
    a: tuple[str, int],
    b: tuple[str, int],
    key: str,
) -> float | None:
    ra, rb = by_key.get((wl, a[0], a[1])), by_key.get((wl, b[0], b[1]))
    if ra is None or rb is None:
        return None
    return _ratio_of(ra[key], rb[key])


def ratios(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Runtime / peer for every figure where both ran (JSON-friendly rows)."""
    by_key = _rows(result)
    out = []
    for wl in result["workloads"]:
        for n in result["threads"]:
            if (wl, "runtime", n) not in by_key:
                continue
            for peer in PEERS:
                peer_threads = 1 if peer == "quixstreams" else n
                if (wl, peer, peer_threads) not in by_key:
                    continue
                row: dict[str, Any] = {
                    "workload": wl,
                    "threads": n,
                    "peer": peer,
                    "peer_threads": peer_threads,
                }
                row["throughput_figure"] = headline(result, wl)
                for key in (
                    "records_per_s",
                    "records_per_s_first_to_last",
                    "cpu_s_per_million",
                    "peak_rss_mb",
                    "connections_at_ready",
                    "p50_ms",
                    "p99_ms",
                ):
                    row[key] = _figure_ratio(by_key, wl, ("runtime", n), (peer, peer_threads), key)
                out.append(row)
    return out


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    by_key = _rows(result)
    versions = result.get("peer_versions") or {}
    models = result["models"]
    lines = [
        "# The runtime against Kafka Streams and quixstreams",
        "",
        f"`{result['command']}`: {result['repeats']} repeat(s) per workload, thread counts "
        f"{', '.join(map(str, result['threads']))} (quixstreams: 1), models {', '.join(models)} "
        f"rotated at each thread count; one broker per workload, every run in a fresh process "
        f"on identical input. Suite time {result.get('suite_s', 0) / 60:.1f} min.",
        "",
        f"Broker: {m.get('broker', result.get('broker', '?'))}, on the same machine. Machine: "
        f"nproc={m.get('nproc')}, {m.get('cpu', '?')}; Python {m.get('python')}, "
        f"confluent-kafka {m.get('confluent_kafka')} / librdkafka {m.get('librdkafka')}; "
        f"Kafka Streams {versions.get('kafka_streams', 'n/a')} on {versions.get('java', 'n/a')}; "
        f"{versions.get('quixstreams', 'quixstreams n/a')} (its own virtualenv); "
        f"git {m.get('git_head', '?')}; {m.get('date')}.",
        "",
        "Config of every model: "
        f"`{', '.join(f'{k}={v}' for k, v in result['config'].items())}` (the runtime takes all of "
        "it; Kafka Streams the same keys; quixstreams `commit_interval` and its consumer's "
        "session/heartbeat), everything else each system's defaults"
        + (f"; Kafka Streams also `{result['ks_settings']}`" if result.get("ks_settings") else "")
        + (f"; quixstreams also `{result['quix_settings']}`" if result.get("quix_settings") else "")
        + (f"; JVM options `{' '.join(result['jvm_opts'])}`" if result.get("jvm_opts") else "")
        + ". Kafka Streams warm-up records (a throw-away instance before the measured one): "
        + ", ".join(f"{k} {v:,}" for k, v in (result.get("jvm_warmup") or {}).items())
        + ".",
        "",
        *status_lines(result),
        "## Summary",
        "",
        "records/s: medians, measured by a separate consumer of the output topic: from the "
        "first to the last output record for stateless, io, skew and join; from `go` until the "
        "latest counts add up to the input for stateful and session (counts are folded per "
        "commit). Input records in all: for the join, the records of both its input topics. "
        "ratio = runtime / peer at equal threads (quixstreams: against its one thread); "
        "n/a: the peer cannot express the workload (why: under the table).",
        "",
    ]
    header = "| workload | threads | " + " | ".join(TITLES[mo] for mo in models)
    ratio_peers = [p for p in PEERS if p in models] if "runtime" in models else []
    if "runtime" in models:
        header += " | " + " | ".join(f"rt / {p}" for p in ratio_peers)
    lines += [header + " |", "|---" * (2 + len(models) + len(ratio_peers)) + "|"]
    for wl in result["workloads"]:
        key = headline(result, wl)
        for n in result["threads"]:
            cells = []
            for mo in models:
                row = by_key.get((wl, mo, n))
                cells.append(_med(row[key]) if row else "")
            if not any(cells):
                continue
            if "runtime" in models:
                for peer in ratio_peers:
                    pt = 1 if peer == "quixstreams" else n
                    ran = any(r["workload"] == wl and r["model"] == peer for r in result["runs"])
                    ratio = _figure_ratio(by_key, wl, ("runtime", n), (peer, pt), key)
                    not_run = peer == "quixstreams" and wl in QUIX_NOT_RUN
                    cells.append(_ratio(ratio) if ran else ("n/a" if not_run else ""))
            lines.append(f"| {wl} | {n} | " + " | ".join(cells) + " |")
    for wl in result["workloads"]:
        if "quixstreams" in models and wl in QUIX_NOT_RUN:
            lines += ["", f"quixstreams, {wl}: n/a, {QUIX_NOT_RUN[wl]}."]
    lines += ["", "## Targets", "", *_verdicts(result, by_key), ""]
    lines += _against_kafka_streams(result, by_key)
    lines += _processes(result, by_key)
    for wl_name, wl in result["workloads"].items():
        lines += [
            "",
            f"## {wl_name}: {wl['title']}",
            "",
            wl["description"] + ".",
            backlog_line(wl),
        ]
        note = _PEER_NOTES.get(wl_name)
        if note:
            lines += ["", note]
        floor = wl.get("latency_floor")
        if floor:
            lines.append(
                f"Latency floor of the measuring path alone (feeder -> broker -> reader, no "
                f"model, same rate): p50 {floor['p50_ms']:.1f} ms, p99 {floor['p99_ms']:.1f} ms."
            )
        lines += [
            "",
            "| model | threads | records/s first to last output (min-max) | records/s go to "
            "complete (min-max) | go to first output s | processed/s | CPU s / M records | "
            "peak RSS MB | conns ready (max) | OS threads | p50 ms | p99 ms | start to stable s "
            "| runs ok |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for mo in models:
            for n in result["threads"]:
                row = by_key.get((wl_name, mo, n))
                if row is None:
                    continue
                threads_os = [
                    r.get("os_threads_at_ready")
                    for r in result["runs"]
                    if r["workload"] == wl_name
                    and r["model"] == mo
                    and r["threads"] == n
                    and not r.get("discarded")
                    and isinstance(r.get("os_threads_at_ready"), int)
                ]
                lines.append(
                    f"| {mo} | {n} | {_range(row['records_per_s_first_to_last'])} | "
                    f"{_range(row['records_per_s'])} | {_med(row['first_output_s'], 2)} | "
                    f"{_med(row['records_per_s_processed'])} | "
                    f"{_med(row['cpu_s_per_million'], 1)} | {_range(row['peak_rss_mb'])} | "
                    f"{_med(row['connections_at_ready'])} ({_med(row['connections_max'])}) | "
                    f"{max(threads_os) if threads_os else 'n/a'} | "
                    f"{_range(row['p50_ms'])} | {_range(row['p99_ms'])} | "
                    f"{_med(row['join_s'], 1)} | {row['runs_ok']}/{row['runs_ok'] + row['runs_failed']}"
                    + (f" ({row['noisy_runs']} noisy)" if row["noisy_runs"] else "")
                    + " |"
                )
        for mo in models:
            for n in result["threads"]:
                row = by_key.get((wl_name, mo, n))
                for error in (row or {}).get("errors", []):
                    first = error.strip().splitlines()[0] if error.strip() else "?"
                    lines.append(f"- FAILED {mo} t={n}: {first[:300]}")
    lines += ["", "## How it is measured", "", *_METHOD, "", "## Caveats", "", *_CAVEATS, ""]
    return "\n".join(lines)


def _verdicts(result: dict[str, Any], by_key: dict[tuple[str, str, int], Any]) -> list[str]:
    withheld = no_verdict_reason(result)
    if withheld:
        return [f"- No verdict: {withheld}."]
    out = []
    threads = result["threads"]
    for wl in ("stateless", "stateful"):
        if wl not in result["workloads"] or (wl, "quixstreams", 1) not in by_key:
            continue
        key = headline(result, wl)
        at1 = _figure_ratio(by_key, wl, ("runtime", 1), ("quixstreams", 1), key)
        best = max(
            (
                (by_key[(wl, "runtime", n)][key]["median"], n)
                for n in threads
                if (wl, "runtime", n) in by_key and by_key[(wl, "runtime", n)][key]["n"]
            ),
            default=None,
        )
        quix = by_key[(wl, "quixstreams", 1)][key]
        best_txt = (
            f"; best runtime thread count (t={best[1]}): {_ratio(best[0] / quix['median'])}"
            if best and quix["n"] and quix["median"] > 0
            else ""
        )
        verdict = "n/a" if at1 is None else ("met" if at1 >= 2.0 else "missed")
        out.append(
            f"- {wl}: runtime (1 thread) / quixstreams >= 2x: {_ratio(at1)}, {verdict}{best_txt}."
        )
    if "io" in result["workloads"]:
        for peer in ("ks-classic", "ks-proc"):
            parts, misses = [], []
            for n in threads:
                r = _figure_ratio(by_key, "io", ("runtime", n), (peer, n), headline(result, "io"))
                if r is None:
                    continue
                parts.append(f"t={n}: {_ratio(r)}")
                if r < MATCH:
                    misses.append(f"t={n}")
            if parts:
                out.append(
                    f"- io: runtime >= {TITLES[peer]} at equal threads (>= {MATCH}x counted as "
                    f"matching): {', '.join(parts)}; "
                    + ("met everywhere." if not misses else "missed at " + ", ".join(misses) + ".")
                )
    if "io1" in result["workloads"] and "keypar" in result["models"]:
        key = headline(result, "io1")
        for peer in ("ks-classic", "ks-proc"):
            parts = []
            for n in threads:
                r = _figure_ratio(by_key, "io1", ("keypar", n), (peer, n), key)
                if r is not None:
                    parts.append(f"t={n}: {_ratio(r)}")
            if parts:
                out.append(
                    f"- io1 (one partition, threads beyond it): runtime key-parallel / "
                    f"{TITLES[peer]} at equal threads: {', '.join(parts)}."
                )
    out.append(
        "- Against Kafka Streams (throughput, CPU per record, memory, connections at each thread "
        "count): the table below; no pass/fail target, reported as measured."
    )
    return out


def _against_kafka_streams(
    result: dict[str, Any], by_key: dict[tuple[str, str, int], Any]
) -> list[str]:
    peers = [p for p in ("ks-classic", "ks-proc") if p in result["models"]]
    if not peers or "runtime" not in result["models"]:
        return []
    lines = [
        "## Against Kafka Streams at equal threads",
        "",
        "Each cell: runtime / Kafka Streams (the ratio runtime / Kafka Streams). records/s: "
        "higher is better; CPU s per million records, peak RSS MB (whole process, the JVM's "
        "included) and broker connections: lower is better.",
        "",
        "| workload | threads | peer | records/s | CPU s / M | peak RSS MB | connections | p99 ms |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for wl in result["workloads"]:
        for n in result["threads"]:
            rt = by_key.get((wl, "runtime", n))
            if rt is None:
                continue
            for peer in peers:
                ks = by_key.get((wl, peer, n))
                if ks is None:
                    continue
                cells = []
                for key, digits in (
                    (headline(result, wl), 0),
                    ("cpu_s_per_million", 1),
                    ("peak_rss_mb", 0),
                    ("connections_at_ready", 0),
                    ("p99_ms", 0),
                ):
                    cells.append(
                        f"{_med(rt[key], digits)} / {_med(ks[key], digits)} "
                        f"({_ratio(_ratio_of(rt[key], ks[key]))})"
                    )
                lines.append(f"| {wl} | {n} | {peer} | " + " | ".join(cells) + " |")
    return lines


_METHOD = [
    "- Each run: fresh input topic loaded with the workload's records (same bytes, same "
    "partitions for every model), fresh output topic and application id / consumer group; the "
    "model starts gated (it joins the group and takes its partitions but processes nothing) "
    "and reports ready once its assignment is complete and unchanged for 0.5 s; then `go`. "
    "Gates: the runtime `App.pause()`/`resume()` (it buffers input meanwhile); Kafka Streams "
    "keeps every input partition paused in its main consumers until `go` (tasks restore, the "
    "application is RUNNING, nothing is fetched); quixstreams holds its loop at the first "
    "record in an `update` step before the topology.",
    "- Input records: a workload's backlog; the join's is the records of both its input "
    "topics (left and right, interleaved in event time), so its records/s counts both sides.",
    "- records/s, stateless, io, skew, join: backlog / (the moment the harness's reader, a separate "
    "consumer of the output topic, has seen the last of the backlog's output - the moment it "
    "saw the first); 'go to complete' is the same from `go`, so it adds each model's start-up "
    "(first fetch, first batch, producer linger). Stateful: backlog / (the moment the latest "
    "count per key adds up to the input - go): the runtime and Kafka Streams fold counts per "
    "key per commit in their caches, so their first output comes at the first commit; "
    "quixstreams writes one count per input record and is complete as soon as it has "
    "processed the last record. Join: complete at the number of pairs the input holds "
    "(computed by the harness from the data, the same for every model; a windowed inner join "
    "emits each pair once, whatever the cache). Session: as stateful, the latest count per "
    "session (a session merged away gets a tombstone, counted 0) adding up to the input.",
    "- CPU s / M records: the child process's user+system CPU over the same window (all "
    "threads: the JVM's compiler and GC threads, librdkafka's). Peak RSS: VmHWM of the "
    "process at the end of the run (the whole JVM for Kafka Streams, the warm-up included). "
    "Connections: ESTABLISHED TCP sockets of the process to the broker port when it reported "
    "ready ((max): sampled every 0.25 s). OS threads: the process's threads at ready.",
    "- Latency: after the backlog, a feeder produces at a fixed rate, each record stamped "
    "with the wall clock; latency = the reader's clock at receipt - that stamp (every model "
    "keeps the input timestamp on its output). Count workloads: one output per key per commit "
    "for the runtime and Kafka Streams (commit.interval.ms=1000), so latency there is the "
    "commit interval.",
    "- Noise: before each run the harness waits for other processes to use < 0.25 cores; a run "
    "during which they used more is run again once and marked noisy if it stays so.",
]

# Under a workload's heading: how each model expresses it, where they differ.
_PEER_NOTES = {
    "join": "Every model: `left.join(right, joiner, JoinWindows 1 s / 10 s grace)` with String "
    "serdes (Kafka Streams: `StreamJoined` stores named `joined`, RocksDB window stores with "
    "changelogs; the runtime the same through its DSL). Both pick the next record of a task by "
    "the lowest head timestamp across its two partitions (Kafka Streams with "
    "`max.task.idle.ms=0`, its default). quixstreams: n/a (" + QUIX_NOT_RUN["join"] + ").",
    "session": "The runtime and Kafka Streams: `groupByKey().windowedBy(SessionWindows 1 s gap, "
    "2 s grace).count()` in a store named `sessions`, written with Kafka's session-windowed "
    "key (key, end, start) and a tombstone for each session a merge replaces; each with its "
    "default caching: both fold a session's updates per commit (Kafka Streams' record cache; "
    "the runtime's session store cache, runtime/topology/session_store.py), and neither "
    "forwards a session created and merged away within one commit. quixstreams: `session_window(1 s, grace 2 s).count().current()` "
    "(no cache: one output per input record), keyed by key + session start (its sessions keep "
    "their start as they grow on this data).",
}

_CAVEATS = [
    "- **JIT warm-up.** Kafka Streams runs on a JVM that interprets, then compiles its hot "
    "code on the same cores during the first seconds; a long-running service has paid that "
    "long before. The peer therefore runs a throw-away instance over the first records "
    "(`--jvm-warmup`, see above) before the measured one; `--jvm-warmup stateless=0` etc. "
    "measures a cold JVM. CPython needs no warm-up.",
    "- **Kafka Streams' defaults.** Its producer lingers 100 ms (`linger.ms=100`, a Kafka "
    "Streams default) and its consumers fetch with `fetch.max.wait.ms=500`; the runtime's "
    "producer lingers 5 ms. Latency at low rates shows it; `--ks-set producer.linger.ms=5` "
    "removes that difference.",
    "- **quixstreams** has one processing thread per process (it scales by processes), so it "
    "runs at 1 thread only, and it has no store cache: every input record of the count writes "
    "the store, the changelog and an output record.",
    "- **The GIL** bounds the runtime (and quixstreams) to one core of Python work; Kafka "
    "Streams' threads run in parallel. On this 2-core machine the broker, the harness's "
    "reader and feeder and the echo server share the cores with the model.",
    "- **Processing-threads mode** is an internal, unfinished Kafka Streams feature "
    "(`benchmarks/peers/kafka_streams/README.md`): one task executor per stream thread, so "
    "it has the same clients and the same processing parallelism as classic mode.",
]


# -- files -------------------------------------------------------------------------------


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    if "summary" not in result:
        result["summary"] = summarize(result)
    result["ratios"] = ratios(result)
    return write_files(out_dir, name, result, markdown, lambda: plot(out_dir, name, result))


def plot(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    plt = pyplot()
    if plt is None:
        return []
    rows = result.get("summary") or summarize(result)
    panels = [
        ("headline", "records/s (median, min-max)"),
        ("cpu_s_per_million", "CPU s per million records"),
        ("peak_rss_mb", "peak RSS MB"),
        ("connections_at_ready", "broker connections"),
        ("p99_ms", "p99 latency ms"),
    ]
    paths = []
    for wl_name, wl in result["workloads"].items():
        wl_rows = [r for r in rows if r["workload"] == wl_name]
        if not wl_rows:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(20, 3.8))
        for ax, (panel_key, label) in zip(axes, panels, strict=True):
            key = headline(result, wl_name) if panel_key == "headline" else panel_key
            for model in result["models"]:
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
                    xs,
                    med,
                    yerr=[lo, hi],
                    marker="o",
                    capsize=3,
                    label=TITLES.get(model, model),
                    color=COLORS.get(model),
                )
            ax.set_xscale("log", base=2)
            ax.set_xticks(result["threads"])
            ax.set_xticklabels([str(t) for t in result["threads"]])
            ax.set_xlabel("threads")
            ax.set_title(label, fontsize=10)
            ax.set_ylim(bottom=0)
            ax.grid(alpha=0.3)
        if axes[0].get_legend_handles_labels()[0]:
            axes[0].legend(fontsize=8)
        fig.suptitle(f"{wl_name}: {wl['title']} ({result['machine'].get('broker', '')})")
        fig.tight_layout()
        path = os.path.join(out_dir, f"{name}-{wl_name}.png")
        fig.savefig(path, dpi=100)
        plt.close(fig)
        paths.append(path)
    return paths


def _processes(result: dict[str, Any], by_key: dict[tuple[str, str, int], Any]) -> list[str]:
    """The `processes` axis (issue 36): the runtime in 2 processes against itself in
    one, Kafka Streams at equal threads per process count, and quixstreams in two."""
    if "runtime-p2" not in result["models"]:
        return []
    lines = [
        "",
        "## Processes (runtime-p2: `processes=2`)",
        "",
        "CPU, RSS and connections of a model in several processes are the sums over its "
        "process tree (the supervisor and its processing processes). "
        "Peak RSS of a tree is the sum of each process's own peak.",
        "",
        "| workload | threads per process | p2 / p1 records/s | p2 / Kafka Streams at "
        "2x threads | p2 / Kafka Streams at equal threads | p2 / quixstreams in 2 processes | "
        "CPU s / M p1 -> p2 | peak RSS MB p1 -> p2 | connections p1 -> p2 |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    verdicts = []
    for wl in result["workloads"]:
        key = headline(result, wl)
        for n in result["threads"]:
            p2, p1 = by_key.get((wl, "runtime-p2", n)), by_key.get((wl, "runtime", n))
            if p2 is None:
                continue
            speedup = _figure_ratio(by_key, wl, ("runtime-p2", n), ("runtime", n), key)
            ks_double = _figure_ratio(by_key, wl, ("runtime-p2", n), ("ks-classic", 2 * n), key)
            ks_equal = _figure_ratio(by_key, wl, ("runtime-p2", n), ("ks-classic", n), key)
            quix2 = _figure_ratio(by_key, wl, ("runtime-p2", n), ("quixstreams-p2", 1), key)

            def pair(field: str, digits: int = 0, a: Any = p1, b: Any = p2) -> str:
                left = _med(a[field], digits) if a else "n/a"
                return f"{left} -> {_med(b[field], digits)}"

            lines.append(
                f"| {wl} | {n} | {_ratio(speedup)} | {_ratio(ks_double)} | {_ratio(ks_equal)} | "
                f"{_ratio(quix2)} | {pair('cpu_s_per_million', 1)} | {pair('peak_rss_mb')} | "
                f"{pair('connections_at_ready')} |"
            )
            if wl == "stateful" and speedup is not None:
                cpu1 = p1["cpu_s_per_million"]["median"] if p1 else None
                cpu2 = p2["cpu_s_per_million"]["median"]
                verdicts.append(
                    f"- stateful t={n}: 2 processes / 1 process {_ratio(speedup)} (target >= "
                    f"{PROCESSES_SPEEDUP}x: {'met' if speedup >= PROCESSES_SPEEDUP else 'missed'})"
                    + (
                        f"; against Kafka Streams at {n} thread(s): {_ratio(ks_equal)} "
                        f"({'ahead' if ks_equal >= 1.0 else 'behind'})"
                        if ks_equal is not None
                        else ""
                    )
                    + (
                        f"; CPU per million records {cpu1:.1f} -> {cpu2:.1f} s "
                        f"({'no worse' if cpu2 <= cpu1 * 1.03 else 'worse'})"
                        if cpu1
                        else ""
                    )
                    + "."
                )
    return lines + ([""] + verdicts if verdicts else [])
