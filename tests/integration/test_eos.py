"""exactly_once_v2: exactly-once output and state through crashes, rebalances
and failed transactions, checked with read_committed consumers."""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from runtime import App, AppState, StreamsBuilder, serdes
from runtime.brokers import Broker
from tests.configs import app_config
from tests.harness import Daemon, Feeder, TopicReader
from tests.harness import clean_env as _clean_env
from tests.kafka_helpers import (
    broker_filters_aborted_transactions,
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

EOS_APP = "tests.apps.eos_app:topology"


def eos_config(bootstrap: str, app_id: str, state_dir: Path) -> dict[str, object]:
    return app_config(bootstrap, app_id, state_dir, commit_ms=None, guarantee="exactly_once_v2")


class Topics:
    def __init__(self, bootstrap: str, partitions: int = 4) -> None:
        self.input, self.output, self.counts = (unique_name(n) for n in ("in", "out", "counts"))
        for topic in (self.input, self.output, self.counts):
            create_topic(bootstrap, topic, partitions)

    def env(self) -> dict[str, str]:
        return _clean_env(
            STREAMS_TEST_INPUT=self.input,
            STREAMS_TEST_OUTPUT=self.output,
            STREAMS_TEST_COUNTS=self.counts,
        )


@pytest.fixture(scope="module")
def aborts_filtered(bootstrap: str, on_kafka: bool) -> bool:
    """True on Kafka. False on the Tansu development broker: its read_committed
    consumers see the records of aborted transactions (and of transactions a
    crashed producer left open), so exactly-once output cannot be observed
    there after an abort. The tests below then check what such a broker
    allows (nothing lost, counts never below the truth) and say so. On Kafka
    the probe is not consulted: exactly-once must hold there, strictly."""
    return on_kafka or broker_filters_aborted_transactions(bootstrap)


def exactly_once_checks(
    bootstrap: str, topics: Topics, total: int, keys: int, strict: bool = True
) -> None:
    """Every input record once in the output; final counts are the true counts.

    The truth is what the input topic holds, read back: sequence numbers
    0..total-1, each once unless the feeding producer wrote one twice. That
    can happen on Kafka when an input partition's leader dies (librdkafka#4953:
    an idempotent producer's epoch bump re-sends a batch the old leader had
    written), and exactly-once then means those records twice in the output
    too.

    With `strict=False` (a broker that shows aborted records), only: every
    input record at least once, and counts at least the true counts.
    """
    source = [int(m.value) for m in consume_all(bootstrap, topics.input, expected=total, idle=1.0)]
    assert set(source) == set(range(total)), "the feeder's input is incomplete"
    fed = Counter(source)
    fed_twice = sum(n - 1 for n in fed.values())
    if fed_twice:
        print(f"the input holds {fed_twice} records twice (its producer's duplicates)")
    output = consume_all(
        bootstrap,
        topics.output,
        expected=None if not strict else len(source),
        timeout=120,
        idle=2.0,
    )
    values = Counter(int(m.value) for m in output)
    true_counts = Counter(f"k{i % keys}" for i in source)
    latest: dict[str, int] = {}
    for m in sorted(consume_all(bootstrap, topics.counts, idle=1.0), key=lambda m: m.offset):
        latest[m.key.decode()] = serdes.INT64.deserialize(m.value)
    if strict:
        extra = sorted((values - fed).elements())
        missing = sorted((fed - values).elements())
        if extra:
            # Where each copy of the first duplicates sits (output partition, offset):
            # adjacent copies point at one transaction written twice, distant ones
            # at input processed again after a rewind.
            copies = {v: [(m.partition, m.offset) for m in output if int(m.value) == v]
                      for v in extra[:5]}  # fmt: skip
            # The uncommitted view adds the copies in aborted transactions, and
            # the offsets it skips between two committed records are markers.
            raw = consume_all(bootstrap, topics.output, isolation="read_uncommitted", idle=1.0)
            raw_copies = {v: [(m.partition, m.offset) for m in raw if int(m.value) == v]
                          for v in extra[:5]}  # fmt: skip
            raise AssertionError(
                f"{len(extra)} output records more than the input holds, e.g. {extra[:5]}; "
                f"their copies at (partition, offset): {copies}; with aborted ones: {raw_copies}"
            )
        assert not missing, (
            f"{len(missing)} input records missing in the output, e.g. {missing[:5]}"
        )
        assert latest == dict(true_counts)
    else:
        print(
            f"broker shows aborted records: {values.total() - len(source)} duplicate outputs seen"
        )
        assert set(values) == set(fed)
        assert set(latest) == set(true_counts)
        assert all(latest[k] >= n for k, n in true_counts.items()), latest


def test_exactly_once_pass_through_and_count_in_process(bootstrap: str, tmp_path: Path) -> None:
    topics = Topics(bootstrap)
    total, keys = 3000, 30
    produce(bootstrap, topics.input, [(f"k{i % keys}", str(i)) for i in range(total)])
    builder = StreamsBuilder()
    stream = builder.stream(topics.input, key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.to(topics.output)
    stream.group_by_key().count(store="counts").to_stream().to(
        topics.counts, value_serde=serdes.INT64
    )
    app = App(builder.build(), eos_config(bootstrap, unique_name("eos"), tmp_path))
    app.start()
    try:
        exactly_once_checks(bootstrap, topics, total, keys)
        status = app.status()
        assert status["transactions_committed"] > 0
        assert status["transactions_aborted"] == 0
    finally:
        assert app.close(30)


CHAOS_KILLS = 20


def test_slow_chaos_kill_9_twenty_times_gives_exactly_once_output_and_counts(
    bootstrap: str, tmp_path: Path, aborts_filtered: bool
) -> None:
    """20 SIGKILLs of the daemon at random moments, each restart on the same state.

    The slowest test of the module (about 3 min here): every round is a process
    start, a group join and at least one committed transaction before the kill.
    """
    if not aborts_filtered:
        # Measured on Tansu 0.6.0: a producer killed inside a transaction
        # leaves it open (InitProducerId with the same transactional.id does
        # not abort it), its records later show to read_committed readers,
        # and the group's pending transactional offsets can stall the next
        # member's offset fetch. Exactly-once after a crash needs a broker
        # that completes or aborts those transactions, as Kafka does.
        pytest.skip("the broker does not abort/filter a crashed producer's transaction")
    topics = Topics(bootstrap)
    app_id = unique_name("chaos")
    keys = 40
    # Input flows until the last daemon runs: with a fixed amount the feed could end
    # before the last kills (a daemon then had nothing left to process).
    feeder = Feeder(bootstrap, topics.input, rate=400, keys=keys)
    feeder.start()
    reader = TopicReader(bootstrap, topics.output, 4)  # read_committed
    rng = random.Random(20261123)
    state_dir = tmp_path / "state"
    sets = eos_config(bootstrap, app_id, state_dir)
    # A killed member leaves the classic group only when its session expires; the
    # next daemon's join waits for that. 3 s (the broker allows 1 s) keeps rounds short.
    sets["consumer.session.timeout.ms"] = 3000
    sets["commit.interval.ms"] = 200
    daemons: list[Daemon] = []

    def start(n: int) -> Daemon:
        daemon = Daemon(tmp_path / f"daemon-{n}.log", EOS_APP, sets, topics.env()).start()
        daemons.append(daemon)
        return daemon

    def committed_beyond(first_new: int, daemon: Daemon) -> bool:
        daemon.assert_alive()
        reader.poll()
        return any(int(m.value) >= first_new for m in reader.msgs[-2000:] if m.value)

    started = time.monotonic()
    try:
        for n in range(CHAOS_KILLS):
            # Records from here on were produced after the last kill: committed output
            # holding one of them proves this daemon committed a transaction.
            first_new = feeder.sent
            daemon = start(n)
            wait_until(
                lambda d=daemon, f=first_new: committed_beyond(f, d),
                90,
                message=f"daemon {n} committed no transaction",
            )
            time.sleep(rng.uniform(0.0, 1.0))  # a random moment, not a wait for a condition
            daemon.assert_alive()
            daemon.send(signal.SIGKILL)
            assert daemon.wait(10) is not None
        kills_s = time.monotonic() - started
        final = start(CHAOS_KILLS)
        first_new = feeder.sent
        wait_until(lambda: committed_beyond(first_new, final), 90, message="final daemon idle")
        feeder.stop()
        total = feeder.sent
        exactly_once_checks(bootstrap, topics, total, keys)
        final.assert_alive()
        final.send(signal.SIGTERM)
        assert final.wait(30) == 0
        print(f"chaos: {CHAOS_KILLS} kills in {kills_s:.0f} s, {total} records exactly once")
    finally:
        feeder._halt.set()  # if the test failed before stop(): no input after it
        reader.close()
        for daemon in daemons:
            daemon.kill()
        for daemon in daemons[-2:]:
            print(f"--- {daemon.log_path.name} ---\n{daemon.tail(3000)}")


GROUP_PROTOCOLS = ["classic", "consumer"]


@pytest.mark.parametrize("protocol", GROUP_PROTOCOLS)
def test_second_instance_joins_and_leaves_under_eos(
    bootstrap: str, tmp_path: Path, on_kafka: bool, protocol: str
) -> None:
    if protocol == "consumer" and not on_kafka:
        pytest.skip("KIP-848 (group.protocol=consumer) needs Apache Kafka 4.x")
    topics = Topics(bootstrap)
    app_id = unique_name("eosjoin")
    total, keys = 6000, 40
    feeder = Feeder(bootstrap, topics.input, total, rate=500, keys=keys)
    feeder.start()

    def config(state: str) -> dict[str, object]:
        sets = eos_config(bootstrap, app_id, tmp_path / state)
        sets["consumer.group.protocol"] = protocol
        return sets

    first = Daemon(tmp_path / "first.log", EOS_APP, config("a"), topics.env()).start()
    second = Daemon(tmp_path / "second.log", EOS_APP, config("b"), topics.env())
    reader = TopicReader(bootstrap, topics.output, 4)
    try:
        wait_until(lambda: reader.poll() >= 0 and len(reader.msgs) > 500, 60, message="no output")
        second.start()
        # The second instance must really join (and take tasks) before it leaves.
        wait_until(
            lambda: '"partitions_assigned"' in second.tail(200_000),
            90,
            message="the second instance never got partitions",
        )
        joined_at = len(reader.msgs)
        wait_until(
            lambda: reader.poll() >= 0 and len(reader.msgs) > max(3000, joined_at + 500),
            90,
            message="stalled",
        )
        second.send(signal.SIGTERM)
        assert second.wait(30) == 0
        feeder.join(120)
        # A clean join and leave commits before partitions move: no abort,
        # so exactly-once holds even where aborted records would show.
        exactly_once_checks(bootstrap, topics, total, keys)
        first.assert_alive()
    finally:
        reader.close()
        first.kill()
        second.kill()
        print(f"--- first ---\n{first.tail(3000)}\n--- second ---\n{second.tail(3000)}")


def test_failed_transaction_is_aborted_rewound_and_recovered(
    fresh_broker_not_self_fenced: Broker, on_kafka: bool, tmp_path: Path
) -> None:
    """A commit attempted while the broker is paused fails; the runtime aborts,
    rewinds, and the output is still exactly once.

    The broker must not fence itself over the pause (see the fixture): when it
    did, 2 runs in 78 here left the rolled-back transaction's records without
    abort markers (the broker logged that it skipped them), and the next commit
    committed them: duplicates no client can prevent."""
    broker = fresh_broker_not_self_fenced
    bootstrap = broker.bootstrap
    topics = Topics(bootstrap, partitions=2)
    total, keys = 3000, 20
    feeder = Feeder(bootstrap, topics.input, total, rate=300, keys=keys)
    builder = StreamsBuilder()
    stream = builder.stream(topics.input, key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.to(topics.output)
    stream.group_by_key().count(store="counts").to_stream().to(
        topics.counts, value_serde=serdes.INT64
    )
    config = eos_config(bootstrap, unique_name("eosfail"), tmp_path)
    config["producer.transaction.timeout.ms"] = 5000
    app = App(builder.build(), config)
    app.start()
    feeder.start()
    try:
        wait_until(lambda: app.status()["transactions_committed"] > 5, 60, message="no txn")
        broker.pause()
        try:
            time.sleep(12)  # the outage itself: longer than the transaction timeout
        finally:
            broker.resume()
            committed_at_resume = app.status()["transactions_committed"]
        feeder.join(120)
        # Commits run one after another on the polling thread: once one
        # succeeds after the outage, the failed one has been aborted (and
        # counted). Reading the count earlier raced with a slow abort.
        wait_until(
            lambda: app.status()["transactions_committed"] > committed_at_resume,
            120,
            message="no transaction committed after the outage",
        )
        aborted = app.status()["transactions_aborted"]
        # Then until every input record is consumed and a few more
        # transactions committed: the output is complete before it is read
        # (after the outage the group may still be rejoining).
        wait_until(lambda: app.status()["total_lag"] == 0, 120, message="input not consumed")
        done_at = app.status()["transactions_committed"]
        wait_until(
            lambda: app.status()["transactions_committed"] >= done_at + 3,
            60,
            message="no commits after the input was consumed",
        )
        strict = on_kafka or broker_filters_aborted_transactions(bootstrap)
        exactly_once_checks(bootstrap, topics, total, keys, strict=strict or aborted == 0)
        assert app.state in (AppState.RUNNING, AppState.REBALANCING)
    finally:
        app.close(30)


def test_fenced_producer_is_aborted_rewound_and_recreated(
    bootstrap: str, on_kafka: bool, tmp_path: Path
) -> None:
    """Another producer initialises the runtime's transactional.id mid-stream: the
    runtime's producer is fenced; the runtime aborts, rewinds every task, makes a
    new producer (which fences the intruder in turn) and the output stays exactly once."""
    if not on_kafka:
        pytest.skip("fencing by transactional.id is checked on Apache Kafka")
    topics = Topics(bootstrap, partitions=2)
    total, keys = 4000, 20
    feeder = Feeder(bootstrap, topics.input, total, rate=400, keys=keys)
    builder = StreamsBuilder()
    stream = builder.stream(topics.input, key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.to(topics.output)
    stream.group_by_key().count(store="counts").to_stream().to(
        topics.counts, value_serde=serdes.INT64
    )
    app_id = unique_name("eosfence")
    config = eos_config(bootstrap, app_id, tmp_path)
    config["commit.interval.ms"] = 300
    app = App(builder.build(), config)
    app.start()
    feeder.start()
    intruder: Producer | None = None
    try:
        wait_until(lambda: app.status()["transactions_committed"] > 3, 60, message="no txn")
        transactional_id = (tmp_path / app_id / ".transactional-id").read_text().strip()
        intruder = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
        # InitProducerId bumps the epoch: the runtime's producer is fenced from here on.
        intruder.init_transactions(30)
        wait_until(
            lambda: app.status()["transactions_aborted"] >= 1,
            60,
            message="the fenced transaction was never aborted",
        )
        aborted_at = app.status()["transactions_committed"]
        wait_until(
            lambda: app.status()["transactions_committed"] > aborted_at + 2,
            60,
            message="no transaction committed with the new producer",
        )
        feeder.join(120)
        wait_until(lambda: app.status()["total_lag"] == 0, 120, message="input not consumed")
        done_at = app.status()["transactions_committed"]
        wait_until(
            lambda: app.status()["transactions_committed"] >= done_at + 2,
            60,
            message="no commits after the input was consumed",
        )
        exactly_once_checks(bootstrap, topics, total, keys)
        assert app.state in (AppState.RUNNING, AppState.REBALANCING), repr(app.failure)
    finally:
        feeder._halt.set()
        app.close(30)
