"""SIGINT and SIGTERM at any moment of `streams-runtime run` (issue 31, item 9).

Before the fix, a SIGINT between `App.start()` returning and the admin loop's
handlers gave a KeyboardInterrupt traceback and no close, and a SIGTERM while
start-up waited for an unreachable cluster killed the process without a word.
Now (runtime.admin.signals) both behave alike at every moment:

- right after exec, before the interpreter runs our code: the signal's default
  action ends the process (a shell shows 130/143), nothing to close;
- before the app started anything (waiting for 127.0.0.1:1): one line and
  exit 128 + the signal's number (130 SIGINT, 143 SIGTERM);
- once `App.start()` is under way (topics being made, the app started and its
  process-isolated query's child starting, the gap before the admin loop, and
  RUNNING): a graceful close with its final commit, one line, exit 0, and the
  child process does not outlive the daemon.

Every run is a real subprocess on the session's broker; waits are on log
events or admin replies with deadlines.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.client import request
from tests.configs import app_config
from tests.harness import REPO, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

APP = "tests.apps.isolated_app:queries"  # `main` in the daemon, `side` in a child process
SIGNALS = [signal.SIGINT, signal.SIGTERM]
MARK = "STREAMS_TEST_SIGNAL_RUN"  # inherited by every process the daemon starts


class Run:
    """One `streams-runtime run` process with its log, env marker and admin socket."""

    def __init__(self, workdir: Path, sets: dict[str, Any], env: dict[str, str]) -> None:
        self.mark = uuid.uuid4().hex
        self.log_path = workdir / "daemon.log"
        self.sock = str(workdir / "admin.sock")
        argv = [sys.executable, "-m", "runtime", "run", APP]
        for key, value in {**sets, "admin.socket": self.sock}.items():
            argv += ["--set", f"{key}={value}"]
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env={**env, MARK: self.mark}, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def event(self, name: str) -> bool:
        """Whether the log has an event `name` (and the process still runs)."""
        for line in self.output().splitlines():
            if line.startswith("{"):
                with contextlib.suppress(ValueError):
                    if json.loads(line).get("event") == name:
                        return True
        assert self.proc.poll() is None, f"exited {self.proc.returncode}:\n{self.output()[-3000:]}"
        return False

    def human_lines(self) -> list[str]:
        """What is not a JSON log line: the lines meant for a person."""
        return [line for line in self.output().splitlines() if not line.startswith("{")]

    def marked_processes(self) -> list[int]:
        """Live processes carrying this run's marker: the daemon and what it started."""
        needle = f"{MARK}={self.mark}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if needle in Path(f"/proc/{entry}/environ").read_bytes().split(b"\0"):
                        found.append(int(entry))
        return found

    def kill(self) -> None:
        for pid in self.marked_processes():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if self.proc.poll() is None:
            self.proc.wait(10)


@pytest.fixture
def workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="sig"))  # short: the admin socket path


def _topics(bootstrap: str) -> dict[str, str]:
    names = {}
    for query in ("main", "side"):
        for end in ("input", "output"):
            names[f"STREAMS_TEST_{query.upper()}_{end.upper()}"] = name = unique_name(
                f"sig-{query}-{end}"
            )
            create_topic(bootstrap, name, 2)
    return names


def _settings(bootstrap: str, workdir: Path, app_id: str) -> dict[str, Any]:
    return app_config(
        bootstrap,
        app_id,
        workdir / "state",
        threads=1,
        commit_ms=600000,  # offsets can only come from the final commit
        **{"query.side.isolation": "process"},
    )


