"""The peers benchmark's pure parts: which model runs where, how each child is launched,
and how the report turns runs into ratios and target verdicts (no broker, no JVM)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from benchmarks.peers import report
from benchmarks.peers.models import Launcher, runs


def test_quixstreams_runs_single_threaded_and_only_the_cpu_workloads() -> None:
    assert runs("quixstreams", "stateless", 1)
    assert runs("quixstreams", "stateful", 1)
    assert not runs("quixstreams", "stateless", 2)
    assert not runs("quixstreams", "io", 1)
    assert all(runs(m, "skew", 4) for m in ("runtime", "ks-classic", "ks-proc"))


def _spec(workload: str = "stateless") -> dict[str, Any]:
    return {
        "workload": workload,
        "topology": "stateless",
        "config": {
            "commit.interval.ms": 1000,
            "consumer.session.timeout.ms": 3000,
            "consumer.heartbeat.interval.ms": 1000,
            "processing.threads": 4,  # runtime-only: must not reach the peers
        },
    }


def test_launcher_gives_kafka_streams_its_mode_config_and_warmup() -> None:
    launch = Launcher(
        jar=Path("/cache/ks-peer.jar"),
        ks_settings={"producer.linger.ms": 5},
        jvm_opts=["-Xmx1g"],
        warmup={"stateless": 1234},
    )
    argv, spec = launch("ks-proc", _spec())
    assert argv == ["java", "-Xmx1g", "-jar", "/cache/ks-peer.jar"]
    assert spec["mode"] == "processing-threads"
    assert spec["warmup_records"] == 1234
    assert spec["config"] == {
        "commit.interval.ms": "1000",
        "consumer.session.timeout.ms": "3000",
        "consumer.heartbeat.interval.ms": "1000",
        "producer.linger.ms": "5",
    }
    _argv, classic = launch("ks-classic", _spec("io"))
    assert classic["mode"] == "classic" and classic["warmup_records"] == 0


def test_launcher_runs_quixstreams_in_its_virtualenv_and_runtime_as_before() -> None:
    launch = Launcher(quix_python=Path("/venv/bin/python"), quix_settings={"consumer.x": "y"})
    argv, spec = launch("quixstreams", _spec())
    assert argv == ["/venv/bin/python", "-m", "benchmarks.peers.quix_child"]
    assert "processing.threads" not in spec["config"]
    assert spec["config"]["consumer.x"] == "y"
    argv, spec = launch("runtime", _spec())
    assert argv == [] and spec == _spec()
    with pytest.raises(RuntimeError, match="not built"):
        Launcher()("ks-classic", _spec())
    with pytest.raises(ValueError, match="unknown model"):
        Launcher()("flink", _spec())


def _run(workload: str, model: str, threads: int, rate: float, **extra: Any) -> dict[str, Any]:
    return {
        "workload": workload,
        "model": model,
        "threads": threads,
        "repeat": 1,
        "correct": True,
        "records_per_s": rate * 0.9,
        "records_per_s_first_to_last": rate,
        "cpu_s_per_million": 10.0,
        "peak_rss_mb": 100.0,
        "connections_at_ready": 5,
        "latency": {"p50_ms": 10.0, "p99_ms": 20.0},
        **extra,
    }


def _result(runs_: list[dict[str, Any]]) -> dict[str, Any]:
    workloads = {
        "stateless": {"output_check": "count"},
        "stateful": {"output_check": "sum"},
        "io": {"output_check": "count"},
    }
    for w in workloads.values():
        w.update(title="t", description="d", backlog=10, backlog_per_partition=[10], feed_rate=1.0)
        w.update(feed_seconds=1.0)
    return {
        "command": "python -m benchmarks peers",
        "repeats": 1,
        "threads": [1, 2],
        "models": ["runtime", "ks-classic", "ks-proc", "quixstreams"],
        "config": {},
        "machine": {},
        "workloads": workloads,
        "runs": runs_,
    }


def test_report_judges_each_target_on_its_throughput_figure() -> None:
    result = _result(
        [
            # stateless judged on first-to-last output: 2.5x quixstreams (met)
            _run("stateless", "runtime", 1, 50_000.0, records_per_s=30_000.0),
            _run("stateless", "quixstreams", 1, 20_000.0),
            # stateful judged from go to complete (records_per_s): 1.5x (missed)
            _run("stateful", "runtime", 1, 0.0, records_per_s=30_000.0),
            _run("stateful", "quixstreams", 1, 0.0, records_per_s=20_000.0),
            # io: equal at 1 thread, behind at 2 (0.9x < 0.97x)
            _run("io", "runtime", 1, 900.0),
            _run("io", "ks-classic", 1, 900.0),
            _run("io", "runtime", 2, 1_800.0),
            _run("io", "ks-classic", 2, 2_000.0),
        ]
    )
    result["summary"] = report.summarize(result)
    text = report.markdown(result)
    assert "- stateless: runtime (1 thread) / quixstreams >= 2x: 2.50x, met" in text
    assert "- stateful: runtime (1 thread) / quixstreams >= 2x: 1.50x, missed" in text
    assert "t=1: 1.00x, t=2: 0.90x; missed at t=2." in text
    ratios = {(r["workload"], r["threads"], r["peer"]): r for r in report.ratios(result)}
    assert ratios[("io", 2, "ks-classic")]["throughput_figure"] == "records_per_s_first_to_last"
    assert ratios[("stateful", 1, "quixstreams")]["records_per_s"] == pytest.approx(1.5)
    # The runtime at 2 threads is compared with quixstreams' one thread.
    assert ("stateless", 2, "quixstreams") not in ratios  # no runtime run at t=2 here


def test_two_quixstreams_processes_run_through_the_group_child() -> None:
    assert runs("quixstreams-p2", "stateful", 1)
    assert not runs("quixstreams-p2", "stateful", 2)
    assert not runs("quixstreams-p2", "io", 1)
    argv, spec = Launcher(quix_python=Path("/venv/bin/python"))("quixstreams-p2", _spec())
    assert argv == ["/venv/bin/python", "-m", "benchmarks.peers.quix_group"]
    assert spec["processes"] == 2


def test_the_processes_table_compares_two_runtime_processes_with_two_quixstreams_ones() -> None:
    result = _result(
        [
            _run("stateful", "runtime", 1, 0.0, records_per_s=10_000.0),
            _run("stateful", "runtime-p2", 1, 0.0, records_per_s=15_000.0),
            _run("stateful", "quixstreams-p2", 1, 0.0, records_per_s=5_000.0),
        ]
    )
    result["models"] = ["runtime", "runtime-p2", "quixstreams-p2"]
    text = report.markdown(result)
    rows = [line for line in text.splitlines() if line.startswith("| stateful | 1 | 1.50x")]
    assert rows, text
    assert "| 3.00x |" in rows[0]
