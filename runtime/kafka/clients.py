"""Configuration of the shared Kafka clients.

One consumer and one producer per process, created here from the validated
config and used only by the polling thread. User overrides (`consumer.*`,
`producer.*`) win over our defaults except for the few settings the runtime's
correctness depends on, which are forced and documented. A user setting that
contradicts one of those is refused when the config is built
(`runtime.config`, issue 31: `consumer.isolation.level=read_uncommitted`
under exactly_once_v2 over-counted); forcing them here as well keeps each
builder correct on its own. Any thread may call the builders (they read the
immutable config only).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Message, TopicPartition

from runtime.config import StreamsConfig
from runtime.kafka.broker_health import Retrying
from runtime.logging import get_logger, librdkafka_logger
from runtime.topology.topology import Topology

log = get_logger("runtime.polling")

# librdkafka stops fetching a partition for fetch.queue.backoff.ms (default
# 1000) whenever its prefetch queue is over queued.min.messages or
# queued.max.messages.kbytes. The input buffers and the restoration thread
# drain that queue in milliseconds, so the default left both idle for most of
# each second through a backlog (the compare benchmark's stateful count at 1
# thread: 0.59x of the thread-per-client baseline before this and the other
# consumer fixes here, 1.16x after). 0 busy-loops librdkafka's fetcher.
# Users can override it (consumer.* / restore.consumer.*).
FETCH_QUEUE_BACKOFF_MS = 10

# The main consumer's session timeout unless `consumer.session.timeout.ms` says otherwise.
DEFAULT_SESSION_TIMEOUT_MS = 10_000

# Settings the commit protocol relies on: offsets are committed explicitly by
# the polling thread, never automatically.
_FORCED_CONSUMER = {"enable.auto.commit": False, "enable.auto.offset.store": False}

# Under exactly_once_v2 both consumers read only committed transactions: the
# main consumer must not process the output of an aborted attempt, the
# restore consumer must not restore its changelog writes.
_FORCED_EXACTLY_ONCE_CONSUMER = {"isolation.level": "read_committed"}

# The restoration thread learns that a changelog partition is restored from
# the end-of-partition event (runtime.state.restoration).
_FORCED_RESTORE_CONSUMER = {"enable.partition.eof": True}


def assignment_strategy(topology: Topology) -> str:
    """The classic protocol's assignor for this topology.

    Co-partitioned inputs must land on the same member: range does that for
    topics with equal partition counts; otherwise cooperative-sticky avoids
    stop-the-world rebalances.
    """
    multi_source = any(len(s.sources) > 1 for s in topology.subtopologies)
    return "range" if multi_source else "cooperative-sticky"


# The main consumer's fetch size per partition unless `consumer.*` says
# otherwise (see `input_prefetch`): large for an app's one topology, small
# while named queries share the consumer.
INPUT_PARTITION_FETCH_BYTES = 262_144
QUERIES_PARTITION_FETCH_BYTES = 65_536

# librdkafka's defaults for the settings `input_prefetch` changes (for a
# consumer that wants them back: the benchmarks' thread-per-client baseline).
LIBRDKAFKA_PREFETCH = {"max.partition.fetch.bytes": 1_048_576, "queued.min.messages": 100_000}


def input_prefetch(config: StreamsConfig, named_queries: bool = False) -> dict[str, int]:
    """The main consumer's prefetch settings, sized to the input buffers.

    A full input buffer pauses its partition, and pausing makes librdkafka
    drop what it had prefetched for it; the resume fetches it all again. At
    librdkafka's defaults (1 MiB a fetch, 100,000 records queued per
    partition) a partition paused at `buffered.records.per.partition` and
    resumed at half of it refetched and parsed some 15,000 small records for
    every 2,500 it kept (on a stateful count over a backlog librdkafka's
    fetch thread spent 4.1 s of CPU per 3,000,000 records against 1.0 s for
    the thread-per-client baseline, whose consumer rarely runs ahead of its
    processing). So librdkafka stops fetching a partition once it holds a
    quarter of the bound: that, plus one fetch, is what a pause can drop.

    How much one fetch brings a partition is the other side: a fast
    topology (a count, about 2.5 us a record) empties its buffers faster
    than 64 KiB fetches refill them, one round trip to the broker at a time.
    In the compare benchmark's stateful count (1 thread, quiet, Apache Kafka
    on the same 2 cores) the processing thread waited for input half of its
    time, with the buffers nearly empty, at 229,000-286,000 records/s; with
    256 KiB fetches (and the quarter) 337,000-366,000, while the JSON map,
    whose buffers stay full, kept its pace (122,000-128,000 against
    128,000-134,000, within its run-to-run spread). So 256 KiB, except where
    named queries share the consumer: there a light query's record waits in
    the consumer's one queue behind whatever a heavy query's refill brought
    (measured p99 3.75x of running alone at 1 MiB, 1.72x at 64 KiB), and
    such an app keeps 64 KiB fetches and half the bound queued, as
    measured for the queries benchmark. A setting the user gave
    (`consumer.max.partition.fetch.bytes`, `consumer.queued.min.messages`)
    wins. Pure; any thread.
    """
    overrides = config.consumer_overrides
    bound = config.buffered_records_per_partition
    settings: dict[str, int] = {}
    if "max.partition.fetch.bytes" not in overrides:
        settings["max.partition.fetch.bytes"] = (
            QUERIES_PARTITION_FETCH_BYTES if named_queries else INPUT_PARTITION_FETCH_BYTES
        )
    if "queued.min.messages" not in overrides:
        settings["queued.min.messages"] = max(1, bound // 2 if named_queries else bound // 4)
    return settings


def consumer_config(
    config: StreamsConfig,
    assignment_strategy: str,
    callbacks: dict[str, Any],
    named_queries: bool = False,
) -> dict[str, Any]:
    """The main consumer's settings (prefetch: see `input_prefetch`;
    `named_queries`: the app runs a mapping of named queries)."""
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "group.id": config.application_id,
        "client.id": f"{config.client_id}-consumer",
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": assignment_strategy,
        "enable.partition.eof": False,
        "isolation.level": "read_committed" if config.exactly_once else "read_uncommitted",
        "queued.max.messages.kbytes": 32768,
        "fetch.wait.max.ms": 100,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        # librdkafka's 45 s made a crashed instance's partitions wait 45 s to
        # move, and a new group's first join on Tansu (about half of it) take
        # 23 s. Heartbeats run on librdkafka's own thread, untouched by the GIL
        # or a long batch (that is max.poll.interval.ms's business), so 10 s is
        # safe; Kafka's group.min.session.timeout.ms is 6 s. Dropped under
        # KIP-848 (`consumer.group.protocol=consumer`), where the broker decides.
        "session.timeout.ms": DEFAULT_SESSION_TIMEOUT_MS,
        # Broker restarts are reported through error_cb; librdkafka's own
        # line per closed connection is noise.
        "log.connection.close": False,
        # librdkafka's log through the runtime's structured logging, served on
        # the polling thread by consume() (see runtime.logging.librdkafka_level).
        "logger": librdkafka_logger(),
        # New partitions of subscribed topics reach the group's assignment
        # only at a metadata refresh (librdkafka's default: every 5 min);
        # a consumer's list_topics() does not trigger the rebalance (tried).
        # The runtime checks partition counts on the same interval
        # (runtime.polling.expansion).
        "topic.metadata.refresh.interval.ms": config.partition_check_interval_ms,
    }
    settings.update(input_prefetch(config, named_queries))
    settings.update(config.consumer_overrides)
    if str(settings.get("group.protocol", "classic")).lower() == "consumer":
        _use_consumer_group_protocol(settings, assignment_strategy)
    settings.update(_FORCED_CONSUMER)
    if config.exactly_once:
        settings.update(_FORCED_EXACTLY_ONCE_CONSUMER)
    settings.update(callbacks)
    return settings


# Client-side group settings that KIP-848's protocol moves to the broker:
# librdkafka refuses them with group.protocol=consumer.
_CLASSIC_ONLY = (
    "partition.assignment.strategy",
    "session.timeout.ms",
    "heartbeat.interval.ms",
    "group.protocol.type",
)


def _use_consumer_group_protocol(settings: dict[str, Any], assignment_strategy: str) -> None:
    """KIP-848 (`consumer.group.protocol=consumer`, Kafka 4.x): the broker
    assigns, incrementally. Co-partitioned inputs need its `range` assignor
    (same partition numbers to one member, as the classic `range` does);
    otherwise its `uniform` assignor spreads partitions. A user's
    `consumer.group.remote.assignor` wins. Session and heartbeat timing are
    the broker's (`group.consumer.session.timeout.ms` and friends)."""
    for key in _CLASSIC_ONLY:
        settings.pop(key, None)
    settings.setdefault(
        "group.remote.assignor", "range" if assignment_strategy == "range" else "uniform"
    )


