"""The pool's named-query changes: who is asked what, in which order, and
what a process started later starts with (runtime.isolation.pool_queries)."""

from __future__ import annotations

from typing import Any

import pytest

from runtime.config import StreamsConfig
from runtime.isolation.merge import merge_statuses
from runtime.isolation.plan import ChildSpec
from runtime.isolation.pool_queries import AddedQuery, PoolQueries, worker_config
from runtime.status import AppStatus, QueryStatus


class FakeProcesses:
    def __init__(self, names: list[str], refuse: dict[str, str] | None = None) -> None:
        self.names = names
        self.refuse = refuse or {}
        self.calls: list[tuple[str, tuple[str, ...], dict[str, Any]]] = []

    def ask_each(self, op: str, wait_s: float, names: list[str] | None, **fields: Any) -> dict:
        asked = tuple(self.names if names is None else names)
        self.calls.append((op, asked, fields))
        failed = [n for n in asked if n in self.refuse]
        if failed:
            raise RuntimeError("; ".join(f"{n}: {self.refuse[n]}" for n in failed))
        return {n: None for n in asked}


CONFIG = StreamsConfig.from_dict({"application.id": "app", "bootstrap.servers": "localhost:1"})


def pool(
    names: list[str], refuse: dict[str, str] | None = None
) -> tuple[PoolQueries, FakeProcesses]:
    fake = FakeProcesses(names, refuse)
    return PoolQueries(CONFIG, "m:queries", fake.ask_each, lambda: list(fake.names)), fake


def test_an_add_goes_to_one_process_first_then_to_the_rest_and_is_remembered() -> None:
    queries, fake = pool(["p0", "p1", "p2"])
    queries.add(AddedQuery("extra", "m:t", priority=2), None, None, 30.0)
    assert [(op, asked) for op, asked, _ in fake.calls] == [
        ("query.add", ("p0",)),
        ("query.add", ("p1", "p2")),
    ]
    assert fake.calls[0][2]["source"] == "m:t" and fake.calls[0][2]["priority"] == 2
    fields = queries.spec_fields()
    assert fields["queries_added"] == (
        {"name": "extra", "source": "m:t", "priority": 2, "weight": None, "max_threads": None},
    )
    raw: dict[str, Any] = {"query.side.priority": 1, "query.main.weight": 2}
    worker_config(raw, {**fields, "queries_removed": ("side",)})
    # A removed query's keys go (a key naming no query is refused at start).
    assert raw == {"query.extra.priority": 2, "query.main.weight": 2}


def test_an_add_refused_by_the_first_process_changes_nothing_anywhere() -> None:
    queries, fake = pool(["p0", "p1"], refuse={"p0": "QueryError: name in use"})
    with pytest.raises(RuntimeError, match="p0: QueryError: name in use"):
        queries.add(AddedQuery("extra", "m:t"), None, None, 30.0)
    assert [asked for _, asked, _ in fake.calls] == [("p0",)]
    assert queries.spec_fields()["queries_added"] == ()


def test_an_add_failing_in_a_later_process_is_kept_for_its_restart() -> None:
    queries, _ = pool(["p0", "p1"], refuse={"p1": "did not answer"})
    with pytest.raises(RuntimeError, match="p1: did not answer"):
        queries.add(AddedQuery("extra", "m:t"), None, None, 30.0)
    assert [q["name"] for q in queries.spec_fields()["queries_added"]] == ["extra"]


def test_a_reset_runs_in_the_last_process_after_every_other_removed_the_query() -> None:
    queries, fake = pool(["p0", "p1", "p2"])
    queries.add(AddedQuery("extra", "m:t"), None, None, 30.0)
    fake.calls.clear()
    queries.remove("extra", reset=True, timeout=30.0)
    assert [(asked, f["reset"]) for _, asked, f in fake.calls] == [
        (("p0", "p1"), False),
        (("p2",), True),
    ]
    fields = queries.spec_fields()
    assert fields["queries_added"] == () and fields["queries_removed"] == ("extra",)


