"""The polling thread's expansion follower, step by step, with a fake admin client."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from runtime import VirtualPartitioner
from runtime.config import StreamsConfig
from runtime.kafka.topics import TopicLayout
from runtime.partitioning.expansion_marker import done_topic, marker_topic
from runtime.polling.expansion import PartitionExpansion, PartitionsChangedError
from tests.apps import expansion_app

APP = "app"
REPARTITION = f"{APP}-{expansion_app.REPARTITION}-repartition"
CHANGELOG = f"{APP}-{expansion_app.STORE}-changelog"


def done(value: Any = None, error: KafkaError | None = None) -> Future[Any]:
    future: Future[Any] = Future()
    if error is not None:
        future.set_exception(KafkaException(error))
    else:
        future.set_result(value)
    return future


class FakeAdmin:
    """The cluster's partition counts; CreatePartitions and CreateTopics apply at once."""

    def __init__(self, counts: dict[str, int]) -> None:
        self.counts = counts
        self.created: list[list[tuple[str, int]]] = []
        self.topics: set[str] = set()

    def describe_topics(self, collection: Any, request_timeout: float) -> dict[str, Future[Any]]:
        return {
            name: done(SimpleNamespace(partitions=[0] * self.counts[name]))
            for name in collection.topic_names
        }

    def create_partitions(self, new: list[Any], **_: Any) -> dict[str, Future[Any]]:
        self.created.append([(n.topic, n.new_total_count) for n in new])
        for n in new:
            self.counts[n.topic] = n.new_total_count
        return {n.topic: done() for n in new}

    def create_topics(self, new: list[Any], **_: Any) -> dict[str, Future[Any]]:
        out = {}
        for n in new:
            exists = n.topic in self.topics
            self.topics.add(n.topic)
            error = KafkaError(KafkaError.TOPIC_ALREADY_EXISTS) if exists else None
            out[n.topic] = done(error=error)
        return out

    def poll(self, timeout: float) -> int:
        return 0


class FakeTasks:
    def __init__(self) -> None:
        self.held: set[tuple[str, int]] = set()
        self.released = 0

    def pause_held(self) -> None:
        pass

    def release_held(self) -> int:
        self.released += 1
        return 0


class FakeProducer:
    def __init__(self, admin: FakeAdmin) -> None:
        self.admin = admin

    def list_topics(self, topic: str, timeout: float) -> Any:
        partitions = dict.fromkeys(range(self.admin.counts[topic]))
        return SimpleNamespace(topics={topic: SimpleNamespace(partitions=partitions)})


def follower(
    static: Any, counts: dict[str, int], admin: FakeAdmin | None = None
) -> tuple[PartitionExpansion, FakeAdmin, Any]:
    config = StreamsConfig.from_dict(
        {
            "application.id": APP,
            "bootstrap.servers": "localhost:9092",
            "static.partitioner": static,
            "partition.check.interval.ms": 100,
        }
    )
    layout = TopicLayout(
        sources={0: ["in"], 1: [REPARTITION]},
        partitions=dict(counts),
        subtopology_of={"in": 0, REPARTITION: 1},
        changelogs={CHANGELOG: 1},
    )
    admin = admin or FakeAdmin(dict(counts))
    tasks = FakeTasks()
    expansion = PartitionExpansion(
        config,
        expansion_app.build("in", "out"),
        layout,
        tasks,  # type: ignore[arg-type]
        SimpleNamespace(producer=FakeProducer(admin)),  # type: ignore[arg-type]
        admin_factory=lambda: admin,  # type: ignore[arg-type,return-value]
    )
    expansion._next_check = 0.0
    return expansion, admin, SimpleNamespace(layout=layout, tasks=tasks)


START = {"in": 4, "out": 4, REPARTITION: 4, CHANGELOG: 4}


def turns(expansion: PartitionExpansion, n: int = 20) -> None:
    for _ in range(n):
        expansion._next_check = min(expansion._next_check, 0.0)
        expansion.tick()


def test_internal_topics_grow_downstream_first_then_the_counts_are_accepted() -> None:
    static = VirtualPartitioner(4)
    expansion, admin, parts = follower(static, START)
    turns(expansion, 3)
    assert admin.created == [] and expansion.expansions == 0

    admin.counts.update({"out": 8, "in": 8})
    turns(expansion)
    assert admin.created == [[(CHANGELOG, 8)], [(REPARTITION, 8)]]
    assert parts.layout.partitions == {"in": 8, "out": 8, REPARTITION: 8, CHANGELOG: 8}
    assert expansion.expansions == 1 and expansion.waiting_for is None
    assert parts.tasks.released >= 1
    assert static.expansions == [(4, 8)]
    marker = marker_topic(APP, [("in", 4, 8)])
    assert marker in admin.topics and done_topic(marker) in admin.topics


def test_a_callback_that_raises_is_not_recorded_done() -> None:
    class Failing(VirtualPartitioner):
        def on_partition_expansion(self, old_count: int, new_count: int) -> None:
            raise RuntimeError("no")

    expansion, admin, parts = follower(Failing(4), dict(START))
    admin.counts.update({"out": 8, "in": 8})
    turns(expansion)
    marker = marker_topic(APP, [("in", 4, 8)])
    assert marker in admin.topics and done_topic(marker) not in admin.topics
    assert parts.layout.partitions["in"] == 8  # the expansion went on


def test_the_callback_runs_on_the_instance_that_creates_the_marker_only() -> None:
    static = VirtualPartitioner(4)
    first, admin, _ = follower(static, START)
    second, _, _ = follower(static, START, admin)
    admin.counts.update({"out": 8, "in": 8})
    turns(first)
    turns(second)
    assert static.expansions == [(4, 8)]
    assert first.expansions == second.expansions == 1


def test_without_a_static_partitioner_a_grown_input_stops_the_app() -> None:
    expansion, admin, parts = follower(None, START)
    admin.counts["out"] = 8  # an output topic: written with its start-up count
    turns(expansion, 3)
    assert parts.layout.partitions["out"] == 4
    admin.counts["in"] = 6
    with pytest.raises(PartitionsChangedError, match=r"'in' 4 -> 6.*static.partitioner"):
        turns(expansion, 3)
    assert admin.created == []


def test_admin_status_says_what_an_expansion_waits_for() -> None:
    from runtime.admin.client import format_status

    text = format_status(
        {
            "state": "RUNNING",
            "expansion_waiting_for": "co-partitioned topics of subtopology 0 differ: a=4, b=2",
            "held_partitions": ["a-2", "a-3"],
            "partition_expansions": 1,
            "tasks_created_by_expansion": 4,
        }
    )
    assert "expansion    waiting: co-partitioned topics of subtopology 0 differ" in text
    assert "held         2 partitions not tasks yet: a-2, a-3" in text
    assert "expansions   1 followed, 4 tasks created by them" in text
    assert "expansion" not in format_status({"state": "RUNNING"})


def test_start_up_names_expand_when_an_internal_topic_is_behind() -> None:
    from runtime.kafka.topics import TopicError, resolve_topics

    counts = {"in": 8, "out": 8, REPARTITION: 4, CHANGELOG: 4}
    metadata = SimpleNamespace(
        topics={n: SimpleNamespace(partitions=[0] * c, error=None) for n, c in counts.items()}
    )
    admin = SimpleNamespace(list_topics=lambda timeout: metadata)
    with pytest.raises(TopicError, match="has 4 partitions, the topology needs 8.*expand") as info:
        resolve_topics(admin, expansion_app.build("in", "out"), APP, 1, {})  # type: ignore[arg-type]
    assert "static.partitioner" in str(info.value)
