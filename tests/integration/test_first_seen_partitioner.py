"""FirstSeenPartitioner on Apache Kafka: an expansion under load.

The app re-keys its input (`k` -> `g-k`, a repartition topic: the runtime
decides where every `g-` key goes) and counts per key idempotently (per-key
sequence numbers, as `tests.apps.expansion_app`). The feeder places the
input keys with its own FirstSeenPartitioner on the same map (a producer
outside the app). The input goes from 4 to 8 partitions (output first)
while records flow, with new keys after it. Checked: every key's count
equals what was sent (state kept across the expansion, nothing lost or
counted twice), every key on one partition of every topic, keys seen before
the expansion where Kafka's default partitioner put them over 4 partitions,
keys first seen after it over 8 (so the new partitions get some of them),
the internal topics at 8, the callback once and recorded done; then a new
instance with an empty map (read from the topic at start-up) keeps every
key where it was.

Skipped on Tansu (no CreatePartitions).
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, Message, Producer
from confluent_kafka.admin import AdminClient, NewPartitions

from runtime import App, AppState, FirstSeenPartitioner, StreamsBuilder, Topology, serdes
from runtime.partitioning.default import default_partition
from runtime.partitioning.expansion_marker import done_topic, marker_topic
from tests.apps.expansion_app import fold
from tests.configs import app_config
from tests.kafka_helpers import Msg, consume_all, create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration

OLD_KEYS = [f"k{i}" for i in range(24)]


def new_keys() -> list[str]:
    """Keys first fed after the expansion whose input partition is one of the
    new ones (so the app meets them only once it accepted 8), chosen so
    that their `g-` keys cover each new partition of the repartition topic."""
    chosen: list[str] = []
    covered: dict[int, int] = {}
    i = 0
    while any(covered.get(p, 0) < 2 for p in range(4, 8)):
        key = f"n{i}"
        i += 1
        target = default_partition(f"g-{key}".encode(), 8)
        if default_partition(key.encode(), 8) >= 4 and covered.get(target, 0) < 2:
            chosen.append(key)
            covered[target] = covered.get(target, 0) + 1
    return chosen + [f"m{i}" for i in range(8)]  # and some anywhere


NEW_KEYS = new_keys()


@pytest.fixture(autouse=True)
def _kafka_only(on_kafka: bool) -> None:
    if not on_kafka:
        pytest.skip("partition expansion needs CreatePartitions (Tansu has none)")


def build(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(lambda key, value: f"g-{key}", key_serde=serdes.STRING, name="regroup")
        .aggregate(
            lambda: {"seq": 0, "count": 0, "replays": 0},
            fold,
            store="counts",
            value_serde=serdes.JSON,
        )
        .to_stream()
        .to(sink, value_serde=serdes.JSON)
    )
    return builder.build()


class Feeder(threading.Thread):
    """Per-key sequence numbers at about `rate` records/s, each key on the
    partition the feeder's own FirstSeenPartitioner gives it for `count`."""

    def __init__(self, bootstrap: str, app_id: str, topic: str, rate: float) -> None:
        super().__init__(name="first-seen-feeder", daemon=True)
        self.topic, self.rate, self.count = topic, rate, 4
        self.partitioner = FirstSeenPartitioner()
        self.partitioner.open(app_id, {"bootstrap.servers": bootstrap})
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5}
        )
        self.sent: dict[str, int] = {}
        self.errors: list[str] = []
        self.keys = list(OLD_KEYS)
        self._halt = threading.Event()

    def grown(self) -> None:
        """After the topic grew: a producer refuses partitions it has not seen."""
        wait_until(
            lambda: (
                len(self.producer.list_topics(self.topic, 10).topics[self.topic].partitions) == 8
            ),
            30,
            message="the feeder's producer never saw 8 partitions",
        )
        self.count = 8
        self.keys = OLD_KEYS + NEW_KEYS

    def run(self) -> None:
        started, produced = time.monotonic(), 0
        try:
            while not self._halt.is_set():
                for key in self.keys:
                    seq = self.sent.get(key, 0) + 1
                    partition = self.partitioner.static_partition(self.topic, key, self.count)
                    self.producer.produce(
                        self.topic, str(seq).encode(), key.encode(), partition, self._report
                    )
                    self.sent[key] = seq
                    produced += 1
                self.producer.poll(0)
                ahead = produced / self.rate - (time.monotonic() - started)
                if ahead > 0:
                    self._halt.wait(ahead)
        except Exception as exc:
            self.errors.append(f"{type(exc).__name__}: {exc}")
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


