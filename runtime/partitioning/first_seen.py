"""`FirstSeenPartitioner`: a key keeps the partition it had when first seen.

Why (the other ready-made static partitioner, next to `VirtualPartitioner`):
a virtual partition count keeps every hashed key, old or new, on the
partitions that existed before the first expansion, so an expansion brings
parallelism only for keys a placement rule routes. Here a key seen for the
first time gets Kafka's default partition over the topic's *current* count
(`murmur2(key bytes) % num_partitions`), and keeps it forever: keys seen
before an expansion stay where their state is, keys first seen after it
spread over all partitions, new ones included.

The memory of "first seen" is the compacted topic `<application.id>-partitioner`
(1 partition; `topic=` names another), read whole by every instance at
start-up and followed from then on. How two deciders agree (see
`runtime.partitioning.claims`): a new key's partition is never used until the
key's *claim* was written to partition 0 of that topic and read back; the
first claim per key in offset order wins, on every reader. Two instances
that see the same new key at once, even with different partition counts
(one accepted an expansion, the other not yet), both write a claim, both
read both claims in the same order, and both use the first (the one still
at the old count writes the new partition too: the claim names the topic
and the count its decider had accepted, `known_partition_count`, which the
sinks trust). A claim is durable before any record uses its answer, so a
crash, an aborted transaction or a restart never leaves a record on a
partition the map does not name.

Costs, honestly:
- Each *new* key costs the processing thread that first meets it one round
  trip to the broker (produce with acks=all, then the reader's fetch brings
  it back: about 4 ms on a local broker); concurrent new keys share the
  producer's batches. Known keys cost a dict lookup. A fresh app whose input
  is all new keys runs at the rate claims come back, not at full speed.
- Memory: every key ever seen, as its bytes in a dict (about 90 bytes per
  short key in CPython, measured; 1 M keys about 90 MB), on every instance
  and in every producer process that opens it. Nothing is forgotten.
- Start-up: `open` reads the whole topic (one record per key, plus one per
  lost race) before the app starts processing, at the speed of one Python
  consumer loop.
- During a broker outage a new key waits up to `claim_timeout_s`, then its
  record fails (`processing.exception.handler`); known keys go on.

Producers of the app's *input* topics that must keep keys in place use the
same object: `open(application_id, {"bootstrap.servers": ...})`, then
`static_partition(topic, key, partition_count)` per record, `close()` at
the end. They become writers of the same map.

Threads: `static_partition` from any thread (processing threads, several at
once); `open`/`close` from the app's start and end (the caller of
`App.start`, the supervisor thread); the Kafka reader runs on its own
daemon thread `FirstSeenPartitioner-<topic>`, which owns its consumer; the
producer is shared (librdkafka's producer is thread-safe).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from confluent_kafka import (
    OFFSET_BEGINNING,
    Consumer,
    KafkaError,
    KafkaException,
    Message,
    Producer,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.logging import get_logger
from runtime.partitioning.claims import CLAIM_ID_BYTES, ClaimBook, ClaimError, encode_claim
from runtime.partitioning.default import default_partition
from runtime.partitioning.static import key_bytes as default_key_bytes

__all__ = ["ClaimError", "ClaimLog", "FirstSeenPartitioner", "LocalClaimLog"]

log = get_logger("runtime.partitioner")

_TOPIC_SUFFIX = "-partitioner"
_ADMIN_TIMEOUT_S = 30.0
# The reader's longest wait for a record: also how late it sees a stop.
_IDLE_WAIT_S = 0.1


class ClaimLog(Protocol):
    """Where claims go and come back from, in one total order per key."""

    def append(self, record_key: bytes, value: bytes, on_failed: Callable[[str], None]) -> None:
        """Send one claim (any thread). Reading it back is `ClaimBook.apply`'s
        job, on the log's reader. `on_failed(reason)` if it cannot be written."""
        ...

    def close(self) -> None: ...


class LocalClaimLog:
    """An in-process log: a claim is read back at once (tests, the topology
    test driver). Shared by nobody, so it agrees with nobody else."""

    def __init__(self, book: ClaimBook) -> None:
        self._book = book
        self._lock = threading.Lock()

    def append(self, record_key: bytes, value: bytes, on_failed: Callable[[str], None]) -> None:
        with self._lock:  # one order, like a partition
            self._book.read(record_key, value, ours=True)

    def close(self) -> None:
        pass


