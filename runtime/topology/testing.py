"""Test helpers: a recording `TaskContext` for running a `TaskGraph` without Kafka.

    graph = topology.subtopologies[0].instantiate()
    ctx = RecordingTaskContext(partitions={"out": 4})
    graph.init(ctx)
    graph.sources["in"].process(Record("k", "v", 5))
    ctx.sent   # [Sent(topic="out", key=b"k", ...)]

Not used by the runtime itself.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from runtime.topology import serdes
from runtime.topology.context import PunctuationType
from runtime.topology.record import Headers


@dataclass
class Sent:
    """One record handed to `TaskContext.send`."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers | None
    partition: int | None


@dataclass
class Scheduled:
    """One `TaskContext.schedule` call; `cancel()` marks it cancelled."""

    interval_ms: int
    punctuation_type: PunctuationType
    callback: Callable[[int], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class RecordingTaskContext:
    """A `TaskContext` that records what the graph asks of it.

    `partitions` gives partition counts per full topic name (default 1);
    `stores` the objects `state_store(name)` returns.
    """

    task_id: str = "0_0"
    application_id: str = "app"
    default_key_serde: Any = serdes.BYTES
    default_value_serde: Any = serdes.BYTES
    partitions: dict[str, int] = field(default_factory=dict)
    stores: dict[str, Any] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    scheduled: list[Scheduled] = field(default_factory=list)
    commits_requested: int = 0

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        self.sent.append(Sent(topic, key, value, timestamp, headers, partition))

    def partition_count(self, topic: str) -> int:
        return self.partitions.get(topic, 1)

    def resolve_topic(self, name: str, internal: bool) -> str:
        return f"{self.application_id}-{name}" if internal else name

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, callback: Callable[[int], None]
    ) -> Scheduled:
        scheduled = Scheduled(interval_ms, punctuation_type, callback)
        self.scheduled.append(scheduled)
        return scheduled

    def request_commit(self) -> None:
        self.commits_requested += 1

    def state_store(self, name: str) -> Any:
        try:
            return self.stores[name]
        except KeyError:
            raise KeyError(f"no state store {name!r} in this task") from None
