"""The scale benchmark (`benchmarks/scale.py`) still runs end to end, smallest size.

`python -m benchmarks scale` only runs when someone benchmarks; this runs its
`runtime` mode once (1 -> 3 -> 2 daemons, a 5,000-record store) on the test
session's broker and checks what the report rests on: the instances balance
after each event, the leaving one exits 0, the counts are exact, the moved
tasks were learned (nothing restored while a task waited), and the files are
written. The `group` mode is the same code with another setting.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from benchmarks import scale

pytestmark = pytest.mark.integration


def test_scale_benchmark_runtime_mode_smoke_run(
    bootstrap: str, on_kafka: bool, tmp_path: Path
) -> None:
    if not on_kafka:
        pytest.skip("task.assignment=runtime is tested on Apache Kafka")
    parser = argparse.ArgumentParser()
    scale.add_arguments(parser)
    args = parser.parse_args(["--records", "5000", "--rate", "300", "--hold-s", "2"])
    run = scale.run_mode(SimpleNamespace(bootstrap=bootstrap), "runtime", args, tmp_path / "logs")
    assert run["counts_exact"], run["counts_wrong"]
    assert run["instances"]["i3"]["exit_code"] == 0
    assert run["time_to_balance_out_s"] > 0 and run["time_to_balance_in_s"] > 0
    # Four tasks move at the scale-out and two at the scale-in, each learned first.
    assert sum(i["handovers_taken"] or 0 for i in run["instances"].values()) >= 6
    assert run["restored_after_start"] < 6 * args.acceptable_lag
    assert set(run["tasks"]) == {f"0_{p}" for p in range(6)}
    assert all(t["output_records"] > 0 for t in run["tasks"].values())
    result = {
        "name": "scale-smoke",
        "records": args.records,
        "partitions": args.partitions,
        "rate": args.rate,
        "commit_interval_ms": args.commit_interval_ms,
        "acceptable_recovery_lag": args.acceptable_lag,
        "max_warmup_replicas": args.warmups,
        "hold_s": args.hold_s,
        "machine": {},
        "load_average_start": 0.0,
        "load_average_end": 0.0,
        "session_s": 0.0,
        "runs": {"runtime": run},
    }
    paths = scale.write(str(tmp_path), "scale-smoke", result)
    assert json.loads(Path(paths[0]).read_text())["runs"]["runtime"]["counts_exact"]
    assert "| `runtime` |" in Path(paths[1]).read_text()
