"""The supervisor's pure parts (runtime.isolation.workers, runtime.isolation.merge):
restart backoff, exit reasons, the merged status of several processes."""

from __future__ import annotations

import signal

from hypothesis import given
from hypothesis import strategies as st

from runtime.isolation.merge import merge_statuses
from runtime.isolation.workers import _exit_reason, restart_delay_ms
from runtime.status import AppStatus, ProcessStatus


def test_first_death_restarts_at_once_then_backoff_doubles_to_its_cap() -> None:
    delays = [restart_delay_ms(n, 1000, 60000) for n in range(9)]
    assert delays == [0, 1000, 2000, 4000, 8000, 16000, 32000, 60000, 60000]


@given(st.integers(0, 10_000), st.integers(0, 3_600_000), st.integers(0, 3_600_000))
def test_backoff_never_exceeds_its_cap_and_never_shrinks(deaths: int, base: int, cap: int) -> None:
    delay = restart_delay_ms(deaths, base, cap)
    assert 0 <= delay <= max(cap, 0)
    assert restart_delay_ms(deaths + 1, base, cap) >= delay


def test_exit_reasons_name_the_signal_or_the_code() -> None:
    assert _exit_reason(-signal.SIGKILL, None) == "killed by SIGKILL"
    assert _exit_reason(1, "TaskFailed: boom") == "exited with code 1: TaskFailed: boom"


def _status(tasks: list[str], processed: int, lag: dict[str, int]) -> AppStatus:
    return AppStatus.from_dict(
        {
            "tasks": [{"id": t, "partitions": [f"in-{t[-1]}"]} for t in tasks],
            "processed": processed,
            "consumed": processed,
            "lag": lag,
            "total_lag": sum(lag.values()),
            "restores": {t: {"records": 3} for t in tasks},
            "last_commit": 10.0 + processed,
        }
    )


def test_merged_status_sums_counts_and_says_which_process_owns_each_task() -> None:
    base = {
        "application_id": "app",
        "client_id": "app",
        "instance_id": "app-1",
        "state": "RUNNING",
        "processing_guarantee": "exactly_once_v2",
    }
    rows = [
        ProcessStatus("p0", 0, 11, "RUNNING", True),
        ProcessStatus("p1", 1, None, "DEAD", False, restarts=2, last_exit="killed by SIGKILL"),
    ]
    merged = merge_statuses(
        base,
        rows,
        {"p0": _status(["0_0", "0_1"], 5, {"in-0": 1}), "p1": _status(["0_2"], 7, {"in-2": 4})},
    )
    assert merged.processed == merged.consumed == 12
    assert merged.total_lag == 5 and merged.lag == {"in-0": 1, "in-2": 4}
    assert [(t.id, t.process) for t in merged.tasks] == [
        ("0_0", "p0"),
        ("0_1", "p0"),
        ("0_2", "p1"),
    ]
    assert merged.restores["0_2"] == {"records": 3, "process": "p1"}
    assert merged.last_commit == 17.0
    again = AppStatus.from_dict(merged.to_dict())
    assert again.processes == tuple(rows)
    assert again.tasks[2].process == "p1"


def test_expositions_merge_into_one_family_per_name_with_a_process_label() -> None:
    from prometheus_client.core import Metric
    from prometheus_client.parser import text_string_to_metric_families

    from runtime.isolation.pool_metrics import relabel

    text = (
        "# HELP streams_records_processed_total Records processed.\n"
        "# TYPE streams_records_processed_total counter\n"
        "streams_records_processed_total 5.0\n"
        "# HELP streams_consumer_lag Lag.\n"
        "# TYPE streams_consumer_lag gauge\n"
        'streams_consumer_lag{partition="0",topic="in"} 3.0\n'
    )
    merged: dict[str, Metric] = {}
    relabel(text_string_to_metric_families(text), "p0", merged)
    relabel(text_string_to_metric_families(text.replace("5.0", "7.0")), "p1", merged)
    processed = merged["streams_records_processed"]
    assert processed.type == "counter"
    assert [(s.labels, s.value) for s in processed.samples if s.name.endswith("_total")] == [
        ({"process": "p0"}, 5.0),
        ({"process": "p1"}, 7.0),
    ]
    lag = merged["streams_consumer_lag"].samples
    assert [s.labels["process"] for s in lag] == ["p0", "p1"]
    assert all(s.labels["topic"] == "in" for s in lag)
