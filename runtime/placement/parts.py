"""What runtime-owned placement is built from: settings, the polling thread's
parts it works through, and what other threads hand it.

`RuntimeAssignment` (the coordinator), `PlanFollower` and `PlacerRole` take
these grouped instead of a long list of arguments, so each says by its type
where a dependency comes from and which thread may touch it.

Threads: types only. Everything in `PollingSide` is the polling thread's and
used on it only; everything in `Handovers` is read there as one immutable
snapshot per decision.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from confluent_kafka import Consumer

from runtime.collector.output import OutputChannel
from runtime.kafka.topics import TopicLayout
from runtime.placement.placer import PlacerSettings
from runtime.placement.status_view import StatusTopicView
from runtime.polling.active_tasks import ActiveTasks
from runtime.polling.committer import Committer
from runtime.polling.status_and_standbys import TaskPlacement


class TaskLifecycle(Protocol):
    """What the polling thread does for placement with its tasks (the
    `PollingThread`; its thread only)."""

    def commit_locked(self, reason: str) -> bool:
        """Commit every processing task (rule 4), every task locked by the
        caller; False if not committed (an aborted transaction: every task
        rewound)."""
        ...

    def close_without_commit(self, task_ids: list[str]) -> None:
        """Close tasks whose offsets can no longer be committed (a lost
        membership): output aborted and every task rewound under exactly-once."""
        ...

    def restart_commit_interval(self) -> None:
        """A commit just happened outside the commit interval's own."""
        ...

    def tasks_changed(self) -> None:
        """The tasks here changed (the figures other threads read)."""
        ...


@dataclass(frozen=True)
class RuntimePlacementSettings:
    """Fixed for the process's life."""

    instance_id: str  # the first identity; renewed ones derive from it
    group_id: str  # the group whose membership the placer describes (rule (b))
    admin_settings: dict[str, Any]  # for the placer's DescribeConsumerGroups
    placer: PlacerSettings = field(default_factory=PlacerSettings)


@dataclass(frozen=True)
class PollingSide:
    """The polling thread's parts placement works through (its thread only)."""

    consumer: Consumer  # the main consumer: data partitions (un)assigned here
    layout: TopicLayout  # partition counts in force (grown in place by an expansion)
    tasks: ActiveTasks  # create, close, ids
    standbys: TaskPlacement  # status publishing, standbys (learners), the status topic
    committer: Committer  # task locks for a hand-over's commit
    output: OutputChannel  # plans produced; transactions; flushes
    lifecycle: TaskLifecycle  # commits and dirty closes (the PollingThread)
    request_commit: Callable[[], None]  # commit at the next loop turn (any thread)
    on_left: Callable[[], None]  # this instance left: stop with the final commit


@dataclass(frozen=True)
class Handovers:
    """What other threads hand over, each read as one snapshot per decision."""

    status: StatusTopicView  # the status topic, read on the restoration thread's loop
    standby_lags: Callable[[], Mapping[str, int]]  # the restoration thread's figures
    capacity: Callable[[], int]  # processing threads this instance offers (any thread)
