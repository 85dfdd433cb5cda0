"""Several instances of one application (same application.id) share its tasks.

Two in-process Apps stand in for two daemons: each has its own consumer in the
group, its own threads and state directory. The deadlines are generous for the
Tansu broker (STREAMS_TEST_BROKER=tansu), whose rebalances are slow (a
first join takes about session.timeout.ms / 2, a cooperative round about 3 s);
on Kafka a round takes about a heartbeat interval.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime import App, AppState, StreamsBuilder
from tests.configs import app_config
from tests.harness import Feeder, TopicReader
from tests.kafka_helpers import create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 8
ALL_TASKS = {f"0_{p}" for p in range(PARTITIONS)}


GROUP_PROTOCOLS = ["classic", "consumer"]


@pytest.fixture(params=GROUP_PROTOCOLS)
def protocol(request: pytest.FixtureRequest, on_kafka: bool) -> str:
    """The consumer group protocol: classic, or KIP-848's `consumer` (Kafka 4.x only)."""
    if request.param == "consumer" and not on_kafka:
        pytest.skip("KIP-848 (group.protocol=consumer) needs Apache Kafka 4.x")
    return str(request.param)


def base_config(
    bootstrap: str, app_id: str, state_dir: Path, protocol: str = "classic"
) -> dict[str, object]:
    return app_config(
        bootstrap, app_id, state_dir, commit_ms=500, **{"consumer.group.protocol": protocol}
    )


def passthrough_app(
    bootstrap: str, app_id: str, source: str, sink: str, state_dir: Path, protocol: str
) -> App:
    builder = StreamsBuilder()
    builder.stream(source).to(sink)
    return App(builder.build(), base_config(bootstrap, app_id, state_dir, protocol))


def tasks_of(app: App) -> set[str]:
    return {t["id"] for t in app.status()["tasks"]}


def wait_for_split(a: App, b: App, timeout: float = 90) -> None:
    """Until both run, each owns some tasks, and together they own all 8, none twice."""

    def split() -> bool:
        assert_not_failed(a, b)
        ta, tb = tasks_of(a), tasks_of(b)
        return (
            a.state is AppState.RUNNING
            and b.state is AppState.RUNNING
            and bool(ta)
            and bool(tb)
            and not (ta & tb)
            and ta | tb == ALL_TASKS
        )

    try:
        wait_until(split, timeout, interval=0.1)
    except AssertionError:
        assert_not_failed(a, b)
        raise AssertionError(
            f"tasks never split: A {a.state} {sorted(tasks_of(a))}, "
            f"B {b.state} {sorted(tasks_of(b))}"
        ) from None


def assert_not_failed(*apps: App) -> None:
    for app in apps:
        assert app.state not in (AppState.ERROR, AppState.PENDING_ERROR), repr(app.failure)


def wait_for_all(reader: TopicReader, n: int, apps: list[App], timeout: float = 90) -> None:
    def complete() -> bool:
        reader.poll()
        assert_not_failed(*apps)
        return len(reader.values()) >= n

    try:
        wait_until(complete, timeout, interval=0.0)
    except AssertionError:
        assert_not_failed(*apps)
        missing = sorted(set(range(n)) - reader.values())
        raise AssertionError(f"{len(missing)} of {n} missing, e.g. {missing[:20]}") from None


def test_two_instances_share_the_tasks(bootstrap: str, tmp_path: Path, protocol: str) -> None:
    source, sink, app_id = unique_name("m-in"), unique_name("m-out"), unique_name("multi")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    first_batch = 2000
    produce(bootstrap, source, ((f"k{i % 64}", str(i)) for i in range(first_batch)))

    a = passthrough_app(bootstrap, app_id, source, sink, tmp_path / "a", protocol)
    b = passthrough_app(bootstrap, app_id, source, sink, tmp_path / "b", protocol)
    reader = TopicReader(bootstrap, sink, PARTITIONS)
    a.start()
    b.start()
    try:
        wait_for_split(a, b)
        split_a, split_b = sorted(tasks_of(a)), sorted(tasks_of(b))
        processed_a, processed_b = a.status()["processed"], b.status()["processed"]

        # A second batch after the split: both instances must take part.
        n = 2 * first_batch
        produce(bootstrap, source, ((f"k{i % 64}", str(i)) for i in range(first_batch, n)))
        wait_for_all(reader, n, [a, b])
        assert sorted(tasks_of(a)) == split_a and sorted(tasks_of(b)) == split_b, (
            "assignment changed without a membership change"
        )
        assert a.status()["processed"] > processed_a, "instance A processed none of batch 2"
        assert b.status()["processed"] > processed_b, "instance B processed none of batch 2"
        print(f"split: A {split_a}, B {split_b}")
    finally:
        reader.poll(0.5)
        reader.close()
        closed_a, closed_b = a.close(30), b.close(30)
    assert closed_a and closed_b
    assert a.state is AppState.NOT_RUNNING and b.state is AppState.NOT_RUNNING
    values = [int(m.value) for m in reader.msgs]
    assert set(values) == set(range(n))
    print(f"two instances: {len(values)} output for {n} input")


def test_survivor_takes_over_when_one_instance_closes(
    bootstrap: str, tmp_path: Path, protocol: str
) -> None:
    source, sink, app_id = unique_name("h-in"), unique_name("h-out"), unique_name("handover")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)

    a = passthrough_app(bootstrap, app_id, source, sink, tmp_path / "a", protocol)
    b = passthrough_app(bootstrap, app_id, source, sink, tmp_path / "b", protocol)
    feeder = Feeder(bootstrap, source, rate=1000)
    reader = TopicReader(bootstrap, sink, PARTITIONS)
    a.start()
    b.start()
    try:
        feeder.start()
        wait_for_split(a, b)
        processed_a = a.status()["processed"]
        wait_until(
            lambda: a.status()["processed"] > processed_a + 200,
            30,
            message="instance A idle before its close",
        )

        closed_at = time.monotonic()
        assert a.close(30), "A did not close within 30 s"
        assert a.state is AppState.NOT_RUNNING
        close_s = time.monotonic() - closed_at

        try:
            wait_until(
                lambda: tasks_of(b) == ALL_TASKS and b.state is AppState.RUNNING,
                90,
                interval=0.1,
            )
        except AssertionError:
            assert_not_failed(b)
            raise AssertionError(f"B never took over: {b.state} {sorted(tasks_of(b))}") from None
        takeover_s = time.monotonic() - closed_at

        # Keep feeding a little after the take-over, so B must process new input on all tasks.
        sent_then = feeder.sent
        wait_until(lambda: feeder.sent >= sent_then + 1000, 30, message="feeder stalled")
        feeder.stop()
        n = feeder.sent
        wait_for_all(reader, n, [b])
        assert b.state is AppState.RUNNING
        print(f"handover: A closed in {close_s:.1f}s, B owned all tasks after {takeover_s:.1f}s")
    finally:
        feeder._halt.set()
        reader.poll(0.5)
        reader.close()
        a.close(30)
        closed_b = b.close(30)
    assert closed_b and b.state is AppState.NOT_RUNNING
    values = [int(m.value) for m in reader.msgs]
    assert set(values) == set(range(n))
    print(f"handover: {n} input, {len(values)} output, {len(values) - n} duplicates")
