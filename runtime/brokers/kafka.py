"""Real Apache Kafka (KRaft), started and stopped from Python: :class:`KafkaBroker`.

The broker is Apache Kafka itself (``kafka.Kafka`` from the jars :mod:`kafka_dist` fetches),
one combined broker+controller node on free loopback ports with a throw-away data directory.
Tests, benchmarks, the demo and ``streams-runtime broker --kind kafka`` use it; the runtime
itself never imports this module (it only speaks the Kafka protocol).

The broker configuration is tuned for tests on a small machine, not for production: internal
topics with replication factor 1 and 10 partitions (the default 50 make the first group join
and the first transaction wait for 50 partition creations), no initial rebalance delay,
session timeouts down to 1 s allowed, fewer network/IO threads, a 16 MB log-cleaner buffer.
``auto.create.topics.enable`` is false: the runtime must create what it needs (the Tansu
broker auto-creates, which could hide a missing create). Pass ``properties`` to override.

:class:`KafkaCluster` (``runtime/brokers/kafka_cluster.py``) runs three such nodes.

Threads: a broker is driven by one thread (a test session, the CLI's main thread); ``stop()``
is also safe from any thread and more than once, and runs at interpreter exit.

A little over 500 lines as one thing: a node's properties, its process and
its readiness checks change together whenever Kafka's start-up changes.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import os
import shutil
import socket
import tempfile
import threading
import time
import uuid
from collections.abc import Iterable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from runtime.brokers.kafka_dist import KAFKA_VERSION, KafkaDist, ensure_kafka
from runtime.brokers.kafka_node import KafkaNode, NodeAddress, PortTaken

__all__ = ["KafkaBroker", "broker_properties", "new_cluster_id"]

_STOP_GRACE_S = 15.0
# Readiness: past its deadline a start goes on while the nodes' logs grow (no
# growth for this long ends it), up to this many times the deadline.
_READY_PROGRESS_GRACE_S = 15.0
_READY_CEILING_FACTOR = 4
_AUTO_PORT_ATTEMPTS = 3


def new_cluster_id() -> str:
    """A KRaft cluster id: a random UUID in URL-safe base64 without padding (22 characters).

    Like Kafka's own ``Uuid.randomUuid`` it never starts with ``-``, which the storage tool's
    command line would read as an option.
    """
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def free_ports(count: int, host: str) -> list[int]:
    """``count`` distinct ports on ``host`` that were free a moment ago.

    All sockets are held open together so the ports are distinct; another process can still
    take one before the broker binds it, which the starters retry (see PortTaken).
    """
    with contextlib.ExitStack() as stack:
        ports = []
        for _ in range(count):
            sock = stack.enter_context(socket.socket(socket.AF_INET, socket.SOCK_STREAM))
            sock.bind((host, 0))
            ports.append(int(sock.getsockname()[1]))
        return ports


def broker_properties(
    address: NodeAddress,
    voters: Iterable[NodeAddress],
    data_dir: Path,
    replication: int,
    overrides: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """server.properties for one combined node of a ``replication``-node test cluster.

    ``replication`` is both the number of nodes and the default replication factor;
    ``min.insync.replicas`` is 1 for a single node and 2 otherwise, so a three-node cluster
    keeps accepting ``acks=all`` writes and transactions with one node down.
    """
    min_isr = "1" if replication == 1 else "2"
    rf = str(replication)
    props = {
        "process.roles": "broker,controller",
        "node.id": str(address.node_id),
        "controller.quorum.voters": ",".join(voter.voter for voter in voters),
        "listeners": (
            f"PLAINTEXT://{address.host}:{address.port},"
            f"CONTROLLER://{address.host}:{address.controller_port}"
        ),
        "advertised.listeners": f"PLAINTEXT://{address.host}:{address.port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir / "logs"),
        "auto.create.topics.enable": "false",
        "num.partitions": "1",
        "default.replication.factor": rf,
        "min.insync.replicas": min_isr,
        "offsets.topic.replication.factor": rf,
        "offsets.topic.num.partitions": "10",
        "transaction.state.log.replication.factor": rf,
        "transaction.state.log.min.isr": min_isr,
        "transaction.state.log.num.partitions": "10",
        "share.coordinator.state.topic.replication.factor": rf,
        "share.coordinator.state.topic.min.isr": min_isr,
        # Groups: no delay before the first rebalance; the small session timeouts tests use
        # are allowed (the broker default minimum is 6 s). KIP-848 (group.protocol=consumer)
        # timeouts are set by the broker, not the client: a 1 s heartbeat and a 6 s session,
        # the values the tests use for the classic protocol.
        "group.initial.rebalance.delay.ms": "0",
        "group.min.session.timeout.ms": "1000",
        "group.consumer.min.heartbeat.interval.ms": "500",
        "group.consumer.heartbeat.interval.ms": "1000",
        "group.consumer.min.session.timeout.ms": "3000",
        "group.consumer.session.timeout.ms": "6000",
        # Two shared cores: fewer threads, a small dedupe buffer for compacted changelogs.
        "num.network.threads": "2",
        "num.io.threads": "4",
        "background.threads": "4",
        "num.recovery.threads.per.data.dir": "1",
        "log.cleaner.threads": "1",
        "log.cleaner.dedupe.buffer.size": str(16 * 1024 * 1024),
    }
    if replication > 1:
        # A killed node is fenced (and its partitions move) after the broker session timeout;
        # 9 s by default, 5 s here so failover tests do not wait long, still well above the
        # pauses two busy cores cause.
        props["broker.session.timeout.ms"] = "5000"
        props["broker.heartbeat.interval.ms"] = "500"
    props.update(overrides or {})
    return props


class KafkaNodes:
    """Shared machinery of KafkaBroker and KafkaCluster: N combined nodes of one cluster.

    Owns the temp directory (node data and, unless the caller gave a log path, the logs),
    the cluster id, start with port-conflict retries, readiness, stop and the atexit hook.
    """

    kind = "kafka"

    def __init__(
        self,
        nodes: int,
        host: str,
        ports: list[int] | None,
        log_paths: list[str] | None,
        heap: str,
        log_level: str,
        properties: Mapping[str, str] | None,
        version: str,
    ) -> None:
        self._node_count = nodes
        self._host = host
        self._requested_ports = ports
        self._requested_log_paths = log_paths
        self._heap = heap
        self._log_level = log_level
        self._overrides = dict(properties or {})
        self._version = version
        self._nodes: dict[int, KafkaNode] = {}
        self._root: Path | None = None
        self._cluster_id = ""
        self._lock = threading.RLock()

    # -- properties ---------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return self._host

    @property
    def bootstrap(self) -> str:
        """``bootstrap.servers`` for clients: every node's listener, comma-separated."""
        if not self._nodes:
            raise RuntimeError(f"{type(self).__name__} has no ports yet: call start() first")
        return ",".join(node.address.bootstrap for node in self._nodes.values())

    @property
    def cluster_id(self) -> str:
        """The KRaft cluster id (empty before start)."""
        return self._cluster_id

    @property
    def node_ids(self) -> list[int]:
        return sorted(self._nodes)

    @property
    def running(self) -> bool:
        """True while every node's process exists (paused counts as running)."""
        return bool(self._nodes) and all(node.running for node in self._nodes.values())

    @property
    def version(self) -> str:
        return self._version

    # -- lifecycle ----------------------------------------------------------------------------

    def _start(self, timeout: float) -> None:
        """Fetch Kafka if needed, format and spawn every node, wait until all are ready.

        ``timeout`` covers formatting and start-up, not a first-time Maven fetch. A port taken
        between choosing and binding it is retried with fresh ports when none were given.
        """
        with self._lock:
            if self._nodes:
                raise RuntimeError(f"{type(self).__name__} already started on {self.bootstrap}")
            dist = ensure_kafka(self._version)
            deadline = time.monotonic() + timeout
            attempts = 1 if self._requested_ports is not None else _AUTO_PORT_ATTEMPTS
            for attempt in range(1, attempts + 1):
                try:
                    self._start_once(dist, deadline)
                    return
                except PortTaken as exc:
                    self._cleanup()  # the message says it all; no log worth keeping
                    if attempt == attempts or time.monotonic() >= deadline:
                        raise RuntimeError(str(exc)) from None
                except BaseException:
                    self._cleanup(keep_logs=True)  # the error message names the log
                    raise

    def _start_once(self, dist: KafkaDist, deadline: float) -> None:
        ports = self._requested_ports or free_ports(2 * self._node_count, self._host)
        if len(ports) != 2 * self._node_count:
            raise ValueError(f"need {2 * self._node_count} ports, got {ports}")
        addresses = [
            NodeAddress(i + 1, self._host, ports[2 * i], ports[2 * i + 1])
            for i in range(self._node_count)
        ]
        for address in addresses:  # a taken port fails here, not 5 s into the JVM's start
            for port in (address.port, address.controller_port):
                if not _bindable(self._host, port):
                    raise PortTaken(
                        f"Kafka node {address.node_id} cannot listen on {self._host}:{port}: "
                        "address in use"
                    )
        self._root = Path(tempfile.mkdtemp(prefix=f"kafka-{addresses[0].port}-"))
        self._cluster_id = new_cluster_id()
        for index, address in enumerate(addresses):
            data_dir = self._root / f"node-{address.node_id}"
            log_path = (
                Path(self._requested_log_paths[index])
                if self._requested_log_paths
                else self._root / f"node-{address.node_id}.log"
            )
            props = broker_properties(
                address, addresses, data_dir, self._node_count, self._overrides
            )
            self._nodes[address.node_id] = KafkaNode(
                dist, address, data_dir, log_path, props, self._heap, self._log_level
            )
        atexit.register(self.stop)
        self._run_on_all(lambda node: node.format(self._cluster_id))
        for node in self._nodes.values():
            node.spawn()
        self._wait_ready(set(self._nodes), deadline)

    def _run_on_all(self, action: Any) -> None:
        """Run ``action(node)`` for every node in parallel (each spawns a short-lived JVM)."""
        errors: list[BaseException] = []

        def run(node: KafkaNode) -> None:
            try:
                action(node)
            except BaseException as exc:  # re-raised on the caller's thread below
                errors.append(exc)

        threads = [
            threading.Thread(target=run, args=(node,), name=f"kafka-format-{node.node_id}")
            for node in self._nodes.values()
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _wait_ready(self, node_ids: set[int], deadline: float) -> None:
        """Poll with metadata requests until our cluster answers with every node in ``node_ids``.

        The cluster id check guards against another broker answering on a reused port.
        """
        from confluent_kafka import KafkaException
        from confluent_kafka.admin import AdminClient

        bootstrap = ",".join(self._nodes[i].address.bootstrap for i in sorted(node_ids))
        probe_config: dict[str, Any] = {
            "bootstrap.servers": bootstrap,
            "reconnect.backoff.ms": 50,
            "reconnect.backoff.max.ms": 200,
            "log_level": 0,
            "error_cb": _ignore,
        }
        admin = AdminClient(probe_config)
        last_error = "no answer"
        # A node that keeps writing its log (loading segments, electing, replaying
        # the metadata log) is making progress: on a loaded machine that can take
        # longer than `deadline` allows, so the wait goes on while the logs grow,
        # up to a ceiling (issue 32: fixed 60 s waits failed after restarts).
        ceiling = time.monotonic() + _READY_CEILING_FACTOR * max(1.0, deadline - time.monotonic())
        logged = self._log_bytes(node_ids)
        while True:
            for node_id in node_ids:
                self._nodes[node_id].check_alive()
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                now_logged = self._log_bytes(node_ids)
                if now_logged != logged and time.monotonic() < ceiling:
                    logged = now_logged
                    deadline = time.monotonic() + _READY_PROGRESS_GRACE_S
                    continue
                logs = "\n".join(
                    f"--- node {i} ({self._nodes[i].log_path}):\n{self._nodes[i].log_tail()}"
                    for i in sorted(node_ids)
                )
                raise RuntimeError(
                    f"Kafka did not become ready on {bootstrap} in time ({last_error})\n{logs}"
                )
            try:
                md = admin.list_topics(timeout=max(0.1, min(1.0, remaining)))
            except KafkaException as exc:
                last_error = str(exc)
                time.sleep(0.1)
                continue
            if md.cluster_id != self._cluster_id:
                last_error = f"a different broker (cluster id {md.cluster_id!r}) answers there"
            elif not node_ids <= set(md.brokers):
                last_error = f"registered brokers {sorted(md.brokers)}, want {sorted(node_ids)}"
            else:
                return
            time.sleep(0.1)

    def _log_bytes(self, node_ids: set[int]) -> int:
        """How much the nodes have logged so far: a sign of progress while they start."""
        total = 0
        for node_id in node_ids:
            with contextlib.suppress(OSError):  # not created yet
                total += os.path.getsize(self._nodes[node_id].log_path)
        return total

    def stop(self, grace: float = _STOP_GRACE_S) -> None:
        """Stop every node (SIGTERM, SIGKILL after ``grace`` s) and delete the data. Idempotent.

        All nodes are asked at once: stopped one by one, the last nodes of a cluster would wait
        for a controller quorum that is already gone. Any thread may call this.
        """
        with self._lock:
            for node in self._nodes.values():
                node.send_terminate()
            end = time.monotonic() + grace
            for node in self._nodes.values():
                with contextlib.suppress(Exception):
                    node.terminate(max(0.0, end - time.monotonic()))
            self._cleanup()

    def _cleanup(self, keep_logs: bool = False) -> None:
        """Kill what still runs, remove the data (and our logs unless kept), forget the nodes."""
        for node in self._nodes.values():
            node.kill()
        if self._root is not None:
            for node in self._nodes.values():
                shutil.rmtree(node.data_dir, ignore_errors=True)
            if not keep_logs or self._requested_log_paths:  # no log of ours in the root
                shutil.rmtree(self._root, ignore_errors=True)
        self._nodes = {}
        self._root = None
        atexit.unregister(self.stop)

    def _node(self, node_id: int) -> KafkaNode:
        try:
            return self._nodes[node_id]
        except KeyError:
            raise ValueError(
                f"no Kafka node {node_id} (nodes: {self.node_ids or 'none, not started'})"
            ) from None

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


class KafkaBroker(KafkaNodes):
    """One Apache Kafka node (broker + controller) on ``host:port`` with throw-away storage.

    The same surface as :class:`runtime.brokers.devbroker.DevBroker`: :meth:`start` or a ``with``
    block, ``bootstrap``, ``pid``, ``log_path``, :meth:`pause` / :meth:`resume` (SIGSTOP /
    SIGCONT: an outage that keeps the data), :meth:`stop`. The JVM runs in its own process
    group, so a Ctrl-C in the terminal reaches only the Python process, which stops it in order.
    """

    def __init__(
        self,
        port: int | None = None,
        host: str = "127.0.0.1",
        log_path: str | None = None,
        *,
        controller_port: int | None = None,
        heap: str = "512m",
        log_level: str = "WARN",
        properties: Mapping[str, str] | None = None,
        version: str = KAFKA_VERSION,
    ) -> None:
        """Describe a broker; nothing is started yet. ``port=None`` picks free ports."""
        ports = None
        if port is not None:
            ports = [port, controller_port or free_ports(1, host)[0]]
        super().__init__(
            1, host, ports, [log_path] if log_path else None, heap, log_level, properties, version
        )
        self._paused = False

    @property
    def port(self) -> int:
        """The client listener port; known once :meth:`start` has chosen it."""
        return self._the_node().address.port

    @property
    def pid(self) -> int:
        """The JVM's process id (also its process group id)."""
        pid = self._the_node().pid
        if pid is None:
            raise RuntimeError("KafkaBroker is not running: call start() first")
        return pid

    @property
    def log_path(self) -> str | None:
        """Where the broker's output goes (removed by stop unless the caller gave the path)."""
        return str(self._nodes[1].log_path) if self._nodes else self._requested_log_path()

    def _requested_log_path(self) -> str | None:
        return self._requested_log_paths[0] if self._requested_log_paths else None

    @property
    def paused(self) -> bool:
        """True between :meth:`pause` and :meth:`resume`."""
        return self._paused

    def _the_node(self) -> KafkaNode:
        if not self._nodes:
            raise RuntimeError("KafkaBroker is not started: call start() first")
        return self._nodes[1]

    def start(self, timeout: float = 60.0) -> KafkaBroker:
        """Format storage, spawn the JVM, return once it answers a metadata request.

        Raises BrokerUnavailable if Java (or, for the first fetch, Maven) is missing, and
        RuntimeError with the tail of the broker's log if it exits or does not answer within
        ``timeout`` seconds (about 2 s on an idle 2-core machine).
        """
        self._start(timeout)
        self._paused = False
        return self

    def stop(self, grace: float = _STOP_GRACE_S) -> None:
        """SIGTERM (controlled shutdown), SIGKILL after ``grace`` s; data removed. Idempotent."""
        with self._lock:
            super().stop(grace)
            self._paused = False

    def pause(self) -> None:
        """Freeze the broker (SIGSTOP): clients see an unresponsive broker, data is kept."""
        with self._lock:
            self._the_node().pause()
            self._paused = True

    def resume(self) -> None:
        """Thaw a paused broker (SIGCONT). Harmless if it is not paused."""
        with self._lock:
            self._the_node().resume()
            self._paused = False

    def log_tail(self, max_bytes: int = 4000) -> str:
        """The last ``max_bytes`` of the broker's log, for error messages."""
        return self._nodes[1].log_tail(max_bytes) if self._nodes else ""

    def __enter__(self) -> KafkaBroker:
        if not self._nodes:
            self.start()
        return self

    def __repr__(self) -> str:
        state = "paused" if self._paused else ("running" if self.running else "stopped")
        where = self._nodes[1].address.bootstrap if self._nodes else self._host
        return f"KafkaBroker({where}, kafka {self._version}, {state})"


def _bindable(host: str, port: int) -> bool:
    """Whether ``host:port`` can be listened on right now (as the JVM will, SO_REUSEADDR)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
        return True


def _ignore(*_args: object) -> None:
    """error_cb for the readiness probe: refused connections are expected while starting."""
