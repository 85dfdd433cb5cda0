"""Live partition expansion: follow a partition increase of the app's topics.

Why: the input topics' partition count caps an application's parallelism,
and raising it used to mean a stop and a manual repartition of every
internal topic, because keys would move and lose their state. With a static
partitioner (`static.partitioner`, keys never move) the runtime follows an
expansion without a restart; without one it stops with an error that says
so instead of silently sending keys to other partitions.

How, once per loop turn of the polling thread (`tick`, cheap: no call
blocks on the network except once per accepted expansion):

1. Every `partition.check.interval.ms` a DescribeTopics request for every
   topic of the app, whose futures later turns look at.
2. A topic with more partitions than the runtime accepted: without a static
   partitioner, an input topic stops the app (`PartitionsChangedError`); an
   output topic keeps being written with its start-up count (logged once).
3. With one: `expansion_plan.plan_expansion` names the internal topics
   (repartition, changelogs) to grow; CreatePartitions runs level by level,
   downstream first, each level after the previous one completed. Other
   instances may do the same at the same time: a topic that already has the
   count is fine. Co-partitioned topics whose counts differ make it wait
   (`waiting_for`), checking again every interval.
4. When a new description shows nothing left to grow: the callback
   `on_partition_expansion(old, new)` runs on the one instance that creates
   the expansion's marker topic (a CreateTopics succeeds once per name
   cluster-wide; `expansion_marker` has the names, the `-done` topic written
   after it, and the re-run at start-up that makes it effectively once), the
   producer's metadata
   is refreshed (it refuses unknown partitions), the new counts are accepted
   (`TopicLayout.partitions`, which sinks read), and held partitions become
   tasks (`ActiveTasks.release_held`).

The new partitions themselves reach this instance through the normal
assignment: the consumer's metadata refresh (set to the same interval by
`clients.consumer_config`) sees them and the group rebalances; until the
runtime accepted the new count such partitions are held, not tasks.

Polling thread only; the figures (`expansions`, `waiting_for`) are read
racily by `App.status()`.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicCollection
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

from runtime.collector.output import OutputChannel
from runtime.config import StreamsConfig
from runtime.kafka.clients import admin_config
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.partitioning.expansion_marker import mark_done, marker_topic, run_callback
from runtime.partitioning.expansion_plan import plan_expansion
from runtime.polling.active_tasks import ActiveTasks
from runtime.topology.topology import Topology

log = get_logger("runtime.expansion")

_REQUEST_TIMEOUT_S = 30.0
# After CreatePartitions, look again soon (not a whole interval later).
_RECHECK_AFTER_CREATE_S = 0.1
_PRODUCER_METADATA_TIMEOUT_S = 5.0
# How often held partitions are looked at between expansions.
_RELEASE_CHECK_S = 1.0


class PartitionsChangedError(RuntimeError):
    """An input topic's partition count changed and the app cannot follow."""


def no_static_partitioner_message(changes: dict[str, tuple[int, int]]) -> str:
    listed = ", ".join(f"{t!r} {old} -> {new}" for t, (old, new) in sorted(changes.items()))
    return (
        f"input topic partition count changed while the app runs ({listed}). Without "
        "static.partitioner the app cannot follow: Kafka's default partitioner would send "
        "most keys to other partitions, and their state (counts, joins) would be split "
        "between tasks. The app stopped; the new partitions were not processed. Either set "
        "static.partitioner (keys never move, and the app follows expansions live; see "
        "the docs' 'Partition expansion' page), or repartition offline: stop every instance, "
        "reset the application (its internal topics, state directories and committed "
        "offsets) and start it again on the new partition count"
    )


