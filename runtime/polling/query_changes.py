"""Adding and removing a named query while the app runs (polling thread side).

`App.add_query` / `App.remove_query` run on the caller's thread: they check
the query, create its internal topics (`resolve_topics` over the new
composite topology) and hand a request here; the polling thread applies it at
its next loop turn (`QueryChanges.apply_requested`) and completes the
request's future:

- add: the query's subtopologies and topics join the live layout (the same
  dicts every helper reads, changed in place on this thread), then the
  consumer subscribes to the enlarged topic list. That is one rebalance; with
  cooperative-sticky assignment the other queries' partitions stay where they
  are, with the eager (range) assignor they are committed, revoked and
  assigned again from their committed offsets. Either way nothing is rewound
  past a commit.
- remove: every task is committed (rule 4), the query's tasks are closed, its
  topics leave the layout and the subscription (one rebalance again). Its
  records still in flight from the broker are dropped by the input buffers.

Standby placement (`TaskPlacement.add_subtopologies`) and partition
expansion (`PartitionExpansion.set_topology`) follow both changes: an added
query's stateful tasks get `num.standby.replicas` standbys like the others, a
removed query's standbys here are closed before anything is reset.

Polling thread only, except `request`, which any thread may call.
"""

from __future__ import annotations

import queue
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from confluent_kafka import KafkaException, TopicPartition

from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.topology.topology import Subtopology, Topology

if TYPE_CHECKING:
    from runtime.polling.polling_thread import PollingThread

log = get_logger("runtime.polling")


@dataclass
class QueryChange:
    """One add or remove request; `done` completes on the polling thread."""

    kind: str  # "add" | "remove" | "rewind" (only commit its input offsets back)
    query: str
    subtopologies: list[Subtopology]
    layout: TopicLayout | None = None  # add: the resolved layout of the new composite
    reset: bool = False  # remove: commit its input offsets back to the start
    topology: Topology | None = None  # the app's whole topology after the change
    done: Future[None] = field(default_factory=Future)


class QueryChanges:
    """Applies query changes between two loop turns. Polling thread only."""

    def __init__(self, polling: PollingThread) -> None:
        self._polling = polling
        self._requests: queue.SimpleQueue[QueryChange] = queue.SimpleQueue()

    def request(self, change: QueryChange) -> Future[None]:
        """Queue a change for the next loop turn (any thread)."""
        self._requests.put(change)
        return change.done

    def apply_requested(self) -> None:
        """Apply queued changes (once per loop turn)."""
        while True:
            try:
                change = self._requests.get_nowait()
            except queue.Empty:
                return
            if not change.done.set_running_or_notify_cancel():
                continue
            try:
                if change.kind == "add":
                    self._add(change)
                elif change.kind == "rewind":
                    # A process-isolated query's reset (runtime.isolation):
                    # not in this process's topology, but this group's older
                    # commits of its input would be carried into its child.
                    self._rewind_offsets(change)
                else:
                    self._remove(change)
            except BaseException as exc:
                change.done.set_exception(exc)
                raise
            change.done.set_result(None)

    def fail_pending(self, error: BaseException) -> None:
        """The polling thread stops: requests still queued fail."""
        while True:
            try:
                change = self._requests.get_nowait()
            except queue.Empty:
                return
            if change.done.set_running_or_notify_cancel():
                change.done.set_exception(error)

    def _add(self, change: QueryChange) -> None:
        polling = self._polling
        live = polling.layout
        new = change.layout
        assert new is not None
        for sub in change.subtopologies:
            live.sources[sub.id] = list(new.sources[sub.id])
            live.task_names[sub.id] = sub.task_name
            for topic in new.sources[sub.id]:
                live.subtopology_of[topic] = sub.id
        for topic, count in new.partitions.items():
            live.partitions.setdefault(topic, count)
        for topic, sub_id in new.changelogs.items():
            if sub_id in live.sources:
                live.changelogs[topic] = sub_id
        polling.tasks.add_subtopologies(change.subtopologies)
        polling.placement.add_subtopologies(change.subtopologies, live)
        if change.topology is not None:
            polling.expansion.set_topology(change.topology)
        polling.subscribe()
        log.info(
            "query_added",
            query=change.query,
            subtopologies=[s.id for s in change.subtopologies],
            topics=sorted(t for s in change.subtopologies for t in new.sources[s.id]),
        )

    def _remove(self, change: QueryChange) -> None:
        polling = self._polling
        ids = {s.id for s in change.subtopologies}
        doomed = sorted(t for t in polling.tasks.ids() if polling.tasks.subtopology_id(t) in ids)
        # One lock for the commit and the close, as a revocation does (rule 6):
        # nothing is processed between them.
        with polling.committer.tasks_locked(barrier=polling.tasks.processable()):
            polling.commit_locked("query removed")
            polling.tasks.close(doomed)
        live = polling.layout
        for topic in [t for t, sub_id in live.subtopology_of.items() if sub_id in ids]:
            del live.subtopology_of[topic]
        for topic in [t for t, sub_id in live.changelogs.items() if sub_id in ids]:
            del live.changelogs[topic]
        for sub_id in ids:
            live.sources.pop(sub_id, None)
            live.task_names.pop(sub_id, None)
        polling.tasks.remove_subtopologies(ids)
        polling.placement.remove_subtopologies(ids)
        if change.topology is not None:
            polling.expansion.set_topology(change.topology)
        if change.reset:
            self._rewind_offsets(change)
        polling.subscribe()
        log.info("query_removed", query=change.query, tasks_closed=sorted(doomed))

    def _rewind_offsets(self, change: QueryChange) -> None:
        """`remove_query(reset=True)`: commit the removed query's input
        partitions back to their earliest offsets, so adding it again starts
        from the beginning. The Python client has no OffsetDelete; a group
        member may commit any partition, assigned or not, and these are no
        longer processed here (still before the resubscription)."""
        consumer = self._polling.consumer
        topics = sorted(
            {s.name for sub in change.subtopologies for s in sub.sources if not s.internal}
        )
        if not topics:
            return
        try:
            metadata = consumer.list_topics(timeout=10)
            offsets = []
            for topic in topics:
                for partition in metadata.topics[topic].partitions:
                    low, _ = consumer.get_watermark_offsets(
                        TopicPartition(topic, partition), timeout=10
                    )
                    offsets.append(TopicPartition(topic, partition, max(low, 0)))
            consumer.commit(offsets=offsets, asynchronous=False)
            log.info("query_offsets_reset", query=change.query, topics=topics)
        except (KafkaException, KeyError) as exc:
            log.warning("query_offsets_not_reset", query=change.query, error=str(exc))
