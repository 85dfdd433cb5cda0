"""Issue 32, a user's first day, on a real broker: a bad record ends the
daemon with one line that names it, its serde and the ways out, and
restarts write nothing twice (at_least_once commits what came before the
failed record; exactly_once_v2 still aborts); a processing failure names
the processor; a REPLACE_THREAD retry repeats only the failed record;
`admin threads set 0` warns, `admin status` says so, and the
StreamsNoProcessingThreads alert fires on what the daemon exports; the
default admin socket is found without `--socket`.

Runs on the session broker (`bootstrap`). Without a broker:
tests/unit/test_first_day.py.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from runtime import (
    REPLACE_THREAD,
    App,
    AppState,
    StreamsBuilder,
    serdes,
)
from runtime.admin.client import format_status
from runtime.status import NO_PROCESSING_THREADS
from tests.harness import REPO, Daemon, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

ALERTS = REPO / "deploy" / "prometheus" / "alerts.yaml"


@pytest.fixture
def runtime_dir() -> Iterator[Path]:
    """A short private directory to be the daemons' $XDG_RUNTIME_DIR: their
    default admin sockets go there, away from other daemons on this machine
    (pytest's tmp_path can be too long for a Unix socket path)."""
    with tempfile.TemporaryDirectory(prefix="fdrun") as d:
        yield Path(d)


def _last_line(daemon: Daemon) -> str:
    return daemon.tail().strip().splitlines()[-1]


def _events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    lines = daemon.log_path.read_text().splitlines()
    events = [json.loads(line) for line in lines if line.startswith("{")]
    return [e for e in events if e.get("event") == name]


# --- a bad record --------------------------------------------------------------------------


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_a_bad_record_ends_in_one_line_and_restarts_write_nothing_twice(
    bootstrap: str, tmp_path: Path, runtime_dir: Path, guarantee: str
) -> None:
    """Before: `the app failed: task 0_0 failed in deserialization:
    JSONDecodeError: ...` (no record, no fix), and each failed run wrote the
    records before the bad one again: 3 copies after 3 runs."""
    source, sink = unique_name("fd-in"), unique_name("fd-out")
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    records = [("k1", b'{"n":1}'), ("k2", b'{"n":2}'), ("k3", b"not json"), ("k4", b'{"n":4}')]
    produce(bootstrap, source, records, key_serializer=str.encode)
    app_id = unique_name("fd")
    sets: dict[str, object] = {
        "application.id": app_id,
        "bootstrap.servers": bootstrap,
        "state.dir": tmp_path / "state",
        "processing.threads": 1,
        "processing.guarantee": guarantee,
        "commit.interval.ms": 60_000,  # no commit but the one the failure path makes
    }
    env = clean_env(
        STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink, XDG_RUNTIME_DIR=str(runtime_dir)
    )
    target = "tests.apps.first_day:json_copy"
    for run in range(3):
        daemon = Daemon(tmp_path / f"run{run}.log", target, sets, env).start()
        try:
            code = daemon.wait(90)
        finally:
            daemon.kill()
        assert code == 1, daemon.tail()
        last = _last_line(daemon)
        assert last.startswith(
            "streams-runtime: the app failed: task 0_0 failed in deserialization: "
            f"record {source}[0]@2 (key b'k3', value b'not json'): value serde serdes.JSON "
            "(given in the topology): JSONDecodeError: Expecting value: line 1 column 1 (char 0); "
            "with deserialization.exception.handler=log_and_fail such a record stops the app, "
            "and a restart meets it again: set deserialization.exception.handler="
            "log_and_continue to skip it (logged and counted), or dead_letter_queue"
        ), last
        assert "errors.dead.letter.queue.topic.name" in last
        assert last.endswith(f"or fix what produces '{source}'"), last
        assert "Traceback" not in daemon.tail(200_000)

    committed = committed_offsets(bootstrap, app_id, source)
    output = [m.value for m in consume_all(bootstrap, sink, timeout=20)]
    if guarantee == "at_least_once":
        # The records before the bad one, once: committed up to it, never past it.
        assert committed == {0: 2}
        assert output == [b'{"n":1}', b'{"n":2}']
    else:
        # Aborted each time: nothing committed, nothing visible to read_committed.
        assert committed == {}
        assert output == []

    # The way out the line names: skip it, and the rest flows.
    sets["deserialization.exception.handler"] = "log_and_continue"
    sets["commit.interval.ms"] = 200  # exactly_once_v2: output shows once committed
    daemon = Daemon(tmp_path / "skip.log", target, sets, env).start()
    try:
        expected = 3
        got = consume_all(bootstrap, sink, expected=expected, timeout=60, idle=1.0)
        daemon.assert_alive()
        daemon.send(15)
        assert daemon.wait(30) == 0, daemon.tail()
    finally:
        daemon.kill()
    assert [m.value for m in got] == [b'{"n":1}', b'{"n":2}', b'{"n":4}']


# --- a processing failure ----------------------------------------------------------------


class FailOn:
    """map_values' function: raises on values ending in '!' (after `fail_once`, once each)."""

    def __init__(self, fail_once: bool = False) -> None:
        self.fail_once = fail_once
        self.failed: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, value: str) -> str:
        if value.endswith("!"):
            with self.lock:
                if not self.fail_once or value not in self.failed:
                    self.failed.add(value)
                    raise RuntimeError(f"marked record {value}")
        return value.upper()


