"""`streams-runtime expand`: grow an input topic and everything downstream of it.

Why a command: growing only the input topic leaves a running application
(with a static partitioner) to grow its internal topics itself, but its
output topics are the user's, and new keys placed on a new partition need
that partition on every topic they are written to. This grows, in one go
and downstream first (`expansion_plan`): the output topics written
downstream of the topic, the application's internal topics (changelogs,
repartition topics) and the topics co-partitioned with it, and the topic
itself last, so nothing is ever written to a partition that does not exist
yet. Topics that already have the count are left alone, so running it again
completes an interrupted expansion.

`main` is the command (`streams-runtime expand MODULE:ATTR TOPIC --partitions
N`): it refuses without `static.partitioner` unless `--force`, and prints
each topic looked at. Runs on the CLI's main thread with a short-lived admin
client.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, NewPartitions

from runtime.commands.common import (
    EXIT_BAD_INPUT,
    EXIT_INTERRUPTED,
    EXIT_OK,
    load_config_and_topology,
)
from runtime.kafka.topics import TopicError, user_topics
from runtime.partitioning.expansion_plan import (
    changelog_topics,
    downstream_user_topics,
    plan_expansion,
)
from runtime.topology.topology import Topology

__all__ = ["ExpandedTopic", "expand_topic", "main"]


@dataclass(frozen=True)
class ExpandedTopic:
    """One topic `expand_topic` looked at, in the order it was grown."""

    name: str
    role: str  # "output", "internal", "input", "co-partitioned input"
    before: int
    after: int

    @property
    def grown(self) -> bool:
        return self.after > self.before


def expand_topic(
    admin: AdminClient,
    topology: Topology,
    application_id: str,
    topic: str,
    partitions: int,
    timeout: float = 30.0,
) -> list[ExpandedTopic]:
    """Grow `topic` to `partitions` and what is downstream of it. Raises TopicError."""
    try:
        metadata = admin.list_topics(timeout=timeout)
    except KafkaException as exc:
        raise TopicError(f"cannot read topic metadata from the cluster: {exc}") from exc
    existing = {name: len(t.partitions) for name, t in metadata.topics.items() if not t.error}
    inputs = sorted(
        {s.name for sub in topology.subtopologies for s in sub.sources} & set(user_topics(topology))
    )
    if topic not in inputs:
        raise TopicError(
            f"{topic!r} is not an input topic of the topology (its input topics: {', '.join(inputs)})"
        )
    downstream, partners = downstream_user_topics(topology, topic)
    missing = [t for t in [topic, *downstream, *partners] if t not in existing]
    if missing:
        raise TopicError(f"topics do not exist: {', '.join(missing)}")
    if existing[topic] > partitions:
        raise TopicError(
            f"{topic!r} has {existing[topic]} partitions already: Kafka cannot remove partitions"
        )
    wanted = dict.fromkeys([topic, *downstream, *partners], partitions)
    internal = {f"{application_id}-{t.name}" for t in topology.internal_topics()}
    internal |= {c for sub in topology.subtopologies for c in changelog_topics(application_id, sub)}
    ours = set(user_topics(topology)) | internal
    current = {name: count for name, count in existing.items() if name in ours}
    plan = plan_expansion(topology, application_id, current, wanted)
    done: list[ExpandedTopic] = []
    for level in plan.levels:
        # Internal topics the app has not created yet get the count at its start.
        level = [(name, count) for name, count in level if name in existing]
        _grow(admin, level, timeout)
        done += [
            ExpandedTopic(n, _role(n, topic, internal, partners), existing[n], c) for n, c in level
        ]
    _wait_for_counts(admin, {n.name: n.after for n in done}, timeout)
    grown = {n.name for n in done}
    done += [
        ExpandedTopic(n, _role(n, topic, internal, partners), existing[n], existing[n])
        for n in sorted(ours & set(existing) - grown)
        if n in wanted or n in internal
    ]
    return done


def _role(name: str, topic: str, internal: set[str], partners: list[str]) -> str:
    if name == topic:
        return "input"
    if name in internal:
        return "internal"
    if name in partners:
        return "co-partitioned input"
    return "output"


def _grow(admin: AdminClient, level: list[tuple[str, int]], timeout: float) -> None:
    if not level:
        return
    futures = admin.create_partitions(
        [NewPartitions(name, count) for name, count in level],
        operation_timeout=timeout,
        request_timeout=timeout,
    )
    for name, future in futures.items():
        try:
            future.result(timeout)
        except KafkaException as exc:
            # A running instance may have grown an internal topic already.
            if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:
                raise TopicError(f"cannot expand {name!r}: {exc}") from exc


def _wait_for_counts(admin: AdminClient, counts: dict[str, int], timeout: float) -> None:
    """Until the metadata shows every topic with at least its count."""
    deadline = time.monotonic() + timeout
    while counts:
        metadata = admin.list_topics(timeout=timeout)
        short = {
            n: c
            for n, c in counts.items()
            if n not in metadata.topics or len(metadata.topics[n].partitions) < c
        }
        if not short:
            return
        if time.monotonic() >= deadline:
            raise TopicError(f"expanded topics not visible after {timeout:.0f} s: {sorted(short)}")
        time.sleep(0.1)


def main(args: argparse.Namespace) -> int:
    """Grow an input topic and everything downstream of it, downstream first."""
    loaded = load_config_and_topology(args, log_level="warning")
    if isinstance(loaded, int):
        return loaded
    config, topology = loaded
    from runtime.config import ConfigError
    from runtime.kafka.cluster import StartupAdmin
    from runtime.kafka.startup_checks import check_client_properties

    if config.static_partitioner is None and not args.force:
        print(
            f"streams-runtime expand: static.partitioner is not set for {config.application_id!r}: "
            "its running instances would stop when the topic grows (Kafka's default "
            "partitioner moves keys away from their state). Set static.partitioner (here and "
            "in the app's config), or pass --force and repartition the app offline.",
            file=sys.stderr,
        )
        return EXIT_BAD_INPUT
    try:
        check_client_properties(config)
        admin = StartupAdmin(config)
        admin.wait_for_cluster()
        topics = expand_topic(
            admin.client, topology, config.application_id, args.topic, args.partitions
        )
    except (ConfigError, TopicError) as exc:
        print(f"streams-runtime expand: {exc}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("streams-runtime expand: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    width = max((len(t.name) for t in topics), default=0)
    for topic in topics:
        verb = "expanded " if topic.grown else "unchanged"
        counts = f"{topic.before} -> {topic.after}" if topic.grown else f"{topic.after}"
        print(f"{verb}  {topic.name.ljust(width)}  {counts}  ({topic.role})")
    return EXIT_OK
