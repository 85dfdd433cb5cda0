"""The broker starters' pure parts: the Kafka configuration, the clear errors without Java or
Maven, the choice of broker kind, Java's string hash for coordinator lookup."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from runtime.brokers import BrokerUnavailable, kafka_available, resolve_kind
from runtime.brokers.kafka import broker_properties, new_cluster_id
from runtime.brokers.kafka_cluster import coordinator_partition, java_string_hash
from runtime.brokers.kafka_dist import ensure_kafka, find_java
from runtime.brokers.kafka_node import NodeAddress, _names_collector


def _nodes(count: int) -> list[NodeAddress]:
    return [NodeAddress(i + 1, "127.0.0.1", 9000 + 2 * i, 9001 + 2 * i) for i in range(count)]


def test_single_node_properties_suit_one_broker() -> None:
    (node,) = _nodes(1)
    props = broker_properties(node, [node], Path("/data"), replication=1)
    assert props["process.roles"] == "broker,controller"
    assert props["controller.quorum.voters"] == "1@127.0.0.1:9001"
    assert props["listeners"] == "PLAINTEXT://127.0.0.1:9000,CONTROLLER://127.0.0.1:9001"
    assert props["advertised.listeners"] == "PLAINTEXT://127.0.0.1:9000"
    for key in ("offsets.topic.replication.factor", "transaction.state.log.replication.factor"):
        assert props[key] == "1"
    assert props["transaction.state.log.min.isr"] == props["min.insync.replicas"] == "1"
    assert props["auto.create.topics.enable"] == "false"
    assert props["log.dirs"] == "/data/logs"


def test_cluster_properties_replicate_three_ways_and_survive_one_loss() -> None:
    nodes = _nodes(3)
    props = broker_properties(nodes[1], nodes, Path("/d"), replication=3)
    assert props["node.id"] == "2"
    assert props["controller.quorum.voters"] == (
        "1@127.0.0.1:9001,2@127.0.0.1:9003,3@127.0.0.1:9005"
    )
    assert props["default.replication.factor"] == "3"
    assert props["offsets.topic.replication.factor"] == "3"
    assert props["min.insync.replicas"] == props["transaction.state.log.min.isr"] == "2"
    assert int(props["broker.session.timeout.ms"]) > int(props["broker.heartbeat.interval.ms"])


def test_overrides_win() -> None:
    (node,) = _nodes(1)
    props = broker_properties(
        node, [node], Path("/d"), 1, {"auto.create.topics.enable": "true", "x.y": "1"}
    )
    assert props["auto.create.topics.enable"] == "true"
    assert props["x.y"] == "1"


def test_cluster_ids_are_kraft_uuids() -> None:
    ids = {new_cluster_id() for _ in range(200)}
    assert len(ids) == 200
    assert all(len(i) == 22 and not i.startswith("-") for i in ids)


def test_java_string_hash_and_coordinator_partition_match_java() -> None:
    # "...".hashCode() as printed by Java 17.
    assert java_string_hash("") == 0
    assert java_string_hash("a") == 97
    assert java_string_hash("hello") == 99162322
    assert java_string_hash("transactional-id-0") == 1051133890
    assert java_string_hash("\u00e9\u2713") == 17226  # UTF-16 code units, not UTF-8 bytes
    assert java_string_hash("polygenelubricants") == -(2**31)
    assert coordinator_partition("transactional-id-0", 10) == 0
    assert coordinator_partition("hello", 7) == 99162322 % 7
    # Kafka's Utils.abs maps Integer.MIN_VALUE to 0 (Math.abs would stay negative).
    assert coordinator_partition("polygenelubricants", 10) == 0


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH with nothing on it, no JAVA_HOME, an empty broker cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("STREAMS_CACHE_DIR", str(tmp_path / "cache"))
    return bin_dir


def test_without_java_the_error_says_what_to_install(bare_path: Path) -> None:
    with pytest.raises(BrokerUnavailable, match="no java was found.*openjdk-17"):
        find_java()
    reason = kafka_available()
    assert reason is not None and "Java 17" in reason
    assert resolve_kind("auto") == "tansu"
    assert resolve_kind("kafka") == "kafka"  # asked for explicitly: start() will say why not


def test_too_old_java_is_refused(bare_path: Path) -> None:
    fake = bare_path / "java"
    fake.write_text("#!/bin/sh\necho 'openjdk version \"11.0.2\" 2019-01-15' >&2\n")
    fake.chmod(0o755)
    with pytest.raises(BrokerUnavailable, match="Java 17 or newer.*Java 11"):
        find_java()


@pytest.mark.skipif(not os.path.exists("/usr/bin/java"), reason="needs a system java")
def test_without_maven_and_cache_the_error_names_maven(bare_path: Path) -> None:
    (bare_path / "java").symlink_to(os.path.realpath("/usr/bin/java"))
    with pytest.raises(BrokerUnavailable, match=r"not cached in .* Maven \(mvn\) is not installed"):
        ensure_kafka()
    assert "Maven" in (kafka_available() or "")


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown broker kind 'redpanda'"):
        resolve_kind("redpanda")


def test_a_collector_in_the_extra_jvm_options_replaces_the_serial_one() -> None:
    # STREAMS_KAFKA_JVM_OPTS="-XX:+UseG1GC ..." must not start a JVM with two collectors.
    assert _names_collector("-XX:+UseG1GC")
    assert _names_collector("-XX:+UseZGC")
    assert not _names_collector("-XX:MaxGCPauseMillis=20")
    assert not _names_collector("-Xlog:gc:file=/tmp/gc.log:time")
