"""A hostile client against a running daemon's /metrics (issue 31, item 6).

The report: 1,100 idle connections to the metrics port exhausted the file
descriptors, and the app died writing a checkpoint (EMFILE). Here the daemon
(a stateful count app, so it writes checkpoints at every commit) runs with
RLIMIT_NOFILE 1024/1024, as on a host whose limit cannot be raised, while the
test opens 1,100 idle connections, 20 slowloris ones that trickle a request
head they never finish, and keeps opening more. Meanwhile /metrics, /healthz
and /readyz answer every scrape, the app keeps committing and writing
checkpoints, the server cuts off what is beyond `metrics.max.connections`
and times out the slowloris clients after `metrics.idle.timeout.ms`, and the
daemon's descriptor count stays within the cap of its resting count.
Bounded: about 15 s of abuse, every wait with a deadline.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.client import request
from tests.configs import app_config
from tests.harness import Daemon, Feeder, clean_env
from tests.kafka_helpers import create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration

MAX_CONNECTIONS = 64  # metrics.max.connections' default
IDLE_TIMEOUT_MS = 3000
OPEN_FILES = 1024  # soft = hard: the daemon cannot raise it


def _limit_open_files() -> None:
    """In the daemon's process before exec (subprocess preexec_fn)."""
    resource.setrlimit(resource.RLIMIT_NOFILE, (OPEN_FILES, OPEN_FILES))


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _events(log_path: Path, name: str) -> list[dict[str, Any]]:
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                event = json.loads(line)
                if event.get("event") == name:
                    found.append(event)
    return found


def _scrape(url: str) -> int:
    """The status code of one GET (raises if there is no answer within 5 s)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            resp.read()
            return int(resp.status)
    except urllib.error.HTTPError as err:  # /readyz before RUNNING: 503
        return int(err.code)


def _closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset), without blocking.

    A peek, not select(): this process holds descriptors above select()'s 1024.
    """
    sock.settimeout(0)  # a socket with a timeout would wait that long for the peek
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def _checkpoints(state_dir: Path, app_id: str) -> dict[str, str]:
    return {
        path.parent.name: path.read_text()
        for path in (state_dir / app_id).glob("*/.checkpoint")
        if path.is_file()
    }


class Slowloris(threading.Thread):
    """`count` connections that send a request head one byte at a time and
    never finish it; records how long each lasted before the server cut it."""

    def __init__(self, port: int, count: int) -> None:
        super().__init__(name="slowloris", daemon=True)
        self.port, self.count = port, count
        self.lasted: list[float] = []
        self.halt = threading.Event()

    def run(self) -> None:
        open_: list[tuple[socket.socket, float]] = []
        for _ in range(self.count):
            sock = socket.create_connection(("127.0.0.1", self.port), timeout=5)
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            open_.append((sock, time.monotonic()))
        while open_ and not self.halt.is_set():
            still = []
            for sock, since in open_:
                try:
                    sock.sendall(b"a")
                    cut = _closed_by_server(sock)
                except OSError:
                    cut = True
                if cut:
                    self.lasted.append(time.monotonic() - since)
                    sock.close()
                else:
                    still.append((sock, since))
            open_ = still
            self.halt.wait(0.3)
        for sock, _ in open_:
            sock.close()


