"""One daemon with several processing processes, as the integration tests drive it.

`Run`: its topics (`PARTITIONS` each), admin socket, settings
(exactly_once_v2, `processes=2` unless a test says otherwise) and log.
"""

from __future__ import annotations

import os
import signal
import tempfile
from pathlib import Path
from typing import Any

from runtime.admin.client import AdminConnection
from tests.configs import app_config
from tests.harness import Daemon, clean_env
from tests.kafka_helpers import create_topic, unique_name, wait_until

PARTITIONS = 4


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not reaped yet) is not alive either
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(") ")[-1][:1] != "Z"
    except (FileNotFoundError, ProcessLookupError):  # reaped meanwhile (ESRCH on the read)
        return False


class Run:
    """One daemon of the test: its topics, socket, settings and log."""

    def __init__(self, bootstrap: str, tmp_path: Path, target: str, **extra: Any) -> None:
        self.bootstrap = bootstrap
        self.input = unique_name("procs-in")
        self.output = unique_name("procs-out")
        create_topic(bootstrap, self.input, PARTITIONS)
        create_topic(bootstrap, self.output, PARTITIONS)
        self.workdir = Path(tempfile.mkdtemp(prefix="procs"))  # AF_UNIX paths <= 107 bytes
        self.socket = str(self.workdir / "admin.sock")
        self.target = target
        self.sets: dict[str, Any] = {
            **app_config(
                bootstrap,
                unique_name("procs"),
                tmp_path,
                threads=1,
                guarantee="exactly_once_v2",
                commit_ms=100,
                session_ms=6000,
            ),
            "admin.socket": self.socket,
            "processes": 2,
            "process.restart.backoff.ms": 200,
            **extra,
        }
        self.env = clean_env(STREAMS_TEST_INPUT=self.input, STREAMS_TEST_OUTPUT=self.output)
        self.daemon: Daemon | None = None
        self.runs = 0

    def start(self) -> Daemon:
        self.runs += 1
        daemon = Daemon(self.workdir / f"daemon{self.runs}.log", self.target, self.sets, self.env)
        self.daemon = daemon.start()
        wait_until(lambda: os.path.exists(self.socket) or not daemon.alive(), 120)
        daemon.assert_alive()
        return daemon

    def ask(self, command: str, **arguments: Any) -> Any:
        with AdminConnection(self.socket, 60 + float(arguments.get("timeout", 0))) as conn:
            return conn.call(command, **arguments)

    def processes(self) -> list[dict[str, Any]]:
        return list(self.ask("status")["processes"])

    def wait_running(
        self, count: int, timeout: float = 120, tasks: int = PARTITIONS
    ) -> list[dict[str, Any]]:
        """Wait until `count` processes run and own every task (`tasks`) between them."""

        def ready() -> bool:
            status = self.ask("status")
            rows = status["processes"]
            return (
                len(rows) == count
                and all(r["up"] and r["state"] == "RUNNING" for r in rows)
                and len(status["tasks"]) == tasks
                and all(r["tasks"] > 0 for r in rows)
            )

        assert self.daemon is not None
        wait_until(ready, timeout, interval=0.3, message=f"not {count} running processes")
        return self.processes()

    def kill_and_wait_restart(
        self, victim: dict[str, Any], tasks: int = PARTITIONS
    ) -> list[dict[str, Any]]:
        """kill -9 the processing process of row `victim`; wait until the
        supervisor restarted it in its slot and every process runs again."""
        os.kill(victim["pid"], signal.SIGKILL)
        wait_until(lambda: not alive(victim["pid"]), 10)

        def restarted() -> bool:
            row = next(r for r in self.processes() if r["name"] == victim["name"])
            return bool(
                row["restarts"] == victim["restarts"] + 1
                and row["pid"] not in (None, victim["pid"])
            )

        wait_until(restarted, 60, interval=0.2, message=f"{victim['name']} not restarted")
        return self.wait_running(2, tasks=tasks)

    def stop(self) -> None:
        daemon = self.daemon
        if daemon is not None and daemon.alive():
            daemon.send(signal.SIGTERM)
            code = daemon.wait(90)
            if code is None:
                daemon.kill()
            assert code == 0, daemon.tail()
