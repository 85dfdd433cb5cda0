"""Real Apache Kafka started by the project's own code: one node and a three-node cluster.

Each test checks what the test suite relies on: the broker answers and round-trips records
exactly, a paused broker delays (not loses) a write, a stopped broker leaves no process and no
data behind, and the cluster keeps serving an RF-3 topic (acks=all, min.insync.replicas 2)
with any one node SIGKILLed, then takes the node back.
"""

from __future__ import annotations

import os
import threading
import time

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, ConfigResource

from runtime.brokers import KafkaBroker, KafkaCluster, kafka_available
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until

_unavailable = kafka_available()
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(_unavailable is not None, reason=_unavailable or ""),
]


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_start_round_trip_stop_leaves_nothing_behind() -> None:
    broker = KafkaBroker()
    broker.start(120)
    pid, log_path = broker.pid, broker.log_path
    assert log_path is not None
    data_root = os.path.dirname(log_path)
    try:
        topic = unique_name("kafka")
        create_topic(broker.bootstrap, topic, 3)
        records = [(f"key-{i % 20}", f"value-{i}") for i in range(500)]
        assert produce(broker.bootstrap, topic, records) == 500
        got = consume_all(broker.bootstrap, topic, expected=500, idle=0.5)
        assert sorted((m.key, m.value) for m in got) == sorted(
            (k.encode(), v.encode()) for k, v in records
        )
        assert len({m.partition for m in got}) == 3
        # The test tuning the suite relies on: topics are never created implicitly.
        admin = AdminClient({"bootstrap.servers": broker.bootstrap})
        resource = ConfigResource(ConfigResource.Type.BROKER, "1")
        config = admin.describe_configs([resource])[resource].result(30)
        assert config["auto.create.topics.enable"].value == "false"
        assert config["group.min.session.timeout.ms"].value == "1000"
    finally:
        broker.stop()
    assert not broker.running
    assert not _process_exists(pid)
    assert not os.path.exists(data_root)
    broker.stop()  # idempotent


def test_produce_during_pause_completes_after_resume() -> None:
    with KafkaBroker() as broker:
        topic = unique_name("pause")
        create_topic(broker.bootstrap, topic, 1)
        produce(broker.bootstrap, topic, [(b"k", b"before")])
        producer = Producer({"bootstrap.servers": broker.bootstrap, "enable.idempotence": True})
        delivered = threading.Event()
        results: list[KafkaError | None] = []

        def on_delivery(err: KafkaError | None, _msg: Message) -> None:
            results.append(err)
            delivered.set()

        broker.pause()
        assert broker.paused
        try:
            producer.produce(topic, key=b"k", value=b"during", on_delivery=on_delivery)
            paused_until = time.monotonic() + 1.0
            while time.monotonic() < paused_until:  # the broker must not acknowledge now
                producer.poll(0.1)
            assert not delivered.is_set()
        finally:
            broker.resume()
        wait_until(lambda: producer.poll(0.1) >= 0 and delivered.is_set(), timeout=30)
        assert results == [None]
        got = consume_all(broker.bootstrap, topic, expected=2, idle=0.2)
        assert [m.value for m in got] == [b"before", b"during"]
        pid = broker.pid
    assert not broker.running
    assert not _process_exists(pid)


def test_a_port_in_use_is_a_clear_error() -> None:
    with KafkaBroker() as first:
        second = KafkaBroker(port=first.port)
        with pytest.raises(RuntimeError, match="address in use"):
            second.start(60)
        assert not second.running
        assert second.log_path is None  # nothing left in the temp directory
        assert first.running


def test_cluster_keeps_serving_rf3_topic_with_the_leader_killed(
    kafka_cluster: KafkaCluster,
) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = unique_name("failover")
    create_topic(bootstrap, topic, 2, replication_factor=3)
    assert produce(bootstrap, topic, [(None, f"a{i}") for i in range(100)], partition=0) == 100

    victim = kafka_cluster.leader(topic, 0)
    pids = {node: kafka_cluster.pid(node) for node in kafka_cluster.node_ids}
    kafka_cluster.kill(victim)
    assert not kafka_cluster.is_running(victim)
    victim_pid = pids[victim]
    assert victim_pid is not None and not _process_exists(victim_pid)
    # A new leader takes over once the controller fences the dead node (about 5 s).
    wait_until(
        lambda: kafka_cluster.leader(topic, 0) != victim, 60, message="no new leader elected"
    )
    # acks=all (the idempotent producer's) with min.insync.replicas=2 still succeeds on the
    # two live replicas.
    assert produce(bootstrap, topic, [(None, f"b{i}") for i in range(100)], partition=0) == 100

    kafka_cluster.restart(victim)
    assert kafka_cluster.is_running(victim)
    kafka_cluster.wait_in_sync([topic], timeout=90)
    got = consume_all(bootstrap, topic, expected=200, idle=0.5)
    values = [m.value for m in sorted(got, key=lambda m: m.offset) if m.partition == 0]
    assert values == [f"a{i}".encode() for i in range(100)] + [f"b{i}".encode() for i in range(100)]


def test_cluster_names_the_transaction_coordinator(kafka_cluster: KafkaCluster) -> None:
    bootstrap = kafka_cluster.bootstrap
    topic = unique_name("txn")
    create_topic(bootstrap, topic, 1, replication_factor=3)
    transactional_id = unique_name("txn-id")
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(60)
    coordinator = kafka_cluster.transaction_coordinator(transactional_id)
    assert coordinator in kafka_cluster.node_ids
    # Killing the coordinator moves the transactional id to another node; the producer finds
    # it there and commits.
    kafka_cluster.kill(coordinator)
    wait_until(
        lambda: kafka_cluster.transaction_coordinator(transactional_id) != coordinator,
        60,
        message="the transaction coordinator did not move",
    )
    producer.begin_transaction()
    producer.produce(topic, b"committed")
    producer.commit_transaction(60)
    kafka_cluster.restart(coordinator)
    got = consume_all(bootstrap, topic, expected=1, idle=0.5)
    assert [m.value for m in got] == [b"committed"]
