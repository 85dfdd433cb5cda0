"""A query moved into its own process resumes where the daemon's group left it.

The child's consumer group (`<application.id>-<query>`) is new the first time
a query runs with `query.<name>.isolation=process`; its committed offsets
would otherwise fall back to `auto.offset.reset` and reprocess or skip the
query's input. And a query moved back into the daemon's process would
resume from the daemon group's older commit: its output again, its state
(the changelog is the same topic) updated twice. So commits follow the
query both ways, per partition the further one: the child takes the
daemon's before its app starts (`carry_into_child`), the daemon takes a
child group's before its own consumer joins (`carry_back_from_children`).
Caller's thread, before the consumer exists: altering a group's offsets
needs it without members.
"""

from __future__ import annotations

from collections.abc import Iterable

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from runtime.config import StreamsConfig
from runtime.isolation.plan import child_application_id
from runtime.kafka.clients import admin_config
from runtime.logging import get_logger
from runtime.topology.topology import Subtopology, Topology

log = get_logger("runtime.isolation")

_TIMEOUT_S = 30.0


def input_topics(subtopologies: Iterable[Subtopology], application_id: str) -> set[str]:
    """Topics these subtopologies read, internal ones under their full names."""
    return {
        f"{application_id}-{spec.name}" if spec.internal else spec.name
        for sub in subtopologies
        for spec in sub.sources
    }


def _committed(admin: AdminClient, group: str) -> list[TopicPartition]:
    request = ConsumerGroupTopicPartitions(group)
    result = admin.list_consumer_group_offsets([request], request_timeout=_TIMEOUT_S)[group].result(
        timeout=_TIMEOUT_S
    )
    return [tp for tp in result.topic_partitions or [] if tp.error is None and tp.offset >= 0]


def carry_forward(
    admin: AdminClient, topics: set[str], source_group: str, target_group: str
) -> int:
    """Where `source_group` committed further into `topics` than `target_group`
    (or the target has no commit), move the target's commit up to it; the
    number of partitions moved. Offsets only move forward, so the further
    commit is the query's latest, wherever it ran last (a query runs in one
    place at a time: moving it means restarting the daemon). A failure is
    logged, not raised (a group with live members cannot be altered: another
    instance still runs the query there)."""
    try:
        target = {(tp.topic, tp.partition): tp.offset for tp in _committed(admin, target_group)}
        ahead = [
            TopicPartition(tp.topic, tp.partition, tp.offset)
            for tp in _committed(admin, source_group)
            if tp.topic in topics and tp.offset > target.get((tp.topic, tp.partition), -1)
        ]
        if not ahead:
            return 0
        request = ConsumerGroupTopicPartitions(target_group, ahead)
        admin.alter_consumer_group_offsets([request], request_timeout=_TIMEOUT_S)[
            target_group
        ].result(timeout=_TIMEOUT_S)
    except KafkaException as exc:
        log.warning(
            "query_offsets_not_carried_over",
            group=target_group,
            source=source_group,
            error=str(exc),
            hint="if another instance still runs the query there, stop it first",
        )
        return 0
    log.info(
        "query_offsets_carried_over", group=target_group, source=source_group, partitions=len(ahead)
    )
    return len(ahead)


def carry_into_child(config: StreamsConfig, topology: Topology, parent_group: str) -> int:
    """The child's start: take the daemon's commits where they are further
    (the query ran in the daemon's process since). `config` is the child's."""
    admin = AdminClient(admin_config(config))
    topics = input_topics(topology.subtopologies, config.application_id)
    return carry_forward(admin, topics, parent_group, config.application_id)


def carry_back_from_children(config: StreamsConfig, topology: Topology) -> int:
    """The daemon's start: for each named query of `topology` (those the
    daemon runs itself) whose child group `<application.id>-<query>` exists
    (the query ran in a child before), take that group's commits where they
    are further. One group listing at start when no query ever ran in a child."""
    admin = AdminClient(admin_config(config))
    app = config.application_id
    queries = {sub.query for sub in topology.subtopologies if sub.query is not None}
    if not queries:
        return 0
    try:
        listed = admin.list_consumer_groups(request_timeout=_TIMEOUT_S).result(timeout=_TIMEOUT_S)
    except KafkaException as exc:
        log.warning("query_offsets_not_checked", error=str(exc))
        return 0
    groups = {g.group_id for g in listed.valid}
    return sum(
        carry_forward(
            admin,
            input_topics((s for s in topology.subtopologies if s.query == query), app),
            child_application_id(config, query),
            app,
        )
        for query in sorted(queries)
        if child_application_id(config, query) in groups
    )