def test_pause_and_resume_reach_every_process_and_a_restart_starts_paused() -> None:
    queries, fake = pool(["p0", "p1"])
    queries.pause("main")
    assert fake.calls[-1][:2] == ("query.pause", ("p0", "p1"))
    assert queries.spec_fields()["queries_paused"] == ("main",)
    queries.resume("main")
    assert queries.spec_fields()["queries_paused"] == ()


def test_a_spec_with_query_changes_survives_its_json_line() -> None:
    spec = ChildSpec(
        query="",
        source="m:t",
        config={},
        nice=0,
        parent_group="g",
        role="worker",
        slot=1,
        queries_added=({"name": "x", "source": "m:x"},),
        queries_removed=("side",),
        queries_paused=("main",),
    )
    assert ChildSpec.from_line(spec.to_line()) == spec


def _status(*queries: QueryStatus) -> AppStatus:
    return AppStatus.from_dict(
        {
            "application_id": "a",
            "client_id": "c",
            "instance_id": "i",
            "state": "RUNNING",
            "processing_guarantee": "at_least_once",
            "queries": [q.__dict__ for q in queries],
        }
    )


def test_the_daemon_status_lists_each_query_once_with_the_processes_sums() -> None:
    p0 = _status(
        QueryStatus(
            "main", "RUNNING", tasks=2, processed=10, busy_seconds=1.0, lag=3, p99_latency_ms=5.0
        ),
        QueryStatus("side", "PAUSED", tasks=1, processed=1, busy_seconds=1.0),
    )
    p1 = _status(
        QueryStatus(
            "main",
            "FAILED",
            tasks=2,
            processed=5,
            busy_seconds=2.0,
            lag=1,
            p99_latency_ms=9.0,
            failure="boom",
        ),
        QueryStatus("side", "PAUSED", tasks=3, processed=2),
    )
    base = {
        "application_id": "a",
        "client_id": "c",
        "instance_id": "i",
        "state": "RUNNING",
        "processing_guarantee": "at_least_once",
    }
    merged = {q.name: q for q in merge_statuses(base, (), {"p0": p0, "p1": p1}).queries}
    main, side = merged["main"], merged["side"]
    assert (main.state, main.failure, main.tasks, main.processed, main.lag) == (
        "FAILED",
        "boom",
        4,
        15,
        4,
    )
    assert main.p99_latency_ms == 9.0 and main.busy_share == pytest.approx(0.75)
    assert (side.state, side.tasks, side.processed) == ("PAUSED", 4, 3)


def test_a_query_isolated_at_start_is_left_out_of_the_processing_processes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    for name in ("MAIN", "SIDE"):
        monkeypatch.setenv(f"STREAMS_TEST_{name}_INPUT", f"{name.lower()}-in")
        monkeypatch.setenv(f"STREAMS_TEST_{name}_OUTPUT", f"{name.lower()}-out")
    config = StreamsConfig.from_dict(
        {**CONFIG.raw, "query.side.isolation": "process", "query.side.priority": 3}
    )
    fake = FakeProcesses(["p0", "p1"])
    queries = PoolQueries(config, "tests.apps.isolated_app:queries", fake.ask_each, lambda: ["p0"])
    fields = queries.spec_fields()
    assert fields["queries_removed"] == ("side",)
    raw = {"query.side.isolation": "process", "query.side.priority": 3}
    worker_config(raw, fields)
    assert raw == {}  # a processing process must not read keys of a query it does not run
    (row,) = queries.isolated_statuses()
    assert (row.name, row.isolation, row.priority, row.pid) == ("side", "process", 3, None)
    with pytest.raises(RuntimeError, match="already runs"):
        queries.add(AddedQuery("side", "m:t"), None, None, 30.0)
    assert fake.calls == []
