"""Start-up checks of the topology's topics, and creation of internal topics.

Run once by `App.start` before any thread starts, with a short-lived admin
client. Fails with `TopicError` naming every problem at once: a missing source
or sink topic, co-partitioned topics with different partition counts, an
internal topic that exists with the wrong partition count.

The user's own topics (sources and sinks) are the user's: they are created
only on request, by `create_user_topics` (`streams-runtime topics create`,
or `topics.create.missing=true` at start-up).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ConfigResource, NewTopic, ResourceType

from runtime.logging import get_logger
from runtime.topology.topology import Topology

log = get_logger("runtime.topics")


class TopicError(RuntimeError):
    """The topology's topics do not match the cluster (a start-up error)."""


# The CLI puts the real MODULE:ATTR in.
MISSING_TOPICS_HINT = (
    "create them with `streams-runtime topics create MODULE:ATTR --partitions N` "
    "(same --config/--set as run), or start with topics.create.missing=true"
)
GROWN_INPUT_HINT = (
    "if an input topic grew while the app was stopped: with static.partitioner set, "
    "`streams-runtime expand MODULE:ATTR TOPIC --partitions N` grows the internal topics "
    "to match (keys never move); without one, reset the application and repartition offline"
)


def user_topics(topology: Topology) -> list[str]:
    """The topics the topology reads or writes that are not its internal ones:
    sources (streams and tables), sinks, `through` topics. Sorted."""
    names = set()
    for sub in topology.subtopologies:
        names |= {spec.name for spec in sub.sources if not spec.internal}
        names |= {spec.name for spec in sub.sinks if not spec.internal}
    return sorted(names)


@dataclass(frozen=True)
class UserTopic:
    """One user topic as `create_user_topics` left it."""

    name: str
    partitions: int
    created: bool


def create_user_topics(
    admin: AdminClient,
    topology: Topology,
    partitions: int,
    replication_factor: int,
    timeout: float = 30.0,
) -> list[UserTopic]:
    """Create the topology's missing source and sink topics; existing ones stay.

    A missing topic gets `partitions` partitions, unless it is co-partitioned
    (a stream-table join) with an existing topic: then that topic's count, so
    the check at start-up passes. Waits until the new topics show in the
    cluster's metadata. Internal topics are not touched: `App.start` creates
    them with the counts the topology needs. Raises `TopicError`.
    """
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot read topic metadata from the cluster: {exc}") from exc
    existing = {name: len(t.partitions) for name, t in metadata.topics.items() if not t.error}
    groups = [g for sub in topology.subtopologies for g in sub.copartition_groups]
    wanted: dict[str, int] = {}
    for name in user_topics(topology):
        if name in existing:
            continue
        partners = [existing[t] for g in groups if name in g for t in g if t in existing]
        wanted[name] = max(partners) if partners else partitions
    if wanted:
        _create(admin, wanted, {}, replication_factor, timeout)
        _wait_visible(admin, set(wanted), timeout)
    return [
        UserTopic(name, wanted.get(name) or existing[name], name in wanted)
        for name in user_topics(topology)
    ]


def _wait_visible(admin: AdminClient, names: set[str], timeout: float) -> None:
    """Until every topic in `names` shows in the metadata (a created topic
    can take a moment to reach the broker that answers)."""
    deadline = time.monotonic() + timeout
    while True:
        metadata = admin.list_topics(timeout=timeout)
        missing = {n for n in names if n not in metadata.topics or metadata.topics[n].error}
        if not missing:
            return
        if time.monotonic() >= deadline:
            raise TopicError(f"created topics not visible after {timeout:.0f} s: {sorted(missing)}")
        time.sleep(0.1)


