"""The supervisor's pure parts (runtime.isolation.workers, runtime.isolation.merge):
restart backoff, exit reasons, the merged status of several processes."""

from __future__ import annotations

import json
import signal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.config import StreamsConfig
from runtime.isolation import workers
from runtime.isolation.merge import merge_statuses
from runtime.isolation.slots import exit_reason, restart_delay_ms
from runtime.isolation.workers import WorkerPool
from runtime.lifecycle import IllegalStateError
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
    assert exit_reason(-signal.SIGKILL, None) == "killed by SIGKILL"
    assert exit_reason(1, "TaskFailed: boom") == "exited with code 1: TaskFailed: boom"


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


# --- the pool's reconcile step, with fake children ---------------------------------------


class FakeChild:
    """A `ChildProcess` stand-in: `launch` reports a running app at once;
    `die` ends it as kill -9 would; a stop request ends it at once."""

    pids = iter(range(1000, 10_000))
    made: list[FakeChild] = []

    def __init__(self, name: str, spec_line: str, on_event: Any, on_exit: Any) -> None:
        self.name = name
        self.spec = json.loads(spec_line)
        self._on_event, self._on_exit = on_event, on_exit
        self.alive = False
        self.exited = False
        self.stopping = False
        self._pid = 0
        self.asked: list[tuple[str, dict[str, Any]]] = []
        FakeChild.made.append(self)

    @property
    def pid(self) -> int | None:
        return self._pid if self.alive else None

    def launch(self) -> int:
        self.alive, self._pid = True, next(FakeChild.pids)
        self._on_event({"event": "started"})
        self._on_event({"event": "status", "state": "RUNNING", "tasks": 1, "processed": 10})
        return self._pid

    def wait_started(self, timeout: float) -> None:
        assert self.alive

    def die(self, code: int = -signal.SIGKILL) -> None:
        self.alive, self.exited = False, True
        self._on_exit(code, None, self.stopping, True)

    def wait(self, timeout: float | None = None) -> bool:
        return self.exited

    def request_stop(self) -> None:
        self.stopping = True
        if self.alive:
            self.die(0)

    def request(self, op: str, wait_s: float, **fields: Any) -> Any:
        self.asked.append((op, fields))
        return None

    def kill(self) -> None:
        if self.alive:
            self.die()


def _pool(
    monkeypatch: pytest.MonkeyPatch, processes: int, **extra: Any
) -> tuple[WorkerPool, list[float]]:
    """A pool of fake children whose reconcile runs only when the test says,
    on a clock the test moves."""
    monkeypatch.setattr(workers, "_RECONCILE_S", 3600.0)
    clock = [1000.0]
    monkeypatch.setattr(workers, "_now", lambda: clock[0])
    config = StreamsConfig.from_dict(
        {
            "application.id": "app",
            "bootstrap.servers": "127.0.0.1:9092",
            "processes": processes,
            "process.restart.backoff.ms": 1000,
            "process.restart.backoff.max.ms": 4000,
            "consumer.group.instance.id": "pod-7",
            **extra,
        }
    )
    FakeChild.made.clear()
    return WorkerPool(config, "tests.apps.count_app:topology", child_factory=FakeChild), clock


def _slot(pool: WorkerPool, name: str) -> ProcessStatus:
    return next(r for r in pool.process_rows() if r.name == name)


