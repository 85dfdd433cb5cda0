"""Faults: a frozen broker, poison records, failing processors.

The broker-outage test runs its own broker (``fresh_broker``: it gets frozen with
SIGSTOP); the others share the session broker.
"""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path

import pytest

from runtime import App, AppState, StreamsBuilder, serdes
from runtime.brokers import Broker
from tests.configs import app_config
from tests.harness import Feeder, TopicReader
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration


def base_config(bootstrap: str, app_id: str, tmp_path: Path, **extra: object) -> dict[str, object]:
    return app_config(bootstrap, app_id, tmp_path / app_id, threads=3, commit_ms=500, **extra)


class StateLog:
    """Every state an app passes through (listener runs on the app's threads)."""

    def __init__(self, app: App) -> None:
        self.seen: list[AppState] = [app.state]
        self._lock = threading.Lock()
        app.set_state_listener(self._on_change)

    def _on_change(self, new: AppState, old: AppState) -> None:
        with self._lock:
            self.seen.append(new)

    def states(self) -> list[AppState]:
        with self._lock:
            return list(self.seen)


def wait_for_output(app: App, bootstrap: str, topic: str, count: int, timeout: float) -> None:
    """Until `topic` holds `count` records; fails at once if the app fails meanwhile."""
    reader = TopicReader(bootstrap, topic, len(end_offsets(bootstrap, topic)), quiet=True)
    try:

        def enough() -> bool:
            assert app.state not in (AppState.ERROR, AppState.PENDING_ERROR), app.failure
            reader.poll()
            return len(reader.msgs) >= count

        wait_until(enough, timeout, interval=0.0, message=f"{topic}: fewer than {count} records")
    finally:
        reader.close()


# --- broker outage ----------------------------------------------------------------------


OUTAGE_S = 15.0  # the spec: SIGSTOP the broker for 15 s


def test_app_survives_a_15s_broker_outage(fresh_broker: Broker, tmp_path: Path) -> None:
    own_broker = fresh_broker
    bootstrap = own_broker.bootstrap
    source, sink, app_id = unique_name("o-in"), unique_name("o-out"), unique_name("outage")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)

    builder = StreamsBuilder()
    builder.stream(source).to(sink)
    app = App(builder.build(), base_config(bootstrap, app_id, tmp_path))
    states = StateLog(app)
    feeder = Feeder(bootstrap, source, rate=500, keys=50)
    reader = TopicReader(bootstrap, sink, 4, quiet=True)
    app.start()
    try:
        feeder.start()

        def output_at_least(count: int) -> bool:
            reader.poll()
            return len(reader.msgs) >= count

        wait_until(lambda: output_at_least(1000), 60, message="no output before the outage")
        before = feeder.sent

        own_broker.pause()
        paused_at = time.monotonic()
        try:
            # The outage itself lasts a fixed time (the fault being injected);
            # meanwhile the app must stay alive.
            while time.monotonic() - paused_at < OUTAGE_S:
                assert app.state in (AppState.RUNNING, AppState.REBALANCING), app.state
                time.sleep(0.25)
        finally:
            own_broker.resume()
        during = feeder.sent - before
        print(f"outage: {before} sent before, {during} during, app {app.state}")

        # Keep feeding for a while after the outage, then stop and flush.
        after_resume = feeder.sent
        wait_until(lambda: feeder.sent >= after_resume + 2500, 30, message="feeder stalled")
        feeder.stop()
        n = feeder.sent

        def complete() -> bool:
            reader.poll()
            assert app.state not in (AppState.ERROR, AppState.PENDING_ERROR), app.failure
            return len(reader.values()) >= n

        try:
            wait_until(complete, 120, interval=0.0, message="output incomplete after outage")
        except AssertionError:
            assert app.state not in (AppState.ERROR, AppState.PENDING_ERROR), repr(app.failure)
            missing = sorted(set(range(n)) - reader.values())
            raise AssertionError(
                f"{len(missing)} of {n} missing, e.g. {missing[:20]}; status {app.status()}"
            ) from None
        wait_until(
            lambda: app.state is AppState.RUNNING, 60, message=f"app not RUNNING: {app.state}"
        )
        seen = states.states()
        assert AppState.ERROR not in seen and AppState.PENDING_ERROR not in seen, seen
        assert app.failure is None
    finally:
        feeder._halt.set()
        reader.close()
        closed = app.close(30)
    assert closed, "close() timed out"
    assert app.state is AppState.NOT_RUNNING
    values = [int(m.value) for m in reader.msgs]
    assert set(values) == set(range(n))
    print(f"outage: {n} input, {len(values)} output, {len(values) - n} duplicates")


