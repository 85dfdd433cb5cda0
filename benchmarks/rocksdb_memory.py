"""RocksDB memory with many stores: RocksDB's default options per store
against the shared budget (`state.rocksdb.memory.bytes`), by process RSS.

No Kafka: each mode runs in a child process of its own, which opens
``--stores`` RocksDB stores the way tasks do (`RocksDBKeyValueStore`),
writes ``--rounds`` commits of ``--keys`` keys of ``--value-bytes`` bytes
into each (one synced write batch per store and commit, as the runtime's
commit does), then reads every key back once from every store. Modes:

- ``default``: each store opens with rocksdict's default options (what the
  runtime did before issue 34): its own block cache, 64 MiB memtables.
- ``shared``: the runtime's `RocksDBMemory` with ``--budget-mib`` (default
  256: the key's default) and ``--ratio``.

Reported per mode (JSON lines with ``--json``): RSS before the stores open,
after the writes, after the reads, the peak (VmHWM), seconds, and for
``shared`` the shared cache's usage, the memtables' usage at the end and the
forced flushes and write stalls. Run with ``python -m benchmarks.rocksdb_memory``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MIB = 1 << 20


def _rss() -> dict[str, int]:
    figures = {}
    with open("/proc/self/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "VmHWM"):
                figures[name] = int(value.split()[0]) * 1024
    return figures


class _DefaultOptions:
    """A `RocksDBMemory` stand-in whose stores open with rocksdict's defaults."""

    def __init__(self) -> None:
        from runtime.state.rocksdb_memory import RocksDBMemorySettings

        self.settings = RocksDBMemorySettings()

    def options(self, store_name: str, create: bool) -> Any:
        from rocksdict import Options

        options = Options(raw_mode=True)
        options.create_if_missing(create)
        return options

    def register(self, store: Any) -> None:
        pass

    def unregister(self, store: Any) -> None:
        pass

    def relieve_write_buffers(self) -> int:
        return 0


def run_child(args: argparse.Namespace) -> dict[str, Any]:
    """One mode in this process; returns its figures."""
    from runtime.state.rocksdb_memory import RocksDBMemory, RocksDBMemorySettings
    from runtime.state.rocksdb_store import RocksDBKeyValueStore

    memory: Any
    if args.child == "shared":
        memory = RocksDBMemory(
            RocksDBMemorySettings(memory_bytes=args.budget_mib * MIB, write_buffer_ratio=args.ratio)
        )
    else:
        memory = _DefaultOptions()
    directory = Path(tempfile.mkdtemp(prefix="rocksdb-memory-"))
    value = os.urandom(args.value_bytes)
    result: dict[str, Any] = {"mode": args.child, "stores": args.stores}
    try:
        result["rss_start_mib"] = _rss()["VmRSS"] / MIB
        started = time.monotonic()
        stores = [
            RocksDBKeyValueStore(f"s{i}", directory / f"0_{i}" / "rocksdb" / "s", memory)
            for i in range(args.stores)
        ]
        for round_ in range(args.rounds):
            for store in stores:
                base = round_ * args.keys
                for k in range(base, base + args.keys):
                    store.put(k.to_bytes(8, "big"), value)
                store.commit()
        result["rss_after_writes_mib"] = _rss()["VmRSS"] / MIB
        for store in stores:
            for k in range(args.rounds * args.keys):
                store.get(k.to_bytes(8, "big"))
        rss = _rss()
        result["rss_after_reads_mib"] = rss["VmRSS"] / MIB
        result["rss_peak_mib"] = rss["VmHWM"] / MIB
        result["seconds"] = round(time.monotonic() - started, 1)
        result["written_mib"] = args.stores * args.rounds * args.keys * args.value_bytes / MIB
        if isinstance(memory, RocksDBMemory):
            result["budget_mib"] = args.budget_mib
            result["cache_usage_mib"] = memory.cache_usage() / MIB
            result["memtables_mib"] = memory.write_buffer_usage() / MIB
            result["forced_flushes"] = memory.forced_flushes
            result["stall_seconds"] = round(memory.stall_seconds, 2)
        for store in stores:
            store.close()
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    return {k: round(v, 1) if isinstance(v, float) else v for k, v in result.items()}


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.rocksdb_memory", description=__doc__
    )
    parser.add_argument("--modes", default="default,shared")
    parser.add_argument("--stores", type=int, default=256)
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--keys", type=int, default=2000, help="keys per store and round")
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--budget-mib", type=int, default=256)
    parser.add_argument("--ratio", type=float, default=0.25)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(run_child(args)), flush=True)
        return 0
    passed = [a for a in (argv if argv is not None else sys.argv[1:]) if a != "--json"]
    for mode in args.modes.split(","):
        done = subprocess.run(
            [sys.executable, "-m", "benchmarks.rocksdb_memory", *passed, "--child", mode],
            capture_output=True,
            text=True,
            check=False,
        )
        if done.returncode != 0:
            out(f"{mode}: failed: {done.stderr[-2000:]}")
            return 1
        figures = json.loads(done.stdout.strip().splitlines()[-1])
        out(json.dumps(figures) if args.json else _line(figures))
    return 0


def _line(figures: dict[str, Any]) -> str:
    return "  ".join(f"{k}={v}" for k, v in figures.items())


if __name__ == "__main__":
    sys.exit(main())
