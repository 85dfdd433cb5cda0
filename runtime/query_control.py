"""The app's named queries: their settings, states and per-query figures.

`App({"orders": t1, "audit": t2}, config)` runs several queries on one set of
clients and threads (runtime.topology.named_queries composes them). This module
keeps what the app knows per query: the scheduling share from the
`query.<name>.*` keys (runtime.processing.query_shares), whether it runs, is
paused or failed (and why), and the figures `App.status()` reports per query.

Any thread: one lock guards the states; figures are computed from racy reads
like the rest of the status.
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from runtime.config import ConfigError, StreamsConfig
from runtime.isolation.plan import PROCESS, child_application_id, isolation_of
from runtime.kafka.clients import admin_config
from runtime.logging import get_logger
from runtime.partitioning.expansion_plan import changelog_topics
from runtime.processing.query_shares import QueryShare
from runtime.status import QueryStatus
from runtime.topology.named_queries import check_query_name, compose
from runtime.topology.topology import Subtopology, Topology

log = get_logger("runtime.queries")

RUNNING = "RUNNING"
PAUSED = "PAUSED"
FAILED = "FAILED"


def share_from_config(config: StreamsConfig, name: str) -> QueryShare:
    settings = config.query_settings.get(name, {})
    return QueryShare(
        priority=int(settings.get("priority", 0)),
        weight=int(settings.get("weight", 1)),
        max_threads=settings.get("max.threads"),
    )


def check_query_keys(config: StreamsConfig, names: Iterable[str]) -> None:
    """Every `query.<name>.*` key must name a query the app runs (a typo in a
    name would otherwise be ignored silently). Raises ConfigError."""
    known = list(names)
    for name, settings in sorted(config.query_settings.items()):
        if name in known:
            continue
        key = f"query.{name}.{next(iter(settings))}"
        if not known:
            raise ConfigError(
                key,
                "query settings need named queries: start the app with a mapping "
                "App({name: topology, ...}, config)",
            )
        raise ConfigError(key, f"no query named {name!r} (queries: {', '.join(known)})")


@dataclass
class _Query:
    topology: Topology
    share: QueryShare
    state: str = RUNNING
    failure: str | None = None
    # Runs in a child process (query.<name>.isolation=process): not part of
    # this process's topology, scheduler or shares.
    in_process: bool = True


class NamedQueries:
    """Settings and states of the named queries (empty for a plain topology)."""

    def __init__(self, queries: Mapping[str, Topology], config: StreamsConfig) -> None:
        self._lock = threading.Lock()
        self._queries: dict[str, _Query] = {}
        for name, topology in queries.items():
            check_query_name(name)
            self._queries[name] = _Query(
                topology,
                share_from_config(config, name),
                in_process=isolation_of(config, name) != PROCESS,
            )
        check_query_keys(config, self._queries)
        self._enabled = bool(self._queries)
        # records/s: the processed count per query at the previous sample.
        self._last_sample: tuple[float, dict[str, int]] | None = None
        self._rates: dict[str, float] = {}

    @classmethod
    def of(
        cls, topology: Topology | Mapping[str, Topology], config: StreamsConfig
    ) -> tuple[NamedQueries, Topology]:
        """The queries and the app-wide topology for what `App` was given."""
        if isinstance(topology, Topology):
            return cls({}, config), topology
        if not isinstance(topology, Mapping):
            raise TypeError(
                "App takes a Topology or a mapping of query name -> Topology, "
                f"got {type(topology).__name__}"
            )
        named = cls(topology, config)
        compose(topology)  # every query's names and topics, wherever it runs
        own = {name: t for name, t in topology.items() if name not in named.isolated()}
        if not own:
            raise ConfigError(
                f"query.{next(iter(topology))}.isolation",
                "every query would run in a process of its own: keep at least one query in "
                "the daemon's process (isolation=thread), or run each as its own app",
            )
        return named, compose(own)

    @property
    def enabled(self) -> bool:
        """The app runs named queries (it was given a mapping)."""
        return self._enabled

    def names(self) -> list[str]:
        with self._lock:
            return list(self._queries)

    def shares(self) -> dict[str, QueryShare]:
        """Scheduling shares of the queries this process schedules."""
        with self._lock:
            return {name: q.share for name, q in self._queries.items() if q.in_process}

    def priorities(self) -> dict[str, int]:
        """Every query's priority, those in child processes too."""
        with self._lock:
            return {name: q.share.priority for name, q in self._queries.items()}

    def isolated(self) -> dict[str, Topology]:
        """The queries that run in child processes."""
        with self._lock:
            return {name: q.topology for name, q in self._queries.items() if not q.in_process}

    def in_process(self) -> dict[str, Topology]:
        """The queries that run in the app's own process (isolation=thread)."""
        with self._lock:
            return {name: q.topology for name, q in self._queries.items() if q.in_process}

    def add(
        self, name: str, topology: Topology, share: QueryShare, in_process: bool = True
    ) -> None:
        with self._lock:
            self._queries[name] = _Query(topology, share, in_process=in_process)

    def remove(self, name: str) -> None:
        with self._lock:
            self._queries.pop(name, None)

    def set_state(self, name: str, state: str, failure: str | None = None) -> None:
        with self._lock:
            query = self._queries.get(name)
            if query is not None:
                query.state = state
                if failure is not None or state == RUNNING:
                    query.failure = failure

    def state(self, name: str) -> str | None:
        with self._lock:
            query = self._queries.get(name)
            return query.state if query is not None else None

    def statuses(
        self,
        tasks: Mapping[str, int],
        processed: Mapping[str, int],
        busy: Mapping[str, float],
        lag: Mapping[str, int],
        p99_ms: Mapping[str, float],
        pids: Mapping[str, int | None] | None = None,
    ) -> tuple[QueryStatus, ...]:
        """Per-query status from per-query figures (each keyed by query name)."""
        now = time.monotonic()
        counts = dict(processed)
        last = self._last_sample
        if last is None or now - last[0] >= 1.0:
            if last is not None:
                elapsed = now - last[0]
                self._rates = {
                    q: max(0, n - last[1].get(q, 0)) / elapsed for q, n in counts.items()
                }
            self._last_sample = (now, counts)
        total_busy = sum(busy.values())
        with self._lock:
            queries = list(self._queries.items())
        return tuple(
            QueryStatus(
                name=name,
                state=q.state,
                priority=q.share.priority,
                weight=int(q.share.weight),
                max_threads=q.share.max_threads,
                tasks=tasks.get(name, 0),
                processed=counts.get(name, 0),
                records_per_s=round(self._rates.get(name, 0.0), 1),
                busy_seconds=round(busy.get(name, 0.0), 3),
                busy_share=round(busy.get(name, 0.0) / total_busy, 4) if total_busy else 0.0,
                lag=lag.get(name, 0),
                p99_latency_ms=round(p99_ms[name], 1) if name in p99_ms else None,
                failure=q.failure,
                isolation="thread" if q.in_process else PROCESS,
                pid=(pids or {}).get(name),
            )
            for name, q in queries
        )


