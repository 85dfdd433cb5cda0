"""The store-layer commit benchmark (issue 34's commit target) runs on the
runtime's own store classes and measures what it says: the reference mode
syncs every store and checkpoint at each commit, so it is the slowest, and
the report judges the layouts against it."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import state_commit


def test_every_mode_runs_and_the_report_judges_against_the_reference(
    tmp_path: Path, capsys: object
) -> None:
    code = state_commit.main(
        ["--tasks", "4", "--dirty", "3", "--commits", "6", "--warmup", "1", "--out", str(tmp_path)]
    )
    assert code == 0
    results = {
        r["mode"]: r for r in json.loads((tmp_path / "state-commit.json").read_text())["results"]
    }
    assert set(results) == set(state_commit.MODES)
    for result in results.values():
        assert result["stores"] == 8 and result["commits"] == 6
        assert 0 < result["median_ms"] <= result["p99_ms"] <= result["max_ms"]
    # Eight store syncs and eight file fsyncs a commit against one synced batch.
    assert results["synced-per-store"]["median_ms"] > results["consolidated"]["median_ms"]
    text = (tmp_path / "state-commit.md").read_text()
    assert "## Target: commit p99 at least 5x lower than one synced write per store" in text
    assert "- consolidated: p99" in text and "- per-task: p99" in text
