"""What crosses the restoration thread's boundary, as types.

What it needs of the active tasks handed to it (`RestorableTask`) and of a
reader of a non-changelog topic sharing its consumer (`SideReader`, made by a
`SideReaderSource`: the status topic's, `runtime.placement.status_reader`),
and the one object it hands other threads (`RestorationFigures`, immutable).
Kept apart from `runtime.state.restoration` so the thread's module holds its
loop only, and so readers of the figures need not import the thread.

Threads: types only; see each for who calls what.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from confluent_kafka import Consumer

from runtime.state.builders import LayeredStore
from runtime.state.changelog_reading import TopicPartitionKey


def _empty() -> Mapping[str, Any]:
    return MappingProxyType({})


class SideReader(Protocol):
    """A topic read on the restore consumer that is not a changelog (the status
    topic: `runtime.placement.status_reader.StatusTopicReader`). This thread
    routes the topic's messages and knows nothing of their meaning. Called on
    this thread only."""

    @property
    def topics(self) -> frozenset[str]:
        """The topics whose messages go to `take`."""
        ...

    def start(self, consumer: Consumer) -> None:
        """Assign its partitions (once, when the thread starts)."""
        ...

    def take(self, consumer: Consumer, messages: list[Any]) -> None:
        """One batch's messages of its topics, in order: records, and the
        end-of-partition and out-of-range events of its partitions."""
        ...


class SideReaderSource(Protocol):
    """What the wiring hands over for the status topic (`StatusTopicView`, the
    view the polling thread reads): it makes the reader of a topic."""

    def reader(self, topic: str) -> SideReader: ...


class RestorableTask(Protocol):
    """What restoration needs of an active task (`StreamTask` is one).

    The stores are opened by the task's owner; restoration writes them only
    between `add_task` and the hand-back through `drain_restored`, while no
    processing thread can see the task.
    """

    @property
    def id(self) -> str: ...

    @property
    def partition(self) -> int: ...

    @property
    def stores(self) -> dict[str, LayeredStore]: ...

    @property
    def restore_from(self) -> dict[TopicPartitionKey, int | None]: ...

    restored_records: int


@dataclass(frozen=True)
class RestorationFigures:
    """What the restoration thread tells other threads, as of one loop turn.

    Immutable, replaced whole (`RestorationThread.figures`): a reader sees
    one turn's figures together. The inner dicts are never changed once
    published."""

    restored_total: int = 0  # changelog records applied to active tasks since start
    # Restoring task id -> {"restored", "remaining" (-1: unknown), "rate"}.
    progress: Mapping[str, dict[str, float]] = field(default_factory=_empty)
    # Task id -> how its last restore went ("source", "seconds", "records",
    # "snapshot", "downloaded_bytes").
    restores: Mapping[str, dict[str, Any]] = field(default_factory=_empty)
    # Standby id -> {"<changelog>-<partition>": position}.
    standby_positions: Mapping[str, dict[str, int]] = field(default_factory=_empty)
    # Standby id -> records its copy lags behind its changelogs' ends (absent
    # while an end is unknown); learners are standbys.
    standby_lags: Mapping[str, int] = field(default_factory=_empty)
