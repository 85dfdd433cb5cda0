"""The uncaught exception handler: REPLACE_THREAD retries, SHUTDOWN_CLIENT stops."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from runtime import (
    REPLACE_THREAD,
    SHUTDOWN_APPLICATION,
    SHUTDOWN_CLIENT,
    App,
    AppState,
    Processor,
    Record,
    StreamsBuilder,
    serdes,
)
from tests.configs import app_config
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration


class FailOnceOnMarked(Processor):
    """Raises the first time it sees a value ending in '!' (shared across tasks)."""

    failed: set[str] = set()
    lock = threading.Lock()

    def init(self, context):  # type: ignore[no-untyped-def]
        self.context = context

    def process(self, record: Record) -> None:
        if record.value.endswith("!"):
            with self.lock:
                if record.value not in self.failed:
                    self.failed.add(record.value)
                    raise RuntimeError(f"marked record {record.value}")
        self.context.forward(record)


class AlwaysFailOnMarked(Processor):
    def init(self, context):  # type: ignore[no-untyped-def]
        self.context = context

    def process(self, record: Record) -> None:
        if record.value.endswith("!"):
            raise RuntimeError(f"marked record {record.value}")
        self.context.forward(record)


def make_app(bootstrap: str, tmp_path: Path, processor: type[Processor]) -> tuple[App, str, str]:
    source, out = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, out, 2)
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).process(
        processor
    ).to(out, key_serde=serdes.STRING, value_serde=serdes.STRING)
    app = App(
        builder.build(),
        app_config(bootstrap, unique_name("policy"), tmp_path, heartbeat_ms=None),
    )
    return app, source, out


def test_replace_thread_retries_the_failed_batch_and_keeps_going(
    bootstrap: str, tmp_path: Path
) -> None:
    app, source, out = make_app(bootstrap, tmp_path, FailOnceOnMarked)
    decisions: list[BaseException] = []

    def handler(exc: BaseException):  # type: ignore[no-untyped-def]
        decisions.append(exc)
        return REPLACE_THREAD

    app.set_uncaught_exception_handler(handler)
    values = [f"v{i}" + ("!" if i in (150, 700) else "") for i in range(1000)]
    produce(
        bootstrap,
        source,
        ((f"k{i % 10}", v) for i, v in enumerate(values)),
        key_serializer=str.encode,
        value_serializer=str.encode,
    )
    app.start()
    try:
        got = consume_all(bootstrap, out, expected=len(values), timeout=60)
        wait_until(lambda: app.status()["failed_threads"] == 2, 10, message="failures not counted")
        assert app.state is AppState.RUNNING
        assert sorted(app.processing_threads) == sorted(
            [
                f"{app.config.client_id}-ProcessingThread-1",
                f"{app.config.client_id}-ProcessingThread-2",
            ]
        )
    finally:
        app.close(30)
    # Every record made it (the failed batches were retried); duplicates are
    # allowed (at-least-once), losses are not.
    assert {m.value.decode() for m in got} >= set(values)
    assert len(decisions) == 2
    assert all("marked record" in str(d) for d in decisions)


def test_shutdown_client_stops_with_error_and_does_not_commit_the_failed_record(
    bootstrap: str, tmp_path: Path
) -> None:
    app, source, out = make_app(bootstrap, tmp_path, AlwaysFailOnMarked)
    app.set_uncaught_exception_handler(lambda exc: SHUTDOWN_CLIENT)
    produce(
        bootstrap,
        source,
        [("k", "a"), ("k", "b!"), ("k", "c")],
        key_serializer=str.encode,
        value_serializer=str.encode,
    )
    app.start()
    assert app.wait(60), "app did not stop"
    assert app.state is AppState.ERROR
    assert "marked record b!" in str(app.failure)
    assert app.status()["failed_threads"] == 1
    from tests.kafka_helpers import committed_offsets

    committed = committed_offsets(bootstrap, app.config.application_id, source)
    # 'b!' is at offset 1 of whichever partition 'k' hashes to: nothing past it.
    assert all(offset <= 1 for offset in committed.values()), committed


def test_shutdown_application_stops_every_instance(bootstrap: str, tmp_path: Path) -> None:
    source, out = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, out, 4)
    app_id = unique_name("shutapp")

    def instance(name: str) -> App:
        builder = StreamsBuilder()
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).process(
            AlwaysFailOnMarked
        ).to(out, key_serde=serdes.STRING, value_serde=serdes.STRING)
        app = App(
            builder.build(),
            app_config(bootstrap, app_id, tmp_path / name, threads=1, heartbeat_ms=None),
        )
        app.set_uncaught_exception_handler(lambda exc: SHUTDOWN_APPLICATION)
        return app

    a, b = instance("a"), instance("b")
    a.start()
    b.start()
    try:
        wait_until(
            lambda: a.status()["tasks"] and b.status()["tasks"],
            60,
            message="the instances never shared the tasks",
        )
        # One marked record: whichever instance owns its partition fails and
        # asks the whole application to stop.
        produce(
            bootstrap,
            source,
            [("k1", "boom!")],
            key_serializer=str.encode,
            value_serializer=str.encode,
        )
        assert a.wait(60) and b.wait(60), "an instance kept running"
        assert a.state is AppState.ERROR and b.state is AppState.ERROR
        messages = {str(a.failure), str(b.failure)}
        assert any("marked record boom!" in m for m in messages)
        assert any("application shutdown requested by" in m for m in messages)
    finally:
        a.close(10)
        b.close(10)
