"""The active tasks of this instance: create, hand to restoration, close, rewind.

A task is created when one of its partitions is assigned. A task with
changelogged stores goes to the restoration thread first and reaches the task
manager when restored (`take_restored`); a stateless one goes to the task
manager at once. At any moment a task is in the task manager or with the
restoration thread, never both (see docs/architecture.md). Closing removes it
from both, unregisters its input buffers and hands output made during close to
the output channel, or drops it when it belongs to an aborted transaction.
Rewinding closes a task and starts it again from the group's committed
offsets, so a failed batch is processed again and never committed.

Which partitions are assigned is decided elsewhere (the group's assignor
through the rebalance callbacks today); this class only turns "these
partitions are mine / no longer mine" into task events.

An assigned partition is *held* (no task, paused, its records dropped) while
it cannot become a task safely: its number is beyond the partition count the
runtime accepted for its topic (a partition expansion not yet followed, see
`runtime.polling.expansion`), or its subtopology joins co-partitioned topics
and the same-numbered partition of another of them is not assigned here.
`release_held` turns held partitions into tasks, from their committed
offsets, once that changed.

A rewound partition waits, paused and without a task, while the group's
committed offsets cannot be read (`seek_unsought`, retried every loop turn):
after a broker outage librdkafka may first need the loop to serve a lost
assignment before it answers an offset lookup, so asking in a blocking retry
loop never ends (seen: four 30 s timeouts in a row, then the app failed).

Used by the polling thread only; `close`, `rewind` and `rewind_all` need every
task locked (`Committer.tasks_locked`).
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, TopicPartition

from runtime.collector.output import OutputChannel
from runtime.kafka.broker_health import Retrying
from runtime.kafka.clients import committed_offsets, lookup_retriable
from runtime.kafka.topics import TopicLayout
from runtime.logging import get_logger
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.key_parallel import make_task
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.topology.topology import Subtopology, Topology

log = get_logger("runtime.tasks")

# How long closing a restoring task waits for the restoration thread to let go
# of its stores.
_RESTORATION_RELEASE_S = 30.0

# One attempt to read a rewound partition's committed offset: the polling
# loop goes on (serving the group) between attempts.
_COMMITTED_LOOKUP_S = 10.0


class TaskRunner(Protocol):
    """Where processable tasks go: the task manager (or a baseline's own loop)."""

    def add_task(self, task: StreamTask) -> None: ...

    def remove_task(self, task_id: str) -> object: ...


class Restorer(Protocol):
    """Where tasks with changelogs wait until restored: the restoration thread."""

    def add_task(self, task: StreamTask) -> None: ...

    def remove_task(self, task_id: str) -> Future[bool]: ...

    def drain_restored(self) -> list[StreamTask]: ...


class ActiveTasks:
    """The tasks this instance runs, from creation to close. Polling thread only."""

    def __init__(
        self,
        topology: Topology,
        layout: TopicLayout,
        settings: TaskSettings,
        buffers: InputBuffers,
        task_manager: TaskRunner,
        restoration: Restorer,
        output: OutputChannel,
        consumer: Consumer,
        release_standby: Callable[[str], None],
        retrying: Retrying | None = None,
    ) -> None:
        self._subtopologies = {s.id: s for s in topology.subtopologies}
        self._layout = layout
        self._settings = settings
        self._buffers = buffers
        self._task_manager = task_manager
        self._restoration = restoration
        self._output = output
        self._consumer = consumer
        self._release_standby = release_standby
        self._retrying = retrying  # noted while a rewind's committed offsets are retried
        self._tasks: dict[str, StreamTask] = {}
        # With the restoration thread, not yet in the task manager.
        self._restoring: set[str] = set()
        # Counts of tasks closed here, so totals survive rebalances.
        self.closed_totals = {"processed": 0, "skipped": 0, "dead_lettered": 0}
        # Assigned partitions that are not tasks (yet), and those of them
        # still to pause (they are assigned only after the callback returns).
        self.held: set[tuple[str, int]] = set()
        self._to_pause: set[tuple[str, int]] = set()
        # Rewound partitions waiting for their committed offsets (paused, no task).
        self.unsought: list[TopicPartition] = []
        # Tasks created for partition numbers the app did not have at start-up,
        # each counted once: a rebalance or an aborted transaction closes and
        # re-creates a task, which is not another task created by an expansion.
        self._expansion_tasks: set[str] = set()
        self._initial_tasks = {sub: layout.task_partitions(sub) for sub in layout.sources}

    # --- views ------------------------------------------------------------------

    @property
    def created_by_expansion(self) -> int:
        """Distinct tasks created for partitions added since start-up."""
        return len(self._expansion_tasks)

    def ids(self) -> frozenset[str]:
        return frozenset(self._tasks)

    def get(self, task_id: str) -> StreamTask | None:
        return self._tasks.get(task_id)

    def __bool__(self) -> bool:
        return bool(self._tasks)

    @property
    def any_restoring(self) -> bool:
        return bool(self._restoring)

    def processable(self) -> list[StreamTask]:
        """Tasks that process (not restoring): the ones a commit covers."""
        return [t for t in self._tasks.values() if t.id not in self._restoring]

    def restoring(self) -> list[StreamTask]:
        return [self._tasks[t] for t in sorted(self._restoring) if t in self._tasks]

    def commit_requested(self) -> bool:
        return any(t.commit_requested for t in self._tasks.values())

    def of(self, partitions: list[TopicPartition]) -> list[str]:
        """Ids of the tasks here that read any of `partitions`."""
        ids = set()
        for tp in partitions:
            sub = self._layout.subtopology_of.get(tp.topic)
            if sub is not None:
                task_id = self._layout.task_id(sub, tp.partition)
                if task_id in self._tasks:
                    ids.add(task_id)
        return sorted(ids)

    def assigned_partitions(self, task_ids: list[str]) -> list[TopicPartition]:
        """The input partitions of `task_ids` that are assigned here."""
        return [
            TopicPartition(topic, self._tasks[t].partition)
            for t in task_ids
            for topic in self._tasks[t].queues
            if (topic, self._tasks[t].partition) in self._buffers
        ]

    def subtopology_id(self, task_id: str) -> int | None:
        """The subtopology of a task here, or None."""
        task = self._tasks.get(task_id)
        return task.subtopology.id if task is not None else None

    # --- named queries added or removed at runtime (runtime.polling.query_changes) --

    def add_subtopologies(self, subtopologies: list[Subtopology]) -> None:
        """Make tasks of these subtopologies when their partitions are assigned
        (the layout already holds their topics)."""
        for sub in subtopologies:
            self._subtopologies[sub.id] = sub
            self._initial_tasks[sub.id] = self._layout.task_partitions(sub.id)

    def remove_subtopologies(self, ids: set[int]) -> None:
        """Forget subtopologies whose tasks were closed (a removed query)."""
        for sub_id in ids:
            self._subtopologies.pop(sub_id, None)
            self._initial_tasks.pop(sub_id, None)
        self.held = {(t, p) for t, p in self.held if t in self._layout.subtopology_of}
        self._to_pause &= self.held

    # --- lifecycle ----------------------------------------------------------------

    def create(self, partitions: list[TopicPartition]) -> int:
        """Create the tasks of newly assigned partitions; how many were new.

        Partitions that cannot be tasks yet are held instead (module docstring).
        """
        created = 0
        registered: list[TopicPartition] = []
        if self.unsought:  # assigned anew: they start from the commit anyway
            new = {(tp.topic, tp.partition) for tp in partitions}
            self.unsought = [tp for tp in self.unsought if (tp.topic, tp.partition) not in new]
        for tp in self._hold_back(partitions):
            sub_id = self._layout.subtopology_of.get(tp.topic)
            if sub_id is None:
                continue
            task_id = self._layout.task_id(sub_id, tp.partition)
            task = self._tasks.get(task_id)
            if task is None:
                # A standby of this task shares its stores: it goes first.
                self._release_standby(task_id)
                topics = [
                    t
                    for t in self._layout.sources[sub_id]
                    if tp.partition < self._layout.partitions[t]
                ]
                task = make_task(self._subtopologies[sub_id], tp.partition, topics, self._settings)
                self._tasks[task_id] = task
                created += 1
                if tp.partition >= self._initial_tasks.get(sub_id, 0):
                    self._expansion_tasks.add(task_id)
                if task.changelog_partitions:
                    self._restoring.add(task_id)
                    self._restoration.add_task(task)
                    log.info("task_created", task_id=task_id, restoring=True)
                else:
                    self._task_manager.add_task(task)
                    log.info("task_created", task_id=task_id)
            self._buffers.register(task.queues[tp.topic])
            registered.append(TopicPartition(tp.topic, tp.partition))
        if registered:
            # A new input queue starts unpaused, so its partition must fetch:
            # librdkafka keeps an application pause across unassign and assign
            # (a partition paused for a full buffer or held, then revoked or
            # lost, comes back paused). Resume works before the assignment
            # takes effect too (the group's callbacks assign after they return).
            self._resume(registered)
        return created

    def _hold_back(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """`partitions` that can become tasks now; the others join `held`."""
        layout = self._layout
        if self.held:  # forget held partitions revoked since
            assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
            self.held &= assigned
            self._to_pause &= assigned
        new = {(tp.topic, tp.partition) for tp in partitions}
        present = new | self.held | set(self._buffers.partitions())
        ready = []
        for tp in partitions:
            sub_id = layout.subtopology_of.get(tp.topic)
            if sub_id is not None and not self._can_be_task(sub_id, tp, present):
                self.held.add((tp.topic, tp.partition))
                self._to_pause.add((tp.topic, tp.partition))
                log.info("partition_held", topic=tp.topic, partition=tp.partition)
            else:
                ready.append(tp)
        return ready

    def _can_be_task(self, sub_id: int, tp: TopicPartition, present: set[tuple[str, int]]) -> bool:
        counts = self._layout.partitions
        if tp.partition >= counts[tp.topic]:
            return False  # an expansion the runtime has not followed (yet)
        siblings = self._layout.sources[sub_id]
        return all((t, tp.partition) in present for t in siblings if tp.partition < counts[t])

    def pause_held(self) -> None:
        """Pause held partitions assigned since the last call (loop turn)."""
        if self._to_pause:
            assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
            to_pause = [TopicPartition(t, p) for t, p in sorted(self._to_pause & assigned)]
            self._to_pause.clear()
            if to_pause:
                self._consumer.pause(to_pause)

    def release_held(self) -> int:
        """Create the tasks of held partitions that can be tasks now (after an
        accepted expansion, or once co-partitioned siblings are assigned here);
        they start from their committed offsets. Returns how many were created."""
        if not self.held:
            return 0
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        self.held &= assigned
        self._to_pause &= assigned
        present = self.held | set(self._buffers.partitions())
        ready = [
            TopicPartition(t, p)
            for t, p in sorted(self.held)
            if self._can_be_task(self._layout.subtopology_of[t], TopicPartition(t, p), present)
        ]
        if not ready:
            return 0
        self.held -= {(tp.topic, tp.partition) for tp in ready}
        self._to_pause -= {(tp.topic, tp.partition) for tp in ready}
        # Records fetched while held were dropped: start again from the commit.
        return self._restart_from_committed(ready)

    def take_restored(self) -> None:
        """Give the tasks the restoration thread finished to the task manager."""
        for task in self._restoration.drain_restored():
            if task.id in self._restoring and not task.closed:
                self._restoring.discard(task.id)
                self._task_manager.add_task(task)
                log.info("task_running", task_id=task.id, restored=task.restored_records)

    def close(self, task_ids: list[str], discard_output: bool = False) -> None:
        """Remove and close tasks (clean: the caller committed them first;
        or not: a rewind, partitions lost).

        Output made during close goes to the output channel, unless it
        belongs to an aborted transaction (`discard_output`).
        """
        for task_id in task_ids:
            task = self._tasks.pop(task_id)
            restoring = task_id in self._restoring  # the restoration thread checkpoints those
            self._let_go(task)
            if not restoring:
                self._checkpoint_committed(task)
            try:
                task.close()
            except Exception as exc:  # a user close() failing must not stop the rebalance
                log.warning("task_close_failed", task_id=task_id, error=str(exc))
            output = task.take_output()
            if output and not discard_output:
                self._output.hand_over(output)
            self._retire_counts(task)
            log.info("task_closed", task_id=task_id)

    def close_all_dirty(self) -> None:
        """Close every task without committing (after a fatal error).

        A processing thread that did not stop in time still holds its task,
        which is then left to it.
        """
        for task_id in list(self._tasks):
            task = self._tasks.pop(task_id)
            self._retire_counts(task)
            try:
                self._let_go(task)
                task.close()
            except Exception as exc:
                log.warning("task_close_failed", task_id=task_id, error=str(exc))
        paused = self._buffers.clear() + sorted(self.held)
        self.held.clear()
        self._to_pause.clear()
        self._resume([TopicPartition(t, p) for t, p in paused])

    def rewind(self, task_id: str) -> bool:
        """Close a task and start it again from its committed offsets.

        Its failed batch is fetched and processed again (output it already
        produced may repeat: at-least-once). False if the task is gone.
        """
        task = self._tasks.get(task_id)
        if task is None:
            return False
        partitions = self.assigned_partitions([task_id])
        self.close([task_id])
        self._restart_from_committed(partitions)
        log.info("task_rewound", task_id=task_id)
        return True

    def rewind_all(self) -> list[str]:
        """After an aborted transaction: every processing task starts again
        from the committed offsets; its uncommitted output and state writes
        are dropped. Returns the rewound task ids."""
        task_ids = [t for t in self._tasks if t not in self._restoring]
        partitions = self.assigned_partitions(task_ids)
        self.close(task_ids, discard_output=True)
        self._restart_from_committed(partitions)
        return task_ids

    def seek_unsought(self) -> bool:
        """Seek rewound partitions to their committed offsets and make their
        tasks again; True once none waits. A lookup that times out (or meets
        another retriable error) leaves them paused for the next loop turn,
        logged and shown in status as a retried call; any other error raises.
        Partitions revoked or lost meanwhile are forgotten."""
        return self._seek_unsought() is not None

    def _seek_unsought(self) -> int | None:
        """`seek_unsought`: the tasks it created, None while they wait."""
        if not self.unsought:
            return 0
        assigned = {(tp.topic, tp.partition) for tp in self._consumer.assignment()}
        partitions = [tp for tp in self.unsought if (tp.topic, tp.partition) in assigned]
        self.unsought = []
        if not partitions:
            return 0
        try:
            committed = committed_offsets(
                self._consumer, partitions, timeout_s=_COMMITTED_LOOKUP_S, budget_s=0.0
            )
        except KafkaException as exc:
            error: KafkaError = exc.args[0]
            if not lookup_retriable(error):
                raise
            self.unsought = partitions
            log.warning(
                "rewind_waits_for_committed_offsets",
                partitions=[f"{tp.topic}-{tp.partition}" for tp in partitions],
                error=error.str(),
                action="paused; asked again next loop turn",
            )
            if self._retrying is not None:
                self._retrying.note("committed_offsets")
            return None
        if self._retrying is not None:
            self._retrying.clear()
        for tp in committed:
            # No committed offset yet: start where auto.offset.reset says.
            offset = tp.offset if tp.offset >= 0 else OFFSET_BEGINNING
            self._consumer.seek(TopicPartition(tp.topic, tp.partition, offset))
        # Where each partition starts again: what a reader of a rewind (an
        # abort, a fenced producer) needs to tell replayed input from new.
        log.info(
            "rewound_to_committed",
            offsets={f"{tp.topic}-{tp.partition}": tp.offset for tp in committed},
        )
        return self.create(partitions)  # resumes them

    # --- helpers ------------------------------------------------------------------

    def _let_go(self, task: StreamTask) -> None:
        """Take a task out of the restoration thread, the task manager and the buffers."""
        if task.id in self._restoring:
            self._restoring.discard(task.id)
            # The restoration thread must let go of the stores first.
            self._restoration.remove_task(task.id).result(timeout=_RESTORATION_RELEASE_S)
        self._task_manager.remove_task(task.id)
        # The consumer's pause state follows the buffers': a partition paused
        # for its full queue is resumed as the queue goes, whether it stays
        # assigned (a rewind), is revoked or was lost (InputBuffers.unregister).
        paused = [
            TopicPartition(topic, task.partition)
            for topic in task.queues
            if self._buffers.unregister(topic, task.partition)
        ]
        self._resume(paused)

    def _resume(self, partitions: list[TopicPartition]) -> None:
        """Resume partitions in the consumer, if it is still open: tasks are
        also let go after the consumer closed (`close_all_dirty` at shutdown),
        when nothing fetches any more."""
        if not partitions or self._consumer is None:
            return
        try:
            self._consumer.resume(partitions)
        except (RuntimeError, KafkaException) as exc:  # a closed consumer
            log.debug("resume_skipped", error=str(exc))

    def _checkpoint_committed(self, task: StreamTask) -> None:
        """Before a task closes: its checkpoint names the positions of its last
        commit, which is what its stores hold (writes since then were never
        applied). A clean close committed with a checkpoint just before, so
        this writes nothing then; a rewind or a lost partition did not, and
        the checkpoint could be up to 10,000 records old
        (`runtime.state.checkpoint`): the task made again replayed all of
        that, and if it moved before it had, its next owner replayed it too
        (seen: a rewind after a commit refused for the group's new
        generation, then the move to a new process, restored a changelog from
        its start). A failed write only makes that replay longer."""
        try:
            task.write_checkpoint()
        except Exception as exc:  # noqa: BLE001 - the restore is longer, nothing is lost
            log.warning("checkpoint_at_close_failed", task_id=task.id, error=str(exc))

    def _restart_from_committed(self, partitions: list[TopicPartition]) -> int:
        """Tasks for `partitions` again, from the group's committed offsets
        (now, or from a later loop turn: `seek_unsought`). Paused meanwhile,
        so that nothing past the commit is fetched before the seek. Returns
        the tasks created now."""
        if not partitions:
            return 0
        self._consumer.pause(partitions)
        known = {(tp.topic, tp.partition) for tp in self.unsought}
        self.unsought += [tp for tp in partitions if (tp.topic, tp.partition) not in known]
        return self._seek_unsought() or 0

    def _retire_counts(self, task: StreamTask) -> None:
        totals = self.closed_totals
        totals["processed"] += task.processed_count
        totals["skipped"] += task.skipped_count
        totals["dead_lettered"] += task.dead_lettered_count
