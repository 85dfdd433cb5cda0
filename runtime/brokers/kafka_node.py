"""One Kafka KRaft node (a JVM running ``kafka.Kafka``): its config, storage and process.

A node is always a *combined* broker+controller (``process.roles=broker,controller``): one JVM
per node is what two shared cores can carry for a three-node cluster, and a static voter set
(``controller.quorum.voters``) needs no dynamic-quorum bootstrapping. :class:`KafkaBroker` runs
one node, :class:`KafkaCluster` three; both live in ``runtime/brokers/kafka.py``.

Threads: a node is driven by its owner (:class:`KafkaBroker` / :class:`KafkaCluster`), which
serialises calls with its own lock. Nothing here starts threads.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from runtime.brokers.kafka_dist import KafkaDist
from runtime.brokers.orphan_guard import start_guard

__all__ = ["KafkaNode", "NodeAddress", "PortTaken"]

_LOG_TAIL_BYTES = 4000
_FORMAT_TIMEOUT_S = 120.0
_BIND_FAILED = "Address already in use"


class PortTaken(RuntimeError):
    """A listener port was taken before the node could bind it; retry with fresh ports."""


@dataclass(frozen=True, slots=True)
class NodeAddress:
    """Where one node listens: clients on ``port``, the controller quorum on ``controller_port``."""

    node_id: int
    host: str
    port: int
    controller_port: int

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def voter(self) -> str:
        """This node's entry in ``controller.quorum.voters``."""
        return f"{self.node_id}@{self.host}:{self.controller_port}"


