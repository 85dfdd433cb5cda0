"""The EOS and rebalance benchmarks still run end to end (tiny sizes, their own broker).

``python -m benchmarks eos`` (``benchmarks/eos.py``) and ``python -m benchmarks
rebalance`` (``benchmarks/rebalance.py``) only run when someone benchmarks; this
runs each once at the smallest size, on the broker they start themselves
(Apache Kafka unless this is a Tansu run), and checks that every run was
complete and correct and that the reports name what they measured.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from benchmarks import eos, rebalance

pytestmark = pytest.mark.integration


def _args(module: object, argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    module.add_arguments(parser)  # type: ignore[attr-defined]
    return parser.parse_args(argv)


def test_eos_benchmark_smoke_run(tmp_path: Path, on_kafka: bool) -> None:
    broker = "kafka" if on_kafka else "tansu"
    args = _args(
        eos,
        [
            "--quick",
            "--workloads=stateless",
            "--commit-intervals=1000",
            "--records=stateless=1000",
            "--feed-seconds=0.3",
            "--quiet-wait=0",
            "--redo-noisy=0",
            f"--broker={broker}",
            f"--out={tmp_path}",
        ],
    )
    assert eos.main(args) == 0
    result = json.loads((tmp_path / "eos.json").read_text())
    runs = result["runs"]
    assert sorted(r["model"] for r in runs) == ["alos-c1000", "eos-c1000"]
    assert all(r.get("correct") for r in runs), [r.get("error") for r in runs]
    (row,) = result["summary"]
    assert row["workload"] == "stateless" and row["commit_interval_ms"] == 1000
    assert row["eos_over_alos"] is not None and row["eos_over_alos"] > 0
    # Each model really ran under its own guarantee.
    guarantees = {r["model"]: (r.get("status") or {}).get("transactions_committed") for r in runs}
    assert guarantees["eos-c1000"], guarantees
    assert not guarantees["alos-c1000"], guarantees
    report = (tmp_path / "eos.md").read_text()
    assert "| stateless | 1000 |" in report and "Broker:" in report


def test_rebalance_benchmark_smoke_run(tmp_path: Path, on_kafka: bool) -> None:
    if not on_kafka:
        pytest.skip("the rebalance benchmark measures Apache Kafka's group protocols")
    args = _args(rebalance, ["--repeats=1", f"--out={tmp_path}"])
    assert rebalance.main(args) == 0
    result = json.loads((tmp_path / "rebalance.json").read_text())
    assert sorted(r["protocol"] for r in result["runs"]) == ["classic", "consumer"]
    for run in result["runs"]:
        assert 0 < run["second_join_s"] < 60, run
        a, b = run["split"]
        assert a and b and not set(a) & set(b)
    assert "| consumer |" in (tmp_path / "rebalance.md").read_text()
