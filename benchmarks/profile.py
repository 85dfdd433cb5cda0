"""Profile one runtime run with py-spy and summarize where the time goes.

``profile_runtime_run`` runs one extra (unmeasured) runtime child under
``py-spy record --format raw`` (collapsed stacks, per thread) and writes:

- ``<out>/profile/<name>-runtime.collapsed.txt``: the raw stacks (feed to
  flamegraph.pl or https://www.speedscope.app);
- ``<out>/profile/<name>-runtime-summary.md``: per-thread sample shares, the
  top functions by self time, and the top ``runtime/`` functions by inclusive time.

``python -m benchmarks.profile FILE`` summarizes an existing collapsed file.
py-spy samples only threads that are not idle (blocked in a syscall or a wait),
so shares are of busy time. It needs ptrace rights (root or CAP_SYS_PTRACE).
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import sysconfig
from collections import Counter, defaultdict
from typing import Any

_FRAME = re.compile(r"^(?P<func>.*?) \((?P<file>[^()]*?)(?::(?P<line>\d+))?\)$")


def _py_spy() -> str | None:
    candidate = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return candidate if os.path.exists(candidate) else shutil.which("py-spy")


def profile_runtime_run(
    session: Any,
    input_topic: str,
    partitions: int,
    records: int,
    threads: int,
    deadline_s: float,
    out_dir: str,
    session_id: str,
    rate: int = 250,
    mode: str = "gil",
    extra_config: dict[str, Any] | None = None,
    name: str = "stateless",
) -> dict[str, Any] | None:
    from benchmarks.harness import run_child

    py_spy = _py_spy()
    if py_spy is None:
        print("[profile] py-spy not found (pip install py-spy); skipped", flush=True)
        return None
    prof_dir = os.path.join(out_dir, "profile")
    os.makedirs(prof_dir, exist_ok=True)
    collapsed = os.path.join(prof_dir, f"{name}-runtime.collapsed.txt")
    output_topic = f"bench-stateless-out-{session_id}-profile"
    session.create_topic(output_topic, partitions)
    spec = {
        "bootstrap": session.bootstrap,
        "input_topic": input_topic,
        "output_topic": output_topic,
        "partitions": partitions,
        "records": records,
        "deadline_s": deadline_s,
        "threads": threads,
        "application_id": f"bench-stateless-{session_id}-profile",
        "extra_config": extra_config or {},
    }
    wrap = [
        py_spy,
        "record",
        "--format",
        "raw",
        "--threads",
        "--rate",
        str(rate),
        "--nonblocking",
        "-o",
        collapsed,
    ]
    if mode == "gil":
        wrap.append("--gil")
    elif mode == "wall":
        wrap.append("--idle")
    wrap.append("--")
    try:
        result = run_child(
            "runtime_stateless",
            spec,
            os.path.join(prof_dir, f"{name}-run.log"),
            deadline_s + 120,
            session,
            wrap=wrap,
        )
    except RuntimeError as exc:
        print(f"[profile] failed: {exc}", flush=True)
        return {"error": str(exc)}
    finally:
        session.delete_topic(output_topic)
    summary = summarize_collapsed(collapsed)
    summary_path = os.path.join(prof_dir, f"{name}-runtime-summary.md")
    with open(summary_path, "w") as f:
        f.write(summary_markdown(summary, result, mode))
    with open(summary_path) as f:
        print(f.read(), flush=True)
    return {
        "collapsed": collapsed,
        "summary": summary_path,
        "records_per_s_from_first_record_under_profiler": result.get(
            "records_per_s_from_first_record"
        ),
        "threads": threads,
        "mode": mode,
    }


def _short_file(path: str) -> str:
    for prefix in (sysconfig.get_paths()["stdlib"] + "/", sysconfig.get_paths()["purelib"] + "/"):
        if path.startswith(prefix):
            return path[len(prefix) :]
    marker = "/runtime/"
    if marker in path:
        return "runtime/" + path.split(marker, 1)[1]
    marker = "/benchmarks/"
    if marker in path:
        return "benchmarks/" + path.split(marker, 1)[1]
    return path


def _parse_frame(frame: str) -> tuple[str, str]:
    """(function, short file) of a py-spy frame 'func (file:line)'; ignores the line."""
    m = _FRAME.match(frame.strip())
    if not m:
        return frame.strip(), ""
    return m.group("func"), _short_file(m.group("file"))


def _thread_label(frame: str) -> str | None:
    if frame.startswith("thread ") or frame.startswith("process "):
        return frame
    return None


def summarize_collapsed(path: str, top: int = 25) -> dict[str, Any]:
    """Self and inclusive sample counts per function, and samples per thread."""
    self_counts: Counter[tuple[str, str]] = Counter()
    incl_counts: Counter[tuple[str, str]] = Counter()
    thread_counts: Counter[str] = Counter()
    thread_kind: dict[str, Counter[str]] = defaultdict(Counter)
    total = 0
    with open(path) as f:
        for line in f:
            line = line.rstrip("\n")
            if not line:
                continue
            stack, _, count_text = line.rpartition(" ")
            try:
                count = int(count_text)
            except ValueError:
                continue
            frames = stack.split(";")
            thread = "?"
            py_frames = []
            for frame in frames:
                label = _thread_label(frame)
                if label is not None:
                    if label.startswith("thread "):
                        thread = label
                    continue
                py_frames.append(_parse_frame(frame))
            total += count
            thread_counts[thread] += count
            # Name threads by their outermost runtime entry point.
            kind = next(
                (
                    f"{fn} ({file})"
                    for fn, file in py_frames
                    if file.startswith(("runtime/", "benchmarks/")) and fn == "run"
                ),
                None,
            )
            if kind is None:
                kind = next(
                    (
                        f"{fn} ({file})"
                        for fn, file in py_frames
                        if file.startswith(("runtime/", "benchmarks/"))
                    ),
                    "other",
                )
            thread_kind[thread][kind] += count
            if py_frames:
                self_counts[py_frames[-1]] += count
            for fn_file in set(py_frames):
                incl_counts[fn_file] += count
    threads = [
        {
            "thread": t,
            "samples": c,
            "share": c / total if total else 0.0,
            "entry": thread_kind[t].most_common(1)[0][0] if thread_kind[t] else "?",
        }
        for t, c in thread_counts.most_common()
    ]
    return {
        "total_samples": total,
        "threads": threads,
        "self": [
            {"function": fn, "file": file, "samples": c, "share": c / total}
            for (fn, file), c in self_counts.most_common(top)
        ],
        "runtime_inclusive": [
            {"function": fn, "file": file, "samples": c, "share": c / total}
            for (fn, file), c in incl_counts.most_common()
            if file.startswith("runtime/")
        ][:top],
    }


_MODE_TEXT = {
    "gil": "py-spy --gil: only the thread holding the GIL is sampled, so shares are of the "
    "serialized Python time, the resource this workload is bound by",
    "busy": "py-spy default: every thread the OS reports running is sampled (GIL waits "
    "and some sleeps can show up as busy)",
    "wall": "py-spy --idle: every thread at every sample, waiting or not, so each thread's "
    "rows show where its wall-clock time goes (waits for work, for the GIL, in consume())",
}


def summary_markdown(
    summary: dict[str, Any], run: dict[str, Any] | None = None, mode: str | None = None
) -> str:
    lines = ["# Profile: one runtime run of the stateless workload (py-spy)", ""]
    if mode:
        lines += [f"Mode: {_MODE_TEXT.get(mode, mode)}.", ""]
    if run:
        lines += [
            f"Run under the profiler: {run.get('records_per_s_from_first_record', 0):,.0f} "
            f"records/s from first record (profiling slows it; not a measured run).",
            "",
        ]
    lines += [
        f"Total samples: {summary['total_samples']}",
        "",
        "## Threads (share of samples)",
        "",
        "| thread | entry | share |",
        "|---|---|---|",
    ]
    for t in summary["threads"]:
        lines.append(f"| {t['thread']} | {t['entry']} | {t['share']:.1%} |")
    lines += [
        "",
        "## Top functions by self time",
        "",
        "| function | file | self |",
        "|---|---|---|",
    ]
    for row in summary["self"]:
        lines.append(f"| {row['function']} | {row['file']} | {row['share']:.1%} |")
    lines += [
        "",
        "## runtime/ functions by inclusive time",
        "",
        "| function | file | inclusive |",
        "|---|---|---|",
    ]
    for row in summary["runtime_inclusive"]:
        lines.append(f"| {row['function']} | {row['file']} | {row['share']:.1%} |")
    lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary_markdown(summarize_collapsed(sys.argv[1])))
