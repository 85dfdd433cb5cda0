"""The state benchmark's rounds: the layouts' order rotates, and the throughput
verdict is the median of the rounds' paired ratios (benchmarks.state)."""

from __future__ import annotations

from typing import Any

from benchmarks.state.main import _rotated
from benchmarks.state.report import round_ratios, side_name, throughput_verdict


def _side(layout: str, number: int, records_per_s: float, partitions: int = 8) -> dict[str, Any]:
    return {
        "side": "runtime",
        "layout": layout,
        "partitions": partitions,
        "round": number,
        "ok": True,
        "process": {"records_per_s": records_per_s},
        "restore": {},
    }


def test_each_round_starts_one_layout_further_on() -> None:
    layouts = ["per-task", "consolidated"]
    assert [_rotated(layouts, n) for n in range(3)] == [
        ["per-task", "consolidated"],
        ["consolidated", "per-task"],
        ["per-task", "consolidated"],
    ]
    assert _rotated([], 3) == []


def test_ratios_are_paired_within_a_round_and_name_who_ran_first() -> None:
    runs = [
        _side("per-task", 0, 100.0),
        _side("consolidated", 0, 90.0),
        _side("consolidated", 1, 110.0),
        _side("per-task", 1, 100.0),
        _side("per-task", 0, 50.0, partitions=256),  # another task count: not paired here
    ]
    assert round_ratios(runs, 8) == [(0.9, "per-task"), (1.1, "consolidated")]


def test_the_verdict_takes_the_median_so_one_slow_round_does_not_decide() -> None:
    ratios = [1.0, 0.7, 0.98]  # consolidated / per-task per round
    runs = []
    for number, ratio in enumerate(ratios):
        runs += [_side("per-task", number, 100.0), _side("consolidated", number, 100.0 * ratio)]
    verdict = throughput_verdict(runs, 8)
    assert "median 0.98x over 3 rounds" in verdict
    assert verdict.endswith(": met")
    runs = [_side("per-task", 0, 100.0), _side("consolidated", 0, 90.0)]
    assert throughput_verdict(runs, 8).endswith("0.90x per-task (target >= 0.95): NOT met")


def test_a_round_without_both_layouts_is_not_judged() -> None:
    assert "not judged" in throughput_verdict([_side("per-task", 0, 100.0)], 8)


def test_a_later_round_is_named_in_its_side() -> None:
    assert side_name(_side("consolidated", 2, 1.0)) == "runtime (consolidated, 8 tasks, round 3)"
    assert side_name(_side("consolidated", 0, 1.0)) == "runtime (consolidated, 8 tasks)"
