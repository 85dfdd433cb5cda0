"""Issue 20, what start-up and the clients say: start-up phases, librdkafka's
log through structlog, and how the admin command and the demo show them."""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Iterator

import pytest
from confluent_kafka import Producer

from runtime.admin.client import format_status, format_threads
from runtime.brokers.devbroker import free_port
from runtime.demo import thread_view
from runtime.logging import librdkafka_level, librdkafka_logger
from runtime.polling.startup import StartupProgress
from runtime.status import AppStatus, ThreadStatus
from tests.logs import capture_logs, logged_events


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    with capture_logs("debug") as stream:
        yield stream


_events = logged_events


def test_startup_phases_in_order_with_what_each_waits_for(log_lines: io.StringIO) -> None:
    progress = StartupProgress("wordsplit", "127.0.0.1:9092", 10000)
    assert progress.phase is None and not progress.done
    progress.subscribed()
    assert progress.phase == "joining_group"
    assert progress.waiting_for == "joining consumer group 'wordsplit' at 127.0.0.1:9092"
    progress.observe(None, joined=False, restoring=0)
    assert progress.phase == "joining_group"
    progress.observe("member-1", joined=False, restoring=0)
    assert progress.phase == "awaiting_assignment"
    assert progress.waiting_for == "consumer group 'wordsplit' to assign partitions"
    progress.observe("member-1", joined=True, restoring=3)
    assert progress.phase == "restoring"
    assert progress.waiting_for == "restoring 3 tasks from their changelogs before they process"
    assert progress.phase_since is not None and abs(progress.phase_since - time.time()) < 5
    progress.observe("member-1", joined=True, restoring=0)
    assert progress.done and progress.waiting_for is None
    phases = [e["phase"] for e in _events(log_lines, "startup_phase")]
    assert phases == ["joining_group", "awaiting_assignment", "restoring", "processing"]
    assert _events(log_lines, "startup_phase")[2]["tasks"] == 3


def test_a_long_wait_is_explained_every_ten_seconds(
    log_lines: io.StringIO, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [1000.0]
    monkeypatch.setattr("runtime.polling.startup.time.monotonic", lambda: clock[0])
    progress = StartupProgress("g", "b:9092", 45000)
    progress.subscribed()
    for _ in range(25):
        clock[0] += 1.0
        progress.observe(None, joined=False, restoring=0)
    reminders = _events(log_lines, "startup_waiting")
    assert [r["waited_s"] for r in reminders] == [10.0, 20.0]
    assert "session.timeout.ms is 45000 ms" in str(reminders[0]["hint"])
    assert "group.initial.rebalance.delay.ms" in str(reminders[0]["hint"])


def test_admin_status_shows_what_start_up_waits_for() -> None:
    status = AppStatus(
        application_id="wordsplit",
        client_id="wordsplit",
        instance_id="i",
        state="REBALANCING",
        started_at=0.0,
        processing_guarantee="at_least_once",
        assignment_strategy="cooperative-sticky",
        threads=(),
        tasks=(),
        startup_phase="joining_group",
        waiting_for="joining consumer group 'wordsplit' at 127.0.0.1:9092",
        startup_phase_since=100.0,
    )
    text = format_status(AppStatus.from_dict(status.to_dict()).to_dict(), now=103.5)
    lines = text.splitlines()
    assert lines[1] == (
        "waiting for  joining consumer group 'wordsplit' at 127.0.0.1:9092 "
        "(joining_group, since 3.5 s ago)"
    )
    done = format_status({**status.to_dict(), "waiting_for": None, "startup_phase": "processing"})
    assert "waiting for" not in done
    threads = (
        ThreadStatus("a-ProcessingThread-1", True, "0_3", 10, 1.5, "processing", "0_3"),
        ThreadStatus("a-ProcessingThread-2", True, None, 4, 0.25, "idle", "0_1"),
    )
    running = format_status({**status.to_dict(), "threads": [t.__dict__ for t in threads]})
    assert (
        "threads      2 alive: a-ProcessingThread-1 (processing 0_3), "
        "a-ProcessingThread-2 (idle, last 0_1)"
    ) in running.splitlines()


def test_threads_show_state_task_and_last_task() -> None:
    threads = (
        ThreadStatus("a-ProcessingThread-1", True, "0_3", 10, 1.5, "processing", "0_3"),
        ThreadStatus("a-ProcessingThread-2", True, None, 4, 0.25, "idle", "0_1"),
        ThreadStatus("a-ProcessingThread-3", True, None, 0, 0.0, "idle", None),
    )
    result = {
        "names": [t.name for t in threads[:2]],  # thread 3 was asked to stop
        "threads": [
            AppStatus.from_dict({"threads": [t.__dict__]}).threads[0].__dict__ for t in threads
        ],
    }
    rows = [line.split() for line in format_threads(result).splitlines()]
    assert rows == [
        ["THREAD", "STATE", "TASK", "LAST_TASK", "BATCHES", "BUSY_S"],
        ["a-ProcessingThread-1", "processing", "0_3", "0_3", "10", "1.5"],
        ["a-ProcessingThread-2", "idle", "-", "0_1", "4", "0.25"],
        ["a-ProcessingThread-3", "stopping", "-", "-", "0", "0.0"],
    ]
    view = thread_view(threads, {"a-ProcessingThread-1": 1.0, "a-ProcessingThread-2": 0.25}, 1.0)
    assert view == "T1 0_3  50% | T2 idle | T3 idle"


@pytest.mark.parametrize(
    ("syslog", "facility", "level"),
    [
        (3, "FAIL", "debug"),  # a refused connection: broker_unreachable says it once
        (5, "REQTMOUT", "debug"),
        (3, "ERROR", "debug"),  # "1/1 brokers are down"
        (4, "CONFWARN", "warning"),  # a property the client ignores: worth a warning
        (2, "SSL", "warning"),
        (6, "INIT", "info"),
        (7, "PROTOCOL", "debug"),
    ],
)
def test_librdkafka_levels(syslog: int, facility: str, level: str) -> None:
    assert librdkafka_level(syslog, facility) == level


def test_librdkafka_lines_become_structured_events(
    log_lines: io.StringIO, capfd: pytest.CaptureFixture[str]
) -> None:
    """A client with the runtime's logger and no broker: librdkafka's connection
    failures arrive as `librdkafka` events at debug, never as raw `%3|` lines."""
    producer = Producer(
        {
            "bootstrap.servers": f"127.0.0.1:{free_port()}",
            "logger": librdkafka_logger(),
            "log.connection.close": False,
            # A producer property on a producer, and a consumer one it ignores.
            "fetch.wait.max.ms": 10,
        }
    )
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not any(
        e["facility"] == "FAIL" for e in _events(log_lines, "librdkafka")
    ):
        producer.poll(0.1)
    del producer
    events = _events(log_lines, "librdkafka")
    failures = [e for e in events if e["facility"] == "FAIL"]
    assert failures, events
    assert {e["level"] for e in failures} == {"debug"}
    assert "Connection refused" in str(failures[0]["message"])
    assert str(failures[0]["client"]).startswith("rdkafka#producer")
    assert any(e["facility"] == "CONFWARN" and e["level"] == "warning" for e in events), events
    assert "%3|" not in capfd.readouterr().err
    assert not logging.getLogger("streams_runtime.librdkafka").propagate
