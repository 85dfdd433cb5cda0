"""The app's process-isolated queries: one `QueryProcess` per query.

`App` owns one `IsolatedQueries`. It builds every child's spec when the app
is made (so a config a child cannot take fails at once, naming the key),
starts the children once the app's own threads run, reports their figures,
and routes pause/resume/remove to them. A child that exits on its own marks
its query FAILED; `resume` starts it again from its last commit.

Threads: any (each QueryProcess has its own lock; the mapping has one).
"""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from runtime import query_control
from runtime.config import ConfigError, StreamsConfig
from runtime.isolation.plan import child_application_id, child_spec
from runtime.isolation.supervisor import ChildFigures, QueryProcess
from runtime.kafka.clients import admin_config
from runtime.logging import get_logger
from runtime.processing.query_shares import QueryShare
from runtime.query_control import NamedQueries, reset_query
from runtime.topology.named_queries import QueryError, check_disjoint_sources, query_subtopologies
from runtime.topology.topology import Topology

log = get_logger("runtime.isolation")


# Commits the daemon group's offsets of a query's input back to the start
# (the polling thread's consumer, a group member): (query, topology, timeout).
Rewinder = Callable[[str, Topology, float], None]


class IsolatedQueries:
    def __init__(
        self,
        config: StreamsConfig,
        named: NamedQueries,
        source: str | None,
        rewind_daemon_offsets: Rewinder,
    ) -> None:
        self._rewind_daemon_offsets = rewind_daemon_offsets
        self._config = config
        self._named = named
        self._source = source
        self._lock = threading.Lock()
        self._processes: dict[str, QueryProcess] = {}
        for name in named.isolated():
            self._processes[name] = self._make(name, source)

    def _make(self, name: str, source: str | None, max_threads: int | None = None) -> QueryProcess:
        if source is None:
            raise ConfigError(
                f"query.{name}.isolation",
                f"query {name!r} runs in its own process, which imports its topology: give "
                "App(..., source='module:attr') naming what the topologies come from "
                "(`streams-runtime run` and `query add` pass their MODULE:ATTR)",
            )
        spec = child_spec(self._config, name, source, self._named.priorities(), max_threads)
        return QueryProcess(spec, self._on_exit)

    def names(self) -> list[str]:
        with self._lock:
            return list(self._processes)

    def __contains__(self, name: object) -> bool:
        with self._lock:
            return name in self._processes

    def start_all(self, timeout: float) -> None:
        """Start every child; one that cannot start marks its query FAILED."""
        for name in self.names():
            self._start(name, timeout)

    def _start(self, name: str, timeout: float) -> bool:
        process = self._get(name)
        try:
            process.start(timeout)
        except RuntimeError as exc:
            self._named.set_state(name, query_control.FAILED, str(exc))
            log.error("query_failed", query=name, error=str(exc), isolation="process")
            return False
        log.info("query_process_started", query=name, pid=process.pid, nice=process.spec.nice)
        return True

    def _get(self, name: str) -> QueryProcess:
        with self._lock:
            return self._processes[name]

    def stop_all(self, timeout: float) -> None:
        with self._lock:
            processes = list(self._processes.values())
        # Asked together: they close (and commit) side by side.
        deadline = time.monotonic() + timeout
        for process in processes:
            process.request_stop()
        for process in processes:
            process.stop(max(0.0, deadline - time.monotonic()))

    def figures(self) -> dict[str, ChildFigures]:
        with self._lock:
            processes = dict(self._processes)
        return {name: p.figures() for name, p in processes.items()}

    def pids(self) -> dict[str, int | None]:
        with self._lock:
            return {name: p.pid for name, p in self._processes.items()}

    def pause(self, name: str) -> None:
        self._get(name).pause()

    def resume(self, name: str, timeout: float) -> None:
        """Resume a paused child, or start a failed one again."""
        process = self._get(name)
        if process.alive:
            process.resume()
            self._named.set_state(name, query_control.RUNNING)
        elif self._start(name, timeout):
            self._named.set_state(name, query_control.RUNNING)

    def add(
        self,
        name: str,
        topology: Topology,
        in_process: Topology,
        source: str | None,
        priority: int | None,
        max_threads: int | None,
        timeout: float,
    ) -> None:
        """`App.add_query` of a process-isolated query: check it against the
        queries running (`in_process`: the daemon's topology), register it
        and start its child. Settings not given come from `query.<name>.*`.
        Raises QueryError, ConfigError, RuntimeError (the child did not start)."""
        if name in self._named.names():
            raise QueryError(f"query {name!r} already runs; remove it first")
        others = list(in_process.subtopologies)
        for query, isolated in self._named.isolated().items():
            others += query_subtopologies(query, isolated, len(others))
        check_disjoint_sources(name, topology, others)
        defaults = query_control.share_from_config(self._config, name)
        share = QueryShare(
            priority=defaults.priority if priority is None else priority,
            max_threads=defaults.max_threads if max_threads is None else max_threads,
        )
        self._named.add(name, topology, share, in_process=False)
        try:
            process = self._make(name, source or self._source, share.max_threads)
            with self._lock:
                self._processes[name] = process
            process.start(timeout)
        except BaseException:
            with self._lock:
                self._processes.pop(name, None)
            self._named.remove(name)
            raise
        log.info("query_added", query=name, priority=share.priority, isolation="process")

    def refuse_store(self, name: str) -> None:
        """`App.store`: KeyError saying why a process-isolated query's store
        is not in this process."""
        query, _, plain = name.partition(".")
        for owner, topology in self._named.isolated().items():
            if (query == owner and plain) or any(
                name in sub.state_stores for sub in topology.subtopologies
            ):
                raise KeyError(
                    f"store {name!r} belongs to query {owner!r}, which runs in a child "
                    f"process (query.{owner}.isolation=process): its stores are there, not "
                    "in the daemon; run the query with isolation=thread to query them"
                )

    def remove(self, name: str, reset: bool, timeout: float) -> None:
        with self._lock:
            process = self._processes.pop(name)
        process.stop(timeout)
        if reset:
            self._reset(name, timeout)

    def _reset(self, name: str, timeout: float) -> None:
        """Forget where the child's query was: its consumer group, the daemon
        group's older commits of its input (else they would be carried into
        the next child, see runtime.isolation.offsets), its internal topics
        and local state (best effort, logged)."""
        app = child_application_id(self._config, name)
        admin = AdminClient(admin_config(self._config))
        try:
            admin.delete_consumer_groups([app], request_timeout=timeout)[app].result(timeout)
            log.info("query_group_deleted", query=name, group=app)
        except KafkaException as exc:
            log.warning("query_group_not_deleted", query=name, group=app, error=str(exc))
        topology = self._named.isolated().get(name)
        if topology is not None:
            self._rewind_daemon_offsets(name, topology, timeout)
            reset_query(
                self._config.with_overrides(application_id=app),
                name,
                list(topology.subtopologies),
                timeout,
            )
        shutil.rmtree(Path(self._config.state_dir) / app, ignore_errors=True)

    def _on_exit(self, name: str, reason: str) -> None:
        self._named.set_state(name, query_control.FAILED, reason)
        log.error(
            "query_failed",
            query=name,
            error=reason,
            isolation="process",
            hint=f"fix the cause, then `query resume {name}` (or remove it)",
        )


def merge_figures(
    figures: Mapping[str, ChildFigures],
    tasks: dict[str, int],
    processed: dict[str, int],
    busy: dict[str, float],
    lag: dict[str, int],
    p99_ms: dict[str, float],
) -> None:
    """Add the children's figures to the per-query maps `App.status()` builds."""
    for name, f in figures.items():
        tasks[name] = f.tasks
        processed[name] = f.processed
        busy[name] = f.busy_seconds
        lag[name] = f.lag
        if f.p99_latency_ms is not None:
            p99_ms[name] = f.p99_latency_ms
