"""The stores' share of a commit, per store layout: a micro-benchmark of the
state layer alone (no Kafka, no app), for issue 34's commit target ("commit
p99 at least 5x lower than one synced write per store").

Why apart from `./dev bench state`: there a commit's time is mostly the
output's (the cache flushed downstream, changelog records produced and
acknowledged), which no store layout changes; the layouts differ in what
follows, the stores' own writes. This times exactly that part, every commit,
on the runtime's own classes (`build_task_stores`, `CommittedPositions`,
`ConsolidatedStores`), each mode in a fresh child process:

- ``synced-per-store``: the reference the issue names: the per-task layout
  with every store's batch synced and the task's `.checkpoint` rewritten at
  every commit (what the runtime did before Kafka Streams' deferral rule:
  two store syncs and two file fsyncs per task per commit);
- ``per-task``: the per-task layout as built: every store's batch written,
  not synced; a task's checkpoint (its stores synced first) only once its
  changelogs moved `CHECKPOINT_DELTA_RECORDS` records (Kafka Streams' rule);
- ``consolidated``: the consolidated layout: every task's batches and
  positions in ONE synced batch per commit.

Each commit writes ``--dirty`` keys into each of the two stores of each of
``--tasks`` tasks (what a steady feed of rate x interval records spread over
the tasks leaves dirty; 5 per store is about 2,500 records a commit over 256
tasks), then runs every task's post-commit store path. Figures: median, p99
(nearest rank) and max of ``--commits`` commits, after ``--warmup``
untimed ones. Run with ``python -m benchmarks.state_commit``; ``--json``
prints one JSON line per mode, ``--out DIR`` writes ``state-commit.json``
and ``state-commit.md`` there.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

MODES = ("synced-per-store", "per-task", "consolidated")
STORES = ("counts", "windows")


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered), max(1, math.ceil(q * len(ordered)))) - 1]


def _child(mode: str, tasks: int, dirty: int, commits: int, warmup: int) -> dict[str, Any]:
    from runtime.state.builders import StoreSpec, build_task_stores, task_checkpoint_offsets
    from runtime.state.checkpoint import CommittedPositions
    from runtime.state.consolidated import ConsolidatedStores, consolidated_directory
    from runtime.state.rocksdb_memory import RocksDBMemory

    root = Path(tempfile.mkdtemp(prefix="state-commit-"))
    memory = RocksDBMemory()
    db = (
        ConsolidatedStores(consolidated_directory(str(root), "bench"), memory)
        if mode == "consolidated"
        else None
    )
    specs = [StoreSpec(name, caching=False) for name in STORES]
    tasks_stores = []
    for p in range(tasks):
        stores = build_task_stores(
            specs,
            root / "bench" / f"0_{p}",
            "bench",
            p,
            None,
            lambda *a, **k: None,
            rocksdb_memory=memory,
            consolidated=db,
        )
        first = next(iter(stores.values()))
        assert first.positions is not None

        def sync(stores: dict[str, Any] = stores) -> None:
            for store in stores.values():
                store.sync()

        tasks_stores.append((stores, CommittedPositions(first.positions, None, sync)))
    position = 0
    forced = mode == "synced-per-store"
    durations: list[float] = []
    try:
        for commit in range(warmup + commits):
            # Processing (untimed): `dirty` keys per store, each a changelog record.
            for p, (stores, _positions) in enumerate(tasks_stores):
                for store in stores.values():
                    for k in range(dirty):
                        store.store.put(
                            b"key-%06d-%03d" % (p, (commit * dirty + k) % 997), b"v" * 8
                        )
            position += dirty
            started = time.perf_counter()
            # Every task's post-commit store path (StreamTask.post_commit's
            # store half), then the consolidated layout's one batch.
            for stores, positions in tasks_stores:
                for store in stores.values():
                    store.flush()
                    store.update_changelog_offset(position)
                positions.commit(task_checkpoint_offsets(stores.values()), forced)
            if db is not None:
                db.write_commit()
            if commit >= warmup:
                durations.append(time.perf_counter() - started)
    finally:
        for stores, _positions in tasks_stores:
            for store in stores.values():
                store.close()
        if db is not None:
            db.close()
        shutil.rmtree(root, ignore_errors=True)
    return {
        "mode": mode,
        "tasks": tasks,
        "stores": len(STORES) * tasks,
        "dirty_keys_per_store": dirty,
        "commits": commits,
        "median_ms": round(1000 * statistics.median(durations), 3),
        "p99_ms": round(1000 * _percentile(durations, 0.99), 3),
        "max_ms": round(1000 * max(durations), 3),
    }


def _markdown(
    results: list[dict[str, Any]], args: argparse.Namespace, machine: dict[str, Any]
) -> str:
    lines = [
        "# The stores' share of a commit, per layout (issue 34)",
        "",
        f"{machine.get('date')}, git {machine.get('git_head', '?')}, {machine.get('nproc')} CPUs "
        f"({machine.get('cpu', '?')}), Python {machine.get('python')}; "
        "`python -m benchmarks.state_commit "
        f"--tasks {args.tasks} --dirty {args.dirty} --commits {args.commits}`. "
        "No Kafka: the runtime's store classes on the local disk.",
        "",
        "| mode | stores | dirty keys per store | commits | median ms | p99 ms | max ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in results:
        lines.append(
            f"| {r['mode']} | {r['stores']} | {r['dirty_keys_per_store']} | {r['commits']} | "
            f"{r['median_ms']:.2f} | {r['p99_ms']:.2f} | {r['max_ms']:.2f} |"
        )
    by_mode = {r["mode"]: r for r in results}
    reference = by_mode.get("synced-per-store")
    if reference is not None:
        lines += ["", "## Target: commit p99 at least 5x lower than one synced write per store", ""]
        for mode in ("per-task", "consolidated"):
            if mode in by_mode:
                ratio = reference["p99_ms"] / max(by_mode[mode]["p99_ms"], 1e-9)
                verdict = "met" if ratio >= 5 else "NOT met"
                lines.append(
                    f"- {mode}: p99 {by_mode[mode]['p99_ms']:.2f} ms vs "
                    f"{reference['p99_ms']:.2f} ms = {ratio:.1f}x lower: {verdict}"
                )
        if "per-task" in by_mode:
            lines.append(
                "- per-task is durable only up to its last checkpoint after a power loss "
                "(changelog replay covers the rest, as in Kafka Streams); consolidated syncs "
                "every commit's data and positions together."
            )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_commit", description=__doc__)
    parser.add_argument("--tasks", type=int, default=256, help="tasks, 2 stores each (256)")
    parser.add_argument("--dirty", type=int, default=5, help="keys written per store per commit")
    parser.add_argument("--commits", type=int, default=100, help="timed commits per mode")
    parser.add_argument("--warmup", type=int, default=5, help="untimed commits first")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {','.join(MODES)}")
    parser.add_argument("--json", action="store_true", help="one JSON line per mode")
    parser.add_argument("--out", default=None, help="write state-commit.json/.md here")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        result = _child(args.child, args.tasks, args.dirty, args.commits, args.warmup)
        print(json.dumps(result))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r} (one of {', '.join(MODES)})")
    results = []
    for mode in modes:
        out = subprocess.run(
            [sys.executable, "-m", "benchmarks.state_commit", "--child", mode,
             "--tasks", str(args.tasks), "--dirty", str(args.dirty),
             "--commits", str(args.commits), "--warmup", str(args.warmup)],
            check=True, capture_output=True, text=True,
        ).stdout  # fmt: skip
        result = json.loads(out.strip().splitlines()[-1])
        results.append(result)
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            print(
                f"{mode:18} {result['stores']} stores  median {result['median_ms']:8.2f} ms  "
                f"p99 {result['p99_ms']:8.2f} ms  max {result['max_ms']:8.2f} ms",
                flush=True,
            )
    if args.out:
        from benchmarks.harness import machine_info

        machine = machine_info("none")
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "state-commit.json"), "w") as f:
            json.dump({"machine": machine, "settings": vars(args), "results": results}, f, indent=1)
        with open(os.path.join(args.out, "state-commit.md"), "w") as f:
            f.write(_markdown(results, args, machine))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
