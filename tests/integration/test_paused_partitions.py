"""Partitions the runtime paused (full input queues) fetch again after the group
membership was lost and the same partitions came back (issue 31, item 1).

librdkafka keeps an application pause across unassign and assign: before the
fix, a task let go while its queue was full forgot its pause, its partition
stayed paused in the consumer, and after the rejoin it never fetched again
(the app said RUNNING with lag frozen). The daemon is frozen with SIGSTOP
past its session timeout, so the broker evicts it and it loses its
partitions; on SIGCONT it rejoins and must process everything, without the
stall watchdog having to step in.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from tests.configs import app_config
from tests.harness import Daemon, TopicReader, clean_env
from tests.kafka_helpers import create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration

PARTITIONS = 4
PER_PARTITION = 2500
SESSION_TIMEOUT_MS = 6000  # the broker's group.min.session.timeout.ms


def test_paused_partitions_fetch_again_after_a_lost_membership(
    bootstrap: str, tmp_path: Path
) -> None:
    source, sink = unique_name("paused-in"), unique_name("paused-out")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    total = PARTITIONS * PER_PARTITION
    produce(bootstrap, source, [(None, str(i), i % PARTITIONS) for i in range(total)])
    sets = app_config(
        bootstrap,
        unique_name("paused-app"),
        tmp_path / "state",
        threads=1,
        commit_ms=500,
        session_ms=SESSION_TIMEOUT_MS,
        heartbeat_ms=1000,
        **{
            "buffered.records.per.partition": 20,  # every queue fills at once: all paused
            "consumer.auto.offset.reset": "earliest",
        },
    )
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink, STREAMS_TEST_SLEEP_MS="1")
    daemon = Daemon(tmp_path / "daemon.log", "tests.apps.slow_copy:topology", sets, env).start()
    reader = TopicReader(bootstrap, sink, PARTITIONS)
    try:
        wait_until(
            lambda: reader.poll() >= 0 and len(reader.msgs) >= 500 or not daemon.alive(),
            60,
            message="the daemon produced no output",
        )
        daemon.assert_alive()
        # Frozen well past the session timeout: the broker evicts the member.
        daemon.send(signal.SIGSTOP)
        try:
            _frozen_for(2.5 * SESSION_TIMEOUT_MS / 1000.0)
        finally:
            daemon.send(signal.SIGCONT)
        wait_until(
            lambda: '"partitions_lost"' in daemon.tail(400_000) or not daemon.alive(),
            30,
            message="the daemon never noticed it lost its partitions",
        )
        daemon.assert_alive()
        wait_until(
            lambda: reader.poll() >= 0 and len(reader.values()) >= total or not daemon.alive(),
            50,  # below the stall watchdog's 60 s: the fix, not the watchdog, must do it
            message=f"output stopped short: {len(reader.values())} of {total} distinct values",
        )
        daemon.assert_alive()
        assert reader.values() == set(range(total))
        assert '"partitions_stalled"' not in daemon.tail(2_000_000)
    finally:
        daemon.kill()
        reader.close()


def _frozen_for(seconds: float) -> None:
    """Keep the daemon frozen this long: here the point is wall time passing
    (the broker's session clock), not a condition to wait on."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.2)