# --- poison records ----------------------------------------------------------------------


def _poison_input(bootstrap: str, source: str, n: int, every: int) -> set[int]:
    """JSON records {"n": i}; every `every`-th is not valid JSON. Returns poison indexes."""
    poison = {i for i in range(n) if i % every == every // 2}
    produce(
        bootstrap,
        source,
        (
            (f"k{i % 30}", f'{{"n": {i}'.encode() if i in poison else json.dumps({"n": i}))
            for i in range(n)
        ),
    )
    return poison


def test_poison_records_go_to_the_dead_letter_queue(bootstrap: str, tmp_path: Path) -> None:
    source, sink, app_id = unique_name("p-in"), unique_name("p-out"), unique_name("poison")
    create_topic(bootstrap, source, 3)
    create_topic(bootstrap, sink, 3)
    n = 3000
    poison = _poison_input(bootstrap, source, n, every=500)
    assert len(poison) == 6
    origins = {
        (m.topic, m.partition, m.offset): m.value
        for m in consume_all(bootstrap, source, expected=n, timeout=30, idle=0.2)
        if int(m.value.split(b":")[1].strip(b" }")) in poison  # type: ignore[union-attr]
    }
    assert len(origins) == len(poison)
    expected_exception = ""
    try:
        serdes.JSON.deserialize(next(iter(origins.values())))
    except Exception as exc:
        expected_exception = type(exc).__qualname__
    assert expected_exception

    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.JSON).to(sink)
    config = base_config(
        bootstrap, app_id, tmp_path, **{"deserialization.exception.handler": "dead_letter_queue"}
    )
    app = App(builder.build(), config)
    states = StateLog(app)
    app.start()
    try:
        wait_for_output(app, bootstrap, sink, n - len(poison), 90)
        out = consume_all(bootstrap, sink, expected=n - len(poison), timeout=30, idle=1.0)
        dlq = consume_all(bootstrap, f"{app_id}-dlq", expected=len(poison), timeout=60, idle=1.0)
        wait_until(
            lambda: app.status()["dead_lettered"] == len(poison),
            10,
            message=f"dead_lettered != {len(poison)}: {app.status()['dead_lettered']}",
        )
        assert app.state is AppState.RUNNING
        status = app.status()
    finally:
        assert app.close(30)
    assert AppState.ERROR not in states.states()

    assert sorted(json.loads(m.value)["n"] for m in out) == sorted(set(range(n)) - poison)
    assert len(dlq) == len(poison), f"DLQ holds {len(dlq)} records, expected {len(poison)}"
    got_origins = {}
    for m in dlq:
        headers = {k: (v or b"").decode() for k, v in m.headers}
        assert headers.get("__streams.errors.exception") == expected_exception, headers
        origin = (
            headers["__streams.errors.topic"],
            int(headers["__streams.errors.partition"]),
            int(headers["__streams.errors.offset"]),
        )
        got_origins[origin] = m.value
    assert got_origins == origins, "DLQ records do not match the poison records' origins"
    assert status["dead_lettered"] == len(poison)


# --- processing errors ---------------------------------------------------------------------


class PoisonError(Exception):
    """Raised by the test's processor for the records it refuses."""


