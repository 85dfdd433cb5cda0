"""Process-isolated named queries on a real broker (`query.<name>.isolation=process`):
the child processes its input completely and reports through the daemon;
pause/resume reach it; a killed child fails its query alone and `resume`
starts it again from its commit (exactly_once_v2: no loss, no duplicate); a
query moved from the daemon's process into its own resumes from the
daemon's commit, and back; a processor error in the child fails only that query."""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from typing import Any

import pytest

from runtime import App, AppState
from runtime.admin.client import request
from runtime.topology.loading import load_topology
from tests.configs import app_config
from tests.harness import Daemon, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

SOURCE = "tests.apps.isolated_app:queries"


@pytest.fixture
def io(bootstrap: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Fresh topics, named in the environment the child processes inherit."""
    names: dict[str, str] = {}
    for query in ("main", "side"):
        for end in ("input", "output"):
            name = unique_name(f"iso-{query}-{end}")
            create_topic(bootstrap, name, 2)
            monkeypatch.setenv(f"STREAMS_TEST_{query.upper()}_{end.upper()}", name)
            names[f"{query}_{end}"] = name
    return names


def config(bootstrap: str, tmp_path: Path, app_id: str, **extra: Any) -> dict[str, Any]:
    settings: dict[str, Any] = {"query.side.isolation": "process", **extra}
    return app_config(
        bootstrap,
        app_id,
        tmp_path,
        threads=1,
        guarantee="exactly_once_v2",
        heartbeat_ms=None,
        **settings,
    )


def side(app: App) -> Any:
    return next(q for q in app.status().queries if q.name == "side")


def child_pid(app: App) -> int:
    status = side(app)
    assert status.isolation == "process"
    pid = status.pid
    assert pid is not None and pid != os.getpid()
    return pid


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) is not alive either.
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def isolated_app(bootstrap: str, tmp_path: Path, **extra: Any) -> App:
    """`main` in this process, `side` in a child (exactly_once_v2 unless `extra` says)."""
    return App(
        load_topology(SOURCE, named=True),
        config(bootstrap, tmp_path, unique_name("iso"), **extra),
        source=SOURCE,
    )


def send(bootstrap: str, topic: str, sent: list[str]) -> None:
    produce(bootstrap, topic, ((f"k{i % 5}", v) for i, v in enumerate(sent)))


def values(bootstrap: str, topic: str, expected: int) -> list[str]:
    return sorted(m.value.decode() for m in consume_all(bootstrap, topic, expected=expected))


def test_a_query_in_its_own_process_runs_reports_pauses_and_stops_with_the_daemon(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    app = isolated_app(bootstrap, tmp_path)
    first = [f"s{i}" for i in range(300)]
    send(bootstrap, io["side_input"], first)
    produce(bootstrap, io["main_input"], ((f"k{i % 5}", f"m{i}") for i in range(300)))
    app.start()
    try:
        pid = child_pid(app)
        assert values(bootstrap, io["side_output"], 300) == sorted(first)
        assert values(bootstrap, io["main_output"], 300) == sorted(f"m{i}" for i in range(300))
        wait_until(lambda: side(app).processed == 300, 30, message="side's figures")
        status = side(app)
        assert status.state == "RUNNING" and status.tasks == 2
        assert status.p99_latency_ms is not None and status.busy_seconds > 0
        # Only the daemon's own query's tasks are in its scheduler.
        assert {t.id.split("__")[0] for t in app.status().tasks} == {"main"}

        app.pause_query("side")
        assert side(app).state == "PAUSED"
        wait_until(lambda: side(app).tasks == 2, 30)
        paused = [f"p{i}" for i in range(100)]
        send(bootstrap, io["side_input"], paused)
        # While paused, nothing of it comes out (the main query still runs).
        produce(bootstrap, io["main_input"], [("k", "after-pause")])
        assert len(consume_all(bootstrap, io["main_output"], expected=301)) == 301
        assert len(consume_all(bootstrap, io["side_output"], timeout=10)) == 300
        app.resume_query("side")
        assert values(bootstrap, io["side_output"], 400) == sorted(first + paused)
    finally:
        assert app.close(60)
    assert app.state is AppState.NOT_RUNNING
    wait_until(lambda: not alive(pid), 10, message="the child outlived the daemon")


def test_a_killed_child_fails_its_query_alone_and_resume_restarts_it_exactly_once(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    app = isolated_app(bootstrap, tmp_path)
    batch = [f"a{i}" for i in range(200)]
    send(bootstrap, io["side_input"], batch)
    app.start()
    try:
        assert values(bootstrap, io["side_output"], 200) == sorted(batch)
        pid = child_pid(app)
        os.kill(pid, signal.SIGKILL)
        wait_until(lambda: side(app).state == "FAILED", 30, message="side never failed")
        assert "code -9" in (side(app).failure or "")
        assert side(app).tasks == 0 and side(app).pid is None
        # The daemon's own query runs on.
        produce(bootstrap, io["main_input"], ((f"k{i}", f"m{i}") for i in range(100)))
        assert len(consume_all(bootstrap, io["main_output"], expected=100)) == 100
        assert app.state is AppState.RUNNING

        more = [f"b{i}" for i in range(200)]
        send(bootstrap, io["side_input"], more)
        app.resume_query("side")
        assert side(app).state == "RUNNING" and child_pid(app) != pid
        # From its last commit: everything, once (read_committed).
        assert values(bootstrap, io["side_output"], 400) == sorted(batch + more)
    finally:
        assert app.close(60)


def test_a_query_moved_into_its_own_process_and_back_resumes_from_its_latest_commit(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    """Thread -> process -> thread -> process, restarting the app each time
    (exactly_once_v2, read_committed): every record once, none skipped."""
    app_id = unique_name("iso")
    sent: list[str] = []
    for step, isolation in enumerate(("thread", "process", "thread", "process")):
        batch = [f"r{step}-{i}" for i in range(200)]
        sent += batch
        send(bootstrap, io["side_input"], batch)
        app = App(
            load_topology(SOURCE, named=True),
            config(bootstrap, tmp_path, app_id, **{"query.side.isolation": isolation}),
            source=SOURCE,
        )
        app.start()
        try:
            # Nothing of an earlier step again: the commits followed the query.
            assert values(bootstrap, io["side_output"], len(sent)) == sorted(sent), isolation
        finally:
            assert app.close(60)


def test_a_processor_error_in_the_child_fails_that_query_only(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    app = isolated_app(bootstrap, tmp_path, **{"processing.guarantee": "at_least_once"})
    produce(bootstrap, io["side_input"], [("k", "fine"), ("k", "poison!")])
    app.start()
    try:
        wait_until(lambda: side(app).state == "FAILED", 60, message="side never failed")
        assert "marked record poison!" in (side(app).failure or "")
        produce(bootstrap, io["main_input"], ((f"k{i}", f"m{i}") for i in range(50)))
        assert len(consume_all(bootstrap, io["main_output"], expected=50)) == 50
        assert app.state is AppState.RUNNING
    finally:
        assert app.close(60)


def test_a_query_added_in_its_own_process_at_runtime_and_removed_with_reset(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    """`side` ran in the daemon's process first (the daemon's group has its
    commits); added at runtime in a child it goes on from there; removed with
    reset, both groups forget it, so adding it again starts over."""
    app_id = unique_name("iso")
    queries = load_topology(SOURCE, named=True)
    first = [f"f{i}" for i in range(200)]
    send(bootstrap, io["side_input"], first)
    settings = config(bootstrap, tmp_path, app_id, **{"query.side.isolation": "thread"})
    before = App(queries, settings)
    before.start()
    try:
        assert values(bootstrap, io["side_output"], 200) == sorted(first)
    finally:
        assert before.close(60)

    del settings["query.side.isolation"]  # `side` is not in the mapping at start
    app = App({"main": queries["main"]}, settings)
    app.start()
    try:
        second = [f"s{i}" for i in range(200)]
        send(bootstrap, io["side_input"], second)
        app.add_query("side", queries["side"], isolation="process", source=SOURCE)
        pid = child_pid(app)
        # From the daemon's commit: nothing of `first` again.
        assert values(bootstrap, io["side_output"], 400) == sorted(first + second)
        wait_until(
            lambda: committed_offsets(bootstrap, f"{app_id}-side", io["side_input"]),
            30,
            message="the child never committed",
        )
        app.remove_query("side", reset=True)
        assert app.queries == ["main"]
        wait_until(lambda: not alive(pid), 10, message="the removed query's child lives on")
        assert committed_offsets(bootstrap, f"{app_id}-side", io["side_input"]) == {}
        # Added again after the reset: from the start of its input.
        app.add_query("side", queries["side"], isolation="process", source=SOURCE)
        everything = sorted(2 * (first + second))
        assert values(bootstrap, io["side_output"], 800) == everything
        # The daemon's own query was not touched.
        produce(bootstrap, io["main_input"], ((f"k{i}", f"m{i}") for i in range(100)))
        assert len(consume_all(bootstrap, io["main_output"], expected=100)) == 100
    finally:
        assert app.close(60)


def test_kill_9_of_the_daemon_takes_its_child_along_and_a_restart_outputs_exactly_once(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    """`streams-runtime run` with `side` in a child process, exactly_once_v2:
    kill -9 the daemon mid-run; its child must not outlive it (it would hold
    the query's partitions and its transactional id); a restarted daemon
    finishes the input, each record exactly once."""
    workdir = Path(tempfile.mkdtemp(prefix="iso"))  # AF_UNIX paths are <= 107 bytes
    sock = str(workdir / "admin.sock")
    sets = {
        **config(bootstrap, tmp_path, unique_name("iso")),
        "admin.socket": sock,
        "commit.interval.ms": 100,
    }

    def start(log_name: str) -> Daemon:
        daemon = Daemon(workdir / log_name, SOURCE, sets, clean_env()).start()
        wait_until(lambda: os.path.exists(sock) or not daemon.alive(), 60)
        daemon.assert_alive()
        return daemon

    def side_query() -> dict[str, Any]:
        return next(q for q in request(sock, "queries")["queries"] if q["name"] == "side")

    sent = [f"v{i}" for i in range(3000)]
    produce(bootstrap, io["side_input"], ((f"k{i % 11}", v) for i, v in enumerate(sent[:1500])))
    daemon = start("daemon1.log")
    try:
        wait_until(lambda: side_query()["pid"] is not None, 60, message="no child")
        pid = side_query()["pid"]
        wait_until(lambda: side_query()["processed"] > 0, 60, message="the child is idle")
        daemon.kill()  # SIGKILL, reaped
        wait_until(lambda: not alive(pid), 30, message="the child outlived its daemon")
        os.unlink(sock)
        produce(bootstrap, io["side_input"], ((f"k{i % 11}", v) for i, v in enumerate(sent[1500:])))
        daemon = start("daemon2.log")
        assert values(bootstrap, io["side_output"], 3000) == sorted(sent)
    finally:
        daemon.send(signal.SIGTERM)
        assert daemon.wait(60) == 0, daemon.tail()


def test_a_child_that_cannot_start_fails_its_query_with_the_reason(
    bootstrap: str, tmp_path: Path, io: dict[str, str]
) -> None:
    app = App(
        load_topology(SOURCE, named=True),
        config(bootstrap, tmp_path, unique_name("iso")),
        source="tests.apps.no_such_module:queries",
    )
    app.start()
    try:
        status = side(app)
        assert status.state == "FAILED" and status.pid is None
        assert "cannot import 'tests.apps.no_such_module'" in (status.failure or "")
        produce(bootstrap, io["main_input"], ((f"k{i}", f"m{i}") for i in range(50)))
        assert len(consume_all(bootstrap, io["main_output"], expected=50)) == 50
    finally:
        assert app.close(60)