def grow(bootstrap: str, *topics: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for topic in topics:
        admin.create_partitions([NewPartitions(topic, 8)])[topic].result(30)
        wait_until(
            lambda t=topic: counts(bootstrap, t)[t] == 8,  # type: ignore[misc]
            30,
            message=f"{topic} never showed 8 partitions",
        )


def counts(bootstrap: str, *topics: str) -> dict[str, int]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30)
    return {t: len(metadata.topics[t].partitions) for t in topics if t in metadata.topics}


def config(
    bootstrap: str, app_id: str, state_dir: Path, partitioner: Any, guarantee: str = "at_least_once"
) -> dict[str, Any]:
    return app_config(
        bootstrap,
        app_id,
        state_dir,
        guarantee=guarantee,
        **{"partition.check.interval.ms": 500, "static.partitioner": partitioner},
    )


def settled_output(bootstrap: str, sink: str, sent: dict[str, int], app: App) -> list[Msg]:
    """The output once every `g-` key's latest value reached what was sent."""
    records: list[Msg] = []

    def complete() -> bool:
        assert app.state is not AppState.ERROR, repr(app.failure)
        records[:] = consume_all(bootstrap, sink, timeout=30)
        latest = {}
        for m in records:
            assert m.key is not None and m.value is not None
            latest[m.key.decode()] = json.loads(m.value)
        return all(latest.get(f"g-{k}", {}).get("seq") == n for k, n in sent.items())

    wait_until(complete, 90, interval=0.5, message="the counts did not reach what was sent")
    return records


def partitions_by_key(records: list[Msg]) -> dict[str, set[int]]:
    out: dict[str, set[int]] = {}
    for m in records:
        assert m.key is not None
        out.setdefault(m.key.decode(), set()).add(m.partition)
    return out


