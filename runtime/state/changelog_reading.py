"""Reading changelogs on a restore consumer: one batch sorted, and the restart
of a store whose position the changelog does not have.

Shared by the restoration thread's restores and standbys
(`runtime.state.restoration`, `runtime.state.standby_updates`) and by the
thread-per-client baseline (`benchmarks.baseline.inline_restore`), so all of
them apply changelogs alike. Pure functions over what a confluent-kafka
consumer returns; the one that restarts a store is called by the thread that
owns the consumer (the restoration thread in the runtime).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from runtime.logging import get_logger

log = get_logger("runtime.restoration")

TopicPartitionKey = tuple[str, int]

# Events of a side topic's partition that go to its reader with its records.
_SIDE_EVENTS = (KafkaError._PARTITION_EOF, KafkaError._AUTO_OFFSET_RESET)


@dataclass
class ChangelogBatch:
    """One consumed batch of changelog records, sorted per partition."""

    records: dict[TopicPartitionKey, list[tuple[bytes, bytes | None]]]
    next_offsets: dict[TopicPartitionKey, int]  # after the last record taken
    reached_end: list[tuple[TopicPartitionKey, int]]  # partitions at their end (EOF)
    # Partitions whose fetch position the log does not have, with that
    # position (only with auto.offset.reset=error, as the restoration thread's).
    out_of_range: list[tuple[TopicPartitionKey, int]] = field(default_factory=list)
    # Messages of `side_topics` (records and their partitions' end and
    # out-of-range events), in order, for their reader.
    side: list[Any] = field(default_factory=list)


def sort_changelog_messages(
    messages: list[Any], side_topics: frozenset[str] = frozenset()
) -> ChangelogBatch:
    """Sort a restore consumer's batch: records per changelog partition, the
    end-of-partition and out-of-range events, and the messages of
    `side_topics` (the status topic) set apart for their reader. A keyless
    changelog record is garbage and skipped; a fatal consumer error raises."""
    records: dict[TopicPartitionKey, list[tuple[bytes, bytes | None]]] = defaultdict(list)
    next_offsets: dict[TopicPartitionKey, int] = {}
    reached_end: list[tuple[TopicPartitionKey, int]] = []
    out_of_range: list[tuple[TopicPartitionKey, int]] = []
    side: list[Any] = []
    for message in messages:
        error = message.error()
        tp: TopicPartitionKey = (message.topic(), message.partition())
        if tp[0] in side_topics and (error is None or error.code() in _SIDE_EVENTS):
            side.append(message)
            continue
        offset: int = message.offset()
        if error is not None:
            if error.code() == KafkaError._PARTITION_EOF:
                reached_end.append((tp, offset))
                continue
            if error.code() == KafkaError._AUTO_OFFSET_RESET and message.topic() is not None:
                out_of_range.append((tp, offset))
                continue
            if error.fatal():
                raise KafkaException(error)
            log.warning("restore_consume_error", error=error.str())
            continue
        key = message.key()
        if key is None:
            continue
        records[tp].append((key, message.value()))
        next_offsets[tp] = offset + 1
    return ChangelogBatch(dict(records), next_offsets, reached_end, out_of_range, side)


def restart_from_start(
    consumer: Consumer,
    tp: TopicPartitionKey,
    position: int,
    store: Any,
    owner: Any,
    standby: bool,
) -> None:
    """The changelog does not have `position`: wipe `store` (of the task or
    standby `owner`) and restore it from the changelog's start, with a
    warning (Kafka Streams does the same on an invalid offset)."""
    log.warning(
        "changelog_position_out_of_range",
        task_id=owner.id,
        standby=standby,
        store=store.name,
        directory=str(store.directory or getattr(owner, "directory", "")),
        changelog=f"{tp[0]}-{tp[1]}",
        position=position,
        action="wiping the store: restoring it from the changelog's start",
    )
    consumer.incremental_unassign([TopicPartition(tp[0], tp[1])])
    store.wipe()
    owner.restore_from[tp] = None
    consumer.incremental_assign([TopicPartition(tp[0], tp[1], OFFSET_BEGINNING)])
