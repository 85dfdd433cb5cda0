"""Standbys with several processing processes (`processes` > 1) on a real broker.

Two daemons of one application, each `streams-runtime run` with `processes=2`
and `num.standby.replicas=1`: every task's standby is kept on the other
daemon (never in a sibling process of its active: same machine), caught up
with the changelog. After kill -9 of one daemon the other takes its tasks
over and restores only what the standbys had not applied (whichever of its
processes the group gives a task to: a sibling of the standby's process
claims the directory and the standby hands it over), and the counts stay
exact under exactly_once_v2.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.integration.test_processes import COUNT, PARTITIONS, Run, alive, final_counts
from tests.kafka_helpers import end_offsets, produce, wait_until

pytestmark = pytest.mark.integration

# cache.max.bytes 0: every update reaches the changelog (a long history not to restore).
STANDBY = {"num.standby.replicas": 1, "cache.max.bytes": 0, "metrics.port": 0}
ALL_TASKS = {f"0_{p}" for p in range(PARTITIONS)}


@pytest.fixture
def two_daemons(bootstrap: str, tmp_path: Path) -> Iterator[tuple[Run, Run]]:
    a = Run(bootstrap, tmp_path / "a", COUNT, **STANDBY)
    b = Run(bootstrap, tmp_path / "b", COUNT, **STANDBY)
    # One application: b reads a's topics under a's application id.
    b.input, b.output, b.env = a.input, a.output, a.env
    b.sets["application.id"] = a.sets["application.id"]
    yield a, b
    for run in (a, b):
        if run.daemon is not None:
            run.daemon.kill()


def tasks_of(run: Run) -> set[str]:
    return {t["id"] for t in run.ask("status")["tasks"] if t.get("state", "RUNNING") == "RUNNING"}


def standbys_of(run: Run) -> dict[str, Any]:
    return dict(run.ask("status")["standbys"])


def test_standbys_stay_off_the_actives_daemon_and_take_over_after_kill_9(
    two_daemons: tuple[Run, Run],
) -> None:
    a, b = two_daemons
    keys = [f"k{i}" for i in range(40)]
    produce(a.bootstrap, a.input, ((k, "x") for _ in range(100) for k in keys))
    a.start()
    b.start()
    changelog = f"{a.sets['application.id']}-counts-changelog"

    def shared() -> bool:
        on_a, on_b = tasks_of(a), tasks_of(b)
        return on_a | on_b == ALL_TASKS and not on_a & on_b and bool(on_a) and bool(on_b)

    wait_until(shared, 180, interval=0.5, message="the two daemons never shared the tasks")
    expected = {k.encode(): 100 for k in keys}
    assert final_counts(a.bootstrap, a.output, expected) == expected

    def standbys_current() -> bool:
        ends = end_offsets(a.bootstrap, changelog)
        for mine, other in ((a, b), (b, a)):
            standbys = standbys_of(mine)
            # The standby of each task is on the daemon that does not run it,
            # and none of a daemon's tasks has one on the daemon itself.
            if set(standbys) != tasks_of(other):
                return False
            for task_id, positions in standbys.items():
                partition = int(task_id.split("_")[1])
                if positions.get(f"{changelog}-{partition}") != ends[partition]:
                    return False
        return True

    wait_until(standbys_current, 90, interval=0.5, message="standbys never placed and caught up")
    on_a = tasks_of(a)
    restored_before = b.ask("status")["restored"]
    changelog_size = sum(end_offsets(a.bootstrap, changelog)[int(t[-1])] for t in on_a)
    pids = [r["pid"] for r in a.processes()]

    assert a.daemon is not None
    a.daemon.kill()  # SIGKILL of the supervisor: its processes follow
    for pid in pids:
        wait_until(lambda p=pid: not alive(p), 60, message="a process outlived its daemon")
    wait_until(
        lambda: tasks_of(b) == ALL_TASKS, 120, interval=0.5, message="b never took a's tasks"
    )
    restored = b.ask("status")["restored"] - restored_before
    # Nothing was written after the standbys caught up: a take-over restores
    # (almost) nothing of changelogs that hold hundreds of records.
    assert changelog_size >= 800, changelog_size
    assert restored <= 40, (restored, changelog_size)
    assert os.path.exists(b.socket)

    produce(a.bootstrap, a.input, ((k, "x") for _ in range(10) for k in keys))
    expected = {k.encode(): 110 for k in keys}
    assert final_counts(a.bootstrap, a.output, expected) == expected
    b.stop()
