"""A three-node Apache Kafka KRaft cluster for failover tests: :class:`KafkaCluster`.

Each node is a combined broker+controller (three JVMs, not three brokers plus a separate
controller quorum: two cores carry three JVMs better than four, and killing a node then takes
out a broker and a voter together, the harsher case). The voters are static, so two of three
nodes keep a quorum: any single node can be SIGKILLed and the cluster keeps serving. Topics get
replication factor 3 and ``min.insync.replicas=2`` by default, internal topics too.

Who leads what: :meth:`KafkaCluster.leader` names a partition's leader from metadata;
:meth:`KafkaCluster.transaction_coordinator` and :meth:`KafkaCluster.group_coordinator` name
the leader of the internal-topic partition that owns a ``transactional.id`` / ``group.id``,
computed as Kafka does (``abs(javaStringHashCode(id)) % partitions``), because
confluent-kafka has no DescribeTransactions call.

Threads: driven by one thread (a test); ``stop()`` is also safe from any thread.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any

from runtime.brokers.kafka import KafkaNodes
from runtime.brokers.kafka_dist import KAFKA_VERSION

__all__ = ["KafkaCluster", "coordinator_partition", "java_string_hash"]

TRANSACTION_TOPIC = "__transaction_state"
GROUP_TOPIC = "__consumer_offsets"
_CLUSTER_STOP_GRACE_S = 3.0


def java_string_hash(text: str) -> int:
    """Java's ``String.hashCode()`` (a signed 32-bit int over UTF-16 code units)."""
    h = 0
    data = text.encode("utf-16-be")
    for i in range(0, len(data), 2):
        h = (31 * h + int.from_bytes(data[i : i + 2], "big")) & 0xFFFFFFFF
    return h - (1 << 32) if h >= 1 << 31 else h


def coordinator_partition(coordinator_key: str, partitions: int) -> int:
    """The internal-topic partition owning ``coordinator_key`` (Kafka's ``Utils.abs`` rule)."""
    h = java_string_hash(coordinator_key)
    return (0 if h == -(1 << 31) else abs(h)) % partitions