def _refuse_multiples(every: int):  # type: ignore[no-untyped-def]
    def check(value: dict) -> int:  # type: ignore[type-arg]
        if value["n"] % every == every // 2:
            raise PoisonError(f"refusing n={value['n']}")
        return int(value["n"])

    return check


def test_processing_error_log_and_continue_skips(bootstrap: str, tmp_path: Path) -> None:
    source, sink, app_id = unique_name("s-in"), unique_name("s-out"), unique_name("skip")
    create_topic(bootstrap, source, 3)
    create_topic(bootstrap, sink, 3)
    n, every = 3000, 500
    produce(bootstrap, source, ((f"k{i % 30}", json.dumps({"n": i})) for i in range(n)))
    failing = {i for i in range(n) if i % every == every // 2}

    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.JSON)
        .map_values(_refuse_multiples(every))
        .to(sink, value_serde=serdes.INT64)
    )
    config = base_config(
        bootstrap, app_id, tmp_path, **{"processing.exception.handler": "log_and_continue"}
    )
    app = App(builder.build(), config)
    app.start()
    try:
        wait_for_output(app, bootstrap, sink, n - len(failing), 90)
        out = consume_all(bootstrap, sink, expected=n - len(failing), timeout=30, idle=1.0)
        wait_until(
            lambda: app.status()["skipped"] == len(failing),
            10,
            message=f"skipped != {len(failing)}: {app.status()['skipped']}",
        )
        assert app.state is AppState.RUNNING
        assert app.status()["dead_lettered"] == 0
    finally:
        assert app.close(30)
    values = [serdes.INT64.deserialize(m.value) for m in out]
    assert sorted(values) == sorted(set(range(n)) - failing)


def test_processing_error_log_and_fail_stops_without_committing_past_it(
    bootstrap: str, tmp_path: Path
) -> None:
    source, sink, app_id = unique_name("f-in"), unique_name("f-out"), unique_name("fail")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)

    def check(value: str) -> str:
        if value.startswith("poison"):
            raise PoisonError(f"refusing {value}")
        return value.upper()

    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .map_values(check)
        .to(sink, value_serde=serdes.STRING)
    )
    # processing.exception.handler left at its default: log_and_fail.
    config = base_config(bootstrap, app_id, tmp_path, **{"commit.interval.ms": 200})
    app = App(builder.build(), config)
    states = StateLog(app)
    app.start()
    try:
        # Phase 1: good records flow and get committed.
        first = 1000
        produce(bootstrap, source, ((f"k{i % 20}", f"good-{i}") for i in range(first)))
        wait_for_output(app, bootstrap, sink, first, 90)
        wait_until(
            lambda: sum(committed_offsets(bootstrap, app_id, source).values()) == first,
            30,
            interval=0.1,
            message="phase-1 offsets never committed",
        )
        phase1_ends = end_offsets(bootstrap, source)

        # Phase 2: one poison record in partition 0, good records after it on both.
        produce(bootstrap, source, [("kp", "poison-1", 0)])
        produce(bootstrap, source, ((f"k{i % 20}", f"good-{i}") for i in range(first, first + 500)))
        poison_offset = phase1_ends[0]
        wait_until(
            lambda: app.state is AppState.ERROR, 60, message=f"app not in ERROR: {app.state}"
        )
    finally:
        app.close(30)
    assert app.state is AppState.ERROR
    assert AppState.PENDING_ERROR in states.states()
    failure = app.failure
    assert failure is not None
    assert "PoisonError" in f"{type(failure).__name__}: {failure}" or isinstance(
        getattr(failure, "cause", None), PoisonError
    ), repr(failure)
    assert "poison-1" in str(failure), repr(failure)

    committed = committed_offsets(bootstrap, app_id, source)
    print(f"log_and_fail: poison at 0@{poison_offset}, committed {committed}")
    assert committed.get(0, 0) >= phase1_ends[0], "phase-1 commit of partition 0 lost"
    assert committed.get(0, 0) < poison_offset + 1, (
        f"partition 0 committed past the failing record: {committed[0]} > {poison_offset}"
    )
