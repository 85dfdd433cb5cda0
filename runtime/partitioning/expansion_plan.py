"""What a partition expansion must create, and in which order. Pure: no client.

Why an order: a new partition of a topic makes new tasks of the
subtopologies reading it, which write their repartition topics and
changelogs on the same partition numbers. Each topic must therefore have its
new partitions before anything can write there: the topics a subtopology
writes (its changelogs, and its repartition topics, which are read further
down) grow before the topics it reads. The plan lists the topics to grow in
levels, downstream first; a level starts when the previous one is done.

The partition counts follow the rules `runtime.kafka.topics` applies at
start-up: a repartition topic has its writer's task count (or the count
`repartition(partitions=N)` fixed, or its co-partitioned topics' count); a
changelog has one partition per task of its subtopology. Counts only grow.

Used by the polling thread (`runtime.polling.expansion`, internal topics
only) and by `streams-runtime expand` (a user topic and what is downstream of
it), so it has no Kafka client and is unit-tested alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from runtime.topology.topology import Subtopology, TopicSpec, Topology

__all__ = ["ExpansionPlan", "downstream_user_topics", "plan_expansion"]


@dataclass(frozen=True)
class ExpansionPlan:
    """The outcome of `plan_expansion`."""

    counts: dict[str, int]
    """Every topic of the topology (full names) -> its count once the plan is done."""
    levels: list[list[tuple[str, int]]]
    """(topic, new count) to grow, downstream first; non-empty levels only."""
    mismatches: list[str]
    """Co-partitioned topics whose counts would still differ, in words."""

    @property
    def empty(self) -> bool:
        return not self.levels

    def growing(self) -> dict[str, int]:
        return {topic: count for level in self.levels for topic, count in level}


def _full(application_id: str, spec: TopicSpec) -> str:
    return f"{application_id}-{spec.name}" if spec.internal else spec.name


def changelog_topics(application_id: str, sub: Subtopology) -> list[str]:
    prefix = sub.topic_prefix(application_id)
    return [f"{prefix}-{s.name}-changelog" for s in sub.store_specs if s.changelog]


def plan_expansion(
    topology: Topology,
    application_id: str,
    current: Mapping[str, int],
    wanted: Mapping[str, int] | None = None,
) -> ExpansionPlan:
    """The topics to grow so that the topology's topics agree again.

    `current`: partition counts as the cluster has them (full names; topics
    missing here count as absent). `wanted`: user topics to bring to at least
    a count (the `expand` command); the runtime passes none and gets the
    internal topics that must follow user topics grown by someone else.
    """
    subs = topology.subtopologies
    counts = dict(current)
    for topic, count in (wanted or {}).items():
        counts[topic] = max(counts.get(topic, 0), count)
    fixed = {spec.name: spec.partitions for spec in topology.internal_topics()}
    groups = [g for sub in subs for g in sub.copartition_groups]

    def full(spec: TopicSpec) -> str:
        return _full(application_id, spec)

    def group_count(relative: str) -> int | None:
        """A repartition topic joined with user topics takes their count."""
        for group in groups:
            if relative in group:
                known = [counts[t] for t in group if t != relative and t in counts]
                if known:
                    return max(known)
        return None

    # Writers come before readers (Subtopology ids), so a subtopology's
    # internal sources are settled when it is reached.
    for sub in subs:
        own = [counts[full(s)] for s in sub.sources if full(s) in counts]
        tasks = max(own) if own else 1
        for spec in sub.sinks:
            if spec.internal:
                need = fixed.get(spec.name) or group_count(spec.name) or tasks
                counts[full(spec)] = max(counts.get(full(spec), 0), need)
        for changelog in changelog_topics(application_id, sub):
            counts[changelog] = max(counts.get(changelog, 0), tasks)

    grow = {t: n for t, n in counts.items() if n > current.get(t, 0)}
    return ExpansionPlan(
        counts, _levels(topology, application_id, grow), _mismatches(subs, counts, application_id)
    )


def _levels(
    topology: Topology, application_id: str, grow: Mapping[str, int]
) -> list[list[tuple[str, int]]]:
    """Downstream first: topics only written (outputs), then per subtopology
    from the last to the first, its changelogs and then the topics it reads
    (a topic read by several subtopologies goes with the first of them)."""
    subs = topology.subtopologies
    first_reader: dict[str, int] = {}
    for sub in subs:
        for spec in sub.sources:
            first_reader.setdefault(_full(application_id, spec), sub.id)
    changelogs = {c for sub in subs for c in changelog_topics(application_id, sub)}
    levels = [sorted(t for t in grow if t not in first_reader and t not in changelogs)]
    for sub in reversed(subs):
        levels.append(sorted(c for c in changelog_topics(application_id, sub) if c in grow))
        levels.append(
            sorted(t for t, first in first_reader.items() if first == sub.id and t in grow)
        )
    return [[(t, grow[t]) for t in level] for level in levels if level]


def _mismatches(
    subs: list[Subtopology], counts: Mapping[str, int], application_id: str
) -> list[str]:
    found = []
    for sub in subs:
        internal = {s.name for s in sub.sources if s.internal}
        for group in sub.copartition_groups:
            names = sorted(f"{application_id}-{t}" if t in internal else t for t in group)
            present = {n: counts[n] for n in names if n in counts}
            if len(set(present.values())) > 1:
                listed = ", ".join(f"{n}={c}" for n, c in present.items())
                found.append(f"co-partitioned topics of subtopology {sub.id} differ: {listed}")
    return found


def downstream_user_topics(topology: Topology, topic: str) -> tuple[list[str], list[str]]:
    """(user topics written downstream of `topic`, user topics co-partitioned
    with `topic` or with anything downstream of it), for `expand`.

    Downstream: the sinks of every subtopology reading `topic`, and on through
    the topics those write that other subtopologies read (repartition and
    `through` topics). Internal topics are left to `plan_expansion`.
    """
    subs = topology.subtopologies
    reached: set[str] = {topic}
    visited: set[int] = set()
    frontier = [topic]
    while frontier:
        name = frontier.pop()
        for sub in subs:
            if sub.id in visited or not any(s.name == name for s in sub.sources):
                continue
            visited.add(sub.id)
            for spec in sub.sinks:
                key = spec.name
                if key not in reached:
                    reached.add(key)
                    frontier.append(key)
    internal = {t.name for t in topology.internal_topics()}
    downstream = sorted(t for t in reached - {topic} if t not in internal)
    partners: set[str] = set()
    for sub in subs:
        for group in sub.copartition_groups:
            if group & reached:
                partners |= {t for t in group if t not in reached and t not in internal}
    return downstream, sorted(partners)