class KafkaCluster(KafkaNodes):
    """``nodes`` (default 3) combined Kafka nodes on free loopback ports; data thrown away.

    :meth:`kill` a node (SIGKILL) and :meth:`restart` it with its data; :meth:`leader`,
    :meth:`transaction_coordinator`, :meth:`group_coordinator` say which node to kill;
    :meth:`wait_in_sync` waits until every replica has caught up again.
    """

    def __init__(
        self,
        nodes: int = 3,
        host: str = "127.0.0.1",
        *,
        heap: str = "384m",
        log_level: str = "WARN",
        properties: Mapping[str, str] | None = None,
        version: str = KAFKA_VERSION,
    ) -> None:
        if nodes < 1:
            raise ValueError(f"a cluster needs at least one node, got {nodes}")
        super().__init__(nodes, host, None, None, heap, log_level, properties, version)

    def start(self, timeout: float = 120.0) -> KafkaCluster:
        """Format and spawn every node; return once all are registered with the controller."""
        self._start(timeout)
        return self

    def stop(self, grace: float = _CLUSTER_STOP_GRACE_S) -> None:
        """Stop every node (SIGTERM, SIGKILL after ``grace`` s), delete the data. Idempotent.

        The grace is short on purpose: stopped together, two nodes exit within a second or two,
        but the last controller then waits 5 s trying to hand its leadership to voters that are
        already gone. The data is thrown away, so nothing is lost by cutting that wait short.
        """
        super().stop(grace)

    def __enter__(self) -> KafkaCluster:
        if not self._nodes:
            self.start()
        return self

    # -- per node -----------------------------------------------------------------------------

    def pid(self, node: int) -> int | None:
        """The node's JVM pid, None while it is killed."""
        return self._node(node).pid

    def log_path(self, node: int) -> str:
        return str(self._node(node).log_path)

    def is_running(self, node: int) -> bool:
        return self._node(node).running

    def node_bootstrap(self, node: int) -> str:
        """``host:port`` of one node's client listener."""
        return self._node(node).address.bootstrap

    def kill(self, node: int) -> None:
        """SIGKILL one node (broker and controller voter at once); its data stays for restart."""
        with self._lock:
            self._node(node).kill()

    def restart(self, node: int, timeout: float = 60.0) -> None:
        """Start a killed node again on its old ports and data; return once it is registered.

        Its replicas then catch up in the background: :meth:`wait_in_sync` waits for that.
        """
        with self._lock:
            target = self._node(node)
            if target.running:
                raise RuntimeError(f"Kafka node {node} is running; kill() it first")
            target.spawn()
            self._wait_ready({node}, time.monotonic() + timeout)

    def pause(self, node: int) -> None:
        """SIGSTOP one node: it stops answering (and heartbeating) but keeps everything."""
        with self._lock:
            self._node(node).pause()

    def resume(self, node: int) -> None:
        with self._lock:
            self._node(node).resume()

    # -- who leads what -----------------------------------------------------------------------

    def leader(self, topic: str, partition: int, timeout: float = 30.0) -> int:
        """The node id leading ``topic``/``partition``, waiting while it has no leader."""
        deadline = time.monotonic() + timeout
        while True:
            leader = self._partition_leaders(topic).get(partition, -1)
            if leader >= 0:
                return leader
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic}[{partition}] has no leader after {timeout} s")
            time.sleep(0.2)

    def transaction_coordinator(self, transactional_id: str, timeout: float = 30.0) -> int:
        """The node coordinating ``transactional_id`` (the leader of its __transaction_state
        partition). The topic exists once any transactional producer has initialised."""
        return self._coordinator(TRANSACTION_TOPIC, transactional_id, timeout)

    def group_coordinator(self, group_id: str, timeout: float = 30.0) -> int:
        """The node coordinating consumer group ``group_id`` (its __consumer_offsets leader)."""
        return self._coordinator(GROUP_TOPIC, group_id, timeout)

    def _coordinator(self, topic: str, key: str, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while True:
            leaders = self._partition_leaders(topic)
            if leaders:
                return self.leader(
                    topic,
                    coordinator_partition(key, len(leaders)),
                    max(0.0, deadline - time.monotonic()),
                )
            if time.monotonic() >= deadline:
                raise TimeoutError(f"{topic} does not exist after {timeout} s")
            time.sleep(0.2)

    def wait_in_sync(self, topics: Iterable[str] | None = None, timeout: float = 60.0) -> None:
        """Wait until every partition of ``topics`` (default: all, internal ones included) has
        a leader and all its replicas in sync, e.g. after :meth:`restart`."""
        from confluent_kafka.admin import AdminClient

        wanted = None if topics is None else set(topics)
        admin = AdminClient(self._admin_config())
        deadline = time.monotonic() + timeout
        # Catching up takes as long as there is to replicate: while fewer
        # partitions lag than before, the wait goes on past `timeout` (up to
        # four times it); it ends when they stop catching up.
        ceiling = time.monotonic() + 4 * timeout
        lagging: list[str] = []
        fewest: int | None = None
        while time.monotonic() < deadline:
            md = admin.list_topics(timeout=10)
            lagging = [
                f"{name}[{p.id}] leader={p.leader} isr={sorted(p.isrs)} replicas={sorted(p.replicas)}"
                for name, meta in md.topics.items()
                if wanted is None or name in wanted
                for p in meta.partitions.values()
                if p.leader < 0 or set(p.isrs) != set(p.replicas)
            ]
            if not lagging:
                return
            if fewest is not None and len(lagging) < fewest:
                deadline = min(ceiling, max(deadline, time.monotonic() + timeout / 2))
            fewest = len(lagging) if fewest is None else min(fewest, len(lagging))
            time.sleep(0.2)
        raise TimeoutError(f"replicas not in sync after {timeout} s: {lagging[:5]}")

    def _partition_leaders(self, topic: str) -> dict[int, int]:
        from confluent_kafka.admin import AdminClient

        md = AdminClient(self._admin_config()).list_topics(topic, timeout=10)
        meta = md.topics.get(topic)
        if meta is None or meta.error is not None:
            return {}
        return {p.id: p.leader for p in meta.partitions.values()}

    def _admin_config(self) -> dict[str, Any]:
        # Only running nodes: a killed node's address would only cost connection attempts.
        live = [n.address.bootstrap for n in self._nodes.values() if n.running]
        return {
            "bootstrap.servers": ",".join(live) or self.bootstrap,
            "log_level": 0,
            "error_cb": _ignore,
        }

    def __repr__(self) -> str:
        states = ",".join(
            f"{i}:{'up' if n.running else 'down'}" for i, n in sorted(self._nodes.items())
        )
        return f"KafkaCluster(kafka {self._version}, nodes {states or 'not started'})"


def _ignore(*_args: object) -> None:
    """error_cb: connection errors to a killed node are expected."""