def test_each_slot_has_its_own_identity(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = _pool(monkeypatch, 2)
    pool.start()
    specs = [child.spec for child in FakeChild.made]
    assert [s["slot"] for s in specs] == [0, 1]
    assert [s["config"]["client.id"] for s in specs] == ["app-p0", "app-p1"]
    assert [s["config"]["consumer.group.instance.id"] for s in specs] == ["pod-7-p0", "pod-7-p1"]
    assert [s["config"]["process.slot"] for s in specs] == [0, 1]
    assert all("processes" not in s["config"] for s in specs)
    assert pool.close(1)


def test_a_dead_slot_restarts_at_once_then_after_a_doubling_backoff(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, clock = _pool(monkeypatch, 2)
    pool.start()
    assert str(pool.state) == "RUNNING"
    assert pool.progress().processed == 20
    first = FakeChild.made[1]
    first.die()
    assert str(pool.state) == "REBALANCING"
    row = _slot(pool, "p1")
    assert (row.up, row.restarts, row.last_exit) == (False, 1, "killed by SIGKILL")
    pool.reconcile()  # the first death: at once
    second = FakeChild.made[-1]
    assert second is not first and _slot(pool, "p1").up
    second.die()  # again within a minute of its start: 1 s
    pool.reconcile()
    assert not _slot(pool, "p1").up
    clock[0] += 0.9
    pool.reconcile()
    assert not _slot(pool, "p1").up
    clock[0] += 0.2
    pool.reconcile()
    third = FakeChild.made[-1]
    assert third.alive and _slot(pool, "p1").restarts == 2
    third.die()  # and again: 2 s
    clock[0] += 1.5
    pool.reconcile()
    assert not _slot(pool, "p1").up
    clock[0] += 0.6
    pool.reconcile()
    assert _slot(pool, "p1").up
    clock[0] += 61  # a minute up: the next death restarts at once again
    FakeChild.made[-1].die()
    pool.reconcile()
    assert _slot(pool, "p1").up and _slot(pool, "p1").restarts == 4
    assert _slot(pool, "p0").restarts == 0
    assert pool.close(1) and pool.wait(0)
    assert str(pool.state) == "NOT_RUNNING"


def test_resizing_starts_new_slots_and_stops_the_highest(monkeypatch: pytest.MonkeyPatch) -> None:
    pool, _ = _pool(monkeypatch, 1)
    pool.start()
    rows = pool.set_processes(3, timeout=1)
    assert [(r.name, r.up) for r in rows] == [("p0", True), ("p1", True), ("p2", True)]
    kept = [c for c in FakeChild.made if c.alive]
    rows = pool.set_processes(1, timeout=1)
    assert [r.name for r in rows] == ["p0"]
    assert kept[0].alive and not kept[1].alive and not kept[2].alive
    assert kept[1].stopping and kept[2].stopping  # asked: a graceful close
    assert all(r.restarts == 0 for r in rows)  # a stop asked for is no death
    rows = pool.add_process(timeout=1)
    assert [r.name for r in rows] == ["p0", "p1"]
    with pytest.raises(ValueError, match="at least 1"):
        pool.set_processes(0)
    assert pool.close(1)
    with pytest.raises(RuntimeError, match="NOT_RUNNING"):
        pool.set_processes(2)


def test_a_slot_started_after_a_pause_starts_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pause reaches the running processes and every process started later:
    a restarted slot (whose tasks come back to it) and a new one."""
    pool, _ = _pool(monkeypatch, 2)
    pool.start()
    assert [c.spec["paused_all"] for c in FakeChild.made] == [False, False]
    pool.pause()
    pool.pause("0_3")
    assert all(("pause", {"task": None}) in c.asked for c in FakeChild.made)
    FakeChild.made[1].die()
    pool.reconcile()
    restarted = FakeChild.made[-1]
    assert restarted.spec["paused_all"] is True and restarted.spec["paused_tasks"] == ["0_3"]
    pool.resume("0_3")
    pool.set_processes(3, timeout=1)
    added = FakeChild.made[-1]
    assert added.spec["slot"] == 2
    assert added.spec["paused_all"] is True and added.spec["paused_tasks"] == []
    pool.resume()
    FakeChild.made[0].die()
    pool.reconcile()
    assert FakeChild.made[-1].spec["paused_all"] is False
    assert pool.close(1)


def test_each_process_names_its_daemon_and_standbys_are_accepted() -> None:
    config = StreamsConfig.from_dict(
        {
            "application.id": "app",
            "bootstrap.servers": "127.0.0.1:9092",
            "processes": 2,
            "num.standby.replicas": 1,
        }
    )
    FakeChild.made.clear()
    pool = WorkerPool(config, "tests.apps.count_app:topology", child_factory=FakeChild)
    pool.start()
    daemons = [child.spec["config"]["process.daemon"] for child in FakeChild.made]
    # One daemon id for both processes: standby placement keeps copies off it.
    assert daemons == [pool.instance_id, pool.instance_id]
    assert StreamsConfig.from_dict(FakeChild.made[0].spec["config"]).process_daemon == (
        pool.instance_id
    )
    assert pool.close(1)


def test_prepare_leave_asks_every_process_and_restarts_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pool, clock = _pool(monkeypatch, 2)
    pool.start()
    with pytest.raises(IllegalStateError, match=r"task\.assignment=runtime"):
        pool.prepare_leave()
    assert pool.close(1)

    pool, clock = _pool(monkeypatch, 2, **{"task.assignment": "runtime"})
    pool.start()
    first, second = FakeChild.made
    pool.prepare_leave()
    assert [op for op, _ in first.asked] == ["prepare_leave"]
    assert [op for op, _ in second.asked] == ["prepare_leave"]
    with pytest.raises(RuntimeError, match="leaving"):
        pool.set_processes(3)
    first.die(0)  # handed its tasks over and exited
    clock[0] += 60
    pool.reconcile()
    assert len(FakeChild.made) == 2, "a process that left is not restarted"
    assert not pool.wait(0), "the daemon runs until the last process left"
    second.die(-signal.SIGKILL)  # one that dies while leaving ends the daemon too
    assert pool.wait(0) and str(pool.state) == "NOT_RUNNING"
    assert pool.close(1)
