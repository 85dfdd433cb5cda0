"""In-process microbenchmark: Python CPU per record of a task's processor graph.

No Kafka, no threads: records are fed to a task's graph on the calling thread
the way the processing thread does it (`StreamTask._process_message`: set the
current record's timestamp, advance stream time, `source.deserialize(...)`,
`source.process(record)`), and every `--commit-every` records the stores are
committed the way the commit does it (`emit_cached`: changelog records and
downstream updates; then `flush`: the RocksDB write batch). Output and
changelog records go to a sink that only collects tuples (the task's `send`
also appends one tuple per record). The stores are real: RocksDB in a fresh
temporary directory per run, with its changelog layer and the cache.

Workloads:

- ``count``: ``group_by_key().count()`` into RocksDB with caching and a
  changelog, output the counts (INT64): the comparison's stateful workload.
- ``reduce``: ``group_by_key().reduce(+)`` over INT64 values.
- ``aggregate``: ``group_by_key().aggregate(0, + len(value))``, INT64 aggregate.
- ``windowed``: ``windowed_by(1 min tumbling).count()``.
- ``map``: the stateless JSON map (orjson serde) of the stateless benchmark.

Reported: CPU microseconds per record (`time.process_time`, best of
``--repeats``), which includes the commits and the cyclic GC's collections
(the input, made before, is frozen out of them as the daemon freezes what
start-up made). Run with
``python -m benchmarks.micro`` (``--help`` for sizes). A diagnostic, not a
target: it leaves out consuming, routing and producing, so it isolates the
processing thread's per-record cost.
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from runtime.topology import serdes
from runtime.topology.builder import StreamsBuilder
from runtime.topology.record import Headers
from runtime.topology.testing import RecordingTaskContext
from runtime.topology.windows import TimeWindows

WORKLOADS = ("count", "reduce", "aggregate", "windowed", "map")
STORE = "counts"
INPUT = "in"
OUTPUT = "out"

Input = list[tuple[bytes, bytes, int]]  # key, value, timestamp


class _CollectingContext(RecordingTaskContext):
    """A RecordingTaskContext whose `send` only appends a tuple (as the task's does)."""

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        self.sent.append((topic, key, value, timestamp, headers, partition))  # type: ignore[arg-type]


def _topology(workload: str) -> Any:
    builder = StreamsBuilder()
    if workload == "map":
        from benchmarks.workloads.stateless import enrich

        (
            builder.stream(INPUT, key_serde=serdes.STRING, value_serde=serdes.JSON)
            .map_values(enrich)
            .to(OUTPUT, value_serde=serdes.JSON)
        )
        return builder.build()
    value_serde = serdes.INT64 if workload == "reduce" else serdes.STRING
    grouped = builder.stream(INPUT, key_serde=serdes.STRING, value_serde=value_serde).group_by_key()
    if workload == "count":
        table = grouped.count(store=STORE)
    elif workload == "reduce":
        table = grouped.reduce(lambda a, b: a + b, store=STORE)
    elif workload == "aggregate":
        table = grouped.aggregate(
            lambda: 0,
            lambda key, value, agg: agg + len(value),
            store=STORE,
            value_serde=serdes.INT64,
        )
    elif workload == "windowed":
        table = grouped.windowed_by(TimeWindows(60_000)).count(store=STORE)
        (
            table.to_stream()
            .map(lambda key, value: (key.key, value))
            .to(OUTPUT, key_serde=serdes.STRING, value_serde=serdes.INT64)
        )
        return builder.build()
    else:
        raise ValueError(f"unknown workload {workload!r}")
    table.to_stream().to(OUTPUT, value_serde=serdes.INT64)
    return builder.build()


def make_input(workload: str, records: int, keys: int) -> Input:
    """The records fed to the graph (serialized, as consumed)."""
    if workload == "map":
        from benchmarks.workloads.stateless import make_record

        return [(*make_record(i), 1_700_000_000_000 + i) for i in range(records)]
    names = [f"key-{k:05d}".encode() for k in range(keys)]
    out: Input = []
    for i in range(records):
        key = names[(i * 7919) % keys]
        value = (i % 100).to_bytes(8, "big") if workload == "reduce" else b"x"
        out.append((key, value, 1_700_000_000_000 + i))
    return out


def run_once(
    workload: str,
    data: Input,
    commit_every: int,
    cache_max_bytes: int = 10 * 1024 * 1024,
    state_dir: str | None = None,
) -> tuple[float, _CollectingContext]:
    """Feed `data` through a fresh task graph; returns (CPU seconds, context).

    The stores are closed before returning (their directory is removed when
    `state_dir` is None); the context keeps what was sent.
    """
    topology = _topology(workload)
    own_dir = state_dir is None
    directory = tempfile.mkdtemp(prefix="micro-") if own_dir else state_dir
    try:
        ctx = _CollectingContext(
            state_dir=directory, cache_max_bytes=cache_max_bytes, partitions={OUTPUT: 1}
        )
        graphs = [ctx.instantiate(sub) for sub in topology.subtopologies]
        (source,) = [g.sources[INPUT] for g in graphs if INPUT in g.sources]
        layered = list(ctx.layered.values())
        sent = ctx.sent
        deserialize = source.deserialize
        process = source.process
        # As the daemon freezes what start-up made: the input list is not
        # the runtime's, and full collections scanning it would be measured.
        gc.collect()
        gc.freeze()
        started = time.process_time()
        pending = 0
        for offset, (key, value, timestamp) in enumerate(data):
            ctx.record_timestamp = timestamp
            if timestamp > ctx.stream_time:
                ctx.stream_time = timestamp
            process(deserialize(key, value, timestamp, None, INPUT, 0, offset))
            pending += 1
            if pending == commit_every:
                pending = 0
                _commit(layered)
                del sent[:]  # handed to the collector
        _commit(layered)
        elapsed = time.process_time() - started
        gc.unfreeze()
        ctx.close()
        return elapsed, ctx
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def _commit(layered: Sequence[Any]) -> None:
    for store in layered:
        store.emit_cached()
    for store in layered:
        store.flush()


def measure(
    workload: str, records: int, keys: int, commit_every: int, repeats: int
) -> dict[str, Any]:
    """Best-of-`repeats` CPU microseconds per record of one workload."""
    data = make_input(workload, records, keys)
    runs = [run_once(workload, data, commit_every)[0] for _ in range(repeats)]
    best = min(runs)
    return {
        "workload": workload,
        "records": records,
        "keys": keys if workload != "map" else None,
        "commit_every": commit_every,
        "us_per_record": round(best / records * 1e6, 3),
        "runs_s": [round(r, 4) for r in runs],
    }


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.micro", description=__doc__)
    parser.add_argument("--workloads", default="count,map", help=f"comma list of {WORKLOADS}")
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--keys", type=int, default=10_000)
    parser.add_argument("--commit-every", type=int, default=10_000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--json", action="store_true", help="one JSON object per workload")
    args = parser.parse_args(argv)
    names = [w.strip() for w in args.workloads.split(",") if w.strip()]
    for name in names:
        if name not in WORKLOADS:
            parser.error(f"unknown workload {name!r} (choose from {', '.join(WORKLOADS)})")
    for name in names:
        result = measure(name, args.records, args.keys, args.commit_every, args.repeats)
        if args.json:
            out(json.dumps(result))
        else:
            out(
                f"{name:10s} {result['us_per_record']:8.3f} us CPU/record "
                f"(best of {args.repeats}; {args.records} records, commit every "
                f"{args.commit_every})"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
