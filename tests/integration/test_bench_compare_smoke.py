"""A tiny comparison runs every model of the compare harness and gives a verdict.

Issue 32: every run of the thread-per-client baseline failed in the compare
child (its status was read as the runtime's), and the report still printed
"met everywhere". ``test_bench_smoke.py`` drives ``BaselineApp`` directly, so
it could not see a break in the harness around it. This runs the harness
itself (``run_suite``: the child processes, the gating, the reader, the
report) on the session's broker, with the runtime, the baseline and the raw
loop (the quick check's three models) on both headline workloads, one small
run each, and requires every run complete and correct, exit code 0 and a
verdict in the report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from benchmarks import quick
from benchmarks.compare import report as compare_report
from benchmarks.compare.main import BASE_CONFIG, Suite, lowest_threads_only, run_suite

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]


def test_tiny_compare_with_the_baseline_gives_a_verdict(
    broker: Any, bootstrap: str, tmp_path: Path
) -> None:
    assert broker.bootstrap == bootstrap
    suite = Suite(
        name="compare-smoke",
        command="tests/integration/test_bench_compare_smoke.py",
        workloads=["stateless", "stateful"],
        models=["runtime", "baseline", "raw"],
        threads=[1],
        repeats=1,
        partitions=4,
        records={"stateless": 1_000, "stateful": 1_000},
        rates={},
        feed_seconds=0.0,  # throughput only: the latency phase adds nothing here
        restore_records=0,
        echo_delay_ms=0.0,
        config=dict(BASE_CONFIG),
        out_dir=str(tmp_path),
        quiet_wait=0.0,
        redo_noisy=0,
        report=quick._Report(),
        external_broker=broker,
        runs_model=lowest_threads_only(("raw",), [1]),
        print_report=False,
    )
    result = run_suite(suite)

    runs = {(r["workload"], r["model"]): r for r in result["runs"]}
    assert sorted(runs) == [
        (w, m) for w in ("stateful", "stateless") for m in ("baseline", "raw", "runtime")
    ]
    assert compare_report.failure_lines(result) == []
    for key, run in runs.items():
        assert run.get("correct") and "error" not in run, (key, run.get("error"))
        assert run["records_per_s"] > 0, key
    # The baseline's final status came back (what issue 32 broke), as a plain dict.
    baseline_status = runs[("stateless", "baseline")]["status"]
    assert baseline_status["model"] == "baseline" and baseline_status["processed"] == 1_000
    assert runs[("stateful", "raw")]["status"]["processed"] == 1_000
    assert compare_report.exit_code(result) == 0

    # Every ratio is there, and the reports judge them.
    ratios = {(q["workload"], q["reference"]): q for q in result["summary"]["ratios"]}
    assert all(q["records_per_s"] for q in ratios.values()), ratios
    quick_md = (tmp_path / "compare-smoke.md").read_text()
    assert "No verdict" not in quick_md and "FAILED" not in quick_md
    assert "| stateless | 1 | thread-per-client baseline |" in quick_md
    saved = json.loads((tmp_path / "compare-smoke.json").read_text())
    assert len(saved["runs"]) == 6
    compare_md = compare_report.markdown({**result, "summary": compare_report.summarize(result)})
    assert "Throughput, runtime >= baseline at equal threads" in compare_md
    assert "No verdict" not in compare_md
