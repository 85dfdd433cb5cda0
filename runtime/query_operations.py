"""Named queries on a running app: add, remove, pause, resume, and the
scheduling and interpreter settings that follow their priorities.

`App.add_query` and its siblings delegate here. A query runs either in this
process (its subtopologies join the app's topology; the polling thread
subscribes to its topics, runtime.polling.query_changes) or in a child process
of its own (`query.<name>.isolation=process`, runtime.isolation.queries).
What the app knows per query (settings, states, figures) is
runtime.query_control's `NamedQueries`; this module changes it.

Any thread but the app's own: one lock lets one query change at a time (each
builds on the topology the previous one left); the app's state lock guards
the topology swap. `apply_priorities` is also called by `App.start`.
"""

from __future__ import annotations

import sys
import threading

from runtime import query_control
from runtime.config import StreamsConfig, clamp_wait_s
from runtime.isolation.plan import PROCESS, isolation_of
from runtime.isolation.queries import IsolatedQueries
from runtime.kafka.cluster import StartupAdmin
from runtime.kafka.serde_check import check_serdes_on_samples
from runtime.kafka.topics import create_user_topics, resolve_topics
from runtime.lifecycle import IllegalStateError, Lifecycle
from runtime.logging import get_logger
from runtime.polling.polling_thread import PollingThread
from runtime.polling.query_changes import QueryChange
from runtime.processing.os_scheduling import idle_class_unavailable
from runtime.processing.query_shares import QueryShare, switch_interval_s
from runtime.processing.task_manager import TaskManager
from runtime.query_control import NamedQueries, reset_query
from runtime.topology.named_queries import (
    QueryError,
    query_subtopologies,
    with_query,
    without_query,
)
from runtime.topology.topology import Topology

log = get_logger("runtime.app")

# How long `start` / `resume_query` / `add_query` wait for a process-isolated
# query's child to start (cluster, topics, its first rebalance).
CHILD_START_TIMEOUT_S = 120.0


def sched_idle_wanted(config: StreamsConfig, named: NamedQueries) -> bool:
    """`sched.idle.lower.priorities`, where the OS lets a thread leave
    SCHED_IDLE again (runtime.processing.os_scheduling). Named queries
    only: a single topology has no lower priority."""
    if not config.sched_idle_lower_priorities or not named.enabled:
        return False
    unavailable = idle_class_unavailable()
    if unavailable is not None:
        log.info("sched_idle_lower_priorities_off", reason=unavailable)
    return unavailable is None


