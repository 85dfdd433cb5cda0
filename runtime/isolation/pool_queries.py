"""Named queries changed at runtime in a daemon with `processes` > 1.

Every processing process runs the whole topology, so a named query runs in
all of them (`query.<name>.isolation=thread`, each process its share of the
query's tasks). `add_query`, `remove_query`, `pause_query` and
`resume_query` of the pool are carried to every running process
(runtime.isolation.child's `query.*` requests), and remembered: a process
started later (a new slot, a restart after a death) starts with the same
queries, settings and paused set (`PoolQueries.spec_fields`), as it starts
with the paused tasks.

Order and failures. An `add` goes to one process first: whatever is wrong
with the query (its name, its source, a topic) is refused there, before
any other process changed anything. The rest then add it at once (each
subscription change is one rebalance of the group). A `remove` with
`reset` removes the query everywhere first and lets the last process reset
its offsets, topics and state: a reset while another process still
consumes the query's input would be overwritten by that process's next
commit.

A process-isolated query (`query.<name>.isolation=process`, at start or
added so) runs once for the daemon, in a child process the supervisor owns
(runtime.isolation.queries, the same `IsolatedQueries` an `App` uses), not
in the processing processes: they start without it. Its pause, resume and
remove go to that child; its reset asks one processing process to rewind
the daemon group's offsets of its input (`query.rewind`). To check a query
added so against the others, and to build the child's spec, the supervisor
imports the topology source itself (the first time one is needed).

Any thread may call; one lock lets one change run at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime import query_control
from runtime.config import StreamsConfig
from runtime.isolation.plan import PROCESS, isolation_of
from runtime.isolation.queries import IsolatedQueries, merge_figures
from runtime.lifecycle import IllegalStateError
from runtime.logging import get_logger
from runtime.processing.query_shares import QueryShare
from runtime.query_control import NamedQueries
from runtime.status import QueryStatus
from runtime.topology.loading import load_topology
from runtime.topology.named_queries import compose
from runtime.topology.topology import Topology

log = get_logger("runtime.isolation")

# Ask the named processes (None: every running one) `op` with `fields`;
# slot name -> result. Raises RuntimeError naming each process that failed.
AskEach = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class AddedQuery:
    """A query added at runtime: where each process imports it from, and its
    scheduling settings (None: the `query.<name>.*` keys, else defaults)."""

    name: str
    source: str
    priority: int | None = None
    weight: int | None = None
    max_threads: int | None = None


class PoolQueries:
    """The pool's named-query changes and its process-isolated queries (see the module doc)."""

    def __init__(
        self,
        config: StreamsConfig,
        source: str,
        ask_each: AskEach,
        slot_names: Callable[[], list[str]],
    ) -> None:
        self._config = config
        self._source = source
        self._ask_each = ask_each
        self._slot_names = slot_names
        self._change = threading.Lock()
        self._lock = threading.Lock()
        self._added: dict[str, AddedQuery] = {}
        self._removed: set[str] = set()
        self._paused: set[str] = set()
        # Loaded the first time a process-isolated query needs them.
        self._named: NamedQueries | None = None
        self._isolated: IsolatedQueries | None = None
        self._isolated_sources: dict[str, str] = {}
        if any(isolation_of(config, name) == PROCESS for name in config.query_settings):
            self._load()

    def _load(self) -> tuple[NamedQueries, IsolatedQueries]:
        """The daemon's queries as the supervisor sees them, and its
        children; built once (raises ConfigError, IllegalStateError)."""
        if self._named is None or self._isolated is None:
            loaded = load_topology(self._source, named=True)
            if not isinstance(loaded, Mapping):
                raise IllegalStateError(
                    "this daemon runs one plain topology; start it with a mapping of named "
                    "queries to run queries in processes of their own"
                )
            named, _ = NamedQueries.of(loaded, self._config)
            with self._lock:
                for query in self._added.values():
                    named.add(query.name, load_topology(query.source), _share(self._config, query))
                for name in self._removed:
                    named.remove(name)
            self._named = named
            self._isolated = IsolatedQueries(self._config, named, self._source, self._rewind)
        return self._named, self._isolated

    def _isolated_has(self, name: str) -> IsolatedQueries | None:
        isolated = self._isolated
        return isolated if isolated is not None and name in isolated else None

    # --- the pool's lifecycle --------------------------------------------------------

    def start_isolated(self, timeout: float) -> None:
        """Start the children of the queries isolated at start-up (after
        the processing processes: a query that cannot start is FAILED)."""
        if self._isolated is not None:
            self._isolated.start_all(timeout)

    def stop_isolated(self, timeout: float) -> None:
        if self._isolated is not None:
            self._isolated.stop_all(timeout)

    def isolated_statuses(self) -> tuple[QueryStatus, ...]:
        """Status rows of the process-isolated queries (the processing
        processes report the others)."""
        named, isolated = self._named, self._isolated
        if named is None or isolated is None:
            return ()
        tasks: dict[str, int] = {}
        processed: dict[str, int] = {}
        busy: dict[str, float] = {}
        lag: dict[str, int] = {}
        p99_ms: dict[str, float] = {}
        merge_figures(isolated.figures(), tasks, processed, busy, lag, p99_ms)
        rows = named.statuses(tasks, processed, busy, lag, p99_ms, isolated.pids())
        return tuple(row for row in rows if row.isolation == PROCESS)

    # --- changes ------------------------------------------------------------------

    def add(
        self, query: AddedQuery, topology: Topology | None, isolation: str | None, timeout: float
    ) -> None:
        if isolation == PROCESS:
            with self._change:
                self._add_isolated(query, topology, timeout)
            return
        fields = {
            "name": query.name,
            "source": query.source,
            "priority": query.priority,
            "weight": query.weight,
            "max_threads": query.max_threads,
            "timeout": timeout,
        }
        wait = timeout + 10.0
        with self._change:
            if self._named is not None and query.name in self._named.names():
                raise RuntimeError(f"query {query.name!r} already runs; remove it first")
            names = self._slot_names()
            if not names:
                raise RuntimeError("no processing process runs: cannot add a query now")
            first, rest = names[0], names[1:]
            self._ask_each("query.add", wait, [first], **fields)
            # From here on the query exists in the group: remember it even if
            # a process below fails (it gets it at its restart).
            with self._lock:
                self._added[query.name] = query
                self._removed.discard(query.name)
            if self._named is not None:
                loaded = topology if topology is not None else load_topology(query.source)
                self._named.add(query.name, loaded, _share(self._config, query))
            if rest:
                self._ask_each("query.add", wait, rest, **fields)
        log.info("pool_query_added", query=query.name, source=query.source, processes=len(names))

    def _add_isolated(self, query: AddedQuery, topology: Topology | None, timeout: float) -> None:
        named, isolated = self._load()
        loaded = topology if topology is not None else load_topology(query.source)
        in_process = compose(named.in_process())
        self._isolated_sources[query.name] = query.source
        isolated.add(
            query.name,
            loaded,
            in_process,
            query.source,
            query.priority,
            query.max_threads,
            timeout,
        )
        log.info("pool_query_added", query=query.name, source=query.source, isolation=PROCESS)

    def remove(self, name: str, reset: bool, timeout: float) -> None:
        isolated = self._isolated_has(name)
        if isolated is not None:
            with self._change:
                isolated.remove(name, reset, timeout)
                if self._named is not None:
                    self._named.remove(name)
                self._isolated_sources.pop(name, None)
            log.info("pool_query_removed", query=name, reset=reset, isolation=PROCESS)
            return
        wait = timeout + 10.0
        with self._change:
            names = self._slot_names()
            last = names[-1:] if reset else []
            others = names[:-1] if reset else names
            if others:
                self._ask_each(
                    "query.remove", wait, others, name=name, reset=False, timeout=timeout
                )
            with self._lock:
                self._added.pop(name, None)
                self._removed.add(name)
                self._paused.discard(name)
            if self._named is not None:
                self._named.remove(name)
            if last:
                self._ask_each("query.remove", wait, last, name=name, reset=True, timeout=timeout)
        log.info("pool_query_removed", query=name, reset=reset, processes=len(names))

    def pause(self, name: str) -> None:
        isolated = self._isolated_has(name)
        with self._change:
            if isolated is not None and self._named is not None:
                isolated.pause(name)
                self._named.set_state(name, query_control.PAUSED)
                return
            self._ask_each("query.pause", 10.0, None, name=name)
            with self._lock:
                self._paused.add(name)

    def resume(self, name: str, timeout: float = 120.0) -> None:
        isolated = self._isolated_has(name)
        with self._change:
            if isolated is not None:
                isolated.resume(name, timeout)  # a failed child starts again
                return
            self._ask_each("query.resume", 30.0, None, name=name)
            with self._lock:
                self._paused.discard(name)

    def _rewind(self, name: str, topology: Topology, timeout: float) -> None:
        """An isolated query's reset: one processing process (a member of the
        daemon's group) commits the group's offsets of its input back to the
        start (IsolatedQueries' rewinder)."""
        names = self._slot_names()[:1]
        if not names:
            log.warning("query_rewind_skipped", query=name, reason="no processing process runs")
            return
        source = self._isolated_sources.get(name, self._source)
        self._ask_each(
            "query.rewind", timeout + 10.0, names, name=name, source=source, timeout=timeout
        )

    # --- what a process started now starts with --------------------------------------

    def spec_fields(self) -> dict[str, Any]:
        """`ChildSpec` fields of a processing process started now: the
        isolated queries run elsewhere, so it starts without them too."""
        isolated = self._isolated.names() if self._isolated is not None else []
        with self._lock:
            return {
                "queries_added": tuple(_added_line(q) for q in self._added.values()),
                "queries_removed": tuple(sorted(self._removed | set(isolated))),
                "queries_paused": tuple(sorted(self._paused)),
            }


