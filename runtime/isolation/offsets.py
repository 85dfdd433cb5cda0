"""A query moved into its own process resumes where the daemon's group left it.

The child's consumer group (`<application.id>-<query>`) is new the first time
a query runs with `query.<name>.isolation=process`; its committed offsets
would otherwise fall back to `auto.offset.reset` and reprocess or skip the
query's input. Before its first start, the child copies the daemon's
committed offsets of the query's input topics (external and repartition)
into its own group. Caller's thread (the child's main thread, before its app
starts); the new group has no members yet, which altering offsets needs.
"""

from __future__ import annotations

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from runtime.config import StreamsConfig
from runtime.logging import get_logger
from runtime.polling.clients import admin_config
from runtime.topology.topology import Topology

log = get_logger("runtime.isolation")

_TIMEOUT_S = 30.0


def input_topics(topology: Topology, application_id: str) -> set[str]:
    """Topics the query reads, internal ones under their full names."""
    return {
        f"{application_id}-{spec.name}" if spec.internal else spec.name
        for sub in topology.subtopologies
        for spec in sub.sources
    }


def _committed(admin: AdminClient, group: str) -> list[TopicPartition]:
    request = ConsumerGroupTopicPartitions(group)
    result = admin.list_consumer_group_offsets([request], request_timeout=_TIMEOUT_S)[group].result(
        timeout=_TIMEOUT_S
    )
    return [tp for tp in result.topic_partitions or [] if tp.error is None and tp.offset >= 0]


def carry_over_offsets(config: StreamsConfig, topology: Topology, parent_group: str) -> int:
    """Copy `parent_group`'s committed offsets of the query's input topics into
    the child's group if it has none of them; the number copied. A failure is
    logged, not raised: the query then starts as `auto.offset.reset` says."""
    topics = input_topics(topology, config.application_id)
    group = config.application_id
    admin = AdminClient(admin_config(config))
    try:
        if any(tp.topic in topics for tp in _committed(admin, group)):
            return 0
        carried = [tp for tp in _committed(admin, parent_group) if tp.topic in topics]
        if not carried:
            return 0
        request = ConsumerGroupTopicPartitions(
            group, [TopicPartition(tp.topic, tp.partition, tp.offset) for tp in carried]
        )
        admin.alter_consumer_group_offsets([request], request_timeout=_TIMEOUT_S)[group].result(
            timeout=_TIMEOUT_S
        )
    except KafkaException as exc:
        log.warning("query_offsets_not_carried_over", group=group, error=str(exc))
        return 0
    log.info(
        "query_offsets_carried_over", group=group, source=parent_group, partitions=len(carried)
    )
    return len(carried)
