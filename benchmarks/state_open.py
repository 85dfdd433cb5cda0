"""Opening, restoring, reopening and dropping many task-stores, per store
layout: a micro-benchmark of the state layer alone (no Kafka, no app).

Why: `./dev bench state` found the consolidated layout's open and restore
(256 tasks x 2 stores) about 5x slower than per-task, from creating a
RocksDB column family per task-store (RocksDB rewrites and re-parses its
OPTIONS file, which lists every family, at each creation). This measures
the stores' own share of those phases, each mode in a fresh child process,
``--repeat`` times (medians reported: the figures are a few seconds each and
fine on a shared machine if repeated):

- ``per-task``: the runtime's per-task layout (`build_task_stores`, a
  database per store, a `.checkpoint` per task);
- ``consolidated``: the runtime's consolidated layout (`ConsolidatedStores`:
  a column family per store name, the tasks' keys under their prefixes);
- ``family-per-task-store``: raw rocksdict, the layout's first version: one
  database, a column family per task-store created one at a time with the
  runtime's options (the O(N^2) this replaced); ``--tasks`` above 128 takes
  minutes here;
- ``families-at-open``: raw rocksdict, the same families all named when the
  database opens (`create_missing_column_families`), for comparison: what
  a batch creation would cost, which rocksdict does not offer once open.

Phases: ``open`` (every store of ``--tasks`` tasks x 2 stores, a count and a
window store, on an empty state dir), ``restore`` (``--records`` changelog
records into each store as restoration writes them, the WAL synced and the
task's positions written per task), ``reopen`` (close everything, open it
again: a restart with state), ``drop`` (the state of half the tasks
deleted, as the cleanup thread does). Run with ``python -m
benchmarks.state_open``; ``--json`` prints one JSON line per mode.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

MODES = ("per-task", "consolidated", "family-per-task-store", "families-at-open")
PHASES = ("open", "restore", "reopen", "drop")
STORES = ("counts", "windows")
TOPIC = "bench-{}-changelog"


def _records(count: int) -> list[tuple[bytes, bytes | None]]:
    return [(b"key-%06d" % i, b"v" * 100) for i in range(count)]


def _timed(phases: dict[str, float], name: str, step: Callable[[], None]) -> None:
    started = time.perf_counter()
    step()
    phases[name] = time.perf_counter() - started


def _runtime_layout(root: Path, tasks: int, records: int, consolidated: bool) -> dict[str, float]:
    from runtime.state.builders import StoreSpec, build_task_stores
    from runtime.state.checkpoint import TaskPositions
    from runtime.state.consolidated import ConsolidatedStores, consolidated_directory
    from runtime.state.rocksdb_memory import RocksDBMemory

    memory = RocksDBMemory()
    specs = [StoreSpec("counts", caching=False), StoreSpec("windows", caching=False)]
    task_ids = [f"0_{p}" for p in range(tasks)]
    db: list[ConsolidatedStores | None] = [None]
    opened: dict[str, Any] = {}

    def open_all() -> None:
        if consolidated:
            db[0] = ConsolidatedStores(consolidated_directory(str(root), "bench"), memory)
        for p, task in enumerate(task_ids):
            opened[task] = build_task_stores(
                specs,
                root / "bench" / task,
                "bench",
                p,
                None,
                lambda *a, **k: None,
                rocksdb_memory=memory,
                consolidated=db[0],
            )

    def restore() -> None:
        batch = _records(records)
        for task in task_ids:
            positions: TaskPositions | None = None
            offsets = {}
            for store in opened[task].values():
                store.restore_batch(batch, records)
                store.sync()
                offsets.update(store.checkpoint_offsets())
                positions = store.positions
            assert positions is not None
            positions.write(offsets)

    def close_all() -> None:
        for stores in opened.values():
            for store in stores.values():
                store.close()
        opened.clear()
        if db[0] is not None:
            db[0].close()

    def drop() -> None:
        for task in task_ids[: tasks // 2]:
            for store in opened.pop(task).values():
                store.close()
            if db[0] is not None:
                assert db[0].drop_task(task)
            else:
                shutil.rmtree(root / "bench" / task)

    phases: dict[str, float] = {}
    _timed(phases, "open", open_all)
    _timed(phases, "restore", restore)
    close_all()
    _timed(phases, "reopen", open_all)
    _timed(phases, "drop", drop)
    close_all()
    return phases


def _raw_families(root: Path, tasks: int, records: int, at_open: bool) -> dict[str, float]:
    from rocksdict import Rdict, WriteBatch

    from runtime.state.rocksdb_memory import RocksDBMemory

    memory = RocksDBMemory()
    names = [f"0_{p}/{store}" for p in range(tasks) for store in STORES]
    path = str(root / "db")
    holder: list[Rdict] = []

    def options(create: bool) -> Any:
        o = memory.options("consolidated", create=create, setter=False)
        o.create_missing_column_families(True)
        return o

    def open_all() -> None:
        if at_open:
            families = {n: memory.options(n.rpartition("/")[2], create=True) for n in names}
            holder.append(Rdict(path, options(True), column_families=families))
        else:
            db = Rdict(path, options(True))
            for name in names:
                db.create_column_family(name, memory.options(name.rpartition("/")[2], True))
            holder.append(db)

    def restore() -> None:
        db = holder[0]
        batch_records = _records(records)
        for name in names:
            handle = db.get_column_family_handle(name)
            batch = WriteBatch(raw_mode=True)
            for key, value in batch_records:
                batch.put(key, value, handle)
            db.write(batch)
            db.flush_wal(True)

    def reopen() -> None:
        families = {n: memory.options(n.rpartition("/")[2], create=True) for n in names}
        holder.append(Rdict(path, options(False), column_families=families))

    def drop() -> None:
        for name in names[: len(names) // 2]:
            holder[0].drop_column_family(name)

    phases: dict[str, float] = {}
    _timed(phases, "open", open_all)
    _timed(phases, "restore", restore)
    holder.pop().close()
    _timed(phases, "reopen", reopen)
    _timed(phases, "drop", drop)
    holder.pop().close()
    return phases


def _child(mode: str, tasks: int, records: int) -> dict[str, float]:
    root = Path(tempfile.mkdtemp(prefix="state-open-"))
    try:
        if mode in ("per-task", "consolidated"):
            return _runtime_layout(root, tasks, records, mode == "consolidated")
        return _raw_families(root, tasks, records, mode == "families-at-open")
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.state_open", description=__doc__)
    parser.add_argument("--tasks", type=int, default=256, help="tasks, 2 stores each (256)")
    parser.add_argument("--records", type=int, default=100, help="records restored per store")
    parser.add_argument("--modes", default="per-task,consolidated", help=f"of {','.join(MODES)}")
    parser.add_argument("--repeat", type=int, default=3, help="runs per mode (medians)")
    parser.add_argument("--json", action="store_true", help="one JSON line per mode")
    parser.add_argument("--child", choices=MODES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.tasks, args.records)))
        return 0
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for mode in modes:
        if mode not in MODES:
            parser.error(f"--modes: unknown mode {mode!r} (one of {', '.join(MODES)})")
    for mode in modes:
        runs = []
        for _ in range(args.repeat):
            out = subprocess.run(
                [sys.executable, "-m", "benchmarks.state_open", "--child", mode,
                 "--tasks", str(args.tasks), "--records", str(args.records)],
                check=True, capture_output=True, text=True,
            ).stdout  # fmt: skip
            runs.append(json.loads(out.strip().splitlines()[-1]))
        medians = {p: round(statistics.median(r[p] for r in runs), 3) for p in PHASES}
        result = {"mode": mode, "tasks": args.tasks, "stores": 2 * args.tasks, "runs": runs}
        result |= {f"{p}_s": medians[p] for p in PHASES}
        if args.json:
            print(json.dumps(result), flush=True)
        else:
            figures = "  ".join(f"{p} {medians[p]:7.2f} s" for p in PHASES)
            print(f"{mode:24} {2 * args.tasks} stores  {figures}  (median of {args.repeat})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
