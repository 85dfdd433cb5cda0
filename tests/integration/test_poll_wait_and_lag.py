"""A long poll.ms never delays output or shutdown; lag after a restart is true lag."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime import App, AppState, StreamsBuilder, serdes
from tests.configs import app_config
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration


def pass_through(source: str, sink: str) -> StreamsBuilder:
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.BYTES, value_serde=serdes.BYTES).to(sink)
    return builder


def config(bootstrap: str, app_id: str, tmp_path: Path, **extra: object) -> dict[str, object]:
    return app_config(bootstrap, app_id, tmp_path / "state", **extra)


def test_poll_ms_longer_than_shutdown_timeout_neither_delays_output_nor_shutdown(
    bootstrap: str, tmp_path: Path
) -> None:
    source, sink = unique_name("wait-in"), unique_name("wait-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    app = App(
        pass_through(source, sink).build(),
        config(
            bootstrap,
            unique_name("wait"),
            tmp_path,
            **{"poll.ms": 600_000, "shutdown.timeout.ms": 5_000},
        ),
    )
    app.start()
    try:
        wait_until(lambda: app.state is AppState.RUNNING, 60, message="app running")
        # Input arrives while the polling thread is in its (10-minute) wait.
        produce(bootstrap, source, [(f"k{i}".encode(), str(i).encode()) for i in range(300)])
        output = consume_all(bootstrap, sink, expected=300, timeout=30, idle=0.2)
        assert sorted(int(m.value) for m in output) == list(range(300))
    finally:
        started = time.monotonic()
        closed = app.close(10)
        took = time.monotonic() - started
    assert closed, "close() returned within its timeout"
    assert took < 10, f"shutdown took {took:.1f} s with poll.ms=600000"
    assert app.state is AppState.NOT_RUNNING


def test_lag_after_restart_counts_from_the_committed_offsets(
    bootstrap: str, tmp_path: Path
) -> None:
    source, sink = unique_name("lag-in"), unique_name("lag-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    produce(bootstrap, source, [(f"k{i}".encode(), str(i).encode()) for i in range(1000)])
    app_id = unique_name("lag")
    topology = pass_through(source, sink).build()

    first = App(topology, config(bootstrap, app_id, tmp_path))
    first.start()
    try:
        wait_until(
            lambda: sum(committed_offsets(bootstrap, app_id, source).values()) == 1000,
            60,
            message="all input committed",
        )
    finally:
        assert first.close(30)

    # Restarted with nothing new to read: lag is 0 once it is known, never
    # the 1000 records the first run already did.
    second = App(topology, config(bootstrap, app_id, tmp_path))
    second.start()
    try:
        wait_until(lambda: second.state is AppState.RUNNING, 60, message="restarted app running")
        wait_until(lambda: second.status()["lag"], 30, message="lag figures published")
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:
            status = second.status()
            assert status["total_lag"] == 0, status["lag"]
            time.sleep(0.2)  # sampling the figure over time, not waiting for a condition
        assert second.status()["processed"] == 0
    finally:
        assert second.close(30)
