"""Start-up check of the sinks' serdes on the newest records of the source topics.

`App.start` calls `check_serdes_on_samples` after the topics are resolved and
before any thread starts. It reads up to `_PER_TOPIC` of the newest records
(not the oldest: those may predate the topology's current version) of each
user source topic (the first partitions that hold any) with a
group-less consumer, runs them through each subtopology's side-effect-free
steps (`runtime.topology.dry_run`), and raises the first `SerializationError`
a built-in serde raised for a Python type it cannot take: a mistake in the
topology that would fail every record, found before the app is RUNNING.
Empty topics cost one offsets request per partition and nothing else; the
whole check is bounded by `_BUDGET_S`.

Called by the thread that starts the app; its consumer is closed before it
returns.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from runtime.config import StreamsConfig
from runtime.kafka.clients import restore_consumer_config
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.topology.dry_run import Sample, dry_run
from runtime.topology.errors import SerializationError
from runtime.topology.topology import Topology

log = get_logger("runtime.serde_check")

__all__ = ["check_serdes_on_samples", "sample_records"]

_PER_TOPIC = 3
_PARTITIONS_LOOKED_AT = 8
_BUDGET_S = 3.0


def check_serdes_on_samples(config: StreamsConfig, topology: Topology, layout: TopicLayout) -> None:
    """Raise the first certain `SerializationError` the newest input records cause.

    Only under `processing.exception.handler=log_and_fail` (the default), where
    such a record would stop the app anyway; a user who chose to skip failing
    records (`log_and_continue`, `dead_letter_queue`) gets that at runtime.
    """
    if config.processing_exception_handler != "log_and_fail":
        return
    internal_prefix = f"{config.application_id}-"
    user_sources = {
        spec.name: layout.partitions[spec.name]
        for sub in topology.subtopologies
        for spec in sub.sources
        if not spec.internal and spec.name in layout.partitions
    }
    if not user_sources:
        return
    started = time.monotonic()
    try:
        samples = sample_records(config, user_sources, _BUDGET_S)
    except KafkaException as exc:  # the check is a courtesy: never a reason not to start
        log.info("serde_check_skipped", reason=str(exc))
        return
    if not samples:
        return

    def relative(topic: str) -> str:
        return topic[len(internal_prefix) :] if topic.startswith(internal_prefix) else topic

    for sub in topology.subtopologies:
        names = {spec.name for spec in sub.sources}
        mine = [s for s in samples if s.topic in names]
        if not mine:
            continue
        error = dry_run(
            sub,
            mine,
            config.application_id,
            config.default_key_serde,
            config.default_value_serde,
            layout.partitions,
            relative,
        )
        if error is not None and error.certain:
            raise SerializationError(
                f"{error} (found at start-up on the newest record of "
                f"{mine[-1].topic!r}, before processing anything)",
                topic=error.topic,
                node=error.node,
                part=error.part,
                serde=error.serde,
                cause=error.cause,
                certain=True,
            )
    log.info(
        "serde_check_passed",
        samples=len(samples),
        took_s=round(time.monotonic() - started, 3),
    )


def sample_records(config: StreamsConfig, topics: dict[str, int], budget_s: float) -> list[Sample]:
    """Up to `_PER_TOPIC` of the newest records of each topic (`topics`: name ->
    partition count), from the first partitions that hold any."""
    settings: dict[str, Any] = restore_consumer_config(config)
    settings["group.id"] = f"{config.application_id}-serde-check"
    settings["enable.partition.eof"] = True
    consumer = Consumer(settings)
    deadline = time.monotonic() + budget_s
    try:
        assignment: list[TopicPartition] = []
        for topic, count in topics.items():
            for partition in range(min(count, _PARTITIONS_LOOKED_AT)):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                low, high = consumer.get_watermark_offsets(
                    TopicPartition(topic, partition), timeout=remaining
                )
                if high > low:
                    start = max(low, high - _PER_TOPIC)
                    assignment.append(TopicPartition(topic, partition, start))
                    break
        if not assignment:
            return []
        consumer.assign(assignment)
        pending = {(tp.topic, tp.partition) for tp in assignment}
        samples: list[Sample] = []
        while pending and time.monotonic() < deadline:
            for message in consumer.consume(100, min(0.2, max(0.0, deadline - time.monotonic()))):
                where = (message.topic(), message.partition())
                error = message.error()
                if error is not None:
                    if error.code() == KafkaError._PARTITION_EOF:
                        pending.discard(where)
                    continue
                samples.append(
                    Sample(
                        topic=str(message.topic()),
                        partition=int(message.partition() or 0),
                        offset=int(message.offset() or 0),
                        key=message.key(),
                        value=message.value(),
                        timestamp=message.timestamp()[1],
                        headers=message.headers(),  # type: ignore[arg-type]
                    )
                )
        return samples
    finally:
        consumer.close()