def producer_config(config: StreamsConfig, callbacks: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": f"{config.client_id}-producer",
        # Idempotence keeps per-partition order through retries (rule 2).
        "enable.idempotence": True,
        "linger.ms": 5,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        # Failed deliveries are all we need to hear about: a Python callback
        # per acknowledged record would cost more than producing it.
        "delivery.report.only.error": True,
        "log.connection.close": False,
        "logger": librdkafka_logger(),
    }
    settings.update(config.producer_overrides)
    settings.update(callbacks)
    return settings


def restore_consumer_config(config: StreamsConfig) -> dict[str, Any]:
    """The restoration thread's consumer: assign() only, never joins the group."""
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        # librdkafka insists on a group id even for a consumer that only
        # assigns; it is never used to join or commit.
        "group.id": f"{config.application_id}-restore-consumer",
        "client.id": f"{config.client_id}-restore-consumer",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        # A restore ends when a fetch reports the partition's end, and a fetch
        # at the end waits fetch.wait.max.ms for data first: librdkafka's
        # 500 ms made every restore (an empty changelog too) take 0.6-1.0 s on
        # Kafka, 0.1 s with 50-100 ms. Idle standbys then fetch ten times a
        # second per broker, which costs next to nothing.
        "fetch.wait.max.ms": 100,
        "queued.min.messages": 20000,
        "fetch.queue.backoff.ms": FETCH_QUEUE_BACKOFF_MS,
        "log.connection.close": False,
        "logger": librdkafka_logger(),
    }
    settings.update(config.restore_consumer_overrides)
    settings.update(_FORCED_CONSUMER)
    settings.update(_FORCED_RESTORE_CONSUMER)
    if config.exactly_once:
        settings.update(_FORCED_EXACTLY_ONCE_CONSUMER)
    return settings


