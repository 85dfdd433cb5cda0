"""Where tasks live besides the group's assignment: status and standbys.

Every instance publishes its status (its active tasks and standbys) on the
compacted `<application.id>-status` topic, which every instance's restoration
thread reads. From those statuses each instance decides by itself which
standbys it keeps (rendezvous hashing, `runtime.placement.records`), and the
restoration thread keeps them warm. The same topic carries
SHUTDOWN_APPLICATION requests to every instance. Runtime-owned placement
(`task.assignment=runtime`, `runtime.placement.runtime_assignment`) adds its
fields to the status and its learners to the standbys kept here.

Used by the polling thread only (it owns the producer that publishes).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from typing import Any

from runtime.collector.output import OutputChannel
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.placement.records import (
    SHUTDOWN_REQUEST_KEY,
    InstanceStatus,
    ShutdownRequest,
    live_instances,
    standbys_for,
    status_topic_name,
)
from runtime.placement.status_view import StatusTopicView
from runtime.processing.task_settings import TaskSettings, task_id_of
from runtime.state.builders import task_directory
from runtime.state.restoration import RestorationThread
from runtime.state.standby import StandbyTask
from runtime.state.task_lock import TaskDirectoryLocked, directory_claimed
from runtime.topology.topology import Subtopology, Topology

log = get_logger("runtime.placement")

# An instance whose status is older than this is taken for gone.
_INSTANCE_TIMEOUT_MS = 10_000
# How long a new active task waits for its standby's stores to close.
_STANDBY_RELEASE_S = 30.0


class TaskPlacement:
    """Status publishing, standby placement and shutdown requests. Polling thread only."""

    def __init__(
        self,
        application_id: str,
        instance_id: str,
        num_standby_replicas: int,
        topology: Topology,
        layout: TopicLayout,
        settings: TaskSettings,
        restoration: RestorationThread,
        output: OutputChannel,
        active_ids: Callable[[], frozenset[str]],
        status_view: StatusTopicView | None = None,
        daemon: str = "",
    ) -> None:
        """`daemon`: the supervisor's id under `processes` > 1 (`process.daemon`),
        published so that no standby is placed on the active's daemon."""
        self.instance_id = instance_id
        self._daemon = daemon
        # What placement keeps copies apart by, and moves between without a
        # learner: the daemon's id, or this instance's own.
        self.machine = daemon or instance_id
        self.status_topic = status_topic_name(application_id)
        self._application_id = application_id
        self._replicas = num_standby_replicas
        self._settings = settings
        self._restoration = restoration
        self._output = output
        self._active_ids = active_ids
        # The status topic as read by the restoration thread (one snapshot a decision).
        self._status_view = status_view or StatusTopicView()
        self._standbys: dict[str, StandbyTask] = {}
        self._removals: dict[str, Future[bool]] = {}
        # Shutdown requests older than this instance are history.
        self._started_ms = int(time.time() * 1000)
        # Subtopologies with changelogged persistent stores: their tasks are
        # the ones worth a standby (`_stateful`, from the counts in force).
        self._layout = layout
        self._stateful_subtopologies = [
            sub for sub in topology.subtopologies if _has_changelogged_store(sub)
        ]
        # The counts `_stateful_tasks` was computed for; None: compute again.
        self._stateful_for: dict[int, int] | None = None
        self._stateful_tasks: dict[str, tuple[Subtopology, int]] = {}

    def add_subtopologies(self, subtopologies: Iterable[Subtopology], layout: TopicLayout) -> None:
        """A named query added at runtime: its stateful tasks get standbys as
        the others do, from the next `reconcile_standbys` on."""
        self._layout = layout
        self._stateful_subtopologies.extend(s for s in subtopologies if _has_changelogged_store(s))
        self._stateful_for = None

    def remove_subtopologies(self, ids: set[int]) -> None:
        """A named query removed: its tasks need no standby any more. The ones
        kept here are closed now (waited for), before a reset deletes state."""
        doomed = [t for t, (sub, _) in self._stateful_tasks.items() if sub.id in ids]
        self._stateful_subtopologies = [s for s in self._stateful_subtopologies if s.id not in ids]
        self._stateful_for = None
        self.release_standbys(doomed)

    def standby_ids(self) -> frozenset[str]:
        return frozenset(self._standbys)

    def publish_status(self, gone: bool = False, **placement: Any) -> None:
        """Tell the other instances which tasks run here (a tombstone when gone).

        `placement` adds the fields runtime-owned placement reads
        (`InstanceStatus.member_id`, `capacity`, `lags`, `plan_version`, `leaving`).
        """
        value = None
        if not gone:
            value = InstanceStatus(
                self.instance_id,
                self._active_ids(),
                frozenset(self._standbys),
                int(time.time() * 1000),
                **placement,
                daemon=self._daemon,
            ).encode()
        self._output.produce_one(self.status_topic, self.instance_id.encode(), value)

    @property
    def stateful_tasks(self) -> frozenset[str]:
        """Ids of the tasks with changelogged persistent stores."""
        return frozenset(self._stateful)

    @property
    def _stateful(self) -> dict[str, tuple[Subtopology, int]]:
        """Stateful task id -> (subtopology, partition), for the partition
        counts in force: an accepted partition expansion adds tasks
        (`PartitionExpansion._accept` grows `TopicLayout.partitions`)."""
        counts = {
            sub.id: self._layout.task_partitions(sub.id)
            for sub in self._stateful_subtopologies
            if sub.id in self._layout.sources  # a removed query's are gone
        }
        if counts != self._stateful_for:
            self._stateful_for = counts
            self._stateful_tasks = {
                task_id_of(sub.task_name, p): (sub, p)
                for sub in self._stateful_subtopologies
                if sub.id in counts
                for p in range(counts[sub.id])
            }
        return self._stateful_tasks

    def reconcile_standbys(self, learners: frozenset[str] = frozenset()) -> None:
        """Move the standbys kept here toward what placement says, plus
        `learners` (runtime-owned placement: copies to take over later)."""
        live = live_instances(
            dict(self._status_view.snapshot.statuses), timeout_ms=_INSTANCE_TIMEOUT_MS
        )
        active = self._active_ids()
        live[self.instance_id] = InstanceStatus(
            self.instance_id, active, timestamp_ms=int(time.time() * 1000), daemon=self._daemon
        )
        wanted = standbys_for(self.instance_id, self._stateful, live, self._replicas)
        learning = learners & set(self._stateful)
        # An active task of another process of this daemon waiting for the
        # directory claims it (runtime.state.task_lock): the group's assignor
        # knows nothing of standbys and may give a task to a sibling of the
        # process that keeps its standby. Hand the directory over (its
        # checkpoint included: the new owner restores only the tail).
        wanted = {t for t in wanted if not self._claimed(t)}
        wanted = (wanted | learning) - active
        for task_id in sorted(set(self._standbys) - wanted):
            self._standbys.pop(task_id)
            self._removals[task_id] = self._restoration.remove_standby(task_id)
        for task_id in sorted(wanted - set(self._standbys)):
            self._wait_removed(task_id)
            sub, partition = self._stateful[task_id]
            try:
                standby = StandbyTask(
                    task_id,
                    partition,
                    sub.store_specs,
                    self._settings.state_dir,
                    self._application_id,
                    changelog_prefix=sub.topic_prefix(self._application_id),
                    rocksdb_memory=self._settings.rocksdb_memory,
                    consolidated=self._settings.consolidated,
                    wait_for_lock=task_id in learning,
                )
            except TaskDirectoryLocked:
                # Another process of this daemon holds the directory (the
                # active owner, or a closing one): placement's view of it is
                # not current yet. Tried again at the next reconcile.
                log.debug("standby_directory_busy", task=task_id)
                continue
            self._standbys[task_id] = standby
            self._restoration.add_standby(standby)

    def release_claimed_standbys(self) -> None:
        """Give up the standbys whose directory an active task of another
        process of this daemon waits for (not waited for: the restoration
        thread closes them). Called while this thread itself waits for a
        directory (`TaskSettings.while_directory_waits`)."""
        for task_id in [t for t in self._standbys if self._claimed(t)]:
            log.info("standby_directory_claimed", task=task_id)
            self._standbys.pop(task_id)
            self._removals[task_id] = self._restoration.remove_standby(task_id)

    def _claimed(self, task_id: str) -> bool:
        return directory_claimed(
            task_directory(self._settings.state_dir, self._application_id, task_id)
        )

    def release_standby(self, task_id: str) -> None:
        """Before a task becomes active here: close its standby (same stores)."""
        if task_id in self._standbys:
            self._standbys.pop(task_id)
            self._removals[task_id] = self._restoration.remove_standby(task_id)
        self._wait_removed(task_id)

    def release_standbys(self, task_ids: list[str]) -> None:
        """`release_standby` for several tasks at once: every removal is asked
        for first, then waited for (a hand-over takes tasks in one go)."""
        for task_id in task_ids:
            if task_id in self._standbys:
                self._standbys.pop(task_id)
                self._removals[task_id] = self._restoration.remove_standby(task_id)
        for task_id in task_ids:
            self._wait_removed(task_id)

    def _wait_removed(self, task_id: str) -> None:
        future = self._removals.pop(task_id, None)
        if future is not None:
            future.result(timeout=_STANDBY_RELEASE_S)

    # --- SHUTDOWN_APPLICATION -------------------------------------------------------

    def request_application_shutdown(self, reason: str) -> None:
        """Ask every instance (this one included) to stop.

        Under exactly-once the open transaction holds the failed batch's
        output: it is aborted first, and the request goes in a transaction of
        its own.
        """
        request = ShutdownRequest(self.instance_id, reason, int(time.time() * 1000))
        transactions = self._output.transactions
        if transactions is not None:
            transactions.abort()
        self._output.produce_one(self.status_topic, SHUTDOWN_REQUEST_KEY, request.encode())
        if transactions is not None:
            transactions.commit([], None)
        else:
            self._output.producer.flush(10)
        log.warning("application_shutdown_requested", reason=reason)

    def shutdown_request(self) -> ShutdownRequest | None:
        """A SHUTDOWN_APPLICATION request made since this instance started, if any."""
        request = self._status_view.snapshot.shutdown_request
        if request is not None and request.timestamp_ms >= self._started_ms:
            return request
        return None


def _has_changelogged_store(sub: Subtopology) -> bool:
    """Whether a subtopology's tasks have a changelogged persistent store (worth a standby)."""
    return any(spec.changelog and spec.kind != "memory" for spec in sub.store_specs)