def _app(bootstrap: str, tmp_path: Path, function: FailOn, **extra: object) -> tuple[App, str, str]:
    source, sink = unique_name("fdp-in"), unique_name("fdp-out")
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).map_values(
        function
    ).to(sink, key_serde=serdes.STRING, value_serde=serdes.STRING)
    config = {
        "application.id": unique_name("fdp"),
        "bootstrap.servers": bootstrap,
        "state.dir": str(tmp_path / "state"),
        "processing.threads": 1,
        "commit.interval.ms": 60_000,
        **extra,
    }
    return App(builder.build(), config), source, sink


def test_a_processing_failure_names_the_processor_and_commits_what_came_before(
    bootstrap: str, tmp_path: Path
) -> None:
    app, source, sink = _app(bootstrap, tmp_path, FailOn())
    produce(
        bootstrap, source, [("k", "a"), ("k", "b!"), ("k", "c")], key_serializer=str.encode,
        value_serializer=str.encode,
    )  # fmt: skip
    app.start()
    try:
        assert app.wait(60), "the app did not stop"
        assert app.state is AppState.ERROR
        status = app.status()
    finally:
        app.close(30)
    failure = status.failure or ""
    assert failure.startswith(
        f"TaskFailedError: task 0_0 failed in processing: record {source}[0]@1 (key b'k', "
        "value b'b!'): processor 'KSTREAM-MAPVALUES-0000000001' ("
    ), failure
    assert "RuntimeError: marked record b!" in failure
    assert "processing.exception.handler=log_and_continue" in failure
    assert failure.endswith("or fix the processor")
    # `admin status` shows the same on its failure line.
    text = format_status(status.to_dict())
    lines = [line for line in text.splitlines() if line.startswith("failure ")]
    assert [line[len("failure") :].strip() for line in lines] == [failure], text
    assert committed_offsets(bootstrap, app.config.application_id, source) == {0: 1}
    assert [m.value for m in consume_all(bootstrap, sink, timeout=20)] == [b"A"]


def test_a_replaced_thread_repeats_only_the_failed_record(bootstrap: str, tmp_path: Path) -> None:
    """REPLACE_THREAD rewinds the task to its last commit: under at_least_once
    the records before the failed one are committed first, so their output is
    not written again (before: every record since the last commit was)."""
    app, source, sink = _app(bootstrap, tmp_path, FailOn(fail_once=True))
    app.set_uncaught_exception_handler(lambda exc: REPLACE_THREAD)
    values = ["a", "b", "c!", "d"]
    app.start()
    try:
        # Produced once processing: the start-up serde check runs map_values
        # on the newest input (and would use up the one failure).
        wait_until(lambda: app.status().startup_phase == "processing", 30)
        produce(
            bootstrap, source, [("k", v) for v in values], key_serializer=str.encode,
            value_serializer=str.encode,
        )  # fmt: skip
        got = consume_all(bootstrap, sink, expected=len(values), timeout=60, idle=2.0)
        assert app.state is AppState.RUNNING
        assert app.status().failed_threads == 1
    finally:
        app.close(30)
    assert [m.value for m in got] == [b"A", b"B", b"C!", b"D"]


# --- no processing threads, the default admin socket -------------------------------------------


def _admin(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "admin", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=60,
    )


def _scrape(url: str) -> dict[str, float]:
    """`name{labels}` -> value of the daemon's /metrics (comments left out)."""
    with urllib.request.urlopen(url, timeout=10) as reply:
        text = reply.read().decode()
    values = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            values[name] = float(value)
    return values


