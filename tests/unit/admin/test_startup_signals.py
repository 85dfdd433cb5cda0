"""Signals around the admin loop (issue 31, item 9), in-process and without Kafka.

`StartupSignals` raises `Interrupted` until `App.start()` is called, records
signals from then on (except inside the cluster wait), and `run_daemon` acts on
what it recorded as its loop starts, then puts its handlers back. The daemon as
a subprocess under real signals is tests/integration/test_signals_at_any_moment.py.

Signals here go to this very process (`signal.raise_signal`), with every
handler restored after each test.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from runtime.admin import daemon as daemon_module
from runtime.admin.daemon import Daemon, run_daemon
from runtime.admin.signals import Interrupted, StartupSignals
from runtime.config import StreamsConfig
from tests.fakes.admin import FakeAdminApp

HANDLED = (signal.SIGTERM, signal.SIGINT, signal.SIGTTIN, signal.SIGTTOU)


@pytest.fixture(autouse=True)
def restore_handlers() -> Iterator[None]:
    saved = {sig: signal.getsignal(sig) for sig in HANDLED}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)


def _raise(sig: signal.Signals) -> None:
    """Send `sig` to this process; its Python handler has run on return."""
    signal.raise_signal(sig)
    # The handler runs at the next bytecode boundary of the main thread.
    for _ in range(10):
        pass


@pytest.mark.parametrize(
    ("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)], ids=["SIGINT", "SIGTERM"]
)
def test_before_start_a_signal_interrupts_with_128_plus_its_number(
    sig: signal.Signals, code: int
) -> None:
    signals = StartupSignals().install()
    with pytest.raises(Interrupted) as caught:
        _raise(sig)
    assert caught.value.signal is sig and caught.value.exit_code == code
    assert signals.first_shutdown is sig
    # Only one exception: a second signal (while the first is reported) is recorded.
    _raise(signal.SIGTERM)
    assert signals.take() == [signal.SIGTERM]
    assert signals.first_shutdown is sig


def test_once_start_is_called_signals_are_recorded_except_inside_the_wait() -> None:
    def wait_for_the_cluster() -> None:
        _raise(signal.SIGINT)

    signals = StartupSignals().install()
    signals.defer(wait_for_the_cluster)
    _raise(signal.SIGTERM)  # threads may be half started: never an exception here
    assert signals.take() == [signal.SIGTERM]
    assert signals.take() == []
    with pytest.raises(Interrupted):
        wait_for_the_cluster()  # nothing started yet: the wait is cut short
    assert signals.first_shutdown is signal.SIGTERM


def test_thread_signals_are_only_recorded() -> None:
    signals = StartupSignals().install()
    _raise(signal.SIGTTIN)  # default action: stop the process
    _raise(signal.SIGTTOU)
    assert signals.take() == [signal.SIGTTIN, signal.SIGTTOU]
    assert signals.first_shutdown is None


class StartedApp(FakeAdminApp):
    """A started app for `run_daemon`: close() finishes it (NOT_RUNNING)."""

    def __init__(self) -> None:
        super().__init__()
        self.config = StreamsConfig.from_dict(
            {"application.id": "app", "bootstrap.servers": "127.0.0.1:9092"}
        )
        self.closes = 0
        self._done = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        self.closes += 1
        self.state = "NOT_RUNNING"
        self._done.set()
        return True


def test_the_daemon_acts_on_a_signal_recorded_during_start_and_puts_handlers_back() -> None:
    # The gap of issue 31: a SIGINT after App.start() returned and before the
    # loop's handlers existed gave a KeyboardInterrupt traceback and no close.
    signals = StartupSignals().install()
    signals.defer()
    _raise(signal.SIGINT)
    _raise(signal.SIGTTIN)
    app = StartedApp()
    assert run_daemon(app, signals=signals) == 0  # a graceful close, as once running
    assert app.closes == 1
    # The SIGTTIN came after the SIGINT: the app was closing, so it changed
    # nothing (a resize racing the close would be decided by thread timing).
    assert len(app.processing_threads) == 1
    assert signals.first_shutdown is signal.SIGINT
    # After the loop: StartupSignals' handlers again, not SIG_DFL (a silent
    # kill) or KeyboardInterrupt. A late signal is recorded and changes nothing.
    assert signal.getsignal(signal.SIGTERM) == signals._on_signal
    assert signal.getsignal(signal.SIGINT) == signals._on_signal
    _raise(signal.SIGTERM)
    assert signals.take() == [signal.SIGTERM]


def test_metrics_connections_stay_within_a_quarter_of_the_open_files_limit(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = {
        "application.id": "app",
        "bootstrap.servers": "127.0.0.1:9092",
        "admin.socket": "/tmp/never-bound.sock",
        "metrics.max.connections": "500",
    }

    class App(FakeAdminApp):
        def __init__(self, settings: dict[str, Any]) -> None:
            super().__init__()
            self.config = StreamsConfig.from_dict(settings)

    monkeypatch.setattr(daemon_module, "open_files_limit", lambda: 1024)
    # 1024 / 4 = 256 descriptors for the endpoints' clients, 32 of them the admin socket's.
    assert Daemon(App(config))._metrics_limits().max_connections == 224
    assert Daemon(App({**config, "metrics.max.connections": "64"}))._metrics_limits() == (
        daemon_module.MetricsLimits(max_connections=64, idle_timeout_s=10.0)
    )
    monkeypatch.setattr(daemon_module, "open_files_limit", lambda: 64)
    assert Daemon(App(config))._metrics_limits().max_connections == 1  # never 0


def test_the_soft_open_files_limit_is_raised_to_the_hard_one() -> None:
    # In a child: this test process keeps its own limits.
    script = (
        "import resource\n"
        "from runtime.admin.preflight import raise_open_files_limit\n"
        "resource.setrlimit(resource.RLIMIT_NOFILE, (256, 2048))\n"
        "print(raise_open_files_limit(), *resource.getrlimit(resource.RLIMIT_NOFILE))\n"
        "print(raise_open_files_limit())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=True
    ).stdout.split()
    assert out == ["2048", "2048", "2048", "2048"]
