"""The daemon as operators run it: `streams-runtime run` in a real subprocess.

Signals (graceful shutdown with a final commit), kill -9 and restart without loss
(at-least-once), and start-up errors that exit with code 2 and name the culprit.
The topology is `tests.apps.passthrough:topology`; topic names reach it through
the environment (`STREAMS_TEST_INPUT`, `STREAMS_TEST_OUTPUT`).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.configs import app_config
from tests.harness import REPO, Daemon, Feeder, TopicReader, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

PASSTHROUGH = "tests.apps.passthrough:topology"


class Daemons:
    """Factory fixture state: every daemon started by a test is killed at teardown."""

    def __init__(self, tmp_path: Path, bootstrap: str) -> None:
        self.tmp_path = tmp_path
        self.bootstrap = bootstrap
        self.started: list[Daemon] = []

    def start(
        self,
        name: str,
        app_id: str,
        source: str,
        sink: str,
        overrides: dict[str, object] | None = None,
    ) -> Daemon:
        sets = app_config(
            self.bootstrap,
            app_id,
            self.tmp_path / f"state-{name}",
            commit_ms=500,
            **(overrides or {}),
        )
        env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
        daemon = Daemon(self.tmp_path / f"{name}.log", PASSTHROUGH, sets, env).start()
        self.started.append(daemon)
        return daemon

    def describe(self) -> str:
        return "\n".join(
            f"--- daemon log {d.log_path.name} (pid {d.pid}) tail ---\n{d.tail()}"
            for d in self.started
        )


@pytest.fixture
def daemons(tmp_path: Path, bootstrap: str) -> Iterator[Daemons]:
    fleet = Daemons(tmp_path, bootstrap)
    try:
        yield fleet
    finally:
        for daemon in fleet.started:
            daemon.kill()
        # Shown by pytest only when the test failed.
        print(fleet.describe())


def _run_cli(
    args: Sequence[str], env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", *args],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


# --- graceful shutdown ---------------------------------------------------------------


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_shuts_down_gracefully_with_final_commit(
    bootstrap: str, daemons: Daemons, sig: signal.Signals
) -> None:
    source, sink, app_id = unique_name("d-in"), unique_name("d-out"), unique_name("d-sig")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    n = 5000
    produce(bootstrap, source, ((f"k{i % 64}", str(i)) for i in range(n)))
    ends = end_offsets(bootstrap, source)
    assert sum(ends.values()) == n

    # A commit interval far beyond the test: offsets can only come from the final commit.
    daemon = daemons.start("sig", app_id, source, sink, {"commit.interval.ms": 600000})
    reader = TopicReader(bootstrap, sink, 4)
    try:

        def complete() -> bool:
            daemon.assert_alive()
            reader.poll()
            return len(reader.msgs) >= n

        wait_until(complete, 90, interval=0.0, message="passthrough output incomplete")
        reader.poll(0.5)  # anything beyond n would be a duplicate
    finally:
        reader.close()
    assert sorted(int(m.value) for m in reader.msgs) == list(range(n)), "output not exact"
    assert committed_offsets(bootstrap, app_id, source) == {}, (
        "offsets were committed before the signal; the test could not tell the final commit"
    )

    sent_at = time.monotonic()
    daemon.send(sig)
    code = daemon.wait(30)
    took = time.monotonic() - sent_at
    assert code == 0, f"exit code {code} after {sig.name} ({took:.1f}s)\n{daemon.tail()}"
    assert committed_offsets(bootstrap, app_id, source) == ends, "final commit missing or short"
    print(f"{sig.name}: exit 0 after {took:.2f}s")


# --- crash and restart -------------------------------------------------------------------


def test_kill_9_and_restart_loses_nothing(bootstrap: str, daemons: Daemons) -> None:
    source, sink, app_id = unique_name("k-in"), unique_name("k-out"), unique_name("d-kill")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    # 15 s of feed from the moment the daemon is ready: the kill below must
    # land mid-stream even where start-up and the first commit are slow (a
    # loaded CI machine had finished a 10 s feed started with the process).
    n, keys = 30000, 40
    feeder = Feeder(bootstrap, source, total=n, rate=2000, keys=keys)
    reader = TopicReader(bootstrap, sink, 4)
    try:
        first = daemons.start("first", app_id, source, sink, {"commit.interval.ms": 1000})
        first.wait_ready()
        feeder.start()

        def output_at_least(count: int) -> bool:
            first.assert_alive()
            reader.poll()
            return len(reader.msgs) >= count

        wait_until(lambda: output_at_least(3000), 90, message="first daemon produced < 3000")
        # Kill once it has committed too, so the restart must resume from committed offsets.
        wait_until(
            lambda: sum(committed_offsets(bootstrap, app_id, source).values()) >= 2000,
            30,
            interval=0.1,
            message="first daemon never committed",
        )
        assert first.alive()
        committed_at_kill = sum(committed_offsets(bootstrap, app_id, source).values())
        first.send(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        reader.poll()
        sent_at_kill, output_at_kill = feeder.sent, len(reader.msgs)
        assert sent_at_kill < n, "the feeder had finished: the kill was not mid-stream"

        second = daemons.start("second", app_id, source, sink, {"commit.interval.ms": 1000})
        feeder.join(60)
        assert not feeder.is_alive(), "feeder did not finish"
        assert feeder.unflushed == 0 and not feeder.errors, feeder.errors[:3]

        def complete() -> bool:
            second.assert_alive()
            reader.poll()
            return len(reader.values()) >= n

        try:
            wait_until(complete, 120, interval=0.0, message="output incomplete after restart")
        except AssertionError:
            second.assert_alive()  # a dead daemon is the real story, with its log
            missing = sorted(set(range(n)) - reader.values())
            raise AssertionError(
                f"{len(missing)} sequence numbers missing, e.g. {missing[:20]}"
            ) from None
        second.send(signal.SIGTERM)
        assert second.wait(30) == 0, "second daemon did not exit 0 on SIGTERM"
        reader.poll(0.5)
    finally:
        reader.close()

    values = [int(m.value) for m in reader.msgs]
    assert set(values) == set(range(n))
    duplicates = len(values) - n
    print(
        f"kill -9 at {sent_at_kill} sent / {output_at_kill} output / {committed_at_kill} "
        f"committed: {len(values)} output records, {duplicates} duplicates (at-least-once)"
    )

    # Per key, first deliveries keep the input order (a key lives on one partition and the
    # reader sees each partition in offset order).
    firsts: dict[bytes, list[int]] = {}
    seen: set[int] = set()
    for m in reader.msgs:
        assert m.key is not None and m.value is not None
        value = int(m.value)
        if value not in seen:
            seen.add(value)
            firsts.setdefault(m.key, []).append(value)
    assert len(firsts) == keys
    for key, seq in firsts.items():
        assert seq == sorted(seq), f"key {key!r}: first deliveries out of order"
        i0 = int(key.decode()[1:])
        assert seq == list(range(i0, n, keys)), f"key {key!r}: values missing or foreign"


# --- start-up errors: exit code 2 naming the problem -----------------------------------


def _base_sets(bootstrap: str, tmp_path: Path) -> list[str]:
    sets = []
    for key, value in {
        "application.id": unique_name("d-bad"),
        "bootstrap.servers": bootstrap,
        "state.dir": tmp_path,
    }.items():
        sets += ["--set", f"{key}={value}"]
    return sets


@pytest.mark.parametrize(
    ("bad_set", "named"),
    [
        ("processing.threads=abc", "processing.threads"),
        ("proccessing.threads=2", "proccessing.threads"),
        # A misspelt client property: librdkafka's refusal, caught before start-up.
        ("consumer.sesion.timeout.ms=6000", "did you mean 'consumer.session.timeout.ms'?"),
    ],
    ids=["bad-value", "unknown-key", "misspelt-client-property"],
)
def test_config_error_exits_2_naming_the_key(
    bootstrap: str, tmp_path: Path, bad_set: str, named: str
) -> None:
    source, sink = unique_name("c-in"), unique_name("c-out")
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    result = _run_cli(["run", PASSTHROUGH, *_base_sets(bootstrap, tmp_path), "--set", bad_set], env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert named in result.stderr, result.stderr[-2000:]
    # One line that says what is wrong, no traceback.
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith("streams-runtime: config key")


def test_missing_source_topic_exits_2_naming_it(bootstrap: str, tmp_path: Path) -> None:
    source, sink = unique_name("c-missing"), unique_name("c-out")
    create_topic(bootstrap, sink, 1)
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    result = _run_cli(["run", PASSTHROUGH, *_base_sets(bootstrap, tmp_path)], env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert source in result.stderr, result.stderr[-2000:]


@pytest.mark.parametrize(
    "target",
    [
        "tests.apps.passthrough:no_such_attr",
        "tests.apps.no_such_module:topology",
        "tests.apps.passthrough",
        "tests.apps.passthrough:__doc__",
    ],
    ids=["missing-attr", "missing-module", "no-colon", "not-a-topology"],
)
def test_bad_target_exits_2(bootstrap: str, tmp_path: Path, target: str) -> None:
    source, sink = unique_name("c-in"), unique_name("c-out")
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    result = _run_cli(["run", target, *_base_sets(bootstrap, tmp_path)], env)
    assert result.returncode == 2, (result.returncode, result.stderr[-2000:])
    assert target in result.stderr, result.stderr