def _assert_clean_exit(run: Run, code: int | None, expected_code: int, line: str) -> None:
    out = run.output()
    assert code == expected_code, f"exit {code}, expected {expected_code}:\n{out[-4000:]}"
    assert "Traceback" not in out and "KeyboardInterrupt" not in out, out[-4000:]
    assert run.human_lines() == [line], run.human_lines()
    # Nothing it started outlives it (the child of the process-isolated query).
    wait_until(lambda: not run.marked_processes(), 15, message="an orphan process is left")


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_right_after_exec(workdir: Path, sig: signal.Signals) -> None:
    # The topology's topics are set, so that a signal arriving later than
    # usual (a loaded machine) finds a loadable app waiting for its cluster:
    # without them the load failed first and the run exited 2, not 128+sig.
    env = clean_env(**{k: k.lower() for k in _topic_env_names()})
    run = Run(workdir, {"application.id": "x", "bootstrap.servers": "127.0.0.1:1"}, env)
    try:
        run.proc.send_signal(sig)
        code = run.proc.wait(30)
        out = run.output()
        if "Traceback" in out and "runtime/commands/run.py" not in out:
            # Landed while Python imported the `runtime` package (its
            # __init__ imports the whole public API, about 0.4 s), before
            # any line of `run` could take the signal over: the one window
            # left (runtime.admin.signals, module doc). Immediately after
            # exec, as here, the signal nearly always comes earlier still.
            pytest.xfail(f"{sig.name} arrived before streams-runtime's code ran")
        if code == -sig:  # before the interpreter installed any handler
            assert out == "", out
        else:
            expected = f"streams-runtime: {sig.name} during start-up; stopped before the app "
            _assert_clean_exit(run, code, 128 + sig, expected + "started anything")
    finally:
        run.kill()


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_while_waiting_for_an_unreachable_cluster(workdir: Path, sig: signal.Signals) -> None:
    sets = {
        "application.id": unique_name("sig"),
        "bootstrap.servers": "127.0.0.1:1",
        "state.dir": workdir / "state",
    }
    run = Run(workdir, sets, clean_env(**{k: k.lower() for k in _topic_env_names()}))
    try:
        wait_until(lambda: run.event("broker_unreachable"), 30, interval=0.05)
        run.proc.send_signal(sig)
        code = run.proc.wait(10)  # the wait is cut short: no 30 s timeout
        expected = f"streams-runtime: {sig.name} during start-up; stopped before the app "
        _assert_clean_exit(run, code, 128 + sig, expected + "started anything")
    finally:
        run.kill()


def _topic_env_names() -> list[str]:
    return [f"STREAMS_TEST_{q}_{e}" for q in ("MAIN", "SIDE") for e in ("INPUT", "OUTPUT")]


def _running(run: Run) -> bool:
    assert run.proc.poll() is None, run.output()[-3000:]
    if not os.path.exists(run.sock):
        return False
    status = request(run.sock, "status")
    side = next(q for q in request(run.sock, "queries")["queries"] if q["name"] == "side")
    return bool(status["state"] == "RUNNING" and side["pid"] and status["processed"] >= 100)


# When the signal is sent, in the order start-up reaches them.
MOMENTS = {
    # App.start() making the status topic: nothing started yet, but past
    # the cluster wait, so the signal waits for start() to return.
    "topics": lambda run: run.event("topic_created"),
    # The app's threads run; the child of `side` is being started.
    "child_starting": lambda run: run.event("query_process_starting"),
    # The child is up; App.start() returns, then the gap before the admin loop.
    "child_started": lambda run: run.event("query_process_started"),
    "running": _running,
}


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
@pytest.mark.parametrize("moment", list(MOMENTS))
def test_during_start_up_and_once_running(
    bootstrap: str, workdir: Path, moment: str, sig: signal.Signals
) -> None:
    topics = _topics(bootstrap)
    main_input = topics["STREAMS_TEST_MAIN_INPUT"]
    produce(bootstrap, main_input, ((f"k{i % 7}", f"v{i}") for i in range(100)))
    ends = end_offsets(bootstrap, main_input)
    app_id = unique_name("sig")
    run = Run(workdir, _settings(bootstrap, workdir, app_id), clean_env(**topics))
    try:
        wait_until(lambda: MOMENTS[moment](run), 90, interval=0.02, message=f"no {moment}")
        run.proc.send_signal(sig)
        code = run.proc.wait(60)
        _assert_clean_exit(run, code, 0, f"streams-runtime: {sig.name}: shut down gracefully")
        if moment == "running":  # the final commit covers what was processed
            assert committed_offsets(bootstrap, app_id, main_input) == ends
    finally:
        run.kill()
