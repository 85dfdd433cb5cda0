"""The benchmark harness's own rules, without a broker (issues 32 and 37).

- A session in which a side failed gives no verdict, says which side failed
  and why, and exits non-zero (compare, peers, quick, stateless reports).
- Ctrl-C ends a compare-harness session at once: no further run, the
  broker's session closed, the runs so far written and marked partial, exit 130.
- Results go to the git-ignored ``benchmarks/results/local/`` unless asked.
- The harness's own clients write no raw librdkafka lines to stderr.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from benchmarks import interrupt, quick
from benchmarks import report as stateless_report
from benchmarks.compare import report as compare_report
from benchmarks.outputs import COMMITTED_RESULTS, LOCAL_RESULTS, output_dir
from benchmarks.peers import report as peers_report

BASELINE_ERROR = (
    "RuntimeError: child failed: AttributeError: 'dict' object has no attribute 'tasks'"
)


def _run(workload: str, model: str, threads: int, rate: float, **extra: Any) -> dict[str, Any]:
    return {
        "workload": workload,
        "model": model,
        "threads": threads,
        "repeat": 1,
        "records_per_s": rate,
        "records_per_s_processed": rate * 1.1,
        "cpu_s_per_million": 10.0,
        "connections_at_ready": 5,
        "peak_rss_mb": 60.0,
        "seconds": 1.0,
        "correct": True,
        **extra,
    }


def _failed(workload: str, model: str, threads: int) -> dict[str, Any]:
    # As run_one records a run whose child failed at its end (issue 32): the
    # figures were measured, the run is not correct and carries the error.
    return _run(workload, model, threads, 50_000.0, correct=False, error=BASELINE_ERROR)


def _result(runs: list[dict[str, Any]], models: list[str], **extra: Any) -> dict[str, Any]:
    workloads = sorted({r["workload"] for r in runs}, key=["stateless", "stateful"].index)
    return {
        "name": "compare",
        "command": "python -m benchmarks compare",
        "threads": [1, 2],
        "models": models,
        "repeats": 1,
        "partitions": 8,
        "config": {"commit.interval.ms": 1000},
        "machine": {"nproc": 2, "broker": "test"},
        "workloads": {
            w: {
                "title": w,
                "description": w,
                "backlog": 1000,
                "backlog_per_partition": [125] * 8,
                "feed_rate": 0.0,
                "feed_seconds": 0.0,
                "restore_records": None,
                "output_check": "count" if w == "stateless" else "sum",
            }
            for w in workloads
        },
        "runs": runs,
        **extra,
    }


def _compare_markdown(result: dict[str, Any]) -> str:
    result["summary"] = compare_report.summarize(result)
    return compare_report.markdown(result)


def _pairs(baseline_fails: bool) -> list[dict[str, Any]]:
    runs = []
    for wl in ("stateless", "stateful"):
        for n in (1, 2):
            runs.append(_run(wl, "runtime", n, 100_000.0))
            runs.append(
                _failed(wl, "baseline", n) if baseline_fails else _run(wl, "baseline", n, 90_000.0)
            )
    return runs


def test_compare_with_every_baseline_run_failed_gives_no_verdict_and_fails() -> None:
    result = _result(_pairs(baseline_fails=True), ["runtime", "baseline"])
    md = _compare_markdown(result)
    assert "met everywhere" not in md
    assert "No verdict" in md
    # Which side failed, where, and why.
    assert f"baseline (reference side) failed: stateless t=1 r1: {BASELINE_ERROR}" in md, md
    assert compare_report.exit_code(result) == 1


def test_compare_with_both_sides_complete_gives_its_verdict() -> None:
    result = _result(_pairs(baseline_fails=False), ["runtime", "baseline"])
    md = _compare_markdown(result)
    assert "met everywhere" in md and "No verdict" not in md and "FAILED" not in md
    assert compare_report.exit_code(result) == 0


def test_compare_never_claims_a_target_no_thread_count_measured() -> None:
    # No failure recorded at all, and no baseline either: nothing was compared.
    runs = [_run("stateless", "runtime", n, 100_000.0) for n in (1, 2)]
    md = _compare_markdown(_result(runs, ["runtime"]))
    assert "met everywhere" not in md
    assert "no thread count ran both" in md


def test_a_failed_runtime_run_withholds_the_verdict_too() -> None:
    runs = _pairs(baseline_fails=False)
    runs[0] = _failed("stateless", "runtime", 1)
    result = _result(runs, ["runtime", "baseline"])
    md = _compare_markdown(result)
    assert "runtime (measured side) failed" in md and "met everywhere" not in md
    assert compare_report.exit_code(result) == 1


def test_an_interrupted_session_is_marked_partial_without_verdict() -> None:
    result = _result(
        _pairs(baseline_fails=False),
        ["runtime", "baseline"],
        partial={
            "reason": "interrupted (SIGINT)",
            "during": "stateful runtime t=2 r1",
            "runs_done": 6,
        },
    )
    md = _compare_markdown(result)
    assert "PARTIAL RESULTS" in md and "stateful runtime t=2 r1" in md
    assert "met everywhere" not in md and "No verdict" in md
    assert compare_report.exit_code(result) == interrupt.EXIT_INTERRUPTED


def test_peers_report_gives_no_verdict_when_a_peer_failed() -> None:
    runs = [
        _run("stateless", "runtime", 1, 100_000.0, records_per_s_first_to_last=120_000.0),
        _failed("stateless", "quixstreams", 1),
    ]
    result = _result(runs, ["runtime", "quixstreams"])
    result["summary"] = peers_report.summarize(result)
    md = peers_report.markdown(result)
    assert "quixstreams (reference side) failed" in md
    assert "No verdict" in md and ">= 2x:" not in md


def test_stateless_report_gives_no_verdict_when_the_raw_loop_failed() -> None:
    from benchmarks.workloads.stateless import summarize_runs

    runtime = {
        "model": "runtime",
        "threads": 1,
        "repeat": 1,
        "records": 1000,
        "records_per_s": 50_000.0,
        "records_per_s_from_first_record": 60_000.0,
        "records_per_s_from_first_consumed": 60_000.0,
        "cpu_s": 0.02,
        "broker_cpu_s": 0.01,
        "peak_rss_mb": 60.0,
        "join_s": 0.5,
        "first_record_s": 0.5,
        "flush_s": 0.01,
        "seconds_from_first_record": 0.02,
        "correct": True,
    }
    raw = {"model": "raw", "threads": 1, "repeat": 1, "error": "raw_loop failed: boom"}
    runs = [raw, runtime]
    result = {
        "workload": "stateless",
        "description": "d",
        "records": 1000,
        "partitions": 8,
        "repeats": 1,
        "machine": {},
        "target_ratio": 0.7,
        "ratio_basis": "b",
        "runs": runs,
        "summary": summarize_runs(runs),
    }
    md = stateless_report.markdown(result)
    assert "No verdict" in md and "raw loop (reference)" in md
    assert "target)" not in md  # no "meets/misses the 0.7x target" line


def _quick_result(baseline_fails: bool, noisy: bool = False) -> dict[str, Any]:
    runs = []
    for wl in ("stateless", "stateful"):
        runs.append(_run(wl, "raw", 1, 120_000.0))
        for n in (1, 2):
            runs.append(_run(wl, "runtime", n, 100_000.0, noisy=noisy and n == 2))
            runs.append(
                _failed(wl, "baseline", n) if baseline_fails else _run(wl, "baseline", n, 90_000.0)
            )
    result = _result(runs, list(quick.MODELS), quiet_wait=5.0, redo_noisy=0)
    result["summary"] = quick.summarize(result)
    return result


def test_quick_gives_every_ratio_and_targets_when_all_ran() -> None:
    result = _quick_result(baseline_fails=False)
    ratios = {(q["workload"], q["threads"], q["reference"]): q for q in result["summary"]["ratios"]}
    assert len(ratios) == 8  # 2 workloads x 2 thread counts x 2 references
    assert ratios[("stateless", 2, "raw")]["reference_threads"] == 1
    assert ratios[("stateless", 1, "raw")]["records_per_s"] == pytest.approx(100 / 120)
    md = quick.markdown(result)
    assert "meets 0.97x" in md and "below 0.70x" not in md and "meets 0.70x" in md
    assert "Quiet: none of the 10 runs was noisy." in md
    assert compare_report.exit_code(result) == 0


def test_quick_with_a_failed_baseline_gives_no_verdict() -> None:
    result = _quick_result(baseline_fails=True)
    md = quick.markdown(result)
    assert "**FAILED: no verdict.**" in md and "baseline (reference side) failed" in md
    assert "meets" not in md and "below" not in md
    assert compare_report.exit_code(result) == 1


def test_quick_says_plainly_which_figures_are_noisy(tmp_path: Path) -> None:
    result = _quick_result(baseline_fails=False, noisy=True)
    md = quick.markdown(result)
    assert "**NOISY: 2 of 10 runs**" in md
    assert "stateless runtime t=2 r1" in md
    lines = quick.closing_lines(result)
    assert lines[0].startswith("NOISY: 2 of 10 runs") and "stateless t=2 vs baseline" in lines[0]
    pytest.importorskip("matplotlib")
    path = quick.plot(str(tmp_path), "quick", result)
    assert path is not None and Path(path).stat().st_size > 0


def test_noise_explanation_says_what_the_options_do_and_how_to_get_quieter() -> None:
    text = quick.noise_explanation(5.0, 0)
    assert "--quiet-wait" in text and "--redo-noisy" in text and "quieter" in text


# -- Ctrl-C ends a session -------------------------------------------------------------


class _FakeSession:
    entered = 0
    exited = 0

    def __init__(self, *_args: Any, **_kwargs: Any) -> None:
        self.bootstrap = "127.0.0.1:1"

    def __enter__(self) -> _FakeSession:
        _FakeSession.entered += 1
        return self

    def __exit__(self, *exc: object) -> None:
        _FakeSession.exited += 1


def test_ctrl_c_ends_the_whole_session_and_writes_partial_results(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import benchmarks.compare.session as session
    import benchmarks.harness as harness
    from benchmarks.compare.main import Suite, run_suite

    calls: list[tuple[str, int]] = []
    stopped: list[int] = []

    def fake_run_one(_session: Any, settings: Any, model: str, threads: int, repeat: int) -> Any:
        calls.append((model, threads))
        if len(calls) == 2:
            # The child of this run is registered, as Child does; Ctrl-C arrives.
            interrupt.register_child(4242, lambda: stopped.append(4242))
            raise KeyboardInterrupt
        return _run(settings.workload.name, model, threads, 1000.0)

    monkeypatch.setattr(session, "run_one", fake_run_one)
    monkeypatch.setattr(harness, "BenchSession", _FakeSession)
    monkeypatch.setattr(harness, "machine_info", lambda _kind="kafka": {"broker": "fake"})
    interrupt.reset()
    try:
        suite = Suite(
            name="compare",
            command="test",
            workloads=["stateless", "stateful"],
            models=["runtime", "baseline"],
            threads=[1, 2],
            repeats=2,
            partitions=2,
            records={"stateless": 10, "stateful": 10},
            rates={},
            feed_seconds=0.0,
            restore_records=0,
            echo_delay_ms=0.0,
            config={},
            out_dir=str(tmp_path),
            quiet_wait=0.0,
            redo_noisy=0,
            report=compare_report,
            print_report=False,
        )
        started = time.monotonic()
        result = run_suite(suite)
        assert time.monotonic() - started < 10
    finally:
        interrupt.reset()
    assert len(calls) == 2, "no run after the interrupt"
    assert _FakeSession.exited == _FakeSession.entered == 1  # the broker's session closed
    assert stopped == [4242]  # the interrupted run's child
    assert result["partial"]["runs_done"] == 1
    assert result["partial"]["during"].startswith("stateless ")
    saved = json.loads((tmp_path / "compare.json").read_text())
    assert saved["partial"] and len(saved["runs"]) == 1
    assert "PARTIAL RESULTS" in (tmp_path / "compare.md").read_text()
    assert compare_report.exit_code(result) == interrupt.EXIT_INTERRUPTED


def test_a_run_ended_by_the_same_ctrl_c_is_not_counted_and_stops_the_session(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child got the terminal's SIGINT too and its run came back failed: the
    session must not record it as a failure and go on to the next run."""
    import benchmarks.compare.session as session
    import benchmarks.harness as harness
    from benchmarks.compare.main import Suite, run_suite

    calls: list[str] = []

    def fake_run_one(_session: Any, settings: Any, model: str, threads: int, repeat: int) -> Any:
        calls.append(model)
        interrupt.mark()  # the handler ran, but its KeyboardInterrupt was swallowed
        return _failed(settings.workload.name, model, threads)

    monkeypatch.setattr(session, "run_one", fake_run_one)
    monkeypatch.setattr(harness, "BenchSession", _FakeSession)
    monkeypatch.setattr(harness, "machine_info", lambda _kind="kafka": {})
    interrupt.reset()
    try:
        result = run_suite(
            Suite(
                name="compare",
                command="test",
                workloads=["stateless"],
                models=["runtime", "baseline"],
                threads=[1],
                repeats=3,
                partitions=2,
                records={"stateless": 10},
                rates={},
                feed_seconds=0.0,
                restore_records=0,
                echo_delay_ms=0.0,
                config={},
                out_dir=str(tmp_path),
                quiet_wait=0.0,
                redo_noisy=0,
                report=compare_report,
                print_report=False,
            )
        )
    finally:
        interrupt.reset()
    assert len(calls) == 1
    assert result["runs"][0]["discarded"] == "interrupted"
    assert compare_report.failed_runs(result) == []
    assert compare_report.exit_code(result) == interrupt.EXIT_INTERRUPTED


