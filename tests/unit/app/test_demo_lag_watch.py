"""The demo says once when its load outruns the machine (issue 32)."""

from __future__ import annotations

from runtime.demo import LagWatch


def test_growing_lag_below_the_load_rate_is_said_once() -> None:
    watch = LagWatch()
    said = [watch.note(lag=100 * i, rate_in=15_000, rate=20_000) for i in range(30)]
    assert said.count(True) == 1 and said.index(True) == LagWatch.SECONDS


def test_lag_that_stops_growing_or_a_keeping_up_app_is_not_said() -> None:
    watch = LagWatch()
    lags = [100 * i if i % 5 else 0 for i in range(40)]  # drains every 5 s
    assert not any(watch.note(lag, 15_000, 20_000) for lag in lags)
    keeping_up = LagWatch()
    assert not any(keeping_up.note(100 * i, 20_000, 20_000) for i in range(40))
