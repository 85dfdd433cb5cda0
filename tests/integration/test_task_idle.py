"""`max.task.idle.ms` on Kafka: a stream-table join sees the table as of each record's time.

Orders (stream) and customers (table) are co-partitioned; every customer
record is older than every order but reaches the broker after them. A task
takes the oldest head record of its partitions, so it must not take an order
while the customers partition is empty and may still bring older records:
- backlog (default 0): the customers are on the broker, not yet fetched;
  the task waits for them and every order is enriched;
- live (a few seconds): the orders are buffered before the customers are
  even produced; the task waits and every order is enriched;
- live with -1 (never wait): the same orders are processed at once, unenriched.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka import Producer

from runtime import App, AppState, StreamsBuilder, serdes
from tests.configs import app_config
from tests.kafka_helpers import consume_all, create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration

ORDERS = 30
CUSTOMERS = 5


def write(bootstrap: str, topic: str, records: list[tuple[str, str, int]]) -> None:
    """(key, value, timestamp ms) to partition 0, in order."""
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for key, value, ts in records:
        producer.produce(topic, value.encode(), key.encode(), partition=0, timestamp=ts)
    assert producer.flush(30) == 0


def orders() -> list[tuple[str, str, int]]:
    return [(f"c{i % CUSTOMERS}", f"o{i}", 10_000 + i) for i in range(ORDERS)]


def customers() -> list[tuple[str, str, int]]:
    return [(f"c{i}", f"name{i}", 1_000 + i) for i in range(CUSTOMERS)]


class Setup:
    def __init__(self, bootstrap: str, tmp_path: Path, idle_ms: int | None) -> None:
        self.bootstrap = bootstrap
        self.orders, self.customers = unique_name("idle-orders"), unique_name("idle-customers")
        self.out = unique_name("idle-out")
        for topic in (self.orders, self.customers, self.out):
            create_topic(bootstrap, topic, 1)
        builder = StreamsBuilder()
        table = builder.table(self.customers, key_serde=serdes.STRING, value_serde=serdes.STRING)
        builder.stream(self.orders, key_serde=serdes.STRING, value_serde=serdes.STRING).left_join(
            table, lambda order, name: f"{order}:{name}"
        ).to(self.out, key_serde=serdes.STRING, value_serde=serdes.STRING)
        extra = {} if idle_ms is None else {"max.task.idle.ms": idle_ms}
        self.app = App(
            builder.build(),
            app_config(bootstrap, unique_name("idle"), tmp_path / "state", threads=1, **extra),
        )

    def joined(self) -> list[str]:
        output = consume_all(self.bootstrap, self.out, expected=ORDERS, timeout=60, idle=0.5)
        return [m.value.decode() for m in output]

    def task(self) -> object:
        tasks = [t for t in self.app.status().tasks if t.state == "RUNNING"]
        return tasks[0] if tasks else None


def enriched(values: list[str]) -> bool:
    return all(not v.endswith(":None") for v in values)


def test_backlog_the_default_waits_for_the_table_records_on_the_broker(
    bootstrap: str, tmp_path: Path
) -> None:
    setup = Setup(bootstrap, tmp_path, None)
    write(bootstrap, setup.orders, orders())
    write(bootstrap, setup.customers, customers())
    setup.app.start()
    try:
        values = setup.joined()
    finally:
        setup.app.close(30)
    assert len(values) == ORDERS
    assert values == [f"o{i}:name{i % CUSTOMERS}" for i in range(ORDERS)]


@pytest.mark.parametrize("idle_ms", [4000, -1])
def test_live_orders_wait_for_customers_produced_after_them(
    bootstrap: str, tmp_path: Path, idle_ms: int
) -> None:
    setup = Setup(bootstrap, tmp_path, idle_ms)
    setup.app.start()
    try:
        wait_until(lambda: setup.app.state is AppState.RUNNING, 60, message="app running")
        wait_until(lambda: setup.task() is not None, 60, message="task running")
        write(bootstrap, setup.orders, orders())
        if idle_ms >= 0:
            # The orders sit in the task's buffer, waiting for the customers partition.
            wait_until(lambda: setup.task().buffered == ORDERS, 30, message="orders buffered")  # type: ignore[attr-defined]
            assert setup.task().processed == 0  # type: ignore[attr-defined]
        else:
            wait_until(lambda: setup.task().processed == ORDERS, 30, message="orders processed")  # type: ignore[attr-defined]
        write(bootstrap, setup.customers, customers())
        values = setup.joined()
        status = setup.app.status()
    finally:
        setup.app.close(30)
    assert len(values) == ORDERS
    if idle_ms >= 0:
        assert values == [f"o{i}:name{i % CUSTOMERS}" for i in range(ORDERS)]
        # Once the customers were taken their partition was empty again: the
        # orders (all younger) waited max.task.idle.ms for more, then went anyway.
        assert sum(t.enforced_processing for t in status.tasks) == ORDERS
    else:
        assert values == [f"o{i}:None" for i in range(ORDERS)]


def test_a_partition_that_never_gets_a_record_does_not_hold_the_others_back(
    bootstrap: str, tmp_path: Path
) -> None:
    """The empty side of a merge is known caught up after the first fetch
    response (cached high watermark, no committed offset): at the default the
    other side's records flow, enforced, without waiting."""
    busy, empty, out = unique_name("idle-busy"), unique_name("idle-empty"), unique_name("idle-m")
    for topic in (busy, empty, out):
        create_topic(bootstrap, topic, 1)
    builder = StreamsBuilder()
    builder.stream(busy, key_serde=serdes.STRING, value_serde=serdes.STRING).merge(
        builder.stream(empty, key_serde=serdes.STRING, value_serde=serdes.STRING)
    ).to(out, key_serde=serdes.STRING, value_serde=serdes.STRING)
    app = App(
        builder.build(), app_config(bootstrap, unique_name("idle"), tmp_path / "s", threads=1)
    )
    write(bootstrap, busy, orders())
    app.start()
    try:
        output = consume_all(bootstrap, out, expected=ORDERS, timeout=60, idle=0.2)
        status = app.status()
    finally:
        app.close(30)
    assert [m.value.decode() for m in output] == [f"o{i}" for i in range(ORDERS)]
    assert sum(t.enforced_processing for t in status.tasks) == ORDERS
