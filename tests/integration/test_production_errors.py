"""Output the broker refuses for good: never committed past, handled as configured.

Issue 21's data loss: a record too large for its topic used to kill the polling
thread, whose consumer close then committed the input offsets past it. Now the
app stops without committing past the record (log_and_fail, the default) and
names it; with `production.exception.handler` set to dead_letter_queue the rest
flows and the refused record lands, truncated, in the dead-letter topic.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from runtime import App, AppState, StreamsBuilder, serdes
from runtime.collector.production_errors import HEADER_SINK_TOPIC, HEADER_TRUNCATED
from tests.configs import app_config
from tests.kafka_helpers import (
    broker_filters_aborted_transactions,
    committed_offsets,
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

RECORDS = 201
BIG_AT = 100
BIG_VALUE_BYTES = 1_200_000  # over the producer's and the broker's default limits


def amplifying_topology(source: str, sink: str) -> StreamsBuilder:
    """Copies values; the value 'BIG' becomes 1.2 MB, which no default topic accepts."""
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).map_values(
        lambda v: "x" * BIG_VALUE_BYTES if v == "BIG" else v
    ).to(sink, key_serde=serdes.STRING, value_serde=serdes.STRING)
    return builder


def config(bootstrap: str, app_id: str, tmp_path: Path, guarantee: str, **extra: object) -> dict:
    return app_config(bootstrap, app_id, tmp_path / "state", guarantee=guarantee, **extra)


def headers_of(message: object) -> dict[str, bytes | None]:
    return dict(message.headers)  # type: ignore[attr-defined]


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_too_large_output_is_never_committed_past_and_dead_lettered_on_restart(
    bootstrap: str, tmp_path: Path, guarantee: str, on_kafka: bool
) -> None:
    source, sink, dlq = (unique_name(n) for n in ("big-in", "big-out", "big-dlq"))
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    values = [("BIG" if i == BIG_AT else str(i)) for i in range(RECORDS)]
    produce(bootstrap, source, [(f"k{i}", v) for i, v in enumerate(values)], partition=0)
    app_id = unique_name("big")
    topology = amplifying_topology(source, sink).build()

    # 1. Default handler (log_and_fail): the app stops and names the record.
    app = App(topology, config(bootstrap, app_id, tmp_path, guarantee))
    app.start()
    try:
        wait_until(lambda: app.state is AppState.ERROR, 60, message="app failed on the big record")
        failure = app.status()["failure"] or ""
        assert f"{source}[0]@{BIG_AT}" in failure, failure
        assert "production.exception.handler" in failure, failure
    finally:
        app.close(30)
    committed = committed_offsets(bootstrap, app_id, source).get(0)
    assert committed is None or committed <= BIG_AT, (
        f"committed {committed} past the refused record"
    )

    # 2. Restarted with the dead-letter handler: everything else flows.
    app = App(
        topology,
        config(
            bootstrap,
            app_id,
            tmp_path,
            guarantee,
            **{
                "production.exception.handler": "dead_letter_queue",
                "errors.dead.letter.queue.topic.name": dlq,
            },
        ),
    )
    app.start()
    try:
        expected = [v for v in values if v != "BIG"]
        output = consume_all(bootstrap, sink, expected=len(expected), timeout=90, idle=1.0)
        seen = Counter(m.value.decode() for m in output if m.value is not None)
        assert set(seen) == set(expected)
        # On Kafka exactly-once is checked strictly, without asking the broker first; on
        # Tansu only where its read_committed readers hide aborted records.
        strict = guarantee == "exactly_once_v2" and (
            on_kafka or broker_filters_aborted_transactions(bootstrap)
        )
        if strict:
            assert all(n == 1 for n in seen.values()), seen.most_common(3)
        wait_until(
            lambda: committed_offsets(bootstrap, app_id, source).get(0) == RECORDS,
            60,
            message="every input record committed",
        )
        assert app.status()["dead_lettered"] >= 1
    finally:
        assert app.close(30)

    dead = consume_all(bootstrap, dlq, expected=1, timeout=30, idle=1.0)
    assert dead, "the refused record is in the dead-letter topic"
    headers = headers_of(dead[0])
    assert headers["__streams.errors.stage"] == b"production"
    assert headers[HEADER_SINK_TOPIC] == sink.encode()
    assert headers["__streams.errors.topic"] == source.encode()
    assert headers["__streams.errors.offset"] == str(BIG_AT).encode()
    assert int(headers[HEADER_TRUNCATED] or b"0") >= BIG_VALUE_BYTES
    assert dead[0].value is not None and 0 < len(dead[0].value) < BIG_VALUE_BYTES


def test_too_large_poison_record_reaches_the_dead_letter_topic_truncated(
    bootstrap: str, tmp_path: Path
) -> None:
    """A 999,000-byte record that fails to deserialize: its dead-letter copy
    (value plus error headers) is over the limit; it is cut, never dropped."""
    source, sink, dlq = (unique_name(n) for n in ("poison-in", "poison-out", "poison-dlq"))
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    poison = b"{" + b"x" * 998_999  # not JSON
    produce(bootstrap, source, [(b"a", b'{"n": 1}'), (b"b", poison), (b"c", b'{"n": 2}')])
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.BYTES, value_serde=serdes.JSON).to(sink)
    app_id = unique_name("poison")
    app = App(
        builder.build(),
        config(
            bootstrap,
            app_id,
            tmp_path,
            "at_least_once",
            **{
                "deserialization.exception.handler": "dead_letter_queue",
                "errors.dead.letter.queue.topic.name": dlq,
            },
        ),
    )
    app.start()
    try:
        output = consume_all(bootstrap, sink, expected=2, timeout=60, idle=0.5)
        assert sorted(m.key for m in output) == [b"a", b"c"]
        dead = consume_all(bootstrap, dlq, expected=1, timeout=60, idle=0.5)
        assert [m.key for m in dead] == [b"b"]
        headers = headers_of(dead[0])
        assert headers["__streams.errors.stage"] == b"deserialization"
        assert int(headers[HEADER_TRUNCATED] or b"0") > len(poison)
        assert dead[0].value is not None and poison.startswith(dead[0].value)
        wait_until(
            lambda: committed_offsets(bootstrap, app_id, source).get(0) == 3,
            60,
            message="all three input records committed",
        )
        assert app.state is AppState.RUNNING
    finally:
        assert app.close(30)
