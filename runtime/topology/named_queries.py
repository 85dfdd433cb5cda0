"""Several named queries (topologies) as one app-wide topology.

`App(topologies={"orders": t1, "audit": t2}, ...)` runs each query's
subtopologies side by side on the app's shared clients and threads. What a
query owns is its own:

- subtopology ids are app-wide (the polling thread keys its maps by them) but
  a query's *task ids* are `<query>__<local subtopology>_<partition>`
  (`Subtopology.task_name`), so they, and the state directories named after
  them, do not depend on which other queries run or in which order they were
  added;
- its internal topics: a repartition topic `x` becomes `<query>-x`, so its
  full name is `<application.id>-<query>-x`; its changelogs are
  `<application.id>-<query>-<store>-changelog` (`Subtopology.topic_prefix`).

One consumer subscription covers every query's source topics, and a record is
routed to exactly one task, so a topic may feed only one query: two queries
reading the same topic are refused (`QueryError`, at start-up or by
`App.add_query`). Letting both read it would need per-query committed offsets
(a consumer group per query), which is what two applications already give.

Pure functions over immutable topologies: any thread may call them.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping

from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef
from runtime.topology.topology import Subtopology, Topology

QUERY_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}", re.ASCII)


class QueryError(TopologyError):
    """Named queries that cannot run together (a bad name, a shared source topic)."""


def check_query_name(name: object) -> str:
    """`name` if it can name a query: 1-64 of `[A-Za-z0-9_-]` (it goes into
    topic names, task ids and the `query.<name>.*` config keys, so no dots)."""
    if not isinstance(name, str) or not QUERY_NAME.fullmatch(name) or "__" in name:
        raise QueryError(
            f"query name {name!r} is not valid: use 1-64 letters, digits, '_' or '-' "
            "(no '__', no dots)"
        )
    return name


def _renamed_topics(query: str, d: NodeDef) -> NodeDef:
    if not d.internal or not d.topics:
        return d
    return dataclasses.replace(d, topics=tuple(f"{query}-{t}" for t in d.topics))


def query_subtopologies(query: str, topology: Topology, first_id: int) -> list[Subtopology]:
    """`topology`'s subtopologies as part of query `query`, numbered from `first_id`."""
    check_query_name(query)
    if topology.global_stores:
        raise QueryError(
            f"query {query!r} has global tables: named queries do not support them "
            "(run it as an app of its own)"
        )
    internal = {spec.name for spec in topology.internal_topics()}
    result = []
    for offset, sub in enumerate(topology.subtopologies):
        defs = [_renamed_topics(query, d) for d in sub.defs]
        groups = [
            frozenset(f"{query}-{t}" if t in internal else t for t in group)
            for group in sub.copartition_groups
        ]
        result.append(sub.renumbered(first_id + offset, query, defs, groups))
    return result


def source_owners(subtopologies: Iterable[Subtopology]) -> dict[str, str]:
    """User source topic -> the query reading it (internal topics are per query)."""
    owners: dict[str, str] = {}
    for sub in subtopologies:
        for spec in sub.sources:
            if not spec.internal and sub.query is not None:
                owners.setdefault(spec.name, sub.query)
    return owners


def check_disjoint_sources(query: str, topology: Topology, others: Iterable[Subtopology]) -> None:
    """Raise QueryError if `query` reads a topic another query reads."""
    owners = source_owners(others)
    shared = sorted(
        {spec.name for spec in topology.source_topics() if not spec.internal} & set(owners)
    )
    if shared:
        listed = ", ".join(f"{t!r} (read by query {owners[t]!r})" for t in shared)
        raise QueryError(
            f"query {query!r} reads {listed}: in one application a topic feeds one query, "
            "since the queries share one consumer group and its committed offsets. Read it "
            "in one query and branch there, or run the other query as its own application "
            "(its own application.id)"
        )


def compose(queries: Mapping[str, Topology]) -> Topology:
    """One topology holding every named query (in the mapping's order).

    Raises QueryError for a bad name, an empty mapping or a topic read by two
    queries.
    """
    if not queries:
        raise QueryError("no queries: give at least one name -> Topology")
    subtopologies: list[Subtopology] = []
    for name, topology in queries.items():
        if not isinstance(topology, Topology):
            raise QueryError(
                f"query {name!r}: expected a Topology (what StreamsBuilder.build() returns), "
                f"got {type(topology).__name__}"
            )
        check_query_name(name)
        check_disjoint_sources(name, topology, subtopologies)
        subtopologies += query_subtopologies(name, topology, len(subtopologies))
    return Topology.of_subtopologies(subtopologies)


def with_query(current: Topology, name: str, topology: Topology) -> Topology:
    """`current` plus query `name` (ids after the highest in use, so ids of
    running tasks never change). Raises QueryError."""
    check_query_name(name)
    if name in current.queries:
        raise QueryError(f"query {name!r} already runs; remove it first")
    subs = current.subtopologies
    check_disjoint_sources(name, topology, subs)
    first = max((s.id for s in subs), default=-1) + 1
    return Topology.of_subtopologies([*subs, *query_subtopologies(name, topology, first)])


def without_query(current: Topology, name: str) -> Topology:
    """`current` without query `name` (the other ids unchanged). Raises QueryError."""
    if name not in current.queries:
        raise QueryError(f"no query {name!r} (queries: {', '.join(current.queries) or 'none'})")
    return Topology.of_subtopologies(s for s in current.subtopologies if s.query != name)


def subtopologies_of(topology: Topology, name: str) -> list[Subtopology]:
    return [s for s in topology.subtopologies if s.query == name]