def _share(config: StreamsConfig, query: AddedQuery) -> QueryShare:
    """An added query's share: its settings, else `query.<name>.*`, else defaults."""
    defaults = query_control.share_from_config(config, query.name)
    return QueryShare(
        priority=defaults.priority if query.priority is None else query.priority,
        weight=defaults.weight if query.weight is None else query.weight,
        max_threads=defaults.max_threads if query.max_threads is None else query.max_threads,
    )


def _added_line(query: AddedQuery) -> dict[str, Any]:
    return {
        "name": query.name,
        "source": query.source,
        "priority": query.priority,
        "weight": query.weight,
        "max_threads": query.max_threads,
    }


def worker_config(raw: dict[str, Any], fields: Mapping[str, Any]) -> None:
    """A processing process's config for `spec_fields`: the `query.<name>.*`
    keys of the queries it starts without are dropped (a key naming no query
    is refused at start), and an added query's settings become such keys
    (the way a process started with the query reads them)."""
    removed = tuple(f"query.{name}." for name in fields["queries_removed"])
    for key in [k for k in raw if removed and k.startswith(removed)]:
        del raw[key]
    for added in fields["queries_added"]:
        for field, key in (
            ("priority", "priority"),
            ("weight", "weight"),
            ("max_threads", "max.threads"),
        ):
            value = added.get(field)
            if value is not None:
                raw[f"query.{added['name']}.{key}"] = value