class KafkaClaimLog:
    """Partition 0 of the partitioner topic: an idempotent producer for
    claims, and a consumer that reads from the beginning on its own thread."""

    def __init__(
        self,
        topic: str,
        application_id: str,
        client_config: Mapping[str, Any],
        book: ClaimBook,
    ) -> None:
        self.topic = topic
        self._book = book
        base = {k: v for k, v in client_config.items() if k != "client.id"}
        client_id = str(client_config.get("client.id", application_id))
        self._producer = Producer(
            {
                **base,
                "client.id": f"{client_id}-partitioner-producer",
                "enable.idempotence": True,  # no duplicate claim from a retry
                "acks": "all",
                "linger.ms": 1,
                "delivery.report.only.error": True,
            }
        )
        self._consumer = Consumer(
            {
                **base,
                "client.id": f"{client_id}-partitioner-reader",
                # Required by librdkafka; never joins a group or commits.
                "group.id": f"{application_id}-partitioner-reader",
                "enable.auto.commit": False,
                "enable.auto.offset.store": False,
                "enable.partition.eof": True,
                "auto.offset.reset": "earliest",
                # The broker answers a fetch as soon as a claim arrives; the
                # wait only bounds idle fetches.
                "fetch.wait.max.ms": 100,
            }
        )
        self._ours: set[bytes] = set()
        self._ours_lock = threading.Lock()
        self._stop = threading.Event()
        self._at_end = threading.Event()
        self.failure: BaseException | None = None
        self.records_read = 0
        self._thread = threading.Thread(
            target=self._run, name=f"FirstSeenPartitioner-{topic}", daemon=True
        )

    def start(self, timeout: float) -> None:
        """Read the topic to its end (all keys seen so far), then keep following
        it. Raises ClaimError if the end is not reached within `timeout` s."""
        self._consumer.assign([TopicPartition(self.topic, 0, OFFSET_BEGINNING)])
        self._thread.start()
        if not self._at_end.wait(timeout) or self.failure is not None:
            reason = self.failure or f"its end not reached within {timeout:g} s"
            self.close()
            raise ClaimError(f"cannot read the partitioner topic {self.topic!r}: {reason}")

    def append(self, record_key: bytes, value: bytes, on_failed: Callable[[str], None]) -> None:
        claim_id = record_key[:CLAIM_ID_BYTES]
        with self._ours_lock:
            self._ours.add(claim_id)

        def report(err: KafkaError | None, _msg: Message) -> None:
            if err is not None:
                with self._ours_lock:
                    self._ours.discard(claim_id)
                on_failed(err.str())

        try:
            self._producer.produce(self.topic, value, record_key, 0, on_delivery=report)
        except (BufferError, KafkaException) as exc:
            with self._ours_lock:
                self._ours.discard(claim_id)
            on_failed(f"{type(exc).__name__}: {exc}")

    def _run(self) -> None:
        """The reader thread: claims in offset order into the book."""
        try:
            while not self._stop.is_set():
                # consume(n, timeout) waits for n records or the timeout: a
                # claim would wait out the timeout. Take what is there, else
                # wait for the first record only (as `consume_available`).
                messages = self._consumer.consume(1000, 0)
                if not messages:
                    first = self._consumer.poll(_IDLE_WAIT_S)
                    messages = [first] if first is not None else []
                for message in messages:
                    self._read(message)
                self._producer.poll(0)  # delivery failures of claims
        except BaseException as exc:  # the reader is gone: nobody may wait for it
            self.failure = exc
            log.error("partitioner_reader_failed", topic=self.topic, error=str(exc))
            self._book.close(f"the partitioner topic's reader failed: {exc}")
            self._at_end.set()

    def _read(self, message: Message) -> None:
        error = message.error()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                self._at_end.set()
                return
            if error.fatal():
                raise KafkaException(error)
            # A topic created a moment ago can be unknown to a broker for a
            # moment: librdkafka retries; a topic that stays gone fails the
            # claims (produce errors) and `open`'s wait for the end.
            level = "debug" if error.code() == KafkaError.UNKNOWN_TOPIC_OR_PART else "warning"
            getattr(log, level)("partitioner_read_error", topic=self.topic, error=error.str())
            return
        self.records_read += 1
        record_key = message.key()
        claim_id = (record_key or b"")[:CLAIM_ID_BYTES]
        with self._ours_lock:
            ours = claim_id in self._ours
            self._ours.discard(claim_id)
        # Not a claim (a tombstone, another format): skipped, never ours to judge.
        self._book.read(record_key, message.value(), ours=ours)

    def close(self) -> None:
        """Stop the reader, deliver what is queued (briefly), close the clients."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(10)
        self._producer.flush(5)
        with contextlib.suppress(RuntimeError):  # closed already
            self._consumer.close()


def create_partitioner_topic(
    topic: str, client_config: Mapping[str, Any], replication_factor: int
) -> None:
    """Create the compacted one-partition topic unless it exists."""
    admin = AdminClient(dict(client_config))
    future = admin.create_topics(
        [NewTopic(topic, 1, replication_factor, config={"cleanup.policy": "compact"})],
        operation_timeout=_ADMIN_TIMEOUT_S,
        request_timeout=_ADMIN_TIMEOUT_S,
    )[topic]
    try:
        future.result(_ADMIN_TIMEOUT_S + 5)
        log.info("partitioner_topic_created", topic=topic)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise ClaimError(f"cannot create the partitioner topic {topic!r}: {exc}") from exc


class FirstSeenPartitioner:
    """A ready-made static partitioner: the partition a key had when first seen.

    A key not seen before gets `murmur2(key bytes) % num_partitions` (Kafka's
    default partitioner over the topic's count in force) and keeps it for
    good; the map lives in the compacted topic `<application.id>-partitioner`
    (or `topic`), see the module docstring for how instances agree, what it
    costs and its limits. The map is per key, not per topic: a key has the
    same partition on every topic the app writes it to (co-partitioning for
    free), so every such topic needs at least that many partitions.

    `key_bytes` turns a key into the bytes hashed and stored (default: bytes
    as they are, str UTF-8, int INT64). `claim_timeout_s`: how long a new key
    may wait for its claim (then its record fails). `open_timeout_s`: how long
    `open` may take to read the map. `expansions` lists the `(old, new)` counts
    `on_partition_expansion` received on this instance.
    """

    def __init__(
        self,
        topic: str | None = None,
        key_bytes: Callable[[Any], bytes] = default_key_bytes,
        claim_timeout_s: float = 60.0,
        open_timeout_s: float = 300.0,
    ) -> None:
        if claim_timeout_s <= 0 or open_timeout_s <= 0:
            raise ValueError("claim_timeout_s and open_timeout_s must be positive")
        self._topic = topic
        self._key_bytes = key_bytes
        self._claim_timeout_s = claim_timeout_s
        self._open_timeout_s = open_timeout_s
        self._lock = threading.Lock()
        self._opened = 0
        self._application_id: str | None = None
        self._book = ClaimBook()
        self._log: ClaimLog | None = None
        self.expansions: list[tuple[int, int]] = []

    # --- life cycle (the app's start and end, or a producer process) ----------------

    def topic_for(self, application_id: str) -> str:
        return self._topic or f"{application_id}{_TOPIC_SUFFIX}"

    def open(
        self,
        application_id: str,
        client_config: Mapping[str, Any],
        replication_factor: int = -1,
    ) -> None:
        """Create the topic if missing and read it to its end; blocks until
        then (at most `open_timeout_s`). Opening an open partitioner again for
        the same application only counts (`close` once per `open`). Raises
        ClaimError."""
        with self._lock:
            if self._opened:
                if application_id != self._application_id:
                    raise ValueError(
                        f"FirstSeenPartitioner is open for {self._application_id!r}; "
                        f"give {application_id!r} its own instance"
                    )
                self._opened += 1
                return
            topic = self.topic_for(application_id)
            create_partitioner_topic(topic, client_config, replication_factor)
            book = ClaimBook()
            kafka_log = KafkaClaimLog(topic, application_id, client_config, book)
            kafka_log.start(self._open_timeout_s)
            self._book, self._log = book, kafka_log
            self._application_id, self._opened = application_id, 1
            log.info("partitioner_map_read", topic=topic, keys=len(book))

    def attach(self, make_log: Callable[[ClaimBook], ClaimLog]) -> None:
        """Open on another log (`LocalClaimLog` for tests and the topology
        test driver; a shared in-memory log in the project's tests)."""
        with self._lock:
            book = ClaimBook()
            self._book, self._log = book, make_log(book)
            self._application_id, self._opened = None, 1

    def close(self) -> None:
        """Undo one `open`; the last one stops the reader and wakes waiters."""
        with self._lock:
            if self._opened == 0:
                return
            self._opened -= 1
            if self._opened:
                return
            claim_log, self._log = self._log, None
            self._book.close("the first-seen partitioner was closed")
        if claim_log is not None:
            claim_log.close()
            log.info("partitioner_closed", **self.figures())

    # --- the static partitioner contract ------------------------------------------

    def static_partition(self, topic: str, key: Any, num_partitions: int) -> int:
        data = self._key_bytes(key)
        book = self._book
        partition = book.get(data)
        if partition is not None:
            return partition
        return self._settle(book, data, topic, num_partitions)

    def known_partition_count(self, topic: str) -> int:
        """The highest partition count of `topic` that the decider of any claim
        had accepted (0: none known). Sinks accept a settled partition below it
        even before this instance accepted the expansion: the key was decided
        by an instance that had, so the partition exists."""
        return self._book.known_counts.get(topic, 0)

    def _settle(self, book: ClaimBook, data: bytes, topic: str, num_partitions: int) -> int:
        """A key not in the map: claim it (unless our claim is on its way) and
        wait until the log settles it."""
        claim_log = self._log
        if claim_log is None:
            raise ClaimError(
                "FirstSeenPartitioner is not open: App.start opens it (static.partitioner); "
                "a producer outside the app calls open(application_id, client_config) first"
            )
        if book.reserve(data):
            proposal = default_partition(data, num_partitions)
            record_key, value = encode_claim(data, proposal, num_partitions, topic)
            claim_log.append(record_key, value, lambda reason: book.failed(data, reason))
        return book.wait(data, self._claim_timeout_s)

    def on_partition_expansion(self, old_count: int, new_count: int) -> None:
        with self._lock:
            self.expansions.append((old_count, new_count))

    def figures(self) -> dict[str, int]:
        """keys in the map, claims this process sent, and claims it lost to
        another writer's earlier one (racy reads)."""
        book = self._book
        return {"keys": len(book), "claims_sent": book.claims_sent, "claims_lost": book.claims_lost}

    def __repr__(self) -> str:
        return f"FirstSeenPartitioner(topic={self._topic!r})"
