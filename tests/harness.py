"""Shared pieces of the integration tests: a group-less topic reader, a steady
sequence-number producer, and the daemon subprocess (`python -m runtime run`).

Why: several test modules read output back from the start of every partition,
feed input at a steady rate while something is crashed, paused or rebalanced,
and run the daemon as operators do. One version of each lives here.

Threads: a `Feeder` produces on its own thread; `TopicReader` and `Daemon`
belong to the thread that made them.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, Producer, TopicPartition

from tests.kafka_helpers import Msg, consume_all, unique_name, wait_until

__all__ = ["REPO", "Daemon", "Feeder", "TopicReader", "clean_env"]

REPO = Path(__file__).resolve().parents[1]
"""The repository root: the daemon's working directory and PYTHONPATH."""


def _ignore_error(_err: KafkaError) -> None:
    """An `error_cb` that drops client-level errors (a broker frozen on purpose)."""


class TopicReader:
    """Reads a topic from the beginning of each partition, incrementally, without a group.

    `isolation` is the consumer's `isolation.level` (`read_committed` or
    `read_uncommitted`). With `quiet=True` the client logs nothing and ignores
    client-level errors (for tests that freeze the broker on purpose), and
    `poll()` does not print per-partition errors.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        partitions: int,
        isolation: str = "read_committed",
        *,
        quiet: bool = False,
    ) -> None:
        self.topic = topic
        self.quiet = quiet
        config: dict[str, object] = {
            "bootstrap.servers": bootstrap,
            "group.id": unique_name("reader"),
            "enable.auto.commit": False,
            "enable.partition.eof": False,
            "auto.offset.reset": "earliest",
            "fetch.wait.max.ms": 100,
            "isolation.level": isolation,
        }
        if quiet:
            config.update({"log_level": 0, "error_cb": _ignore_error})
        self.consumer = Consumer(config)
        self.consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )
        self.msgs: list[Msg] = []
        """Every record read so far, in the order read."""

    def poll(self, timeout: float = 0.2) -> int:
        """Read what is available within `timeout` seconds; returns how many records."""
        got = 0
        for m in self.consumer.consume(5000, timeout):
            err = m.error()
            if err is not None:
                if not self.quiet and err.code() != KafkaError._PARTITION_EOF:
                    print(f"reader {self.topic}: {err}")
                continue
            self.msgs.append(
                Msg(m.key(), m.value(), m.topic(), m.partition(), m.offset(), m.timestamp()[1])
            )
            got += 1
        return got

    def values(self) -> set[int]:
        """The distinct record values read so far, as integers."""
        return {int(m.value) for m in self.msgs if m.value is not None}

    def close(self) -> None:
        self.consumer.close()


_FEEDER_HEADER = "feeder"


class Feeder(threading.Thread):
    """Produces sequence-numbered records (value = str(i), key = f"k{i % keys}")
    at a steady `rate` per second, until `total` are sent or `stop()` is called.

    With `total=None` it runs until `stop()`. Either way it then flushes and
    records in `unflushed` how many records were still undelivered (-1 until
    then); delivery errors go to `errors`.

    Its producer rides out a broker outage: records wait in its local queue
    (`message_timeout_ms` is far longer than any outage a test injects) and are
    delivered after; client-level errors (broker unreachable) are kept in
    `client_errors` rather than logged, and librdkafka's own log is off.
    """

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        total: int | None = None,
        *,
        rate: float,
        keys: int = 64,
        message_timeout_ms: int = 180_000,
        flush_timeout: float = 120.0,
    ) -> None:
        super().__init__(name="feeder", daemon=True)
        self.bootstrap, self.topic = bootstrap, topic
        self.total, self.rate, self.keys = total, rate, keys
        self.message_timeout_ms, self.flush_timeout = message_timeout_ms, flush_timeout
        self.sent = 0
        self.errors: list[str] = []
        self.client_errors: list[str] = []
        self.unflushed = -1
        self._halt = threading.Event()
        # Marks its records (a header), so that `written_keys` tells them from
        # others in the same topic (a test's prefill).
        self._tag = unique_name("feeder").encode()

    def stop(self, timeout: float = 60) -> None:
        """Stop producing, wait for the flush, and assert every record was delivered."""
        self._halt.set()
        self.join(timeout)
        assert not self.is_alive(), "feeder did not stop"
        assert self.unflushed == 0, f"{self.unflushed} input records not delivered"
        assert not self.errors, f"input delivery failed: {self.errors[:3]}"

    def _done(self) -> bool:
        return self._halt.is_set() or (self.total is not None and self.sent >= self.total)

    def written_keys(self) -> Counter[str]:
        """How many records of each key the input topic holds, read back
        (after `stop()`): the truth a count must reach. Not `range(sent)`: the
        idempotent producer can still write a record twice (librdkafka#4953,
        an epoch bump after a timed-out or dropped request re-sends a written
        batch; suspected in CI on a loaded machine), and a count must then
        count it twice. A record written twice is printed."""
        records = [
            m
            for m in consume_all(self.bootstrap, self.topic, timeout=120)
            if (_FEEDER_HEADER, self._tag) in m.headers
        ]
        assert len(records) >= self.sent, f"{len(records)} of {self.sent} fed records found"
        twice = len(records) - len({m.value for m in records})
        if twice:
            print(f"the input holds {twice} records twice (the feeder's duplicates)")
        return Counter(m.key.decode() for m in records if m.key is not None)

    def run(self) -> None:
        producer = Producer(
            {
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "partitioner": "murmur2_random",
                "linger.ms": 5,
                "message.timeout.ms": self.message_timeout_ms,
                "log_level": 0,
                "error_cb": lambda err: self.client_errors.append(str(err)),
            }
        )

        def on_delivery(err: KafkaError | None, _msg: object) -> None:
            if err is not None:
                self.errors.append(str(err))

        started = time.monotonic()
        while not self._done():
            due = int((time.monotonic() - started) * self.rate) + 1
            if self.total is not None:
                due = min(self.total, due)
            while self.sent < due:
                i = self.sent
                producer.produce(
                    self.topic,
                    str(i).encode(),
                    f"k{i % self.keys}".encode(),
                    on_delivery=on_delivery,
                    headers=[(_FEEDER_HEADER, self._tag)],
                )
                self.sent += 1
            producer.poll(0)
            time.sleep(0.01)
        self.unflushed = producer.flush(self.flush_timeout)


def clean_env(**extra: str) -> dict[str, str]:
    """The test's environment without runtime config variables, plus `extra`.

    PYTHONPATH is the repository root, so the daemon finds `tests.apps.*`.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMS_RUNTIME_")}
    env["PYTHONPATH"] = str(REPO)
    env.update(extra)
    return env


