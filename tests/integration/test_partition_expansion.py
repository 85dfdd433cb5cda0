"""Live partition expansion on Apache Kafka (CreatePartitions), while input flows.

An idempotent per-key count (`tests.apps.expansion_app`: keys through a
repartition topic into an aggregate that keeps the highest sequence number
per key) runs with a static partitioner; its input topic goes from 4 to 8
partitions mid-stream, the output topic first. New keys then go to the new
partitions. Checked: every key's final count equals what was sent, no
record lost, none counted twice (exactly_once_v2: not even processed twice),
each key stays on one partition of every topic, the new keys on the new
partitions, the internal topics end at 8 partitions, the callback ran once,
the app never left RUNNING/REBALANCING. Also: two instances spread the new
tasks (classic and KIP-848 group protocols, and `task.assignment=runtime`);
without a static partitioner the app stops with the reason; joined topics
with different counts make the app wait, saying so.

Skipped on Tansu (no CreatePartitions).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from runtime import App, AppState, StreamsBuilder, VirtualPartitioner, serdes
from runtime.metrics import AppCollector
from tests import configs
from tests.apps import expansion_app
from tests.harness import REPO, clean_env
from tests.kafka_helpers import Msg, consume_all, create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration

OLD_KEYS = [f"k{i}" for i in range(32)]
NEW_KEYS = [f"p{p}/n{i}" for p in range(4, 8) for i in range(3)]


@pytest.fixture(autouse=True)
def _kafka_only(on_kafka: bool) -> None:
    if not on_kafka:
        pytest.skip("partition expansion needs CreatePartitions (Tansu has none)")


class SequenceFeeder(threading.Thread):
    """Per-key sequence numbers (1, 2, ...) for the old keys, and for the new
    keys once `open_new_keys()` was called, at about `rate` records/s, each on
    the partition the static partitioner gives it."""

    def __init__(self, bootstrap: str, topic: str, partitioner: VirtualPartitioner, rate: float):
        super().__init__(name="sequence-feeder", daemon=True)
        self.topic, self.partitioner, self.rate = topic, partitioner, rate
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self.sent: dict[str, int] = {}
        self.errors: list[str] = []
        self._keys = list(OLD_KEYS)
        self._halt = threading.Event()

    def open_new_keys(self) -> None:
        """After the topic grew: a producer refuses partitions it has not seen."""
        wait_until(
            lambda: (
                len(self.producer.list_topics(self.topic, 10).topics[self.topic].partitions) == 8
            ),
            30,
            message="the feeder's producer never saw 8 partitions",
        )
        self._keys = OLD_KEYS + NEW_KEYS

    def run(self) -> None:
        started, produced = time.monotonic(), 0
        while not self._halt.is_set():
            for key in self._keys:
                seq = self.sent.get(key, 0) + 1
                self.sent[key] = seq
                partition = self.partitioner.static_partition(self.topic, key, 8)
                self.producer.produce(
                    self.topic, str(seq).encode(), key.encode(), partition, self._report
                )
                produced += 1
            self.producer.poll(0)
            ahead = produced / self.rate - (time.monotonic() - started)
            if ahead > 0:
                self._halt.wait(ahead)
        remaining = self.producer.flush(60)
        if remaining:
            self.errors.append(f"{remaining} records not delivered")

    def _report(self, err: KafkaError | None, _msg: Message) -> None:
        if err is not None:
            self.errors.append(str(err))

    def stop(self) -> dict[str, int]:
        self._halt.set()
        self.join(90)
        assert not self.is_alive() and not self.errors, self.errors[:3]
        return dict(self.sent)


def grow(bootstrap: str, *topics: str, partitions: int = 8) -> None:
    """CreatePartitions, one topic after the other (each visible first)."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in topics:
        admin.create_partitions([NewPartitions(topic, partitions)])[topic].result(30)
        wait_until(
            lambda t=topic: partition_counts(bootstrap, t)[t] == partitions,  # type: ignore[misc]
            30,
            message=f"{topic} never showed {partitions} partitions",
        )


