"""Key-parallel processing on the real broker: one partition, 1,000 keys, ~1 ms
per record, 8 threads sharing the one task (`num.threads.per.task=8`).

Checked: per-key sequence numbers strictly increase in the output, nothing is
lost, the stateful per-key count equals the truth, and under exactly_once_v2
the same holds through SIGKILLs (exactly once in read_committed output).
"""

from __future__ import annotations

import random
import signal
import time
from collections import Counter
from pathlib import Path

import pytest

from runtime import App, serdes
from tests.apps.keypar_app import Overlap, build
from tests.configs import app_config
from tests.harness import Daemon, Feeder, TopicReader, clean_env
from tests.kafka_helpers import Msg, consume_all, create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration

KEYS = 1000
APP = "tests.apps.keypar_app:topology"


class Topics:
    def __init__(self, bootstrap: str) -> None:
        self.input, self.output, self.counts = (
            unique_name(n) for n in ("kpin", "kpout", "kpcount")
        )
        for topic in (self.input, self.output, self.counts):
            create_topic(bootstrap, topic, 1)

    def env(self) -> dict[str, str]:
        return clean_env(
            STREAMS_TEST_INPUT=self.input,
            STREAMS_TEST_OUTPUT=self.output,
            STREAMS_TEST_COUNTS=self.counts,
        )


def key_parallel_config(bootstrap: str, app_id: str, state_dir: Path) -> dict[str, object]:
    return app_config(
        bootstrap,
        app_id,
        state_dir,
        threads=8,
        commit_ms=None,
        session_ms=3000,
        **{"num.threads.per.task": 8},
    )


def check_output(output: list[Msg], counts: list[Msg], total: int) -> None:
    """Every sequence number once; per key they strictly increase in output
    order; the latest count per key is the truth."""
    by_key: dict[str, list[int]] = {}
    for m in sorted(output, key=lambda m: m.offset):
        by_key.setdefault(m.key.decode(), []).append(int(m.value))
    values = [v for seq in by_key.values() for v in seq]
    duplicates = [v for v, n in Counter(values).items() if n > 1]
    assert not duplicates, f"{len(duplicates)} duplicated, e.g. {duplicates[:5]}"
    assert set(values) == set(range(total)), (
        f"missing {sorted(set(range(total)) - set(values))[:5]}"
    )
    for key, seq in by_key.items():
        assert all(a < b for a, b in zip(seq, seq[1:], strict=False)), f"{key}: {seq[:20]}"
    latest: dict[str, int] = {}
    for m in sorted(counts, key=lambda m: m.offset):
        latest[m.key.decode()] = serdes.INT64.deserialize(m.value)
    truth = Counter(f"k{i % KEYS}" for i in range(total))
    assert latest == dict(truth)


def test_one_partition_eight_threads_keep_key_order_and_true_counts(
    bootstrap: str, tmp_path: Path
) -> None:
    topics = Topics(bootstrap)
    total = 6000
    produce(bootstrap, topics.input, [(f"k{i % KEYS}", str(i)) for i in range(total)])
    config = key_parallel_config(bootstrap, unique_name("keypar"), tmp_path)
    config["commit.interval.ms"] = 500
    Overlap.reset()
    app = App(build(topics.input, topics.output, topics.counts), config)
    app.start()
    most_parallel = 0.0
    try:

        def all_processed() -> bool:
            nonlocal most_parallel
            status = app.status()
            for task in status.tasks:
                if task.key_parallel:
                    most_parallel = max(most_parallel, task.parallelism)
            return status.processed >= total

        started = time.monotonic()
        wait_until(all_processed, 120, interval=0.2, message="not all processed")
        elapsed = time.monotonic() - started
        status = app.status()
        (task,) = status.tasks
        assert task.key_parallel and task.threads_per_task == 8
        output = consume_all(bootstrap, topics.output, expected=total, timeout=60)
        wait_until(lambda: app.status().commits > 0, 30, message="no commit")
        assert app.close(30)
        counts = consume_all(bootstrap, topics.counts, idle=1.0)
        check_output(output, counts, total)
        # Records of the one task ran on several threads at once (speed itself is the
        # benchmark's business: `./dev bench compare --models runtime,keypar`).
        print(
            f"key-parallel: {total} records in {elapsed:.1f} s, up to {Overlap.most} at once, "
            f"status parallelism up to {most_parallel}"
        )
        assert Overlap.most >= 2, "records of one partition never ran on two threads at once"
        assert most_parallel > 0
    finally:
        app.close(30)


KILLS = 3


def test_exactly_once_through_sigkills_with_eight_threads_on_one_partition(
    bootstrap: str, tmp_path: Path, on_kafka: bool
) -> None:
    if not on_kafka:
        pytest.skip("exactly-once after a crash needs a broker that aborts the dead transaction")
    topics = Topics(bootstrap)
    app_id = unique_name("keypar-eos")
    sets = key_parallel_config(bootstrap, app_id, tmp_path / "state")
    sets["processing.guarantee"] = "exactly_once_v2"
    sets["commit.interval.ms"] = 200
    feeder = Feeder(bootstrap, topics.input, rate=600, keys=KEYS)
    feeder.start()
    reader = TopicReader(bootstrap, topics.output, 1)  # read_committed
    rng = random.Random(14)
    daemons: list[Daemon] = []

    def start(n: int) -> Daemon:
        daemon = Daemon(tmp_path / f"daemon-{n}.log", APP, sets, topics.env()).start()
        daemons.append(daemon)
        return daemon

    def committed_beyond(first_new: int, daemon: Daemon) -> bool:
        daemon.assert_alive()
        reader.poll()
        return any(int(m.value) >= first_new for m in reader.msgs[-3000:] if m.value)

    try:
        for n in range(KILLS):
            first_new = feeder.sent
            daemon = start(n)
            wait_until(
                lambda d=daemon, f=first_new: committed_beyond(f, d),
                90,
                message=f"daemon {n} committed no transaction",
            )
            time.sleep(rng.uniform(0.2, 1.0))  # a random moment, not a wait for a condition
            daemon.assert_alive()
            daemon.send(signal.SIGKILL)
            assert daemon.wait(10) is not None
        final = start(KILLS)
        first_new = feeder.sent
        wait_until(lambda: committed_beyond(first_new, final), 90, message="final daemon idle")
        feeder.stop()
        total = feeder.sent
        output = consume_all(bootstrap, topics.output, expected=total, timeout=120, idle=2.0)
        counts = consume_all(bootstrap, topics.counts, idle=1.0)
        check_output(output, counts, total)
        final.assert_alive()
        final.send(signal.SIGTERM)
        assert final.wait(30) == 0
        print(f"key-parallel EOS: {KILLS} kills, {total} records exactly once")
    finally:
        feeder._halt.set()
        reader.close()
        for daemon in daemons:
            daemon.kill()
        for daemon in daemons[-2:]:
            print(f"--- {daemon.log_path.name} ---\n{daemon.tail(3000)}")