def global_consumer_config(config: StreamsConfig) -> dict[str, Any]:
    """The global thread's consumer (runtime.state.global_thread): as the
    restore consumer (assign() only, `restore.consumer.` overrides, committed
    records only), its own names, and a position the topic lost (deleted or
    recreated) reset to the earliest offset."""
    settings = restore_consumer_config(config)
    settings["group.id"] = f"{config.application_id}-global-consumer"
    settings["client.id"] = f"{config.client_id}-global-consumer"
    settings["auto.offset.reset"] = "earliest"
    return settings


def admin_config(config: StreamsConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": f"{config.client_id}-admin",
        "log.connection.close": False,
        # Served by admin.poll(): the start-up topic checks poll while they wait.
        "logger": librdkafka_logger(),
    }
    settings.update(config.admin_overrides)
    return settings


def consume_available(consumer: Consumer, max_records: int, timeout: float) -> list[Message]:
    """Up to `max_records` records, returning as soon as any are there.

    librdkafka's `consume(n, timeout)` returns only when it holds n records or
    the timeout has passed, so at input rates below n per timeout every record
    waited for the whole timeout before it was even routed. Here: take what is
    queued without waiting; if nothing is, block in `poll(timeout)`, which
    returns with the first record, then take whatever queued behind it. At high
    rates this is one `consume(n, 0)` call, as before. Rebalance callbacks are
    served by both calls. Called by the thread that owns `consumer` only.
    """
    records = consumer.consume(max_records, 0)
    if records or timeout <= 0:
        return records
    first = consumer.poll(timeout)
    if first is None:
        return []
    if max_records <= 1:
        return [first]
    rest = consumer.consume(max_records - 1, 0)
    rest.insert(0, first)
    return rest


# A long wait is cut in slices of this length, so that whatever else needs the
# polling thread (a shutdown, a commit request, output) is served at once.
_WAIT_SLICE_S = 0.05


