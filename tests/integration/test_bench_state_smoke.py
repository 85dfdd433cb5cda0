"""The state benchmark (``./dev bench state``) still runs end to end, and says so when a side fails.

``benchmarks/state`` only runs when someone benchmarks issue 34's targets;
this runs it at a tiny size on the session's broker: the runtime side must
report every figure (records/s, time to open the stores, commit median and
p99, the steady feed's commits, restore time and records, peak RSS) and read
both restored stores back to the input's count, fed records included; a runtime side that cannot start must make the command
exit 1, name the side and the reason, and give no verdict. The Kafka Streams
side runs once (default memory, about 15 s) when Java and Maven are here.
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import build
from benchmarks.state import main as state
from runtime.brokers import Broker

pytestmark = [pytest.mark.integration, pytest.mark.timeout(600)]

RECORDS = 600
FED = 400  # the steady feed's records, after the backlog
RUNTIME_FIGURES = (
    "records_per_s",
    "open_s",
    "commit_median_ms",
    "commit_p99_ms",
    "commit_stores_p99_ms",
    "commits",
    "restore_s",
    "restored_records",
    "peak_rss_mb",
    "restore_peak_rss_mb",
)


def _run(broker: Broker, out: Path, *argv: str) -> tuple[int, dict[str, Any], str]:
    parser = argparse.ArgumentParser()
    state.add_arguments(parser)
    args = parser.parse_args(
        [
            "--partitions=4",
            f"--records={RECORDS}",
            "--keys=60",
            "--quiet-wait=0",
            "--feed-s=0",
            "--timeout=120",
            f"--out={out}",
            *argv,
        ]
    )
    args.external_broker = broker
    code = state.main(args)
    return code, json.loads((out / "state.json").read_text()), (out / "state.md").read_text()


def _figures(side: dict[str, Any]) -> dict[str, Any]:
    from benchmarks.state.report import _figures

    return _figures(side)


def test_runtime_side_reports_every_figure(broker: Broker, tmp_path: Path) -> None:
    # One layout: the default runs every layout the runtime accepts.
    code, result, text = _run(
        broker,
        tmp_path,
        "--ks-memory=",
        "--layouts=per-task",
        "--feed-s=4",
        f"--feed-rate={FED // 4}",
    )
    assert code == 0, [(s.get("layout"), s.get("error")) for s in result["sides"]]
    (side,) = result["sides"]
    assert side["ok"] and side["layout"] == "per-task" and side["partitions"] == 4
    figures = _figures(side)
    missing = [k for k in RUNTIME_FIGURES if figures.get(k) is None or figures[k] != figures[k]]
    assert not missing, figures
    assert figures["commits"] >= 1 and figures["restored_records"] > 0
    assert figures["commit_median_ms"] <= figures["commit_p99_ms"]
    # The steady feed's records are processed and counted too, in both stores.
    process = side["process"]
    assert process["fed"] == FED and process["processed"] == RECORDS + FED
    assert process["steady_commits"] >= 1
    assert process["steady_commit_median_ms"] <= process["steady_commit_p99_ms"]
    # Where the slowest steady commit's time went, step by step.
    assert set(process["steady_commit_slowest_steps_ms"]) >= {"flush", "stores"}
    assert "Steady commits, median / p99 ms per step: flush " in text
    assert side["restore"]["counted"] == RECORDS + FED == side["restore"]["windowed_counted"]
    assert "| per-task | 4 |" in text and "not judged (needs both layouts)" in text
    assert result["verdicts"][0].startswith("RSS bounded (per-task, 4 tasks)")


def test_a_failed_side_gives_no_verdict_and_exits_1(broker: Broker, tmp_path: Path) -> None:
    code, result, text = _run(
        broker,
        tmp_path,
        "--ks-memory=",
        "--layouts=per-task",
        "--set",
        "state.rocksdb.memory.bytes=1",
    )
    assert code == 1
    (side,) = result["sides"]
    assert not side["ok"] and "state.rocksdb.memory.bytes" in side["error"], side
    assert result["verdicts"] == [
        f"No verdict: runtime (per-task, 4 tasks) failed: {side['error']}"
    ]
    assert "| per-task | 4 | FAILED |" in text and "## Targets\n\n- No verdict: " in text


def test_kafka_streams_side_reports_its_figures(broker: Broker, tmp_path: Path) -> None:
    missing = build.java_missing()
    if missing:
        pytest.skip(missing)
    code, result, _text = _run(broker, tmp_path, "--layouts=", "--ks-memory=default")
    assert code == 0, [s.get("error") for s in result["sides"]]
    (ks,) = result["sides"]
    assert ks["side"] == "kafka-streams" and ks["ok"]
    figures = _figures(ks)
    for name in ("records_per_s", "open_s", "restore_s", "peak_rss_mb", "commits"):
        value = figures[name]
        assert value is not None and not (isinstance(value, float) and math.isnan(value)), figures
    assert figures["restored_records"] > 0