def test_metrics_under_idle_and_slow_connections(bootstrap: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="mh"))  # short: the admin socket path
    source, sink, app_id = unique_name("mh-in"), unique_name("mh-out"), unique_name("mh")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    state_dir = workdir / "state"
    sock_path = str(workdir / "admin.sock")
    sets = app_config(
        bootstrap, app_id, state_dir, threads=1, commit_ms=300,
        **{"admin.socket": sock_path, "metrics.port": 0,
           "metrics.idle.timeout.ms": IDLE_TIMEOUT_MS},
    )  # fmt: skip
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    log_path = workdir / "daemon.log"
    # With the open-files limit of the report's host.
    daemon = Daemon(
        log_path, "tests.apps.count_app:topology", sets, env, preexec_fn=_limit_open_files
    ).start()
    feeder = Feeder(bootstrap, source, rate=300, keys=32)
    idle: list[socket.socket] = []
    slow: Slowloris | None = None
    try:

        def listening() -> dict[str, Any] | None:
            daemon.assert_alive()
            found = _events(log_path, "metrics_listening")
            return found[0] if found else None

        wait_until(listening, 90, interval=0.1, message="no metrics_listening event")
        event = listening()
        assert event is not None and event["max_connections"] == MAX_CONNECTIONS
        base, port, pid = f"http://127.0.0.1:{event['port']}", int(event["port"]), daemon.pid
        feeder.start()
        wait_until(lambda: _scrape(base + "/readyz") == 200, 90, interval=0.2)
        wait_until(lambda: len(_checkpoints(state_dir, app_id)) == 2, 60, interval=0.2)
        resting = _fds(pid)
        commits_before = request(sock_path, "status")["commits"]

        scrapes, most_fds = 0, _fds(pid)

        def keep_scraping(seconds: float, churn: int) -> None:
            """Scrape all three paths every 0.2 s for `seconds`, each answering
            200, while `churn` more idle connections arrive per round."""
            nonlocal scrapes, most_fds
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                daemon.assert_alive()
                for _ in range(churn):
                    with contextlib.suppress(OSError):
                        idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
                for path in ("/metrics", "/healthz", "/readyz"):
                    assert _scrape(base + path) == 200, path
                    scrapes += 1
                most_fds = max(most_fds, _fds(pid))
                time.sleep(0.2)  # the abuse's pace, not a wait for a condition

        # Phase 1: 1,100 idle connections, as in the report, and 20 more per
        # round for 8 s. Beyond the cap the oldest idle ones are cut off.
        refused_at_connect = 0
        for _ in range(1100):
            try:
                idle.append(socket.create_connection(("127.0.0.1", port), timeout=2))
            except OSError:
                refused_at_connect += 1
        most_fds = max(most_fds, _fds(pid))
        keep_scraping(8, churn=20)
        cut = sum(1 for sock in idle if _closed_by_server(sock))
        assert cut >= len(idle) - MAX_CONNECTIONS, (cut, len(idle), refused_at_connect)
        opened = len(idle)
        for sock in idle:
            sock.close()
        idle.clear()
        # The server lets go of them all (their descriptors too).
        wait_until(lambda: _fds(pid) <= resting + 8, 10, interval=0.1, message="fds not freed")

        # Phase 2: slowloris clients below the cap (nothing evicts them): cut
        # off by metrics.idle.timeout.ms although they keep sending.
        slow = Slowloris(port, 20)
        slow.start()
        keep_scraping(IDLE_TIMEOUT_MS / 1000 + 1, churn=0)
        wait_until(lambda: len(slow.lasted) == 20, 10, interval=0.2, message="slowloris not cut")
        timeout_s = IDLE_TIMEOUT_MS / 1000
        assert timeout_s - 0.5 <= min(slow.lasted) <= max(slow.lasted) < timeout_s + 3, slow.lasted

        status = request(sock_path, "status")
        assert status["state"] == "RUNNING"
        assert status["commits"] > commits_before + 5, "the app stopped committing"
        # (The checkpoint files are rewritten every 10,000 changelog records,
        # more than this test's feed writes: the commits say the app goes on.)
        # The server's connections, its own sockets and the app's files: the
        # resting count, the cap, and a little room for what the app opens.
        assert most_fds <= resting + MAX_CONNECTIONS + 32, (most_fds, resting)
        print(
            f"fds resting {resting}, at most {most_fds}; {opened} idle connections, "
            f"{cut} cut off, {refused_at_connect} refused at connect; {scrapes} scrapes "
            f"answered; slowloris lasted {min(slow.lasted):.1f}-{max(slow.lasted):.1f} s"
        )
    finally:
        if slow is not None:
            slow.halt.set()
        for sock in idle:
            sock.close()
        with contextlib.suppress(AssertionError):
            feeder.stop()
        if daemon.alive():
            daemon.send(signal.SIGTERM)
            code = daemon.wait(30)
        else:
            code = daemon.wait(0)
        daemon.kill()
        print(daemon.tail())
    assert code == 0, f"exit code {code}"
    assert "Too many open files" not in log_path.read_text(errors="replace")
    # Logged at most once per 10 s, the rest when the endpoint closes.
    limited = _events(log_path, "metrics_connections_limited")
    assert limited and limited[0]["max_connections"] == MAX_CONNECTIONS
    assert sum(e["evicted"] for e in limited) >= cut - 1100 // 2, limited
    assert sum(e["timed_out"] for e in limited) >= 20, limited