def consume_until(
    consumer: Consumer,
    max_records: int,
    timeout: float,
    other_work: Callable[[], bool],
    slice_s: float = _WAIT_SLICE_S,
) -> list[Message]:
    """`consume_available`, waiting up to `timeout` s in slices of `slice_s`
    that end early once `other_work()` is true. Called by the consumer's
    owning thread."""
    deadline = time.monotonic() + timeout
    while True:
        remaining = deadline - time.monotonic()
        records = consume_available(consumer, max_records, max(0.0, min(remaining, slice_s)))
        if records or remaining <= slice_s or other_work():
            return records


# How long `committed_offsets` keeps asking while the group coordinator is
# unreachable or moving (a killed node's role moves after
# broker.session.timeout.ms, 9 s by default, plus loading the offsets).
COMMITTED_RETRY_BUDGET_S = 120.0

# Answers to an offset lookup that mean "ask again" though librdkafka does not
# flag them retriable: the group's coordinator moved or is loading its offsets
# (met after a broker came back from a pause: NOT_COORDINATOR ended the app
# in a rewind), or a transaction's offsets are not stable yet.
_LOOKUP_RETRIABLE_CODES = frozenset(
    {
        KafkaError._TIMED_OUT,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.UNSTABLE_OFFSET_COMMIT,
    }
)


def lookup_retriable(error: KafkaError) -> bool:
    """Whether a failed committed-offsets lookup is worth asking again. Pure."""
    return bool(error.retriable()) or error.code() in _LOOKUP_RETRIABLE_CODES


def committed_offsets(
    consumer: Consumer,
    partitions: list[TopicPartition],
    timeout_s: float = 30.0,
    budget_s: float = COMMITTED_RETRY_BUDGET_S,
    retrying: Retrying | None = None,
) -> list[TopicPartition]:
    """The group's committed offsets of `partitions`, from the broker.

    A task starts again from these after a rewind, so an answer with an error
    on any partition is not an answer: read as "nothing committed", it would
    send the task back to the partition's start (under exactly_once_v2, output
    again). Timeouts, retriable errors and per-partition errors are retried
    until `budget_s` has passed, each logged (and noted in `retrying`, for
    status); then the last error is raised. Called by the consumer's owning
    thread.
    """
    deadline = time.monotonic() + budget_s
    retrying = retrying if retrying is not None else Retrying()
    try:
        while True:
            try:
                answer = consumer.committed(partitions, timeout=timeout_s)
            except KafkaException as exc:
                error: KafkaError = exc.args[0]
                if not lookup_retriable(error) or time.monotonic() >= deadline:
                    raise
                log.warning("committed_offsets_retry", error=error.str())
                retrying.note("committed_offsets")
                continue
            errors = [(tp, tp.error) for tp in answer if tp.error is not None]
            if not errors:
                return list(answer)
            first = errors[0][1]
            if time.monotonic() >= deadline:
                raise KafkaException(first)
            log.warning(
                "committed_offsets_retry",
                error=first.str(),
                partitions=[f"{tp.topic}-{tp.partition}" for tp, _ in errors],
            )
            retrying.note("committed_offsets")
            time.sleep(0.1)  # a per-partition error comes back at once: do not spin
    finally:
        retrying.clear()


def fetch_resumed_now(consumer: Consumer, partitions: list[TopicPartition]) -> None:
    """Make librdkafka fetch just-resumed partitions now, not up to a second later.

    `pause()` drops a partition's prefetched records; after `resume()`
    librdkafka decides to fetch it again only when the broker thread next
    wakes up. When every other partition is paused too (a backlog with full
    input buffers), nothing wakes it: measured here, most resumes waited
    0.9-1.0 s for their first record, and the processing threads starved.
    Seeking to the current position changes nothing that is consumed and
    starts the fetch at once (15-30 ms here). Partitions with no position
    yet (nothing consumed) are left to librdkafka. Called by the consumer's
    owning thread right after `resume()`.
    """
    for tp in consumer.position(partitions):
        if tp.offset >= 0:
            consumer.seek(tp)


def log_consume_error(message: Message) -> None:
    """A consumed message that carries an error: fatal ones raise, others are logged."""
    error = message.error()
    assert error is not None
    if error.code() == KafkaError._PARTITION_EOF:
        return
    if error.fatal():
        raise KafkaException(error)
    log.warning("consume_error", error=error.str())
