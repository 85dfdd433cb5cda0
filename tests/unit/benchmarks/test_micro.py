"""benchmarks.micro runs (tiny sizes) and its count workload counts right."""

from __future__ import annotations

import json

from benchmarks import micro


def test_every_workload_reports_cpu_per_record() -> None:
    lines: list[str] = []
    code = micro.main(
        [
            "--workloads",
            ",".join(micro.WORKLOADS),
            "--records",
            "300",
            "--keys",
            "20",
            "--commit-every",
            "100",
            "--repeats",
            "1",
            "--json",
        ],
        out=lines.append,
    )
    assert code == 0
    results = [json.loads(line) for line in lines]
    assert [r["workload"] for r in results] == list(micro.WORKLOADS)
    assert all(r["us_per_record"] > 0 for r in results)


def test_count_output_folds_to_the_input_per_key() -> None:
    data = micro.make_input("count", 500, 7)
    _, ctx = micro.run_once("count", data, commit_every=10**9, cache_max_bytes=10**6)
    # One commit at the end: one folded update per key, summing to the input.
    out = [s for s in ctx.sent if s[0] == micro.OUTPUT]  # type: ignore[index]
    assert len(out) == 7
    assert sum(int.from_bytes(s[2], "big") for s in out) == 500  # type: ignore[index]