@dataclass(frozen=True)
class TopicLayout:
    """Where the topology's topics are, as resolved at start-up."""

    # subtopology id -> full source topic names
    sources: dict[int, list[str]]
    # full topic name -> partition count, for every source and sink topic
    partitions: dict[str, int]
    # full source topic name -> subtopology id
    subtopology_of: dict[str, int]
    # changelog topic -> subtopology id
    changelogs: dict[str, int]
    # subtopology id -> what its task ids start with, for named queries
    # (`Subtopology.task_name`); absent: the id itself.
    task_names: dict[int, str] = field(default_factory=dict)
    # The smallest `max.message.bytes` of the topics this app writes, if the
    # cluster told us: the producer's limit is lowered to it, so that a record
    # too large for its topic is refused at produce(), where it is known.
    max_message_bytes: int | None = None

    def task_id(self, subtopology_id: int, partition: int) -> str:
        """The id of the task of `subtopology_id` for `partition`."""
        return f"{self.task_names.get(subtopology_id, subtopology_id)}_{partition}"

    def task_partitions(self, subtopology_id: int) -> int:
        return max(self.partitions[t] for t in self.sources[subtopology_id])


def resolve_topics(
    admin: AdminClient,
    topology: Topology,
    application_id: str,
    replication_factor: int,
    extra_outputs: dict[str, int],
    timeout: float = 30.0,
    extra_configs: dict[str, dict[str, str]] | None = None,
) -> TopicLayout:
    """Check existing topics, create internal ones, return the layout.

    `extra_outputs` are topics the runtime writes besides the topology's sinks
    (the dead-letter topic): created with the given partition count if missing.
    """

    def full(name: str, internal: bool) -> str:
        return f"{application_id}-{name}" if internal else name

    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot read topic metadata from the cluster: {exc}") from exc
    existing = {name: len(t.partitions) for name, t in metadata.topics.items() if not t.error}

    problems: list[str] = []
    partitions: dict[str, int] = {}
    sources: dict[int, list[str]] = {}
    subtopology_of: dict[str, int] = {}

    # Subtopologies are ordered so that a repartition topic's writer comes
    # before its reader; an internal topic's partition count defaults to the
    # writer's task count, as Kafka Streams does.
    internal_specs = {spec.name: spec for spec in topology.internal_topics()}
    # Internal by the topology's own word, never by name: a user topic may well
    # be called `<application.id>-something`.
    internal_sources: set[str] = set()
    to_create: dict[str, int] = {}
    for sub in topology.subtopologies:
        names = []
        for spec in sub.sources:
            name = full(spec.name, spec.internal)
            names.append(name)
            subtopology_of[name] = sub.id
            if spec.internal:
                internal_sources.add(name)
                continue
            if name not in existing:
                problems.append(f"source topic {name!r} (subtopology {sub.id}) does not exist")
            else:
                partitions[name] = existing[name]
        sources[sub.id] = names

    groups = [g for sub in topology.subtopologies for g in sub.copartition_groups]

    def copartitioned_count(relative: str) -> int | None:
        """A repartition topic co-partitioned with user topics (a join) takes
        their partition count, as Kafka Streams does."""
        for group in groups:
            if relative in group:
                known = [existing[t] for t in group if t != relative and t in existing]
                if known:
                    return max(known)
        return None

    # Resolve internal topic partition counts in subtopology order.
    for sub in topology.subtopologies:
        own = [partitions[n] for n in sources[sub.id] if n in partitions]
        for spec in sub.sinks:
            name = full(spec.name, spec.internal)
            if spec.internal:
                wanted = (
                    internal_specs[spec.name].partitions
                    or copartitioned_count(spec.name)
                    or (max(own) if own else 1)
                )
                if name in existing and existing[name] != wanted:
                    problems.append(
                        f"internal topic {name!r} has {existing[name]} partitions, "
                        f"the topology needs {wanted}"
                    )
                partitions[name] = wanted
                if name not in existing:
                    to_create[name] = wanted
            elif name not in existing:
                problems.append(f"output topic {name!r} (subtopology {sub.id}) does not exist")
            else:
                partitions[name] = existing[name]
    # After every writer was resolved: a foreign-key join's response topic is
    # read by a subtopology numbered before the one that writes it.
    for sub in topology.subtopologies:
        for name in sources[sub.id]:
            if name not in partitions and name in internal_sources:
                problems.append(f"internal topic {name!r} has no writer in the topology")

    for sub in topology.subtopologies:
        for group in sub.copartition_groups:
            counts = {full(t, t in internal_specs): 0 for t in group}
            for name in counts:
                counts[name] = partitions.get(name, -1)
            if len({c for c in counts.values() if c >= 0}) > 1:
                listed = ", ".join(f"{n}={c}" for n, c in sorted(counts.items()))
                problems.append(
                    f"co-partitioned topics of subtopology {sub.id} have different "
                    f"partition counts: {listed}"
                )

    # Changelogs: one partition per task of the subtopology, compacted
    # (windowed stores also delete what is past retention).
    changelogs: dict[str, int] = {}
    topic_configs: dict[str, dict[str, str]] = {}
    for sub in topology.subtopologies:
        source_counts = [partitions[n] for n in sources[sub.id] if n in partitions]
        if not source_counts:
            continue
        tasks = max(source_counts)
        for store in sub.store_specs:
            if not store.changelog:
                continue
            name = f"{sub.topic_prefix(application_id)}-{store.name}-changelog"
            changelogs[name] = sub.id
            if name in existing and existing[name] != tasks:
                problems.append(
                    f"changelog topic {name!r} has {existing[name]} partitions, "
                    f"the store's subtopology has {tasks} tasks"
                )
            partitions[name] = tasks
            if name not in existing:
                to_create[name] = tasks
                if store.kind == "window":
                    retention = (store.retention_ms or store.window_size_ms or 0) + 86_400_000
                    topic_configs[name] = {"cleanup.policy": "compact,delete"}
                    topic_configs[name]["retention.ms"] = str(retention)
                else:
                    topic_configs[name] = {"cleanup.policy": "compact"}

    for name, count in extra_outputs.items():
        if name in existing:
            partitions[name] = existing[name]
        else:
            partitions[name] = count
            to_create[name] = count
            if extra_configs and name in extra_configs:
                topic_configs[name] = extra_configs[name]

    if problems:
        if any(p.endswith("does not exist") and "internal" not in p for p in problems):
            problems.append(MISSING_TOPICS_HINT)
        if any("partitions, the" in p for p in problems):
            problems.append(GROWN_INPUT_HINT)
        raise TopicError("; ".join(problems))

    if to_create:
        _create(admin, to_create, topic_configs, replication_factor, timeout)
    written = set(partitions) - set(subtopology_of) | set(changelogs) | set(extra_outputs)
    written |= internal_sources
    return TopicLayout(
        sources=sources,
        partitions=partitions,
        subtopology_of=subtopology_of,
        changelogs=changelogs,
        max_message_bytes=smallest_max_message_bytes(admin, sorted(written), timeout),
        task_names={s.id: s.task_name for s in topology.subtopologies if s.query is not None},
    )