def _alert_fires(scraped: dict[str, float], tmp_path: Path) -> str:
    """promtool's verdict on StreamsNoProcessingThreads over the scraped
    series, held for 10 minutes; "" when the alert fired as expected."""
    tool = shutil.which("promtool")
    if tool is None:
        pytest.skip("promtool not installed (Debian package 'prometheus')")
    rule = next(
        r
        for g in yaml.safe_load(ALERTS.read_text())["groups"]
        for r in g["rules"]
        if r.get("alert") == "StreamsNoProcessingThreads"
    )
    series = []
    for name, value in scraped.items():
        if not name.startswith(("streams_processing_threads_alive", "streams_consumer_lag")):
            continue
        metric, _, labels = name.partition("{")
        labels = labels.rstrip("}")
        joined = ",".join(x for x in (labels, 'instance="d"', 'job="streams"') if x)
        series.append({"series": f"{metric}{{{joined}}}", "values": f"{value:g}x12"})
    summary = rule["annotations"]["summary"].replace("{{ $labels.instance }}", "d")
    tests = {
        "rule_files": [str(ALERTS)],
        "evaluation_interval": "1m",
        "tests": [
            {
                "interval": "1m",
                "input_series": series,
                "alert_rule_test": [
                    {
                        "eval_time": "7m",
                        "alertname": "StreamsNoProcessingThreads",
                        "exp_alerts": [
                            {
                                "exp_labels": {**rule["labels"], "instance": "d", "job": "streams"},
                                "exp_annotations": {
                                    "summary": summary,
                                    "description": rule["annotations"]["description"],
                                },
                            }
                        ],
                    }
                ],
            }
        ],
    }
    path = tmp_path / "no-threads.test.yaml"
    path.write_text(yaml.safe_dump(tests))
    done = subprocess.run(
        [tool, "test", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    return "" if done.returncode == 0 else done.stdout + done.stderr


def test_threads_set_0_warns_and_the_alert_fires_on_what_the_daemon_exports(
    bootstrap: str, tmp_path: Path, runtime_dir: Path
) -> None:
    source, sink = unique_name("fdt-in"), unique_name("fdt-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    app_id = unique_name("fdt")
    sets = {
        "application.id": app_id,
        "bootstrap.servers": bootstrap,
        "state.dir": tmp_path / "state",
        "processing.threads": 1,
        "metrics.port": 0,
    }
    env = clean_env(
        STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink, XDG_RUNTIME_DIR=str(runtime_dir)
    )
    daemon = Daemon(tmp_path / "daemon.log", "tests.apps.passthrough:topology", sets, env).start()
    try:
        wait_until(lambda: _events(daemon, "daemon_ready") or not daemon.alive(), 60, interval=0.1)
        daemon.assert_alive()
        # The default socket, announced at start-up (admin.socket is not set).
        (default,) = _events(daemon, "admin_socket_default")
        assert default["path"] == f"{runtime_dir}/streams-runtime/{app_id}.sock"
        wait_until(
            lambda: '"phase": "processing"' in daemon.tail(200_000), 60, message="not processing"
        )

        # No --socket: the only daemon answering in the default directory.
        set0 = _admin(env, "threads", "set", "0")
        assert set0.returncode == 0, set0.stderr
        assert set0.stdout.strip() == "threads: none"
        assert f"warning: {NO_PROCESSING_THREADS}" in set0.stderr
        (warned,) = _events(daemon, "no_processing_threads")
        assert warned["level"] == "warning"

        produce(bootstrap, source, [(f"k{i}", str(i)) for i in range(50)])
        status = _admin(env, "--application-id", app_id, "status")
        assert status.returncode == 0, status.stderr
        assert f"waiting for  {NO_PROCESSING_THREADS}" in status.stdout, status.stdout
        assert "threads      0 alive" in status.stdout, status.stdout

        (ready,) = _events(daemon, "daemon_ready")
        url = ready["metrics"]["url"] + "/metrics"

        def lagging() -> dict[str, float] | None:
            scraped = _scrape(url)
            lag = sum(v for k, v in scraped.items() if k.startswith("streams_consumer_lag{"))
            return scraped if lag >= 50 else None

        wait_until(lagging, 30, interval=0.5, message="lag not exported")
        scraped = lagging()
        assert scraped is not None
        assert scraped["streams_processing_threads_alive"] == 0
        verdict = _alert_fires(scraped, tmp_path)
        assert verdict == "", verdict

        # Threads back: the records flow, the warning goes.
        back = _admin(env, "threads", "set", "1")
        assert back.returncode == 0 and "warning" not in back.stderr, back.stderr
        assert len(consume_all(bootstrap, sink, expected=50, timeout=60, idle=0.5)) == 50
        assert "no processing threads" not in _admin(env, "status").stdout
        daemon.send(15)
        assert daemon.wait(30) == 0, daemon.tail()
        assert not (runtime_dir / "streams-runtime" / f"{app_id}.sock").exists()
    finally:
        daemon.kill()