class Daemon:
    """One `python -m runtime run ...` process, its output (stdout and stderr)
    going to a log file, started in the repository root.

    `preexec_fn` runs in the child before the exec (e.g. to lower a resource
    limit the way a report's host had it).
    """

    def __init__(
        self,
        log_path: Path,
        target: str,
        sets: dict[str, object],
        env: dict[str, str],
        *,
        preexec_fn: Callable[[], None] | None = None,
    ) -> None:
        self.log_path = log_path
        self.argv = [sys.executable, "-m", "runtime", "run", target]
        for key, value in sets.items():
            self.argv += ["--set", f"{key}={value}"]
        self.env = env
        self.preexec_fn = preexec_fn
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> Daemon:
        """Start the process (appending to the log file); returns self."""
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                cwd=REPO,
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                preexec_fn=self.preexec_fn,
            )
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def send(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        """The exit code, or None if still running after `timeout` seconds."""
        assert self.proc is not None
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def wait_ready(self, timeout: float = 120) -> None:
        """Wait until the daemon logged `daemon_ready` (its app started, its
        signal handlers in place), failing at once if it exits first.

        A SIGTERM sent before that ends a process still importing (Python's
        default action) rather than closing it gracefully: on a loaded machine
        the import alone can take seconds.
        """
        deadline = time.monotonic() + timeout
        while '"daemon_ready"' not in self.tail(2_000_000):
            self.assert_alive()
            assert time.monotonic() < deadline, f"daemon not ready in {timeout}s:\n{self.tail()}"
            time.sleep(0.1)

    def assert_alive(self) -> None:
        """Fail at once (not at some deadline) if the daemon has exited."""
        assert self.proc is not None
        code = self.proc.poll()
        assert code is None, f"daemon exited with code {code}; log tail:\n{self.tail()}"

    def tail(self, max_bytes: int = 6000) -> str:
        """The end of the daemon's log, for failure messages."""
        try:
            data = self.log_path.read_bytes()
        except FileNotFoundError:
            return "<no log>"
        return data[-max_bytes:].decode("utf-8", "replace")

    def kill(self) -> None:
        """SIGKILL the process if it is still running, and reap it."""
        if self.alive():
            assert self.proc is not None
            self.proc.kill()
            self.proc.wait(10)


def kill_rounds(
    bootstrap: str,
    output: str,
    logs: Path,
    app: str,
    sets: dict[str, object],
    env: dict[str, str],
    kills: int,
    rng: random.Random,
) -> list[Daemon]:
    """Start the daemon `kills + 1` times on the same state: each round waits
    until the daemon committed new output (read_committed), then, but for the
    last round, SIGKILLs it at a random moment up to a second later. Returns
    the daemons, the last one still running."""
    daemons: list[Daemon] = []
    for n in range(kills + 1):
        daemon = Daemon(logs / f"daemon-{n}.log", app, sets, env).start()
        daemons.append(daemon)
        seen = len(consume_all(bootstrap, output, timeout=30))
        wait_until(
            lambda d=daemon, s=seen: (
                d.assert_alive() is None and len(consume_all(bootstrap, output, timeout=30)) > s
            ),
            90,
            message=f"daemon {n} committed no output",
        )
        if n == kills:
            break
        time.sleep(rng.uniform(0.0, 1.0))  # a random moment, not a wait for a condition
        daemon.send(signal.SIGKILL)
        assert daemon.wait(10) is not None
    return daemons