class PartitionExpansion:
    """Detects partition increases and follows them. Polling thread only."""

    def __init__(
        self,
        config: StreamsConfig,
        topology: Topology,
        layout: TopicLayout,
        tasks: ActiveTasks,
        output: OutputChannel,
        admin_factory: Callable[[], AdminClient] | None = None,
    ) -> None:
        self._config = config
        self._topology = topology
        self._layout = layout
        self._tasks = tasks
        self._output = output
        self._static = config.static_partitioner
        app = config.application_id
        self._internal = {f"{app}-{t.name}" for t in topology.internal_topics()}
        self._admin_factory = admin_factory or (lambda: AdminClient(admin_config(config)))
        self._admin: AdminClient | None = None
        self._interval = config.partition_check_interval_ms / 1000.0
        self._next_check = time.monotonic() + self._interval
        self._describing: dict[str, Future[Any]] | None = None
        self._creating: dict[str, Future[Any]] | None = None
        self._levels: list[list[tuple[str, int]]] = []
        self._marker: tuple[Future[Any], list[tuple[str, int, int]]] | None = None
        self._pending_accept: dict[str, int] = {}
        self._markers_done: set[str] = set()
        self._next_release = 0.0
        self._ignored: dict[str, int] = {}
        self._last_wait_logged: str | None = None
        # Figures for status and metrics (read racily).
        self.expansions = 0
        self.waiting_for: str | None = None

    # --- the loop turn ------------------------------------------------------------

    def set_topology(self, topology: Topology) -> None:
        """A named query was added or removed: plan later expansions for the
        app's topology as it is now (its internal topics included)."""
        self._topology = topology
        app = self._config.application_id
        self._internal = {f"{app}-{t.name}" for t in topology.internal_topics()}

    def tick(self) -> None:
        """One cheap step (called every loop turn). Raises PartitionsChangedError."""
        self._tasks.pause_held()
        if self._tasks.held and time.monotonic() >= self._next_release:
            # Co-partitioned siblings may have arrived in a later assignment.
            self._next_release = time.monotonic() + _RELEASE_CHECK_S
            self._tasks.release_held()
        if self._creating is not None:
            self._check_created()
        elif self._marker is not None:
            self._check_marker()
        elif self._describing is not None:
            self._check_described()
        elif time.monotonic() >= self._next_check:
            self._describe()

    def _admin_client(self) -> AdminClient:
        if self._admin is None:
            self._admin = self._admin_factory()
        return self._admin

    def _describe(self) -> None:
        self._next_check = time.monotonic() + self._interval
        names = sorted(self._layout.partitions)
        try:
            self._describing = self._admin_client().describe_topics(
                TopicCollection(names), request_timeout=_REQUEST_TIMEOUT_S
            )
        except KafkaException as exc:
            log.debug("partition_check_failed", error=str(exc))

    def _check_described(self) -> None:
        futures = self._describing
        assert futures is not None
        self._admin_client().poll(0)  # serves the admin client's log lines
        if not all(f.done() for f in futures.values()):
            return
        self._describing = None
        observed: dict[str, int] = {}
        for name, future in futures.items():
            try:
                observed[name] = len(future.result().partitions)
            except KafkaException as exc:  # a topic gone or not readable: not ours to judge
                log.debug("partition_check_failed", topic=name, error=str(exc))
        self._on_counts(observed)

    # --- deciding -------------------------------------------------------------------

    def _on_counts(self, observed: dict[str, int]) -> None:
        accepted = self._layout.partitions
        if set(accepted) - set(observed):
            return  # a topic not described this time: judge on a full picture
        grown = {t: n for t, n in observed.items() if n > accepted[t]}
        if self._static is None:
            self._without_static_partitioner(grown)
            return
        current = {t: n for t, n in observed.items() if t in accepted}
        plan = plan_expansion(self._topology, self._config.application_id, current)
        if plan.mismatches:
            self._wait("; ".join(plan.mismatches) + "; waiting until they match")
            return
        if not plan.empty:
            self._levels = list(plan.levels)
            growing = ", ".join(sorted(plan.growing()))
            self._wait(f"expanding internal topics: {growing}", "info")
            self._create_next_level()
            return
        if grown:
            self._start_accepting(grown)
        else:
            self._wait(None)

    def _without_static_partitioner(self, grown: dict[str, int]) -> None:
        accepted = self._layout.partitions
        inputs = {t: (accepted[t], n) for t, n in grown.items() if t in self._layout.subtopology_of}
        if inputs:
            raise PartitionsChangedError(no_static_partitioner_message(inputs))
        for topic, count in grown.items():
            if self._ignored.get(topic) != count:
                self._ignored[topic] = count
                log.warning(
                    "partition_increase_ignored",
                    topic=topic,
                    partitions=count,
                    writing_with=accepted[topic],
                    reason="no static.partitioner: keys keep the partitions of the start-up count",
                )

    def _wait(self, reason: str | None, level: str = "warning") -> None:
        self.waiting_for = reason
        if reason != self._last_wait_logged:
            self._last_wait_logged = reason
            if reason is not None:
                getattr(log, level)("partition_expansion_waiting", reason=reason)

    # --- growing internal topics ------------------------------------------------------

    def _create_next_level(self) -> None:
        level = self._levels.pop(0)
        log.info("internal_topics_expanding", topics={t: n for t, n in level})
        try:
            self._creating = self._admin_client().create_partitions(
                [NewPartitions(t, n) for t, n in level],
                operation_timeout=_REQUEST_TIMEOUT_S,
                request_timeout=_REQUEST_TIMEOUT_S,
            )
        except KafkaException as exc:
            self._give_up(f"cannot expand {[t for t, _ in level]}: {exc}")

    def _check_created(self) -> None:
        futures = self._creating
        assert futures is not None
        self._admin_client().poll(0)
        if not all(f.done() for f in futures.values()):
            return
        self._creating = None
        for topic, future in futures.items():
            try:
                future.result()
                log.info("topic_expanded", topic=topic)
            except KafkaException as exc:
                if exc.args[0].code() != KafkaError.INVALID_PARTITIONS:
                    self._give_up(f"cannot expand {topic!r}: {exc}")
                    return
                # Another instance was first, or the topic has more already:
                # the next description tells.
        if self._levels:
            self._create_next_level()
        else:
            self._next_check = time.monotonic() + _RECHECK_AFTER_CREATE_S

    def _give_up(self, reason: str) -> None:
        """Leave it to the next check (a later interval may succeed)."""
        self._levels = []
        self._creating = None
        log.error("partition_expansion_failed", reason=reason)
        self._wait(reason + "; trying again")

    # --- accepting ---------------------------------------------------------------------

    def _start_accepting(self, grown: dict[str, int]) -> None:
        """Once the producer sees the new partitions: the once-only callback
        if there is one, then accept."""
        if not self._producer_sees(grown):
            self._next_check = time.monotonic() + _RECHECK_AFTER_CREATE_S
            return
        changes = self._input_changes(grown)
        hook = getattr(self._static, "on_partition_expansion", None)
        self._pending_accept = grown
        name = marker_topic(self._config.application_id, changes)
        if not changes or hook is None or name in self._markers_done:
            self._accept(grown)
            return
        try:
            futures = self._admin_client().create_topics(
                [NewTopic(name, 1, self._config.replication_factor)],
                operation_timeout=_REQUEST_TIMEOUT_S,
                request_timeout=_REQUEST_TIMEOUT_S,
            )
            self._marker = (futures[name], changes)
        except KafkaException as exc:
            self._give_up(f"cannot create the expansion marker {name!r}: {exc}")

    def _input_changes(self, grown: dict[str, int]) -> list[tuple[str, int, int]]:
        """(topic, old, new) of the user's input topics among `grown`: what
        makes an expansion (internal topics follow them)."""
        accepted = self._layout.partitions
        return sorted(
            (t, accepted[t], n)
            for t, n in grown.items()
            if t in self._layout.subtopology_of and t not in self._internal
        )

    def _check_marker(self) -> None:
        assert self._marker is not None
        future, changes = self._marker
        self._admin_client().poll(0)
        if not future.done():
            return
        self._marker = None
        self._markers_done.add(marker_topic(self._config.application_id, changes))
        try:
            future.result()
        except KafkaException as exc:
            if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
                self._markers_done.discard(marker_topic(self._config.application_id, changes))
                self._give_up(f"cannot create the expansion marker: {exc}")
                return
            log.info("partition_expansion_callback_elsewhere", changes=changes)
        else:
            self._run_callback(changes)
        self._accept(self._pending_accept)

    def _run_callback(self, changes: list[tuple[str, int, int]]) -> None:
        """This instance won the marker: run the callback, then record it
        done (`expansion_marker`: a callback that raised is run again at
        the next start-up of an instance)."""
        pairs = [(old, new) for _, old, new in changes]
        if run_callback(self._static.on_partition_expansion, pairs):
            name = marker_topic(self._config.application_id, changes)
            mark_done(self._admin_client(), name, self._config.replication_factor)

    def _producer_sees(self, grown: dict[str, int]) -> bool:
        """Refresh the producer's metadata of `grown` (it refuses a partition
        it has not seen); False while it lags behind the cluster."""
        producer = self._output.producer
        for topic, count in grown.items():
            try:
                known = producer.list_topics(topic, timeout=_PRODUCER_METADATA_TIMEOUT_S)
                seen = len(known.topics[topic].partitions)
            except (KafkaException, KeyError) as exc:
                seen = -1
                log.debug("producer_metadata_failed", topic=topic, error=str(exc))
            if seen < count:
                log.debug("producer_metadata_behind", topic=topic, seen=seen, count=count)
                return False
        return True

    def _accept(self, grown: dict[str, int]) -> None:
        """New counts in force (sinks read them), then held partitions become tasks."""
        accepted = self._layout.partitions
        old = {t: accepted[t] for t in grown}
        if self._input_changes(grown):
            self.expansions += 1
        accepted.update(grown)
        # Nothing is waited for once the counts are accepted: cleared before
        # the held partitions become tasks, so that a status read meanwhile
        # (another thread, racily) never shows the new tasks still waiting.
        self._wait(None)
        created = self._tasks.release_held()
        log.info(
            "partition_expansion_accepted",
            topics={t: f"{old[t]} -> {n}" for t, n in sorted(grown.items())},
            tasks_created=created,
            held=len(self._tasks.held),
        )
