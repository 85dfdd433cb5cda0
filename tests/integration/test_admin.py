"""The admin socket and signals on a real daemon (`python -m runtime run` subprocess).

One daemon serves the module (tests.apps.passthrough: input copied to output as bytes):
`admin status` as an operator sees it, thread control through the socket and through
SIGTTIN/SIGTTOU while a producer feeds records (output exact: every sequence number at
least once, per key in order of first appearance), pause/resume, a hypothesis fuzz of the
socket, and finally `admin shutdown`, which must exit 0 and remove the socket file.
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Producer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.admin.client import AdminConnection, request
from tests.configs import app_config
from tests.harness import REPO, Daemon, clean_env
from tests.kafka_helpers import consume_all, create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration

PASSTHROUGH = "tests.apps.passthrough:topology"


@dataclass
class OpsDaemon:
    daemon: Daemon
    socket: str
    source: str
    sink: str
    client_id: str
    env: dict[str, str]

    def call(self, command: str, **arguments: Any) -> Any:
        return request(self.socket, command, **arguments)

    def admin_cli(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "runtime", "admin", "--socket", self.socket, *args],
            cwd=REPO,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def thread_names(self) -> list[str]:
        names: list[str] = self.call("threads")["names"]
        return [n.removeprefix(f"{self.client_id}-") for n in names]

    def tail(self) -> str:
        return self.daemon.tail()


def run_argv(sets: dict[str, object]) -> list[str]:
    argv = [sys.executable, "-m", "runtime", "run", PASSTHROUGH]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    return argv


@pytest.fixture(scope="module")
def ops(bootstrap: str) -> Iterator[OpsDaemon]:
    workdir = Path(tempfile.mkdtemp(prefix="ops"))  # short: AF_UNIX paths are <= 107 bytes
    source, sink, app_id = unique_name("ops-in"), unique_name("ops-out"), unique_name("ops")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    sock = str(workdir / "admin.sock")
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    sets = app_config(bootstrap, app_id, workdir / "state", commit_ms=500, **{"admin.socket": sock})
    process = Daemon(workdir / "daemon.log", PASSTHROUGH, sets, env).start()
    daemon = OpsDaemon(process, sock, source, sink, app_id, env)
    try:
        wait_until(lambda: os.path.exists(sock) or not process.alive(), 60)
        process.assert_alive()
        wait_until(lambda: daemon.call("status")["state"] == "RUNNING", 60, interval=0.2)
        yield daemon
    finally:
        process.kill()
        print(f"--- daemon log tail ---\n{daemon.tail()}")


class Feeder(threading.Thread):
    """Produces `total` records (value = sequence number, key = k<i % keys>) at `rate`/s."""

    def __init__(self, bootstrap: str, topic: str, total: int, rate: float, keys: int) -> None:
        super().__init__(name="feeder", daemon=True)
        self.bootstrap, self.topic, self.total, self.rate, self.keys = (
            bootstrap, topic, total, rate, keys,
        )  # fmt: skip
        self.sent = 0
        self.errors: list[str] = []
        self.unflushed = -1

    def run(self) -> None:
        producer = Producer(
            {"bootstrap.servers": self.bootstrap, "enable.idempotence": True,
             "partitioner": "murmur2_random", "linger.ms": 5}
        )  # fmt: skip

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self.errors.append(str(err))

        started = time.monotonic()
        while self.sent < self.total:
            due = min(self.total, int((time.monotonic() - started) * self.rate) + 1)
            for i in range(self.sent, due):
                key = f"k{i % self.keys}".encode()
                producer.produce(self.topic, str(i).encode(), key, on_delivery=on_delivery)
            self.sent = due
            producer.poll(0)
            time.sleep(0.01)
        self.unflushed = producer.flush(60)


# --- status as an operator sees it --------------------------------------------------------


def test_admin_status_table_and_json(ops: OpsDaemon, bootstrap: str, tmp_path: Path) -> None:
    assert stat.S_IMODE(os.stat(ops.socket).st_mode) == 0o600
    result = ops.admin_cli("status")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["state", "RUNNING"]
    assert any(line.startswith("last commit") for line in lines)
    assert any(line.startswith("records") and "processed" in line for line in lines)
    header = lines.index(next(line for line in lines if line.startswith("TASK")))
    assert lines[header].split()[:5] == ["TASK", "STATE", "OWNER", "BUFFERED", "LAG"]
    assert sorted(line.split()[0] for line in lines[header + 1 :]) == [
        "0_0", "0_1", "0_2", "0_3",
    ]  # fmt: skip

    raw = ops.admin_cli("--json", "status")
    status = json.loads(raw.stdout)
    assert status["daemon"]["admin_socket"] == ops.socket
    assert status["daemon"]["pid"] == ops.daemon.pid
    assert {"consumed", "processed", "produced", "lag", "total_lag"} <= set(status)

    # A second daemon on the same socket is refused before it joins the group (exit 2).
    clash = subprocess.run(
        run_argv({"application.id": unique_name("clash"), "bootstrap.servers": bootstrap,
                  "admin.socket": ops.socket, "state.dir": tmp_path}),
        cwd=REPO, env=ops.env, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert clash.returncode == 2, clash.stderr[-2000:]
    assert "another process is listening" in clash.stderr
    assert ops.call("status")["state"] == "RUNNING"


# --- threads through the socket and signals, under load, output exact -----------------------


def test_thread_control_under_load_keeps_output_exact(ops: OpsDaemon, bootstrap: str) -> None:
    n, keys = 8000, 16
    feeder = Feeder(bootstrap, ops.source, n, rate=1500, keys=keys)
    feeder.start()
    ops.call("threads.set", count=2)
    assert ops.thread_names() == ["ProcessingThread-1", "ProcessingThread-2"]

    added = ops.call("threads.add")["added"]
    assert added == f"{ops.client_id}-ProcessingThread-3"
    assert ops.call("threads.remove", timeout=10)["removed"].endswith("ProcessingThread-3")
    assert ops.call("threads.remove", timeout=10)["removed"].endswith("ProcessingThread-2")
    assert ops.thread_names() == ["ProcessingThread-1"]
    assert ops.call("threads.add")["added"].endswith("ProcessingThread-2")  # index reused
    names = ops.call("threads.set", count=3)["names"]
    assert [n.rsplit("-", 1)[1] for n in names] == ["1", "2", "3"]

    listing = ops.admin_cli("threads")
    assert listing.returncode == 0, listing.stderr
    rows = [line.split() for line in listing.stdout.splitlines()]
    assert rows[0] == ["THREAD", "STATE", "TASK", "LAST_TASK", "BATCHES", "BUSY_S"]
    assert [row[0] for row in rows[1:]] == [
        f"{ops.client_id}-ProcessingThread-{i}" for i in (1, 2, 3)
    ]
    assert {row[1] for row in rows[1:]} <= {"processing", "idle"}, listing.stdout

    ops.daemon.send(signal.SIGTTIN)
    wait_until(lambda: len(ops.thread_names()) == 4, 10, message="SIGTTIN added no thread")
    assert ops.thread_names()[-1] == "ProcessingThread-4"
    # One at a time: the kernel merges a signal sent while the same one is pending.
    for count in (3, 2):
        ops.daemon.send(signal.SIGTTOU)
        wait_until(lambda c=count: len(ops.thread_names()) == c, 10, message="SIGTTOU ignored")
    assert ops.thread_names() == ["ProcessingThread-1", "ProcessingThread-2"]

    result = ops.admin_cli("threads", "set", "3")
    assert result.returncode == 0 and result.stdout.count("ProcessingThread-") == 3, result

    feeder.join(60)
    assert not feeder.is_alive() and feeder.unflushed == 0 and not feeder.errors, feeder.errors
    out = consume_all(bootstrap, ops.sink, expected=n, timeout=90, idle=0.5)
    values = [int(m.value) for m in out if m.value is not None]
    assert set(values) == set(range(n)), f"missing: {sorted(set(range(n)) - set(values))[:20]}"
    by_key: dict[bytes | None, list[int]] = {}
    for m in out:
        by_key.setdefault(m.key, []).append(int(m.value or b"-1"))
    for key, seq in by_key.items():
        firsts = list(dict.fromkeys(seq))
        i0 = int((key or b"k-1")[1:])
        assert firsts == list(range(i0, n, keys)), f"key {key!r}: out of order or foreign"
    ops.daemon.assert_alive()


def test_pause_and_resume(ops: OpsDaemon, bootstrap: str) -> None:
    assert ops.call("pause", task="0_1") == {"paused": "0_1", "assigned": True}
    states = {t["id"]: t["state"] for t in ops.call("tasks")["tasks"]}
    assert states == {"0_0": "RUNNING", "0_1": "PAUSED", "0_2": "RUNNING", "0_3": "RUNNING"}
    result = ops.admin_cli("pause")
    assert (result.returncode, result.stdout.strip()) == (0, "paused all tasks"), result
    assert {t["state"] for t in ops.call("tasks")["tasks"]} == {"PAUSED"}

    time.sleep(0.5)  # let batches in flight end
    before = ops.call("status")["processed"]
    feeder = Feeder(bootstrap, ops.source, 200, rate=10_000, keys=4)
    feeder.run()
    wait_until(lambda: ops.call("status")["consumed"] >= before + 200, 30, interval=0.1)
    time.sleep(0.5)
    assert ops.call("status")["processed"] == before, "paused tasks were processed"

    assert ops.call("resume")["resumed"] == "all"
    assert {t["state"] for t in ops.call("tasks")["tasks"]} == {"RUNNING"}
    wait_until(lambda: ops.call("status")["processed"] >= before + 200, 30, interval=0.1)


# --- fuzz: every line gets one JSON reply, the daemon stays up ---------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=16),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=8), children, max_size=3)
    ),
    max_leaves=10,
)
# Never a valid shutdown, thread change or pause: the fuzz must not change the daemon.
harmless_commands = st.sampled_from(["status", "tasks", "threads", "resume", "reboot", ""])
fuzz_objects = st.builds(
    lambda command, extra: json.dumps({"command": command, **extra}).encode(),
    harmless_commands | st.text(max_size=12).filter(lambda c: c.startswith("x")),
    st.dictionaries(st.sampled_from(["count", "timeout", "task", "x"]), json_values, max_size=2),
)
fuzz_lines = st.lists(
    st.binary(max_size=200) | fuzz_objects | json_values.map(lambda v: json.dumps(v).encode()),
    min_size=1,
    max_size=4,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=fuzz_lines)
def test_fuzzed_requests_get_one_json_reply_each(ops: OpsDaemon, lines: list[bytes]) -> None:
    payload = b"\n".join(lines) + b"\n"
    expected = payload.count(b"\n")
    with AdminConnection(ops.socket, timeout=20) as conn:
        conn._sock.sendall(payload)
        replies = [conn.read_reply() for _ in range(expected)]
        assert all(isinstance(r["ok"], bool) for r in replies)
        assert all(r["ok"] or isinstance(r.get("error"), str) for r in replies)
        assert conn.call("status")["state"] == "RUNNING"


def test_daemon_answers_after_fuzz_and_huge_line(ops: OpsDaemon) -> None:
    with AdminConnection(ops.socket, timeout=20) as conn:
        reply = conn.send_line(b"{" + b"x" * (2 << 20) + b"}")
        assert reply["ok"] is False and "longer than" in reply["error"]
        assert conn.call("status")["state"] == "RUNNING"
    assert len(ops.thread_names()) == 3


# --- shutdown through the socket (last: it ends the module's daemon) -------------------------


def test_admin_shutdown_exits_0_and_removes_the_socket(ops: OpsDaemon) -> None:
    result = ops.admin_cli("shutdown")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("shutting down")
    assert ops.daemon.wait(30) == 0, ops.tail()
    assert not os.path.exists(ops.socket)
    gone = ops.admin_cli("status")
    assert gone.returncode == 1 and "no admin socket" in gone.stderr