def check(records: list[Msg], sent: dict[str, int], exactly_once: bool) -> dict[str, int]:
    """Exact counts; each `g-` key on one partition; old keys where murmur2
    over 4 put them, new ones where murmur2 over 8 does. Returns the map."""
    latest: dict[str, dict[str, int]] = {}
    for m in records:
        assert m.key is not None and m.value is not None
        latest[m.key.decode()] = json.loads(m.value)
    for key, n in sent.items():
        assert latest[f"g-{key}"]["count"] == n, f"g-{key}: counted {latest[f'g-{key}']}, sent {n}"
        if exactly_once:
            assert latest[f"g-{key}"]["replays"] == 0, f"g-{key} processed twice"
    placed = partitions_by_key(records)
    moved = {k: p for k, p in placed.items() if len(p) > 1}
    assert not moved, f"keys on two output partitions: {moved}"
    where = {k: next(iter(p)) for k, p in placed.items()}
    for key in OLD_KEYS:
        assert where[f"g-{key}"] == default_partition(f"g-{key}".encode(), 4), key
    for key in NEW_KEYS[:-8]:  # met only after the app accepted 8 partitions
        assert where[f"g-{key}"] == default_partition(f"g-{key}".encode(), 8), key
    return where


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_first_seen_keys_keep_their_partition_and_new_keys_reach_new_partitions(
    bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    source, sink, app_id = unique_name("fs-in"), unique_name("fs-out"), unique_name("first-seen")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    feeder = Feeder(bootstrap, app_id, source, rate=400)
    partitioner = FirstSeenPartitioner()
    app = App(build(source, sink), config(bootstrap, app_id, tmp_path, partitioner, guarantee))
    states: list[AppState] = []
    app.set_state_listener(lambda new, old: states.append(new))
    app.start()
    try:
        feeder.start()
        wait_until(lambda: app.status().processed > 600, 60, message="no processing")
        grow(bootstrap, sink, source)  # output topic first
        feeder.grown()
        new_tasks = {f"{s}_{p}" for s in (0, 1) for p in range(4, 8)}
        wait_until(
            lambda: sum(t.processed for t in app.status().tasks if t.id in new_tasks) > 0,
            60,
            message="no new task processed anything",
        )
        sent_then = sum(feeder.sent.values())
        wait_until(lambda: sum(feeder.sent.values()) > sent_then + 600, 30, message="feeder")
        sent = feeder.stop()
        records = settled_output(bootstrap, sink, sent, app)
        status = app.status()
        assert status.partition_expansions == 1
        # 8 new tasks; a task re-created here (a rewind under exactly_once_v2,
        # a rebalance) counts again: 12 was seen once.
        assert status.tasks_created_by_expansion >= 8
        repartition = f"{app_id}-regroup-repartition"
        changelog = f"{app_id}-counts-changelog"
        assert counts(bootstrap, repartition, changelog) == {repartition: 8, changelog: 8}
        figures = partitioner.figures()
    finally:
        feeder._halt.set()
        closed = app.close(30)
    assert closed and app.state is AppState.NOT_RUNNING
    assert AppState.ERROR not in states and AppState.PENDING_ERROR not in states
    exactly_once = guarantee == "exactly_once_v2"
    where = check(records, sent, exactly_once)
    assert {where[f"g-{k}"] for k in NEW_KEYS} >= {4, 5, 6, 7}, "no new key on a new partition"
    # The repartition topic holds every key on the same one partition.
    on_repartition = partitions_by_key(consume_all(bootstrap, repartition, timeout=30))
    assert {k: next(iter(p)) for k, p in on_repartition.items()} == where
    assert all(len(p) == 1 for p in on_repartition.values())
    # One map: the feeder's input keys and the app's `g-` keys.
    assert figures["keys"] == 2 * len(sent), figures
    assert partitioner.expansions == [(4, 8)], "the expansion callback runs once"
    marker = marker_topic(app_id, [(source, 4, 8)])
    wait_until(
        lambda: set(counts(bootstrap, marker, done_topic(marker))) == {marker, done_topic(marker)},
        10,
        message="the callback was not recorded done",
    )

    # A new instance with an empty map reads it at start-up: every key stays.
    again = FirstSeenPartitioner()
    app2 = App(build(source, sink), config(bootstrap, app_id, tmp_path / "b", again, guarantee))
    app2.start()
    feeder2 = Feeder(bootstrap, app_id, source, rate=400)
    feeder2.count, feeder2.keys, feeder2.sent = 8, OLD_KEYS + NEW_KEYS, dict(sent)
    try:
        assert again.figures()["keys"] == 2 * len(sent)  # read before any record
        feeder2.start()
        sent_before = sum(sent.values())
        wait_until(lambda: sum(feeder2.sent.values()) > sent_before + 300, 30, message="feeder")
        sent2 = feeder2.stop()
        records2 = settled_output(bootstrap, sink, sent2, app2)
        assert again.figures()["claims_sent"] == 0, "a known key was claimed again"
    finally:
        feeder2._halt.set()
        assert app2.close(30)
        feeder.partitioner.close()
        feeder2.partitioner.close()
    assert check(records2, sent2, exactly_once) == where


def test_two_instances_meeting_the_same_new_keys_agree(bootstrap: str, tmp_path: Path) -> None:
    """Each group key is made from records on every input partition, so both
    instances meet it at about the same time, around an expansion (one may
    have accepted 8 partitions while the other still writes with 4)."""
    source, sink, app_id = unique_name("fs2-in"), unique_name("fs2-out"), unique_name("first-seen2")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(
            lambda key, value: "g-" + key.split("/")[0], key_serde=serdes.STRING, name="regroup"
        )
        .count(store="counts")
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    topology = builder.build()
    partitioners = [FirstSeenPartitioner(), FirstSeenPartitioner()]
    apps = [
        App(topology, config(bootstrap, app_id, tmp_path / str(n), partitioners[n]))
        for n in range(2)
    ]
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    halt = threading.Event()
    partition_count = [4]
    rounds = [0]  # group keys fed so far

    def feed() -> None:
        while not halt.is_set():
            for j in range(partition_count[0]):  # one record per partition per group key
                producer.produce(source, b"v", f"u{rounds[0]}/{j}".encode(), j)
            producer.poll(0)
            rounds[0] += 1
            halt.wait(0.02)
        producer.flush(30)

    def feed_more(n: int) -> None:
        target = rounds[0] + n
        wait_until(lambda: rounds[0] >= target, 30, message="the feeder stalled")

    feeder = threading.Thread(target=feed, daemon=True)
    for app in apps:
        app.start()
    try:
        wait_until(
            lambda: (
                sum(len(a.status().tasks) for a in apps) == 8
                and all(a.status().tasks for a in apps)
            ),
            60,
            message="the two instances never shared the 8 tasks",
        )
        feeder.start()
        feed_more(100)  # group keys met before the expansion
        grow(bootstrap, sink, source)
        wait_until(
            lambda: len(producer.list_topics(source, 10).topics[source].partitions) == 8,
            30,
            message="the feeder never saw 8 partitions",
        )
        partition_count[0] = 8
        wait_until(
            lambda: all(a.status().partitions[source] == 8 for a in apps),
            60,
            message="not both instances accepted 8 partitions: "
            + repr([(a.state, a.failure, a.status().expansion_waiting_for) for a in apps]),
        )
        feed_more(100)  # group keys met after it
        halt.set()
        feeder.join(30)
        for app in apps:
            assert app.state in (AppState.RUNNING, AppState.REBALANCING), repr(app.failure)
    finally:
        halt.set()
        closed = [app.close(30) for app in apps]
    assert all(closed)
    repartition = f"{app_id}-regroup-repartition"
    placed = partitions_by_key(consume_all(bootstrap, repartition, timeout=30))
    placed.update(
        {
            k: p | placed.get(k, set())
            for k, p in partitions_by_key(consume_all(bootstrap, sink)).items()
        }
    )
    split = {k: p for k, p in placed.items() if len(p) > 1}
    assert not split, f"group keys on two partitions: {split}"
    assert len(placed) > 100
    assert max(p for ps in placed.values() for p in ps) >= 4, "no key on a new partition"
    figures = [p.figures() for p in partitioners]
    print(
        f"{len(placed)} group keys; claims sent {[f['claims_sent'] for f in figures]}, "
        f"lost races {[f['claims_lost'] for f in figures]}"
    )


def test_the_producer_learns_a_partition_added_since_it_last_looked(bootstrap: str) -> None:
    """What a sink's proven partition needs on an instance that has not
    accepted the expansion yet: librdkafka refuses a partition missing from
    its metadata at produce() (`_UNKNOWN_PARTITION`); the output channel asks
    the cluster once and produces it."""
    from runtime.collector.collector import RecordCollector
    from runtime.collector.output import OutputChannel
    from runtime.config import StreamsConfig

    topic = unique_name("fs-unseen")
    create_topic(bootstrap, topic, 4)
    output = OutputChannel(
        StreamsConfig.from_dict({"application.id": "unseen", "bootstrap.servers": bootstrap}),
        RecordCollector(),
        None,
        on_client_error=lambda err: None,
        on_stall=lambda n: None,
    )
    output.send([(topic, 1, b"k", b"before", 0, None, "in", 0, 0)])
    output.flush(lambda: False)
    grow(bootstrap, topic)
    output.send([(topic, 6, b"k", b"after", 0, None, "in", 0, 1)])
    output.flush(lambda: False)
    assert output.error_counts.by_error == {}  # log_and_fail would have raised anyway
    placed = [(m.partition, m.value) for m in consume_all(bootstrap, topic)]
    assert sorted(placed) == [(1, b"before"), (6, b"after")]