def smallest_max_message_bytes(admin: AdminClient, topics: list[str], timeout: float) -> int | None:
    """The smallest `max.message.bytes` among `topics`, or None if unknown.

    Brokers that do not answer DescribeConfigs (some Kafka-compatible ones)
    leave the producer's own limit in force; a refusal then arrives in a
    delivery report instead.
    """
    if not topics:
        return None
    try:
        futures = admin.describe_configs(
            [ConfigResource(ResourceType.TOPIC, name) for name in topics],
            request_timeout=timeout,
        )
        limits = []
        for future in futures.values():
            entry = future.result(timeout).get("max.message.bytes")
            if entry is not None and entry.value is not None:
                limits.append(int(entry.value))
    except (KafkaException, ValueError, TypeError) as exc:
        log.debug("max_message_bytes_unknown", error=str(exc))
        return None
    return min(limits) if limits else None


def _create(
    admin: AdminClient,
    topics: dict[str, int],
    configs: dict[str, dict[str, str]],
    replication: int,
    timeout: float,
) -> None:
    futures = admin.create_topics(
        [
            NewTopic(name, count, replication, config=configs.get(name, {}))
            for name, count in topics.items()
        ],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result(timeout)
            log.info("topic_created", topic=name, partitions=topics[name])
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise TopicError(f"cannot create topic {name!r}: {exc}") from exc
