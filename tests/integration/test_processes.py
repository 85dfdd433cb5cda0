"""A daemon with several processing processes (`processes` > 1) on a real broker.

One `streams-runtime run` with `processes=2` runs the stateful count in two
processes of the application's one consumer group and answers as one
daemon: one admin socket (status with a row per process and the totals,
`tasks` naming each task's process, threads forwarded), one log stream
(each line names its process), SIGTERM closing both. Under exactly_once_v2,
kill -9 of one processing process (restarted by the supervisor) loses and
duplicates nothing; kill -9 of the supervisor takes its processes along.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.configs import app_config
from tests.harness import Daemon, Feeder
from tests.kafka_helpers import (
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)
from tests.process_run import PARTITIONS, Run, alive

pytestmark = pytest.mark.integration

COUNT = "tests.apps.count_app:topology"
PASSTHROUGH = "tests.apps.passthrough:topology"


@pytest.fixture
def count_run(bootstrap: str, tmp_path: Path) -> Iterator[Run]:
    run = Run(bootstrap, tmp_path, COUNT, **{"metrics.port": 0})
    yield run
    if run.daemon is not None:
        run.daemon.kill()


def final_counts(bootstrap: str, topic: str, expected: dict[bytes, int]) -> dict[bytes, int]:
    """The last count per key of the committed output, once it is `expected`
    (or when 90 s have passed: the caller's assert then shows the difference).
    A count above the expected one never comes down: it fails at once."""
    latest: dict[bytes, int] = {}

    def final() -> bool:
        latest.clear()
        for message in consume_all(bootstrap, topic, timeout=60, idle=0.5):
            assert message.key is not None and message.value is not None
            latest[message.key] = int.from_bytes(message.value, "big", signed=True)
        over = {k: v for k, v in latest.items() if v > expected.get(k, 0)}
        assert not over, f"counted twice: {over}"
        return latest == expected

    try:
        wait_until(final, 90, interval=0.5)
    except AssertionError as exc:
        if "counted twice" in str(exc):
            raise
    return latest


def test_two_processes_count_exactly_and_answer_as_one_daemon(count_run: Run) -> None:
    run = count_run
    keys = [f"k{i}" for i in range(20)]
    produce(run.bootstrap, run.input, ((k, f"v{n}") for n in range(50) for k in keys))
    run.start()
    rows = run.wait_running(2)
    pids = {r["pid"] for r in rows}
    assert len(pids) == 2 and run.daemon is not None and run.daemon.pid not in pids
    assert [r["name"] for r in rows] == ["p0", "p1"]

    expected = {k.encode(): 50 for k in keys}
    assert final_counts(run.bootstrap, run.output, expected) == expected

    # The totals of both processes. Work of an aborted transaction counts as
    # processed too (a commit refused for the group's next generation at the
    # second process's join: the records are processed again, the output is
    # still exact), so the total is at least the input, and the sum of the
    # rows (which come from the processes' status lines, up to 0.5 s old).
    def totals_agree() -> bool:
        status = run.ask("status")
        rows = sum(r["processed"] for r in status["processes"])
        return bool(status["processed"] == rows >= 50 * len(keys))

    wait_until(totals_agree, 30, interval=0.3, message="status totals are not the rows' sum")
    status = run.ask("status")
    assert len(status["threads"]) == 2
    tasks = run.ask("tasks")["tasks"]
    assert len(tasks) == PARTITIONS
    assert {t["process"] for t in tasks} == {"p0", "p1"}

    # One /metrics for the daemon: each process's families with its label.
    url = status["daemon"]["metrics"]["url"] + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as response:
        text = response.read().decode()
    processed = {
        process: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("streams_records_processed_total{")
        for process in ("p0", "p1")
        if f'process="{process}"' in line
    }
    assert sum(processed.values()) == status["processed"] and set(processed) == {"p0", "p1"}
    assert "streams_processes 2.0" in text
    for row in rows:
        assert f'streams_process_up{{pid="{row["pid"]}",process="{row["name"]}"}} 1.0' in text
        assert f'streams_process_restarts_total{{process="{row["name"]}"}} 0.0' in text
    assert 'process_resident_memory_bytes{process="supervisor"}' in text

    # Threads are per process: one more in each, by the socket or SIGTTIN.
    before = len(run.ask("threads")["names"])
    run.ask("threads.add")
    wait_until(lambda: len(run.ask("threads")["names"]) == before + 2, 30)
    assert run.daemon is not None
    run.daemon.send(signal.SIGTTIN)
    wait_until(lambda: len(run.ask("threads")["names"]) == before + 4, 30)

    run.stop()
    log = (run.workdir / "daemon1.log").read_text()
    assert '"process": "p0"' in log and '"process": "p1"' in log
    for pid in pids:
        assert not alive(pid)


# kill -9 of one processing process, repeated. The issue asks for 10
# repetitions; the suite runs KILLS (2 by default, one of each process: about 18 s per
# workload) and STREAMS_TEST_PROCESS_KILLS=10 runs the full count.
KILLS = int(os.environ.get("STREAMS_TEST_PROCESS_KILLS", "2"))


@pytest.mark.parametrize("target", [COUNT, PASSTHROUGH], ids=["count", "passthrough"])
def test_kill_9_of_a_processing_process_is_restarted_and_loses_and_duplicates_nothing(
    bootstrap: str, tmp_path: Path, target: str
) -> None:
    """exactly_once_v2, input arriving all along: kill -9 one processing
    process (p0 and p1 in turn) KILLS times; the supervisor restarts it in
    its slot (same transactional id: the dead one's open transaction is
    aborted by the new one's init; static membership: it takes its
    partitions back without waiting for the session to expire); the
    committed output holds every input record exactly once (pass-through)
    and the exact final count per key (count)."""
    run = Run(bootstrap, tmp_path, target, **{"consumer.group.instance.id": unique_name("s")})
    feeder = Feeder(bootstrap, run.input, rate=400, keys=20)
    try:
        run.start()
        rows = run.wait_running(2)
        feeder.start()
        for kill in range(KILLS):
            victim = rows[kill % 2]
            before = run.ask("status")["processed"]
            wait_until(lambda b=before: run.ask("status")["processed"] > b + 100, 60)
            rows = run.kill_and_wait_restart(victim)
            last_exit = next(r for r in rows if r["name"] == victim["name"])["last_exit"]
            assert last_exit is not None and "SIGKILL" in last_exit
        feeder.stop()
        sent = feeder.sent
        if target == PASSTHROUGH:
            out = consume_all(bootstrap, run.output, expected=sent, timeout=90, idle=1.0)
            values = sorted(int(m.value or b"-1") for m in out)
            assert values == list(range(sent)), "lost or duplicated records"
        else:
            expected = {f"k{k}".encode(): len(range(k, sent, 20)) for k in range(20)}
            assert final_counts(bootstrap, run.output, expected) == expected
        run.stop()
    finally:
        if feeder.is_alive():
            feeder.stop()
        if run.daemon is not None:
            run.daemon.kill()


def test_kill_9_of_the_supervisor_takes_its_processes_along_and_a_restart_is_exactly_once(
    count_run: Run,
) -> None:
    run = count_run
    keys = [f"k{i}" for i in range(10)]
    produce(run.bootstrap, run.input, ((k, "v") for n in range(100) for k in keys))
    daemon = run.start()
    pids = [r["pid"] for r in run.wait_running(2)]
    wait_until(lambda: run.ask("status")["processed"] > 0, 60)
    daemon.kill()  # SIGKILL, reaped: the processes' stdin closes
    for pid in pids:
        wait_until(
            lambda p=pid: not alive(p), 60, message="a processing process outlived its daemon"
        )
    os.unlink(run.socket)
    produce(run.bootstrap, run.input, ((k, "v") for n in range(100) for k in keys))
    run.start()
    expected = {k.encode(): 200 for k in keys}
    assert final_counts(run.bootstrap, run.output, expected) == expected
    run.stop()


def _restores_logged(log: str, process: str) -> dict[str, int]:
    """task id -> the changelog offset its latest restore in `process` started
    from (the `task_restoring` log line; -2: the beginning, no checkpoint)."""
    starts: dict[str, int] = {}
    for line in log.splitlines():
        if '"task_restoring"' not in line or f'"process": "{process}"' not in line:
            continue
        event = json.loads(line)
        (changelog,) = event["changelogs"]
        starts[event["task_id"]] = int(changelog.rsplit("@", 1)[1])
    return starts


def test_resize_1_2_1_under_load_counts_exactly_and_a_moved_task_restores_only_its_tail(
    bootstrap: str, tmp_path: Path
) -> None:
    """processes.resizable, one process, input arriving all along:
    `processes set 2` moves some tasks to p1, `processes set 1` moves them
    back (p1 commits, closes and leaves first). Each moved task opens the
    directory its old owner closed and restores from that owner's
    checkpoint: its restore starts past the changelog's beginning and
    replays at most the records after that checkpoint. The final counts are
    exact (exactly_once_v2)."""
    run = Run(bootstrap, tmp_path, COUNT, processes=1, **{"processes.resizable": True})
    feeder = Feeder(bootstrap, run.input, rate=300, keys=20)
    changelog = f"{run.sets['application.id']}-counts-changelog"
    try:
        run.start()
        run.wait_running(1)
        feeder.start()
        wait_until(lambda: run.ask("status")["processed"] > 300, 60)

        # The CLI's form: `streams-runtime admin processes set 2 --wait 120`.
        cli = subprocess.run(
            [sys.executable, "-m", "runtime", "admin", "--socket", run.socket]
            + ["processes", "set", "2", "--wait", "120"],
            capture_output=True,
            text=True,
            timeout=180,
            env=run.env,
        )
        assert cli.returncode == 0, cli.stderr
        assert cli.stdout.splitlines()[0].split()[:3] == ["PROCESS", "PID", "STATE"]
        assert [line.split()[0] for line in cli.stdout.splitlines()[1:]] == ["p0", "p1"]
        run.wait_running(2)
        moved = {t["id"] for t in run.ask("tasks")["tasks"] if t["process"] == "p1"}
        assert moved, "no task moved to the new process"

        def restored_in(process: str, tasks: set[str]) -> dict[str, int]:
            restores = run.ask("status")["restores"]
            return {
                t: restores[t]["records"]
                for t in tasks
                if t in restores and restores[t].get("process") == process
            }

        wait_until(lambda: len(restored_in("p1", moved)) == len(moved), 60)
        records = restored_in("p1", moved)
        ends = end_offsets(bootstrap, changelog)
        starts = _restores_logged((run.workdir / "daemon1.log").read_text(), "p1")
        for task in moved:
            partition = int(task.split("_")[1])
            assert starts[task] > 0, f"{task} restored from the beginning in p1"
            assert records[task] <= ends[partition] - starts[task], (task, records, starts)
        wait_until(lambda: run.ask("status")["processed"] > 600, 60)

        reply = run.ask("processes.set", count=1, timeout=120)
        assert reply["processes"] == 1
        assert [r["name"] for r in run.wait_running(1)] == ["p0"]
        assert {t["process"] for t in run.ask("tasks")["tasks"]} == {"p0"}
        wait_until(lambda: len(restored_in("p0", moved)) == len(moved), 60)
        records = restored_in("p0", moved)
        ends = end_offsets(bootstrap, changelog)
        back = _restores_logged((run.workdir / "daemon1.log").read_text(), "p0")
        for task in moved:
            partition = int(task.split("_")[1])
            assert back[task] >= starts[task] > 0, f"{task} restored from the beginning in p0"
            assert records[task] <= ends[partition] - back[task], (task, records, back)

        feeder.stop()
        sent = feeder.sent
        expected = {f"k{k}".encode(): len(range(k, sent, 20)) for k in range(20)}
        assert final_counts(bootstrap, run.output, expected) == expected
        run.stop()
    finally:
        if feeder.is_alive():
            feeder.stop()
        if run.daemon is not None:
            run.daemon.kill()


def test_a_benchmark_can_run_k_processes_from_python_and_read_their_totals(
    bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`WorkerPool` as a benchmark drives it: no daemon, no socket; the
    processes inherit the environment (the topics) and `progress()` sums
    their counts as `App.progress()` does for one."""
    from runtime.config import StreamsConfig
    from runtime.isolation.workers import WorkerPool

    topic_in, topic_out = unique_name("procs-in"), unique_name("procs-out")
    create_topic(bootstrap, topic_in, PARTITIONS)
    create_topic(bootstrap, topic_out, PARTITIONS)
    monkeypatch.setenv("STREAMS_TEST_INPUT", topic_in)
    monkeypatch.setenv("STREAMS_TEST_OUTPUT", topic_out)
    monkeypatch.setenv("PYTHONPATH", str(Path(__file__).resolve().parents[2]))
    produce(bootstrap, topic_in, ((f"k{i}", f"{i}") for i in range(2000)))
    config = StreamsConfig.from_dict(
        app_config(bootstrap, unique_name("procs"), tmp_path, threads=1, processes=2)
    )
    pool = WorkerPool(config, PASSTHROUGH)
    pool.start()
    try:
        # at_least_once: a commit refused at the second process's join may
        # have a record processed (and consumed) twice; never fewer.
        wait_until(lambda: pool.progress().processed >= 2000, 60, message="not all processed")
        assert pool.progress().consumed >= 2000
        assert len([r for r in pool.process_rows() if r.up]) == 2
    finally:
        assert pool.close(60)
    assert str(pool.state) == "NOT_RUNNING"
    values = {int(m.value or b"-1") for m in consume_all(bootstrap, topic_out, expected=2000)}
    assert values == set(range(2000))


def test_a_process_that_cannot_start_fails_the_daemons_start_with_its_reason(
    bootstrap: str, tmp_path: Path
) -> None:
    """A missing input topic: each process's start-up check refuses it; the
    supervisor stops the others and exits 2 with the process's reason."""
    run = Run(bootstrap, tmp_path, PASSTHROUGH)
    run.env["STREAMS_TEST_INPUT"] = unique_name("procs-missing")
    daemon = Daemon(run.workdir / "daemon.log", PASSTHROUGH, run.sets, run.env).start()
    try:
        assert daemon.wait(120) == 2, daemon.tail()
        tail = daemon.tail()
        assert "processing process p" in tail and "could not start" in tail, tail
        assert "TopicError: source topic 'procs-missing-" in tail, tail
        assert f"topics create {PASSTHROUGH}" in tail, tail
    finally:
        daemon.kill()
