"""The GIL switch interval an app runs with (`gil.switch.interval.us`).

0 (the default) shortens it to 0.1 ms only while named queries of different
priorities run: the polling thread then waits at most that long for each GIL
turn beside a CPU-bound query, which is what kept a high-priority query's
records waiting (issue 17's latency target). The rule is pure; the app part
checks that the process's interval follows the queries and comes back.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import App, StreamsBuilder, serdes
from runtime.processing.query_shares import PRIORITY_SWITCH_INTERVAL_S, switch_interval_s
from runtime.topology.topology import Topology

PYTHON_DEFAULT = 0.005


@given(st.lists(st.integers(-5, 5), max_size=6), st.integers(0, 1_000_000))
def test_configured_interval_wins_else_short_only_when_priorities_differ(
    priorities: list[int], configured_us: int
) -> None:
    got = switch_interval_s(configured_us, priorities, PYTHON_DEFAULT)
    if configured_us > 0:
        assert got == configured_us / 1_000_000
    elif len(set(priorities)) > 1:
        assert got == PRIORITY_SWITCH_INTERVAL_S < PYTHON_DEFAULT
    else:
        assert got == PYTHON_DEFAULT


def test_a_process_interval_already_shorter_is_not_lengthened() -> None:
    assert switch_interval_s(0, [0, 10], 0.0001) == 0.0001


def _copy(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).to(
        sink, key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    return builder.build()


@pytest.fixture
def process_interval() -> Iterator[float]:
    before = sys.getswitchinterval()
    sys.setswitchinterval(PYTHON_DEFAULT)
    yield PYTHON_DEFAULT
    sys.setswitchinterval(before)


def _app(config: dict[str, object]) -> App:
    return App(
        {"light": _copy("l-in", "l-out"), "heavy": _copy("h-in", "h-out")},
        {"application.id": "switch-test", "bootstrap.servers": "localhost:1", **config},
    )


def test_different_priorities_shorten_the_interval_until_they_are_equal_again(
    process_interval: float,
) -> None:
    from runtime.processing.query_shares import QueryShare

    app = _app({"query.light.priority": 10})
    app._queries.apply_priorities()  # what start() does once the checks passed
    assert sys.getswitchinterval() == pytest.approx(PRIORITY_SWITCH_INTERVAL_S)
    app._named.remove("light")  # as remove_query() does, then re-applies
    app._queries.apply_priorities()
    assert sys.getswitchinterval() == pytest.approx(process_interval)
    app._named.add("light", _copy("l-in", "l-out"), QueryShare(priority=10))
    app._queries.apply_priorities()
    assert sys.getswitchinterval() == pytest.approx(PRIORITY_SWITCH_INTERVAL_S)


def test_equal_priorities_leave_the_interval_alone(process_interval: float) -> None:
    _app({"query.light.weight": 3})._queries.apply_priorities()
    assert sys.getswitchinterval() == pytest.approx(process_interval)


def test_a_configured_interval_is_used_whatever_the_priorities(process_interval: float) -> None:
    _app({"gil.switch.interval.us": 2000})._queries.apply_priorities()
    assert sys.getswitchinterval() == pytest.approx(0.002)
