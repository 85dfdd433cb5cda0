"""The daemon's shutdown path with a fake app (issue 21, point 3): a shutdown that
raises is logged and ends the daemon with exit 1, never "Task exception was never
retrieved" with the state stuck in PENDING_SHUTDOWN; a huge shutdown.timeout.ms is
clamped before it reaches any wait. The real daemon under SIGTERM is in
tests/integration/test_hardening.py.
"""

from __future__ import annotations

import io
import json
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from runtime.admin import client as admin_client
from runtime.admin.daemon import run_daemon
from runtime.config import MAX_WAIT_MS, StreamsConfig
from runtime.logging import configure_logging
from tests.fakes.admin import FakeAdminApp
from tests.kafka_helpers import wait_until


class ClosingApp(FakeAdminApp):
    """A started app for `run_daemon`; `close()` does what the test says."""

    def __init__(self, socket_path: Path, close: Any) -> None:
        super().__init__()
        self.config = StreamsConfig.from_dict(
            {
                "application.id": "app",
                "bootstrap.servers": "127.0.0.1:9092",
                "admin.socket": str(socket_path),
                "shutdown.timeout.ms": "9223372036854775807",
            }
        )
        self._close = close
        self.close_timeouts: list[float | None] = []
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        self.state = "PENDING_SHUTDOWN"
        self.close_timeouts.append(timeout)
        result: bool = self._close(self)
        return result

    def finish(self, state: str) -> None:
        self.state = state
        self._done.set()


@pytest.fixture
def sock_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dsd") as d:
        yield Path(d) / "admin.sock"


def _shutdown_when_listening(path: Path) -> threading.Thread:
    def run() -> None:
        wait_until(path.exists, 10, interval=0.02)
        admin_client.request(str(path), "shutdown")

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def test_a_shutdown_that_raises_is_logged_and_exits_1(sock_path: Path) -> None:
    def overflow(app: ClosingApp) -> bool:
        raise OverflowError("timestamp out of range for platform time_t")

    app = ClosingApp(sock_path, overflow)
    log = io.StringIO()
    configure_logging("info", json=True, stream=log)
    try:
        helper = _shutdown_when_listening(sock_path)
        assert run_daemon(app, install_signals=False) == 1
        helper.join(5)
    finally:
        configure_logging()
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    failed = [e for e in events if e["event"] == "daemon_task_failed"]
    assert failed and failed[0]["task"] == "close", events[-5:]
    assert "OverflowError" in failed[0]["error"]
    assert not sock_path.exists()


def test_the_infinite_shutdown_timeout_reaches_the_app_clamped(sock_path: Path) -> None:
    def finish(app: ClosingApp) -> bool:
        app.finish("NOT_RUNNING")
        return True

    app = ClosingApp(sock_path, finish)
    assert app.config.shutdown_timeout_ms == MAX_WAIT_MS
    helper = _shutdown_when_listening(sock_path)
    assert run_daemon(app, install_signals=False) == 0
    helper.join(5)
    assert app.close_timeouts == [None]  # App.close reads shutdown.timeout.ms (clamped) itself