class KafkaNode:
    """One combined broker+controller JVM with its own data directory and log file.

    The data directory is formatted once (:meth:`format`); :meth:`spawn` can then run the
    process any number of times (a restart after :meth:`kill` keeps the node's data, as a real
    broker's disk would). The process runs in its own process group so signals reach the JVM
    and nothing else.
    """

    def __init__(
        self,
        dist: KafkaDist,
        address: NodeAddress,
        data_dir: Path,
        log_path: Path,
        properties: Mapping[str, str],
        heap: str,
        log_level: str,
    ) -> None:
        self.dist = dist
        self.address = address
        self.data_dir = data_dir
        self.log_path = log_path
        self._properties = dict(properties)
        self._heap = heap
        self._log_level = log_level
        self._log_file: IO[bytes] | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        # Kills the JVM if this process dies without stopping it (runtime.brokers.orphan_guard).
        self._guard: subprocess.Popen[bytes] | None = None
        self._dumping_archive: Path | None = None
        self._log_start = 0

    @property
    def node_id(self) -> int:
        return self.address.node_id

    @property
    def config_path(self) -> Path:
        return self.data_dir / "server.properties"

    @property
    def pid(self) -> int | None:
        """The JVM's pid while it runs (a SIGSTOPped JVM counts as running), else None."""
        return self._proc.pid if self.running and self._proc is not None else None

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def exit_code(self) -> int | None:
        """The JVM's exit code once it has exited on its own; None while running or unspawned."""
        return None if self._proc is None else self._proc.poll()

    # -- storage ------------------------------------------------------------------------------

    def format(self, cluster_id: str) -> None:
        """Write server.properties and format the KRaft storage (``kafka.tools.StorageTool``).

        Raises RuntimeError with the tool's output if formatting fails.
        """
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text(
            "".join(f"{key}={value}\n" for key, value in sorted(self._properties.items()))
        )
        argv = [
            self.dist.java,
            "-Xmx256m",
            # A one-shot tool: the C1 compiler alone and the serial GC cost less CPU
            # (about 30 % here), which matters when three nodes format at once on two cores.
            "-XX:TieredStopAtLevel=1",
            "-XX:+UseSerialGC",
            "-cp",
            self.dist.classpath,
            f"-Dlog4j2.configurationFile={self.dist.log4j_config}",
            "kafka.tools.StorageTool",
            "format",
            "--cluster-id",
            cluster_id,
            "--config",
            str(self.config_path),
            "--ignore-formatted",
        ]
        result = subprocess.run(
            argv, capture_output=True, text=True, timeout=_FORMAT_TIMEOUT_S, check=False
        )
        if result.returncode != 0:
            raise RuntimeError(
                f"formatting Kafka storage for node {self.node_id} failed "
                f"(exit {result.returncode}):\n{(result.stdout + result.stderr)[-3000:]}"
            )

    # -- process ------------------------------------------------------------------------------

    def spawn(self) -> None:
        """Start the JVM (appending to the node's log); the caller then waits for readiness."""
        if self.running:
            raise RuntimeError(f"Kafka node {self.node_id} is already running")
        self._close_log()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed by _close_log
        self._log_start = self._log_file.tell()
        # Extra JVM options (e.g. -Xlog:gc:file=/tmp/gc.log:time, or another collector
        # for latency runs), as Kafka's own scripts take $KAFKA_OPTS.
        extra = os.environ.get("STREAMS_KAFKA_JVM_OPTS", "").split()
        # Serial GC: a test broker's heap is small and two cores are shared with the
        # clients; G1's concurrent threads and remembered sets cost more than they save.
        # A collector named in the extra options replaces it (the JVM refuses two).
        collector = [] if any(_names_collector(o) for o in extra) else ["-XX:+UseSerialGC"]
        argv = [
            self.dist.java,
            *self._class_archive_options(),
            f"-Xmx{self._heap}",
            "-Xms64m",
            *collector,
            "-Djava.awt.headless=true",
            f"-Dlog4j2.configurationFile={self.dist.log4j_config}",
            f"-Dstreams.kafka.log.level={self._log_level}",
            *extra,
            "-cp",
            self.dist.classpath,
            "kafka.Kafka",
            str(self.config_path),
        ]
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        self._guard = start_guard(self._proc.pid)

    def _class_archive_options(self) -> list[str]:
        """Use the shared class archive if there is one, else have this JVM write one at exit.

        The archive is written to a temp name and renamed into place by :meth:`_reap` once the
        JVM has exited by itself or on SIGTERM (a SIGKILLed JVM may leave half a file).
        """
        archive = self.dist.class_archive
        if archive.exists():
            self._dumping_archive = None
            return [f"-XX:SharedArchiveFile={archive}"]
        self._dumping_archive = archive.with_name(f"{archive.name}.{os.getpid()}-{id(self)}.tmp")
        return [f"-XX:ArchiveClassesAtExit={self._dumping_archive}"]

    def _finish_archive(self, returncode: int) -> None:
        tmp = self._dumping_archive
        self._dumping_archive = None
        if tmp is None or not tmp.exists():
            return
        if returncode == -signal.SIGKILL or tmp.stat().st_size == 0:
            tmp.unlink(missing_ok=True)
            return
        with contextlib.suppress(OSError):
            os.replace(tmp, self.dist.class_archive)

    def check_alive(self) -> None:
        """Raise if the JVM exited or cannot bind a port (PortTaken: retry elsewhere).

        A port conflict is recognised in the log while the JVM still runs: Kafka logs the
        BindException and then takes several seconds to shut itself down.
        """
        code = self.exit_code()
        if _BIND_FAILED in self._log_since_spawn():
            self.kill()
            raise PortTaken(
                f"Kafka node {self.node_id} could not bind its ports "
                f"({self.address.port}, {self.address.controller_port}): address in use"
            )
        if code is None:
            return
        raise RuntimeError(
            f"Kafka node {self.node_id} exited with code {code} while starting on "
            f"{self.address.bootstrap}; log {self.log_path}:\n{self.log_tail()}"
        )

    def _log_since_spawn(self) -> str:
        """What the node logged since its last spawn (small at WARN level; used at start-up)."""
        if self._log_file is not None:
            self._log_file.flush()
        try:
            with open(self.log_path, "rb") as f:
                f.seek(self._log_start)
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def terminate(self, grace: float) -> None:
        """SIGTERM (a controlled shutdown), then SIGKILL after ``grace`` seconds. Idempotent."""
        proc = self._proc
        if proc is not None and proc.poll() is None:
            self._signal(signal.SIGCONT)  # a paused JVM cannot handle SIGTERM
            self._signal(signal.SIGTERM)
            try:
                proc.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                self._signal(signal.SIGKILL)
                proc.wait()
        self._reap()

    def send_terminate(self) -> None:
        """SIGTERM without waiting, so several nodes can shut down at the same time."""
        if self.running:
            self._signal(signal.SIGCONT)
            self._signal(signal.SIGTERM)

    def kill(self) -> None:
        """SIGKILL: the node dies as in a power cut; its data directory stays."""
        if self.running:
            self._signal(signal.SIGKILL)
        self._reap()

    def pause(self) -> None:
        """SIGSTOP: the node stops answering but keeps its state and connections."""
        if not self.running:
            raise RuntimeError(f"Kafka node {self.node_id} is not running")
        self._signal(signal.SIGSTOP)

    def resume(self) -> None:
        """SIGCONT after :meth:`pause`; harmless otherwise."""
        if not self.running:
            raise RuntimeError(f"Kafka node {self.node_id} is not running")
        self._signal(signal.SIGCONT)

    def _signal(self, sig: signal.Signals) -> None:
        assert self._proc is not None
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self._proc.pid, sig)

    def _reap(self) -> None:
        proc = self._proc
        if proc is not None:
            if proc.poll() is None:
                proc.kill()
            self._finish_archive(proc.wait())
        self._proc = None
        guard, self._guard = self._guard, None
        if guard is not None:
            guard.kill()  # its broker is gone; it would leave within a second anyway
            guard.wait()
        self._close_log()

    def _close_log(self) -> None:
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None

    def log_tail(self, max_bytes: int = _LOG_TAIL_BYTES) -> str:
        """The last ``max_bytes`` of the node's log, for error messages."""
        if self._log_file is not None:
            self._log_file.flush()
        try:
            with open(self.log_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                return f.read().decode("utf-8", errors="replace")
        except FileNotFoundError:
            return ""


def _names_collector(jvm_option: str) -> bool:
    """`-XX:+UseG1GC`, `-XX:+UseParallelGC`, `-XX:+UseZGC`, ...: a garbage collector."""
    return jvm_option.startswith("-XX:+Use") and jvm_option.endswith("GC")
