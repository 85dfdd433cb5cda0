"""Issue 20, a user's first hour, on a real broker: start-up says what it waits
for and stops at once when asked, an unreachable cluster is one clear line,
topics are created with one command (or at start-up when asked), and serde
mistakes name the sink, the serde and the fix.

Runs on the session broker (`bootstrap`), whichever kind it is.
"""

from __future__ import annotations

import io
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from runtime import App, StreamsBuilder, Topology, serdes
from runtime.devbroker import free_port
from runtime.logging import configure_logging
from tests.harness import REPO, clean_env
from tests.kafka_helpers import create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging("info", json=True, stream=stream)
    try:
        yield stream
    finally:
        structlog.contextvars.clear_contextvars()
        configure_logging()


def _events(stream: io.StringIO, name: str) -> list[dict[str, object]]:
    return [e for e in map(json.loads, stream.getvalue().splitlines()) if e["event"] == name]


def _copy_topology(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.BYTES, value_serde=serdes.BYTES).to(sink)
    return builder.build()


def _config(bootstrap: str, tmp_path: Path, **extra: object) -> dict[str, object]:
    return {
        "application.id": unique_name("fh"),
        "bootstrap.servers": bootstrap,
        "state.dir": str(tmp_path / "state"),
        "processing.threads": 1,
        "commit.interval.ms": 200,
        **extra,
    }


# --- start-up -------------------------------------------------------------------------------


def test_startup_names_each_phase_until_processing(
    bootstrap: str, tmp_path: Path, log_lines: io.StringIO
) -> None:
    source, sink = unique_name("fh-in"), unique_name("fh-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    app = App(_copy_topology(source, sink), _config(bootstrap, tmp_path))
    started = time.monotonic()
    app.start()
    try:
        seen: list[tuple[str | None, str | None]] = []

        def processing() -> bool:
            status = app.status()
            seen.append((status.startup_phase, status.waiting_for))
            return status.startup_phase == "processing" and status.state == "RUNNING"

        # The README's settings (no session timeout given) on a fresh group.
        wait_until(processing, 20, interval=0.02, message="start-up did not finish")
        took = time.monotonic() - started
    finally:
        assert app.close(30)
    phases = [e["phase"] for e in _events(log_lines, "startup_phase")]
    assert phases[0] == "joining_group" and phases[-1] == "processing", phases
    order = ["joining_group", "awaiting_assignment", "restoring", "processing"]
    assert phases == sorted(phases, key=order.index), phases
    waiting = [w for p, w in seen if p in ("joining_group", "awaiting_assignment")]
    assert all(w and "consumer group" in w for w in waiting), seen
    assert seen[-1] == ("processing", None)
    assert took < 10, f"a fresh group took {took:.1f} s to start"


def test_close_during_startup_is_quick(bootstrap: str, tmp_path: Path) -> None:
    """Stopped before the group was joined, nothing waits for a LeaveGroup."""
    source, sink = unique_name("fh-in"), unique_name("fh-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    for _ in range(2):
        app = App(_copy_topology(source, sink), _config(bootstrap, tmp_path))
        app.start()
        wait_until(lambda a=app: a.status().startup_phase is not None, 10)
        began = time.monotonic()
        assert app.close(30)
        took = time.monotonic() - began
        assert app.state.value == "NOT_RUNNING"
        assert took < 1.0, f"close during start-up took {took:.2f} s"


def test_unreachable_cluster_is_one_clear_line_and_ctrl_c_is_quick(tmp_path: Path) -> None:
    port = free_port()
    env = clean_env(STREAMS_TEST_INPUT="in", STREAMS_TEST_OUTPUT="out")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "runtime",
            "run",
            "tests.apps.passthrough:topology",
            "--set",
            "application.id=unreachable",
            "--set",
            f"bootstrap.servers=127.0.0.1:{port}",
            "--set",
            f"state.dir={tmp_path}",
        ],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    try:
        lines: list[str] = []
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            lines.append(line)
            if "broker_unreachable" in line:
                break
        warning = json.loads(next(line for line in lines if "broker_unreachable" in line))
        assert warning["bootstrap_servers"] == f"127.0.0.1:{port}"
        assert "Connection refused" in warning["error"]
        assert "check bootstrap.servers" in warning["hint"]
        proc.send_signal(signal.SIGINT)
        began = time.monotonic()
        code = proc.wait(10)
        took = time.monotonic() - began
        rest = proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    assert code == 130, rest
    assert took < 2.0, f"Ctrl-C during start-up took {took:.2f} s"
    assert rest.strip().splitlines()[-1] == "streams-runtime: interrupted during start-up"
    everything = "".join(lines) + rest
    assert "Traceback" not in everything
    assert not [line for line in everything.splitlines() if line.startswith("%")], everything
