"""The windowed stream-stream join under exactly_once_v2, through SIGKILLs.

Pairs of records (`L:<n>`, `R:<n>`, same key, same event time; sequences
250 ms apart, so each left record meets exactly its own right record in the
100 ms window) are fed while the daemon is killed at random moments and
restarted on the same state (`tests/apps/ss_join_app.py`). The join keeps
both sides in window stores (change-logged) and emits when the second of a
pair arrives; a crash between a store write, its changelog record and the
output must leave no trace in the committed output: every pair fed is joined
exactly once (read_committed), nothing else comes out.
"""

from __future__ import annotations

import contextlib
import random
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from confluent_kafka import Producer

from tests.configs import app_config
from tests.harness import Daemon, kill_rounds
from tests.harness import clean_env as _clean_env
from tests.kafka_helpers import consume_all, create_topic, unique_name, wait_until

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

APP = "tests.apps.ss_join_app:topology"
KEYS = 10
KILLS = 3
# Event time: pairs STEP_MS apart from three hours ago. Not a fixed date: the
# broker's time retention (7 days) deleted a 2023-stamped input and output
# from under a CI run ("offset out of range", the first pairs missing); and
# no later than now, which the broker caps (message.timestamp.after.max.ms):
# 200 pairs a second for ten minutes stay in the past.
STEP_MS = 250
BASE_MS = int(time.time() * 1000) - 3 * 3600 * 1000


class PairFeeder(threading.Thread):
    """Writes `L:<n>` then `R:<n>` for n = 0, 1, ... until stopped."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        super().__init__(name="ss-feeder", daemon=True)
        # murmur2 like Java clients: the key's partition is the task's.
        self.producer = Producer(
            {"bootstrap.servers": bootstrap, "enable.idempotence": True, "partitioner": "murmur2"}
        )
        self.topic = topic
        self.pairs = 0
        self._halt = threading.Event()

    def run(self) -> None:
        while not self._halt.is_set():
            for _ in range(20):
                n = self.pairs
                key = f"k{n % KEYS}".encode()
                for side in ("L", "R"):
                    self.producer.produce(
                        self.topic,
                        key=key,
                        value=f"{side}:{n}".encode(),
                        timestamp=BASE_MS + n * STEP_MS,
                    )
                self.pairs += 1
            self.producer.poll(0)
            time.sleep(0.1)  # about 200 pairs a second
        assert self.producer.flush(60) == 0

    def stop(self) -> None:
        self._halt.set()
        self.join(90)


def test_stream_stream_join_survives_kill_9_exactly_once(bootstrap: str, tmp_path: Path) -> None:
    topic, output = unique_name("ss-in"), unique_name("ss-out")
    create_topic(bootstrap, topic, 4)
    create_topic(bootstrap, output, 4)
    env = _clean_env(STREAMS_TEST_INPUT=topic, STREAMS_TEST_OUTPUT=output)
    sets = app_config(
        bootstrap,
        unique_name("ss-eos"),
        tmp_path / "state",
        commit_ms=200,
        guarantee="exactly_once_v2",
        session_ms=3000,
    )
    feeder = PairFeeder(bootstrap, topic)
    rng = random.Random(2027)
    daemons: list[Daemon] = []
    feeder.start()
    try:
        daemons += kill_rounds(bootstrap, output, tmp_path, APP, sets, env, KILLS, rng)
        feeder.stop()
        want = Counter((f"k{n % KEYS}", f"L:{n}|R:{n}") for n in range(feeder.pairs))
        got: Counter[tuple[str, str]] = Counter()

        def caught_up() -> bool:
            nonlocal got
            got = Counter(
                (m.key.decode(), m.value.decode())
                for m in consume_all(bootstrap, output, timeout=30)
            )
            return sum(got.values()) >= sum(want.values())

        # On a timeout the comparison below says which pairs are missing.
        with contextlib.suppress(AssertionError):
            wait_until(caught_up, 120, interval=1.0)
        twice = {pair: c for pair, c in got.items() if c > 1}
        assert not twice, f"joined more than once: {dict(list(twice.items())[:10])}"
        missing = want - got
        extra = got - want
        assert not missing and not extra, (
            f"{sum(missing.values())} pairs missing (e.g. {list(missing)[:5]}), "
            f"{sum(extra.values())} unexpected (e.g. {list(extra)[:5]})"
        )
        final = daemons[-1]
        final.send(signal.SIGTERM)
        assert final.wait(30) == 0, final.tail()
    finally:
        feeder._halt.set()
        for daemon in daemons:
            daemon.kill()
        for daemon in daemons[-2:]:
            print(f"--- {daemon.log_path.name} ---\n{daemon.tail(3000)}")
