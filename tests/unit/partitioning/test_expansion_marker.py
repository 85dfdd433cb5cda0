"""The expansion callback: elected by a marker topic, recorded done, re-run at start-up."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from hypothesis import given
from hypothesis import strategies as st

from runtime import VirtualPartitioner
from runtime.partitioning.expansion_marker import (
    done_topic,
    finish_interrupted_callbacks,
    marker_topic,
    parse_marker,
)

APP = "app"


class Topics:
    """CreateTopics once per name, ListTopics: all a marker needs of a cluster."""

    def __init__(self, *names: str) -> None:
        self.names = set(names)

    def create_topics(self, new: list[Any], **_: Any) -> dict[str, Future[Any]]:
        out: dict[str, Future[Any]] = {}
        for n in new:
            future: Future[Any] = Future()
            if n.topic in self.names:
                future.set_exception(KafkaException(KafkaError(KafkaError.TOPIC_ALREADY_EXISTS)))
            else:
                future.set_result(None)
            self.names.add(n.topic)
            out[n.topic] = future
        return out

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(topics=dict.fromkeys(self.names))


changes = st.lists(
    st.tuples(st.sampled_from(["in", "other", "x.y-z"]), st.integers(1, 999), st.integers(1, 999)),
    min_size=1,
    max_size=3,
)


@given(changes=changes)
def test_a_marker_names_its_counts(changes: list[tuple[str, int, int]]) -> None:
    name = marker_topic(APP, changes)
    assert parse_marker(APP, name) == sorted({(old, new) for _, old, new in changes})
    assert parse_marker(APP, done_topic(name)) is None
    assert parse_marker("other-app", name) is None
    assert marker_topic(APP, list(reversed(changes))) == name  # same on every instance


def test_older_markers_and_other_topics_are_not_markers() -> None:
    assert parse_marker(APP, f"{APP}-expansion-0123456789abcdef") is None
    assert parse_marker(APP, f"{APP}-partitioner") is None
    assert parse_marker(APP, f"{APP}-expansion-4to8-nothex") is None


class Hook:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[int, int]] = []
        self.fail = fail

    def static_partition(self, topic: str, key: Any, n: int) -> int:
        return 0

    def on_partition_expansion(self, old: int, new: int) -> None:
        self.calls.append((old, new))
        if self.fail:
            raise RuntimeError("downstream not reachable")


def test_an_interrupted_callback_runs_again_at_start_up_and_is_recorded_done() -> None:
    finished = marker_topic(APP, [("in", 2, 4)])
    interrupted = marker_topic(APP, [("in", 4, 8)])
    cluster = Topics(finished, done_topic(finished), interrupted, "unrelated")
    hook = Hook()
    assert finish_interrupted_callbacks(cluster, APP, hook, 1, grace_s=0) == 1  # type: ignore[arg-type]
    assert hook.calls == [(4, 8)]
    assert done_topic(interrupted) in cluster.names
    assert finish_interrupted_callbacks(cluster, APP, hook, 1, grace_s=0) == 0  # type: ignore[arg-type]
    assert hook.calls == [(4, 8)]


def test_a_failing_callback_is_not_done_and_no_hook_means_nothing_to_do() -> None:
    interrupted = marker_topic(APP, [("in", 4, 8)])
    cluster = Topics(interrupted)
    failing = Hook(fail=True)
    finish_interrupted_callbacks(cluster, APP, failing, 1, grace_s=0)  # type: ignore[arg-type]
    assert done_topic(interrupted) not in cluster.names
    assert finish_interrupted_callbacks(cluster, APP, None, 1, grace_s=0) == 0  # type: ignore[arg-type]
    ok = Hook()
    finish_interrupted_callbacks(cluster, APP, ok, 1, grace_s=0)  # type: ignore[arg-type]
    assert ok.calls == [(4, 8)] and done_topic(interrupted) in cluster.names


def test_a_slow_runner_gets_the_grace_period() -> None:
    import threading

    interrupted = marker_topic(APP, [("in", 4, 8)])
    cluster = Topics(interrupted)
    timer = threading.Timer(0.3, lambda: cluster.names.add(done_topic(interrupted)))
    timer.start()
    hook = Hook()
    assert finish_interrupted_callbacks(cluster, APP, hook, 1, grace_s=5) == 0  # type: ignore[arg-type]
    assert hook.calls == []
    timer.join()


def test_virtual_partitioner_records_each_call() -> None:
    partitioner = VirtualPartitioner(4)
    cluster = Topics(marker_topic(APP, [("a", 4, 8), ("b", 2, 4)]))
    finish_interrupted_callbacks(cluster, APP, partitioner, 1, grace_s=0)  # type: ignore[arg-type]
    assert partitioner.expansions == [(2, 4), (4, 8)]