def reset_query(
    config: StreamsConfig, name: str, subtopologies: list[Subtopology], timeout: float
) -> None:
    """After `App.remove_query(name, reset=True)`: delete the query's internal
    topics (repartition and changelog) and its local state directories (its
    committed offsets were moved back by the polling thread, see
    `runtime.polling.query_changes`). Best effort, logged: a failure here
    leaves leftovers, never touches another query. The caller's thread.
    """
    app = config.application_id
    admin = AdminClient(admin_config(config))
    internal = sorted(
        {
            f"{app}-{spec.name}"
            for sub in subtopologies
            for spec in (*sub.sources, *sub.sinks)
            if spec.internal
        }
        | {c for sub in subtopologies for c in changelog_topics(app, sub)}
    )
    if internal:
        for topic, future in admin.delete_topics(internal, operation_timeout=timeout).items():
            try:
                future.result(timeout)
                log.info("query_topic_deleted", query=name, topic=topic)
            except KafkaException as exc:
                log.warning("query_topic_not_deleted", query=name, topic=topic, error=str(exc))
    # Had the query run in a child process (runtime.isolation), that group's
    # commits would be carried back at the next start: the reset goes there too.
    child_group = child_application_id(config, name)
    try:
        admin.delete_consumer_groups([child_group], request_timeout=timeout)[child_group].result(
            timeout
        )
        log.info("query_group_deleted", query=name, group=child_group)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.GROUP_ID_NOT_FOUND:
            log.warning("query_group_not_deleted", query=name, group=child_group, error=str(exc))
    state = Path(config.state_dir) / app
    for directory in sorted(state.glob(f"{name}__*")):
        shutil.rmtree(directory, ignore_errors=True)
        log.info("query_state_deleted", query=name, directory=str(directory))