def partition_counts(bootstrap: str, *topics: str) -> dict[str, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {t: len(metadata.topics[t].partitions) for t in topics}


def app_config(
    bootstrap: str, app_id: str, state_dir: Path, protocol: str = "classic", **extra: Any
) -> dict[str, Any]:
    # KIP-848 (`consumer`): the broker assigns, and keeps the session and
    # heartbeat timings itself.
    kip848 = protocol == "consumer"
    protocol_settings: dict[str, Any] = {"consumer.group.protocol": "consumer"} if kip848 else {}
    if protocol == "runtime":  # the classic protocol, the runtime places tasks
        protocol_settings["task.assignment"] = "runtime"
    return configs.app_config(
        bootstrap,
        app_id,
        state_dir,
        # The store cache emits the counts at each commit (exactly_once_v2: 100 ms).
        commit_ms=200,
        session_ms=None if kip848 else 6000,
        heartbeat_ms=None if kip848 else 500,
        **{"partition.check.interval.ms": 500, **protocol_settings, **extra},
    )


def tasks_of(app: App) -> set[str]:
    return {t.id for t in app.status().tasks}


def assert_alive(*apps: App) -> None:
    for app in apps:
        assert app.state in (AppState.RUNNING, AppState.REBALANCING), repr(app.failure)


def processed(app: App, task_ids: set[str]) -> int:
    return sum(t.processed for t in app.status().tasks if t.id in task_ids)


def final_values(bootstrap: str, sink: str, sent: dict[str, int], apps: list[App]) -> list[Msg]:
    """The output once every key's latest value reached what was sent."""
    latest: dict[str, dict[str, int]] = {}
    records: list[Msg] = []

    def complete() -> bool:
        for app in apps:
            assert app.state is not AppState.ERROR, repr(app.failure)
        records[:] = consume_all(bootstrap, sink, timeout=30)
        latest.clear()
        for m in records:  # per partition in offset order; a key lives on one partition
            assert m.key is not None and m.value is not None
            latest[m.key.decode()] = json.loads(m.value)
        return all(latest.get(k, {}).get("seq") == n for k, n in sent.items())

    wait_until(complete, 90, interval=0.5, message="the counts did not reach what was sent")
    return records


def expand_to_8_while_feeding(
    app: App,
    bootstrap: str,
    source: str,
    sink: str,
    feeder: SequenceFeeder,
    new_tasks: set[str],
) -> tuple[dict[str, int], list[Msg]]:
    """Grow `sink`, then `source`, to 8 partitions while `feeder` runs; wait
    until `new_tasks` processed something and a few hundred more records (new
    and old keys) went in; stop the feeder. Returns what was sent per key and
    the output once every key's latest value reached it."""
    grow(bootstrap, sink, source)  # output topic first
    feeder.open_new_keys()
    wait_until(
        lambda: assert_alive(app) or processed(app, new_tasks) > 0,
        60,
        message=f"no new task processed anything: {sorted(new_tasks)}",
    )
    sent_then = sum(feeder.sent.values())
    wait_until(lambda: sum(feeder.sent.values()) > sent_then + 400, 30, message="feeder")
    sent = feeder.stop()
    return sent, final_values(bootstrap, sink, sent, [app])


def check_counts(records: list[Msg], sent: dict[str, int], exactly_once: bool) -> None:
    latest: dict[str, dict[str, int]] = {}
    partitions: dict[str, set[int]] = {}
    for m in records:
        assert m.key is not None and m.value is not None
        key = m.key.decode()
        latest[key] = json.loads(m.value)
        partitions.setdefault(key, set()).add(m.partition)
    for key, n in sent.items():
        assert latest[key]["count"] == n, f"{key}: counted {latest[key]}, sent {n}"
        if exactly_once:
            assert latest[key]["replays"] == 0, f"{key} processed twice: {latest[key]}"
    moved = {k: p for k, p in partitions.items() if len(p) > 1}
    assert not moved, f"keys moved between output partitions: {moved}"
    for key in NEW_KEYS:
        assert partitions[key] == {expansion_app.place(key)}, (key, partitions[key])
    assert all(max(partitions[k]) < 4 for k in OLD_KEYS), "an old key left partitions 0-3"


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_stateful_count_follows_a_4_to_8_expansion(
    bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    source, sink, app_id = unique_name("x-in"), unique_name("x-out"), unique_name("expand")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    partitioner = expansion_app.new_partitioner()
    config = app_config(
        bootstrap,
        app_id,
        tmp_path,
        **{"static.partitioner": partitioner, "processing.guarantee": guarantee},
    )
    if guarantee == "exactly_once_v2":
        del config["commit.interval.ms"]  # its default, 100 ms
    app = App(expansion_app.build(source, sink), config)
    states: list[AppState] = []
    app.set_state_listener(lambda new, old: states.append(new))
    feeder = SequenceFeeder(bootstrap, source, partitioner, rate=400)
    app.start()
    try:
        feeder.start()
        wait_until(lambda: app.status().processed > 400, 60, message="no processing")
        old_tasks = {f"{s}_{p}" for s in (0, 1) for p in range(4)}
        assert tasks_of(app) == old_tasks

        new_tasks = {f"{s}_{p}" for s in (0, 1) for p in range(4, 8)}
        sent, records = expand_to_8_while_feeding(app, bootstrap, source, sink, feeder, new_tasks)
        status = app.status()
        assert tasks_of(app) == old_tasks | new_tasks
        assert status.partition_expansions == 1
        assert status.tasks_created_by_expansion == 8
        assert status.held_partitions == [] and status.expansion_waiting_for is None
        repartition = f"{app_id}-{expansion_app.REPARTITION}-repartition"
        changelog = f"{app_id}-{expansion_app.STORE}-changelog"
        assert status.partitions[source] == 8 and status.partitions[repartition] == 8
        metrics = {m.name: m for m in AppCollector.families(status)}
        assert metrics["streams_partition_expansions"].samples[0].value == 1
        assert partition_counts(bootstrap, repartition, changelog) == {
            repartition: 8,
            changelog: 8,
        }
    finally:
        feeder._halt.set()
        closed = app.close(30)
    assert closed and app.state is AppState.NOT_RUNNING
    assert AppState.ERROR not in states and AppState.PENDING_ERROR not in states
    assert partitioner.expansions == [(4, 8)], "the expansion callback runs exactly once"
    check_counts(records, sent, exactly_once=guarantee == "exactly_once_v2")
    # Every key kept its partition on the repartition topic too.
    on_repartition: dict[bytes | None, set[int]] = {}
    for m in consume_all(bootstrap, repartition, timeout=30):
        on_repartition.setdefault(m.key, set()).add(m.partition)
    assert all(len(p) == 1 for p in on_repartition.values())
    print(f"{guarantee}: {sum(sent.values())} records, {len(sent)} keys, states {states}")


def run_expand(bootstrap: str, app_id: str, source: str, sink: str) -> str:
    """`streams-runtime expand` as an operator runs it."""
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "expand", "tests.apps.expansion_app:topology", source]
        + ["--partitions", "8", "--set", f"application.id={app_id}"]
        + ["--set", f"bootstrap.servers={bootstrap}"]
        + ["--set", "static.partitioner=tests.apps.expansion_app:partitioner"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("protocol", ["classic", "consumer", "runtime"])
def test_two_instances_spread_the_new_tasks(bootstrap: str, tmp_path: Path, protocol: str) -> None:
    """`runtime`: task.assignment=runtime (the classic protocol): no
    rebalance brings the new partitions; the placer places the new tasks
    once it accepted the new counts, and an instance that was given some
    before it accepted them takes them when it has."""
    source, sink, app_id = unique_name("x2-in"), unique_name("x2-out"), unique_name("expand2")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    partitioner = expansion_app.new_partitioner()
    apps = [
        App(
            expansion_app.build(source, sink),
            app_config(
                bootstrap,
                app_id,
                tmp_path / name,
                protocol,
                **{"static.partitioner": partitioner},
            ),
        )
        for name in ("a", "b")
    ]
    feeder = SequenceFeeder(bootstrap, source, partitioner, rate=300)
    for app in apps:
        app.start()
    try:
        feeder.start()
        wait_until(
            lambda: sum(len(tasks_of(a)) for a in apps) == 8 and all(tasks_of(a) for a in apps),
            120,
            message="the two instances never shared the 8 tasks",
        )
        out = run_expand(bootstrap, app_id, source, sink)
        lines = [line.split() for line in out.splitlines()]
        grown_order = [parts[1] for parts in lines if parts[0] == "expanded"]
        assert grown_order[0] == sink and grown_order[-1] == source, out
        assert len(grown_order) == 4, out  # output, changelog, repartition, input
        feeder.open_new_keys()
        new_tasks = {f"{s}_{p}" for s in (0, 1) for p in range(4, 8)}
        all_tasks = {f"{s}_{p}" for s in (0, 1) for p in range(8)}

        def spread() -> bool:
            assert_alive(*apps)
            a, b = (tasks_of(app) for app in apps)
            return a | b == all_tasks and not a & b and bool(a & new_tasks) and bool(b & new_tasks)

        wait_until(spread, 120, interval=0.1, message="the new tasks did not spread over both")
        # The tasks can spread before the feeder's next round reaches the new keys.
        wait_until(lambda: all(k in feeder.sent for k in NEW_KEYS), 30, message="new keys unsent")
        sent = feeder.stop()
        records = final_values(bootstrap, sink, sent, apps)
        split = [sorted(tasks_of(app) & new_tasks) for app in apps]
        assert sum(app.status().partition_expansions for app in apps) == 2  # each followed it
    finally:
        feeder._halt.set()
        closed = [app.close(30) for app in apps]
    assert all(closed)
    assert all(app.state is AppState.NOT_RUNNING for app in apps), [app.failure for app in apps]
    assert partitioner.expansions == [(4, 8)], "the callback runs on one instance, once"
    check_counts(records, sent, exactly_once=False)
    print(f"new tasks: A {split[0]}, B {split[1]}")


def test_without_a_static_partitioner_the_app_stops_and_says_why(
    bootstrap: str, tmp_path: Path
) -> None:
    source, sink, app_id = unique_name("xs-in"), unique_name("xs-out"), unique_name("expand-stop")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    app = App(expansion_app.build(source, sink), app_config(bootstrap, app_id, tmp_path))
    feeder = SequenceFeeder(bootstrap, source, expansion_app.new_partitioner(), rate=200)
    app.start()
    try:
        feeder.start()
        wait_until(lambda: app.status().processed > 100, 60, message="no processing")
        grow(bootstrap, source)
        feeder.open_new_keys()
        assert app.wait(30), "the app kept running after its input grew"
    finally:
        feeder._halt.set()
        app.close(30)
    assert app.state is AppState.ERROR
    reason = str(app.failure)
    assert f"{source!r} 4 -> 8" in reason
    assert "static.partitioner" in reason and "repartition offline" in reason
    assert app.status().tasks_created_by_expansion == 0, "a new partition became a task"


def test_joined_topics_with_different_counts_wait(bootstrap: str, tmp_path: Path) -> None:
    stream, table, sink = (unique_name(n) for n in ("xj-s", "xj-t", "xj-out"))
    app_id = unique_name("expand-join")
    for topic in (stream, table, sink):
        create_topic(bootstrap, topic, 2)
    builder = StreamsBuilder()
    lookup = builder.table(table, key_serde=serdes.STRING, value_serde=serdes.STRING)
    builder.stream(stream, key_serde=serdes.STRING, value_serde=serdes.STRING).join(
        lookup, lambda v, t: f"{v}:{t}"
    ).to(sink)
    config = app_config(
        bootstrap, app_id, tmp_path, **{"static.partitioner": VirtualPartitioner(2)}
    )
    app = App(builder.build(), config)
    app.start()
    try:
        wait_until(lambda: tasks_of(app) == {"0_0", "0_1"}, 60, message="never ran")
        grow(bootstrap, stream, partitions=4)

        def waiting() -> bool:
            assert_alive(app)
            return app.status().expansion_waiting_for is not None

        wait_until(waiting, 30, message="no wait reported for the co-partitioned topics")
        status = app.status()
        assert "co-partitioned" in (status.expansion_waiting_for or "")
        assert status.partitions[stream] == 2
        # The old tasks keep running (after the eager rebalance the new
        # partitions caused); the stream's new partitions are held.
        wait_until(lambda: tasks_of(app) == {"0_0", "0_1"}, 30, message="old tasks gone")
        assert {f"{stream}-2", f"{stream}-3"} <= set(app.status().held_partitions)
        metrics = {m.name: m for m in AppCollector.families(status)}
        assert metrics["streams_partition_expansion_waiting"].samples[0].value == 1

        grow(bootstrap, table, partitions=4)
        wait_until(
            lambda: assert_alive(app) or tasks_of(app) == {f"0_{p}" for p in range(4)},
            60,
            message="the join did not take its new partitions",
        )
        assert app.status().expansion_waiting_for is None
    finally:
        app.close(30)
    assert app.state is AppState.NOT_RUNNING


def test_expand_refuses_without_a_static_partitioner(bootstrap: str) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "runtime", "expand", "tests.apps.expansion_app:topology", "in"]
        + ["--partitions", "8", "--set", "application.id=x"]
        + ["--set", f"bootstrap.servers={bootstrap}"],
        cwd=REPO,
        env=clean_env(STREAMS_TEST_INPUT="in", STREAMS_TEST_OUTPUT="out"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert "static.partitioner is not set" in result.stderr and "--force" in result.stderr


def test_expand_benchmark_smoke_run(tmp_path: Path) -> None:
    """`python -m benchmarks expand` runs end to end (one short repeat, its own broker)."""
    import argparse

    from benchmarks import expand

    parser = argparse.ArgumentParser()
    expand.add_arguments(parser)
    args = parser.parse_args(
        ["--quick", "--window-s=1.5", "--feed-rate=500", "--check-interval-ms=500"]
        + [f"--out={tmp_path}"]
    )
    assert expand.main(args) == 0
    (run,) = json.loads((tmp_path / "expand.json").read_text())["runs"]
    assert 0 < run["first_new_s"] <= run["all_new_s"] < 30
    assert run["expansions"] == 1 and run["tasks_created_by_expansion"] == 8
    assert "| first record of a new partition processed |" in (tmp_path / "expand.md").read_text()


def test_a_query_added_at_runtime_follows_an_expansion(bootstrap: str, tmp_path: Path) -> None:
    """Issue 17: expansions are planned for the topology as it is now, so a
    stateful query added while another runs gets its new tasks (and its
    internal topics grow) when its input goes from 4 to 8 partitions; its
    counts stay true and the query that was there first is untouched."""
    source, sink = unique_name("qx-in"), unique_name("qx-out")
    base_in, base_out = unique_name("qx-base-in"), unique_name("qx-base-out")
    for topic in (source, sink, base_in, base_out):
        create_topic(bootstrap, topic, 4)
    app_id = unique_name("expand-query")
    partitioner = expansion_app.new_partitioner()
    config = app_config(bootstrap, app_id, tmp_path, **{"static.partitioner": partitioner})
    base = StreamsBuilder()
    base.stream(base_in, key_serde=serdes.STRING, value_serde=serdes.STRING).to(
        base_out, key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    app = App({"base": base.build()}, config)
    feeder = SequenceFeeder(bootstrap, source, partitioner, rate=400)
    base_sent = 200
    app.start()
    try:
        wait_until(lambda: app.state is AppState.RUNNING, 60, message="never RUNNING")
        app.add_query("grow", expansion_app.build(source, sink))
        feeder.start()
        old_tasks = {f"grow__{s}_{p}" for s in (0, 1) for p in range(4)}
        wait_until(
            lambda: assert_alive(app) or processed(app, old_tasks) > 400,
            60,
            message="the added query processed nothing",
        )
        producer = Producer({"bootstrap.servers": bootstrap})
        for i in range(base_sent):
            producer.produce(base_in, f"v{i}".encode(), f"b{i}".encode())
        assert producer.flush(30) == 0

        new_tasks = {f"grow__{s}_{p}" for s in (0, 1) for p in range(4, 8)}
        sent, records = expand_to_8_while_feeding(app, bootstrap, source, sink, feeder, new_tasks)
        status = app.status()
        assert old_tasks | new_tasks <= tasks_of(app)
        assert status.partition_expansions == 1
        repartition = f"{app_id}-grow-{expansion_app.REPARTITION}-repartition"
        changelog = f"{app_id}-grow-{expansion_app.STORE}-changelog"
        assert partition_counts(bootstrap, repartition, changelog) == {
            repartition: 8,
            changelog: 8,
        }
        base_tasks = {t for t in tasks_of(app) if t.startswith("base__")}
        assert base_tasks == {f"base__0_{p}" for p in range(4)}, base_tasks
        base_values = {m.value for m in consume_all(bootstrap, base_out, timeout=30)}
        assert base_values == {f"v{i}".encode() for i in range(base_sent)}
    finally:
        feeder._halt.set()
        closed = app.close(30)
    assert closed
    assert partitioner.expansions == [(4, 8)]
    check_counts(records, sent, exactly_once=False)