# -- where results go ---------------------------------------------------------------------


def _args(**kwargs: Any) -> Any:
    import argparse

    return argparse.Namespace(**{"out": None, "update_results": False, **kwargs})


def test_results_go_to_the_ignored_local_folder_unless_asked() -> None:
    assert Path(output_dir(_args())).resolve() == Path(LOCAL_RESULTS)
    assert Path(output_dir(_args(update_results=True))).resolve() == Path(COMMITTED_RESULTS)
    assert output_dir(_args(out="/tmp/elsewhere")) == "/tmp/elsewhere"
    with pytest.raises(SystemExit):
        output_dir(_args(out="/tmp/elsewhere", update_results=True))


def test_every_workload_defaults_to_the_local_folder() -> None:
    import argparse
    import importlib

    from benchmarks.workloads import WORKLOADS

    for name, module_name in WORKLOADS.items():
        parser = argparse.ArgumentParser()
        importlib.import_module(module_name).add_arguments(parser)
        args = parser.parse_args([])
        assert args.out is None and args.update_results is False, name
        assert Path(output_dir(args)).resolve() == Path(LOCAL_RESULTS), name


def test_the_local_results_folder_is_ignored_by_git() -> None:
    root = Path(COMMITTED_RESULTS).parents[1]
    ignored = (root / ".gitignore").read_text().splitlines()
    assert "benchmarks/results/local/" in ignored


# -- librdkafka's lines ----------------------------------------------------------------------


def test_harness_clients_write_no_raw_librdkafka_lines(
    tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    from confluent_kafka import Producer

    from benchmarks.harness import client_config, log_librdkafka_to

    log_librdkafka_to(str(tmp_path))
    try:
        # Nothing listens on port 1: librdkafka logs a connection failure (%3|...|FAIL|).
        producer = Producer(
            client_config({"bootstrap.servers": "127.0.0.1:1", "reconnect.backoff.ms": 10})
        )
        deadline = time.monotonic() + 10
        log = tmp_path / "librdkafka.log"
        while time.monotonic() < deadline and not (log.exists() and log.read_text()):
            producer.poll(0.1)
        del producer
    finally:
        log_librdkafka_to(None)
    captured = capfd.readouterr()
    assert "%3|" not in captured.err and "%4|" not in captured.err
    assert "127.0.0.1:1" in log.read_text()
