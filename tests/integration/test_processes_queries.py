"""Named queries changed at runtime in a daemon with `processes` > 1, on a real broker.

The daemon runs the named queries `main` and `side` in two processing
processes (exactly_once_v2). Through its one admin socket a query is added
(each process imports it), paused, resumed and removed; the processes the
supervisor restarts after kill -9 start with the queries as they are at that
moment, not as the daemon started (runtime.isolation.pool_queries).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until
from tests.process_run import PARTITIONS, Run, alive

pytestmark = pytest.mark.integration

SOURCE = "tests.apps.isolated_app:queries"  # `main` and `side`: copies
EXTRA = "tests.apps.query_app:topology"  # copies STREAMS_TEST_QUERY_INPUT to ..._OUTPUT


@pytest.fixture
def run(bootstrap: str, tmp_path: Path) -> Iterator[Run]:
    run = Run(bootstrap, tmp_path, SOURCE)
    topics = {}
    for name in ("MAIN", "SIDE", "QUERY"):
        for end in ("INPUT", "OUTPUT"):
            topic = unique_name(f"pq-{name.lower()}-{end.lower()}")
            create_topic(bootstrap, topic, PARTITIONS)
            topics[f"STREAMS_TEST_{name}_{end}"] = topic
    run.env.update(topics)
    yield run
    if run.daemon is not None:
        run.daemon.kill()


def queries(run: Run) -> dict[str, dict[str, Any]]:
    return {q["name"]: q for q in run.ask("status")["queries"]}


def copied(run: Run, expected: int) -> int:
    """How many records the `extra` query's output holds (committed)."""
    out = consume_all(run.bootstrap, run.env["STREAMS_TEST_QUERY_OUTPUT"], expected=expected)
    return len(out)


def kill_each(run: Run, tasks: int) -> None:
    """kill -9 each processing process in turn; each comes back in its slot."""
    for victim in run.processes():
        run.kill_and_wait_restart(victim, tasks=tasks)


def test_a_query_added_paused_resumed_and_removed_in_every_process_and_kept_across_restarts(
    run: Run,
) -> None:
    extra_in = run.env["STREAMS_TEST_QUERY_INPUT"]
    run.start()
    run.wait_running(2, tasks=2 * PARTITIONS)
    assert set(queries(run)) == {"main", "side"}

    answer = run.ask("query.add", name="extra", target=EXTRA, priority=1, timeout=60)
    assert "extra" in {q["name"] for q in answer["queries"]}
    run.wait_running(2, tasks=3 * PARTITIONS)
    row = queries(run)["extra"]
    assert row["tasks"] == PARTITIONS and row["priority"] == 1 and row["state"] == "RUNNING"
    produce(run.bootstrap, extra_in, ((f"k{i}", f"a{i}") for i in range(200)))
    assert copied(run, 200) == 200

    # Paused in every process: its input waits (lag), nothing is copied.
    run.ask("query.pause", name="extra")
    assert queries(run)["extra"]["state"] == "PAUSED"
    produce(run.bootstrap, extra_in, ((f"k{i}", f"b{i}") for i in range(100)))
    wait_until(lambda: queries(run)["extra"]["lag"] == 100, 60, message="no lag while paused")
    assert copied(run, 200) == 200
    run.ask("query.resume", name="extra")
    assert copied(run, 300) == 300

    # Both processes die and come back: each starts with `extra` (and its
    # priority): the output takes the next records, exactly once.
    kill_each(run, tasks=3 * PARTITIONS)
    assert queries(run)["extra"]["priority"] == 1
    produce(run.bootstrap, extra_in, ((f"k{i}", f"c{i}") for i in range(100)))
    assert copied(run, 400) == 400

    # Removed everywhere; a process restarted after that does not bring it back.
    answer = run.ask("query.remove", name="extra", timeout=60)
    assert {q["name"] for q in answer["queries"]} == {"main", "side"}
    run.wait_running(2, tasks=2 * PARTITIONS)
    kill_each(run, tasks=2 * PARTITIONS)
    assert set(queries(run)) == {"main", "side"}
    produce(run.bootstrap, extra_in, ((f"k{i}", f"d{i}") for i in range(50)))
    main_in = run.env["STREAMS_TEST_MAIN_INPUT"]
    produce(run.bootstrap, main_in, ((f"k{i}", f"m{i}") for i in range(50)))
    main_out = run.env["STREAMS_TEST_MAIN_OUTPUT"]
    assert len(consume_all(run.bootstrap, main_out, expected=50)) == 50
    assert copied(run, 400) == 400  # the removed query copied nothing more
    run.stop()


def test_a_query_in_a_process_of_its_own_runs_once_for_the_daemon(run: Run) -> None:
    """`query.side.isolation=process`: the supervisor runs `side` in one
    child; the processing processes start without it. kill -9 of that child
    fails `side` alone and `query resume` starts it again, exactly once; a
    query added with `--isolation process` runs so too and is removed with
    its reset."""
    run.sets["query.side.isolation"] = "process"
    side_in, side_out = run.env["STREAMS_TEST_SIDE_INPUT"], run.env["STREAMS_TEST_SIDE_OUTPUT"]
    run.start()
    workers = {r["pid"] for r in run.wait_running(2, tasks=PARTITIONS)}  # `main` alone
    side = queries(run)["side"]
    assert side["isolation"] == "process" and side["state"] == "RUNNING"
    assert side["pid"] not in workers and alive(side["pid"])
    produce(run.bootstrap, side_in, ((f"k{i}", f"a{i}") for i in range(100)))
    assert len(consume_all(run.bootstrap, side_out, expected=100)) == 100

    os.kill(side["pid"], signal.SIGKILL)
    wait_until(lambda: queries(run)["side"]["state"] == "FAILED", 60, message="not FAILED")
    assert {r["pid"] for r in run.processes()} == workers  # the processing processes stay
    produce(run.bootstrap, side_in, ((f"k{i}", f"b{i}") for i in range(50)))
    run.ask("query.resume", name="side")
    wait_until(lambda: queries(run)["side"]["state"] == "RUNNING", 60, message="not resumed")
    values = sorted(m.value or b"" for m in consume_all(run.bootstrap, side_out, expected=150))
    assert values == sorted(
        [f"a{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(50)]
    ), "lost or duplicated records"

    run.ask("query.add", name="extra", target=EXTRA, isolation="process", timeout=90)
    extra = queries(run)["extra"]
    assert extra["isolation"] == "process" and extra["pid"] not in workers | {side["pid"]}
    produce(run.bootstrap, run.env["STREAMS_TEST_QUERY_INPUT"], ((f"k{i}", "x") for i in range(80)))
    assert copied(run, 80) == 80
    answer = run.ask("query.remove", name="extra", reset=True, timeout=60)
    assert {q["name"] for q in answer["queries"]} == {"main", "side"}
    wait_until(lambda: not alive(extra["pid"]), 30, message="the removed query's child lives on")
    run.stop()
