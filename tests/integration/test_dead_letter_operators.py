"""The dead-letter topic covers the new operators' user functions (issue 35, item 10).

One app on Kafka runs three subtopologies whose user functions raise on a
poison value: a stream-stream join's joiner, a foreign-key join's extractor
(behind the left table's cache) and a session aggregation's aggregator.
Under `processing.exception.handler=dead_letter_queue` each poison record
lands in `<application.id>-dlq` once, with its original key and value and
headers naming the error and its origin (topic, partition, offset), and the
good records around it come out.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest
from confluent_kafka import Producer

from runtime import App, JoinWindows, SessionWindows, StreamsBuilder, serdes
from runtime.error_handlers import (
    HEADER_EXCEPTION,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_STAGE,
    HEADER_TOPIC,
)
from tests.configs import app_config
from tests.kafka_helpers import consume_all, create_topic, unique_name

pytestmark = pytest.mark.integration


class Poison(Exception):
    pass


def check(value: str) -> str:
    if value == "boom":
        raise Poison(f"poison value {value!r}")
    return value


def write(bootstrap: str, topic: str, records: list[tuple[str, str, int]]) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, ts in records:
        producer.produce(topic, value.encode(), key.encode(), partition=0, timestamp=ts)
    assert producer.flush(30) == 0


def test_poison_records_of_joins_fk_joins_and_sessions_are_dead_lettered(
    bootstrap: str, tmp_path: Path
) -> None:
    t = {
        name: unique_name(f"dlq-{name}")
        for name in ("left", "right", "orders", "customers", "clicks", "out")
    }
    for topic in t.values():
        create_topic(bootstrap, topic, 1)
    s = serdes.STRING
    builder = StreamsBuilder()
    # Stream-stream join: the joiner raises on a poison left value.
    left = builder.stream(t["left"], key_serde=s, value_serde=s)
    right = builder.stream(t["right"], key_serde=s, value_serde=s)
    left.join(
        right,
        lambda lv, rv: f"join:{check(lv)}+{rv}",
        windows=JoinWindows.of_time_difference_and_grace(timedelta(seconds=5), timedelta(0)),
    ).to(t["out"], key_serde=s, value_serde=s)
    # Foreign-key join: the extractor raises on a poison order.
    orders = builder.table(t["orders"], key_serde=s, value_serde=s)
    customers = builder.table(t["customers"], key_serde=s, value_serde=s)
    orders.join(
        customers,
        lambda order: check(order).split(":")[1],
        lambda o, c: f"fk:{o}+{c}",
        value_serde=s,
    ).to_stream().to(t["out"], key_serde=s, value_serde=s)
    # Session aggregation: the aggregator raises on a poison click.
    sessions = SessionWindows.of_inactivity_gap_with_grace(timedelta(seconds=10), timedelta(0))
    builder.stream(t["clicks"], key_serde=s, value_serde=s).group_by_key().windowed_by(
        sessions
    ).aggregate(lambda: "", lambda k, v, agg: agg + check(v), lambda k, a, b: a + b, value_serde=s)

    app_id = unique_name("dlq-ops")
    app = App(
        builder.build(),
        app_config(
            bootstrap,
            app_id,
            tmp_path / "state",
            **{"processing.exception.handler": "dead_letter_queue"},
        ),
    )
    write(bootstrap, t["right"], [("a", "r1", 1_000), ("b", "r2", 1_000)])
    write(bootstrap, t["left"], [("a", "boom", 1_001), ("b", "ok", 1_001)])
    write(bootstrap, t["customers"], [("c1", "Ada", 1_000)])
    write(bootstrap, t["orders"], [("o1", "boom", 1_001), ("o2", "order:c1", 1_002)])
    write(bootstrap, t["clicks"], [("u", "x", 1_000), ("u", "boom", 1_001), ("u", "y", 1_002)])
    app.start()
    try:
        dlq = consume_all(bootstrap, f"{app_id}-dlq", expected=3, timeout=60, idle=1.0)
        out = consume_all(bootstrap, t["out"], expected=2, timeout=60, idle=0.5)
        status = app.status()
    finally:
        app.close(30)

    # (a foreign-key join may emit its result twice: once answering the
    # subscription, once on the customer's arrival, as Kafka Streams does)
    assert {m.value.decode() for m in out} == {"fk:order:c1+Ada", "join:ok+r2"}
    by_origin = {}
    for m in dlq:
        headers = dict(m.headers)
        by_origin[headers[HEADER_TOPIC].decode()] = (m, headers)
    # The extractor runs when the orders table's cache is flushed at a commit,
    # with no consumed record at hand: the flushed entry is dead-lettered,
    # naming the table's changelog (runtime.processing.flush_errors).
    (changelog,) = (o for o in by_origin if o.endswith("-changelog"))
    assert t["orders"] in changelog
    assert set(by_origin) == {t["left"], changelog, t["clicks"]}, "one per poison record"
    expected = {t["left"]: (b"a", b"0"), changelog: (b"o1", b"-1"), t["clicks"]: (b"u", b"1")}
    for origin, (m, headers) in by_origin.items():
        assert (m.key, headers[HEADER_OFFSET]) == expected[origin], origin
        assert m.value == b"boom", "the original value"
        assert headers[HEADER_EXCEPTION] == b"Poison"
        assert b"poison value" in headers[HEADER_MESSAGE]
        assert headers[HEADER_STAGE] == b"processing"
        assert headers[HEADER_PARTITION] == b"0"
    assert status.dead_lettered == 3