class QueryOperations:
    """Changes to the app's named queries, and the app's current topology."""

    def __init__(
        self,
        lifecycle: Lifecycle,
        config: StreamsConfig,
        named: NamedQueries,
        topology: Topology,
        task_manager: TaskManager,
        source: str | None,
    ) -> None:
        """`topology`: the in-process queries composed (NamedQueries.of);
        `source`: 'module:attr' children import their query from."""
        self._lifecycle = lifecycle
        self._config = config
        self._named = named
        self._task_manager = task_manager
        # The in-process queries composed; replaced (under the state lock)
        # when one is added or removed. `App.topology` reads it.
        self.topology = topology
        self.isolated = IsolatedQueries(config, named, source, self.rewind_daemon_offsets)
        # One query added or removed at a time (each builds on the topology
        # the previous one left).
        self._change = threading.Lock()
        self._polling: PollingThread | None = None
        # Topics the runtime writes besides the topologies' (start-up and add_query).
        self._extra_outputs: dict[str, int] = {}
        self._extra_configs: dict[str, dict[str, str]] = {}
        # The interpreter's switch interval before `start` changed it, and
        # what this app set (restored when the app stops).
        self._python_switch_interval = sys.getswitchinterval()
        self._switch_interval_set: float | None = None

    def attach(
        self,
        polling: PollingThread,
        extra_outputs: dict[str, int],
        extra_configs: dict[str, dict[str, str]],
    ) -> None:
        """The started app's polling thread and the runtime's own topics
        (`App.start`, before that thread starts)."""
        self._polling = polling
        self._extra_outputs, self._extra_configs = extra_outputs, extra_configs

    # --- priorities -------------------------------------------------------------

    def remember_switch_interval(self) -> None:
        """The interpreter's switch interval now, restored when the app stops.
        Process-wide; `App.start` calls it once the start-up checks passed,
        so a start that fails leaves it be."""
        self._python_switch_interval = sys.getswitchinterval()

    def apply_priorities(self) -> None:
        """Tune latency for the priorities of the queries running now: the
        polling thread's refill (`query_shares.input_refill`) and the
        interpreter's switch interval (`gil.switch.interval.us`; 0: shorter
        while their priorities differ, see `query_shares.switch_interval_s`;
        process-wide). Called by `start`, `add_query` and `remove_query`."""
        priorities = [share.priority for share in self._named.shares().values()]
        if self._polling is not None:
            self._polling.tune_refill(priorities)
        wanted = switch_interval_s(
            self._config.gil_switch_interval_us, priorities, self._python_switch_interval
        )
        if wanted != sys.getswitchinterval():
            sys.setswitchinterval(wanted)
            self._switch_interval_set = wanted
            log.info("gil_switch_interval_set", microseconds=round(wanted * 1_000_000))

    def restore_switch_interval(self) -> None:
        """The process's own switch interval again, unless someone else
        changed it since this app set it (the supervisor, once stopped)."""
        if self._switch_interval_set is not None and (
            sys.getswitchinterval() == self._switch_interval_set
        ):
            sys.setswitchinterval(self._python_switch_interval)

    # --- add ------------------------------------------------------------------------

    def add(
        self,
        name: str,
        topology: Topology,
        priority: int | None,
        weight: int | None,
        max_threads: int | None,
        timeout: float,
        source: str | None,
        isolation: str | None,
    ) -> None:
        """`App.add_query` (see there)."""
        with self._change:
            if (isolation or isolation_of(self._config, name)) == PROCESS:
                self._add_isolated(name, topology, priority, max_threads, timeout, source)
            else:
                self._add_in_process(name, topology, priority, weight, max_threads, timeout)

    def _add_isolated(
        self,
        name: str,
        topology: Topology,
        priority: int | None,
        max_threads: int | None,
        timeout: float,
        source: str | None,
    ) -> None:
        with self._lifecycle.lock:
            self.check_named("add a query")
            self._lifecycle.require_active("add_query()")
            in_process = self.topology
        self.isolated.add(
            name, topology, in_process, source, priority, max_threads, clamp_wait_s(timeout)
        )

    def rewind_daemon_offsets(self, name: str, topology: Topology, timeout: float) -> None:
        """This group's commits of an isolated query's input back to the start
        (its reset; runtime.polling.query_changes, on the polling thread)."""
        polling = self._polling
        if polling is None:
            return
        change = QueryChange("rewind", name, query_subtopologies(name, topology, 0))
        polling.query_changes.request(change).result(timeout=timeout)

    def _add_in_process(
        self,
        name: str,
        topology: Topology,
        priority: int | None,
        weight: int | None,
        max_threads: int | None,
        timeout: float,
    ) -> None:
        polling = self._polling
        with self._lifecycle.lock:
            self.check_named("add a query")
            if polling is None:
                raise IllegalStateError(
                    f"add_query() needs a running app, it is {self._lifecycle.state}"
                )
            self._lifecycle.require_active("add_query()")
            composite = with_query(self.topology, name, topology)
        added = [s for s in composite.subtopologies if s.query == name]
        if polling.assignment_strategy != "range" and any(len(s.sources) > 1 for s in added):
            raise QueryError(
                f"query {name!r} joins co-partitioned topics, which needs the range assignor, "
                f"and this app started with {polling.assignment_strategy}: start the app "
                "with the query in its mapping instead"
            )
        defaults = query_control.share_from_config(self._config, name)
        share = QueryShare(
            priority=defaults.priority if priority is None else priority,
            weight=defaults.weight if weight is None else weight,
            max_threads=defaults.max_threads if max_threads is None else max_threads,
        )
        if share.weight <= 0 or (share.max_threads is not None and share.max_threads < 1):
            raise ValueError("weight must be above 0 and max_threads at least 1")
        config = self._config
        startup_admin = StartupAdmin(config)
        startup_admin.wait_for_cluster()
        if config.topics_create_missing:
            create_user_topics(
                startup_admin.client,
                topology,
                config.topics_create_partitions,
                config.replication_factor,
            )
        layout = resolve_topics(
            startup_admin.client,
            composite,
            config.application_id,
            config.replication_factor,
            self._extra_outputs,
            extra_configs=self._extra_configs,
        )
        check_serdes_on_samples(config, Topology.of_subtopologies(added), layout)
        self._task_manager.set_query_share(name, share)
        self._named.add(name, topology, share)
        done = polling.query_changes.request(
            QueryChange("add", name, added, layout, topology=composite)
        )
        try:
            done.result(timeout=clamp_wait_s(timeout))
        except BaseException:
            self._named.remove(name)
            self._task_manager.forget_query(name)
            raise
        with self._lifecycle.lock:
            self.topology = composite
        self.apply_priorities()
        log.info("query_added", query=name, priority=share.priority, weight=share.weight)

    # --- remove, pause, resume --------------------------------------------------------

    def remove(self, name: str, reset: bool, timeout: float) -> None:
        """`App.remove_query` (see there)."""
        with self._change:
            self._remove(name, reset, timeout)

    def _remove(self, name: str, reset: bool, timeout: float) -> None:
        if name in self.isolated:
            self._lifecycle.require_active("remove_query()")
            self.isolated.remove(name, reset, clamp_wait_s(timeout))
            self._named.remove(name)
            log.info("query_removed", query=name, reset=reset, isolation="process")
            return
        polling = self._polling
        with self._lifecycle.lock:
            self.check_named("remove a query")
            if polling is None:
                raise IllegalStateError(
                    f"remove_query() needs a running app, it is {self._lifecycle.state}"
                )
            self._lifecycle.require_active("remove_query()")
            remaining = without_query(self.topology, name)
        removed = [s for s in self.topology.subtopologies if s.query == name]
        done = polling.query_changes.request(
            QueryChange("remove", name, removed, reset=reset, topology=remaining)
        )
        done.result(timeout=clamp_wait_s(timeout))
        with self._lifecycle.lock:
            self.topology = remaining
        self._named.remove(name)
        self._task_manager.forget_query(name)
        self.apply_priorities()
        log.info("query_removed", query=name, reset=reset)
        if reset:
            reset_query(self._config, name, removed, timeout=clamp_wait_s(timeout))

    def pause(self, name: str) -> None:
        """`App.pause_query` (see there)."""
        self._check_known(name)
        if name in self.isolated:
            self.isolated.pause(name)
        else:
            self._task_manager.pause_query(name)
        self._named.set_state(name, query_control.PAUSED)
        log.info("query_paused", query=name)

    def resume(self, name: str) -> None:
        """`App.resume_query` (see there)."""
        self._check_known(name)
        if name in self.isolated:
            self.isolated.resume(name, CHILD_START_TIMEOUT_S)
            log.info("query_resumed", query=name, state=self._named.state(name))
            return
        self._task_manager.resume_query(name)
        self._named.set_state(name, query_control.RUNNING)
        log.info("query_resumed", query=name)

    def check_named(self, what: str) -> None:
        """IllegalStateError unless the app runs named queries."""
        if not self._named.enabled:
            raise IllegalStateError(
                f"cannot {what}: this app runs one plain topology; start it with a mapping "
                "App({name: topology, ...}, config) to run named queries"
            )

    def _check_known(self, name: str) -> None:
        self.check_named("pause or resume a query")
        if name not in self._named.names():
            raise QueryError(f"no query {name!r} (queries: {', '.join(self._named.names())})")
