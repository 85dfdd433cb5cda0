"""Shared pytest fixtures: the session's broker (real Kafka by default), a failover cluster,
the S3-compatible server of the remote state tests (S3Proxy), hypothesis profiles.

Which broker: Apache Kafka (``runtime.brokers.KafkaBroker``, one KRaft node) unless
``STREAMS_TEST_BROKER=tansu`` selects the Tansu development broker. Kafka is the
default because the runtime's guarantees (exactly-once, rebalances, CreatePartitions) are only
meaningful against Kafka's semantics; Tansu stays selectable for machines without Java.

Why one broker per session: each test isolates itself with unique topic and group names
(``kafka_helpers.unique_name``) instead, which keeps the suite fast. Brokers start lazily, only
when a test asks for ``broker``/``bootstrap``/``kafka_cluster``, so unit-only runs never spawn
one. Tests that freeze or break a broker take ``fresh_broker`` (their own, same kind).
Fixtures run on pytest's main thread.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from hypothesis import settings

from runtime.brokers import Broker, KafkaBroker, KafkaCluster, kafka_available, make_broker
from runtime.brokers.s3proxy import S3Proxy

settings.register_profile("ci", deadline=None, max_examples=100)
settings.register_profile("dev", deadline=None, max_examples=25)
settings.load_profile("ci" if os.environ.get("CI") else "dev")

# Not STREAMS_RUNTIME_*: the runtime reads every STREAMS_RUNTIME_<KEY> variable as a
# configuration key (and rejects unknown ones); STREAMS_TEST_* is the tests' own prefix.
BROKER_ENV = "STREAMS_TEST_BROKER"
_BROKER_START_TIMEOUT_S = 120.0  # a loaded CI machine; Kafka takes about 2 s here


def broker_kind() -> str:
    """``kafka`` (default) or ``tansu``, from ``$STREAMS_TEST_BROKER``."""
    kind = os.environ.get(BROKER_ENV, "kafka").strip().lower() or "kafka"
    if kind not in ("kafka", "tansu"):
        raise pytest.UsageError(f"{BROKER_ENV}={kind!r}: use 'kafka' (default) or 'tansu'")
    return kind


def pytest_report_header() -> str:
    return f"broker: {broker_kind()} (set {BROKER_ENV}=kafka|tansu)"


def _started(kind: str, kafka_properties: dict[str, str] | None = None) -> Broker:
    """A started broker of `kind`; `kafka_properties` override a Kafka node's
    server.properties (Tansu has none of them)."""
    if kind == "kafka" and kafka_properties:
        broker: Broker = KafkaBroker(properties=kafka_properties)
    else:
        broker = make_broker(kind)
    broker.start(_BROKER_START_TIMEOUT_S)
    return broker


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """The session's broker on free ports: Kafka unless ``STREAMS_TEST_BROKER=tansu``."""
    session_broker = _started(broker_kind())
    try:
        yield session_broker
    finally:
        session_broker.stop()


@pytest.fixture(scope="session")
def bootstrap(broker: Broker) -> str:
    """``bootstrap.servers`` for the session's broker, e.g. ``127.0.0.1:40123``."""
    return broker.bootstrap


@pytest.fixture(scope="session")
def on_kafka() -> bool:
    """True when the session's brokers are Apache Kafka, False on Tansu."""
    return broker_kind() == "kafka"


@pytest.fixture
def fresh_broker() -> Iterator[Broker]:
    """A broker of the session's kind for this test alone (to pause or break), stopped after."""
    own = _started(broker_kind())
    try:
        yield own
    finally:
        own.stop()


# What a broker from `fresh_broker_not_self_fenced` gives its own controller
# before it fences the broker (Kafka's default: 9 s).
_UNFENCED_SESSION_MS = "60000"


@pytest.fixture
def fresh_broker_not_self_fenced() -> Iterator[Broker]:
    """`fresh_broker`, but a pause of up to a minute does not fence it.

    A single Kafka node paused past `broker.session.timeout.ms` is fenced by
    its own controller when it resumes, and for a moment its partitions have
    no leader. A transaction the coordinator rolls back for its timeout in
    that moment has its abort markers skipped (broker log: "Couldn't find
    leader endpoint for partitions ... likely deleted already and hence can
    be skipped", Apache Kafka 4.4.0); its records stay open and the same
    producer id's next commit commits them. That breaks exactly-once for
    every transactional client (docs/guarantees.md); tests of the runtime's
    own handling of an outage under exactly_once_v2 use this broker.
    """
    own = _started(broker_kind(), {"broker.session.timeout.ms": _UNFENCED_SESSION_MS})
    try:
        yield own
    finally:
        own.stop()


@pytest.fixture(scope="session")
def _session_kafka_cluster() -> Iterator[KafkaCluster]:
    if broker_kind() != "kafka":
        pytest.skip(f"failover tests need Apache Kafka ({BROKER_ENV}=tansu)")
    reason = kafka_available()
    if reason is not None:
        pytest.skip(reason)
    cluster = KafkaCluster().start(_BROKER_START_TIMEOUT_S)
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture
def kafka_cluster(_session_kafka_cluster: KafkaCluster) -> Iterator[KafkaCluster]:
    """A three-node Kafka KRaft cluster (RF 3, min.insync.replicas 2) for failover tests.

    One per session, started on first use (about 6 s, 3 JVMs of about 185 MB); skipped on a
    Tansu run or without Java. Nodes a test killed or paused are brought back after it.
    """
    cluster = _session_kafka_cluster
    yield cluster
    for node in cluster.node_ids:
        if cluster.is_running(node):
            cluster.resume(node)
        else:
            cluster.restart(node)


def _started_s3proxy() -> S3Proxy:
    # Like the Kafka broker, it needs Java 17+ and Maven (or the cached jars): a machine
    # without them fails these tests loudly rather than skipping them.
    return S3Proxy().start(_BROKER_START_TIMEOUT_S)


@pytest.fixture(scope="session")
def s3proxy() -> Iterator[S3Proxy]:
    """The session's S3-compatible server (S3Proxy, file-system backend) on loopback.

    Started on first use (about 6 s: a JVM); tests isolate themselves with a bucket each
    (``s3_bucket``). A real server, never a mock: boto3 talks HTTP to it.
    """
    server = _started_s3proxy()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def fresh_s3proxy() -> Iterator[S3Proxy]:
    """An S3Proxy for this test alone (to freeze with SIGSTOP), stopped after."""
    server = _started_s3proxy()
    try:
        yield server
    finally:
        server.stop()
