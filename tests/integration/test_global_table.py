"""Global tables on the suite's Kafka: loaded before the first output, kept
up to date while the app runs, and resumed from the global checkpoint after
a restart (under exactly_once_v2: the global store is outside the
transaction, its consumer reads committed records only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime import App, AppState, StreamsBuilder, serdes
from runtime.state.checkpoint import checkpoint_path, read_checkpoint
from runtime.state.global_store import GlobalStore, global_directory
from runtime.topology.topology import Topology
from tests.configs import app_config
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration

STR = serdes.STRING
STORE = "customers"
TABLE_KEYS = 40


def topology(table_topic: str, topic: str, out: str) -> Topology:
    builder = StreamsBuilder()
    table = builder.global_table(table_topic, key_serde=STR, value_serde=STR, store=STORE)
    (
        builder.stream(topic, key_serde=STR, value_serde=STR)
        .left_join(table, lambda key, value: value, lambda v, t: f"{v}={t}")
        .to(out, key_serde=STR, value_serde=STR)
    )
    return builder.build()


def _values(bootstrap: str, out: str, expected: int) -> list[str]:
    records = consume_all(bootstrap, out, expected=expected, timeout=60, idle=0.5)
    return [m.value.decode() for m in records if m.value is not None]


def _global(app: App) -> dict[str, Any]:
    return app.status().global_stores[STORE]


def test_loaded_first_updated_later_resumed_from_the_checkpoint(
    bootstrap: str, tmp_path: Path
) -> None:
    table_topic, topic, out = (unique_name(f"global-{n}") for n in ("tbl", "in", "out"))
    create_topic(bootstrap, table_topic, 2, {"cleanup.policy": "compact"})
    create_topic(bootstrap, topic, 2)
    create_topic(bootstrap, out, 2)
    # Two versions of every row, a deleted row, all written before the app starts.
    rows = [(f"c{i}", f"old{i}") for i in range(TABLE_KEYS)]
    rows += [(f"c{i}", f"v{i}") for i in range(TABLE_KEYS)] + [("c0", None)]
    produce(
        bootstrap, table_topic, rows, key_serializer=STR.serialize, value_serializer=STR.serialize
    )
    lookups = [(f"o{i}", f"c{i}") for i in range(TABLE_KEYS)]
    produce(bootstrap, topic, lookups, key_serializer=STR.serialize, value_serializer=STR.serialize)

    app_id = unique_name("global-app")
    config = app_config(bootstrap, app_id, tmp_path, guarantee="exactly_once_v2", commit_ms=100)
    app = App(topology(table_topic, topic, out), config)
    app.start()  # returns once the global table is loaded
    try:
        assert _global(app)["state"] == "running"
        assert _global(app)["records"] == len(rows)
        # Every stream record saw the whole table: the newest value, the deletion.
        want = ["c0=None"] + [f"c{i}=v{i}" for i in range(1, TABLE_KEYS)]
        assert sorted(_values(bootstrap, out, TABLE_KEYS)) == sorted(want)

        # A table update while running is seen by a later stream record.
        produce(
            bootstrap,
            table_topic,
            [("c1", "new1")],
            key_serializer=STR.serialize,
            value_serializer=STR.serialize,
        )
        wait_until(lambda: _global(app)["records"] == len(rows) + 1, timeout=30)
        assert _global(app)["lag"] == 0
        produce(
            bootstrap,
            topic,
            [("o-late", "c1")],
            key_serializer=STR.serialize,
            value_serializer=STR.serialize,
        )
        assert "c1=new1" in _values(bootstrap, out, TABLE_KEYS + 1)
        assert app.store(STORE).get("c1") == "new1"
    finally:
        app.close(30)

    saved = read_checkpoint(checkpoint_path(global_directory(tmp_path, app_id, -1)))
    assert saved is not None and sum(saved.values()) == len(rows) + 1

    # Restart: only what came after the checkpoint is read.
    produce(
        bootstrap,
        table_topic,
        [("c2", "new2")],
        key_serializer=STR.serialize,
        value_serializer=STR.serialize,
    )
    again = App(topology(table_topic, topic, out), config)
    again.start()
    try:
        assert _global(again)["records"] == 1
        produce(
            bootstrap,
            topic,
            [("o-restart", "c2")],
            key_serializer=STR.serialize,
            value_serializer=STR.serialize,
        )
        assert "c2=new2" in _values(bootstrap, out, TABLE_KEYS + 2)
    finally:
        again.close(30)


def test_a_global_thread_failure_after_start_stops_the_app(
    bootstrap: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As Kafka Streams: joins must not go on against a table that stopped
    following its topic; the app ends in ERROR, naming the global thread."""
    table_topic, topic, out = (unique_name(f"global-fail-{n}") for n in ("tbl", "in", "out"))
    for name in (table_topic, topic, out):
        create_topic(bootstrap, name, 1)
    produce(
        bootstrap,
        table_topic,
        [("c1", "v1")],
        key_serializer=STR.serialize,
        value_serializer=STR.serialize,
    )
    config = app_config(bootstrap, unique_name("global-fail"), tmp_path, commit_ms=100)
    app = App(topology(table_topic, topic, out), config)
    app.start()
    try:
        assert _global(app)["state"] == "running"

        def disk_gone(self: GlobalStore, records: Any) -> int:
            raise OSError("No space left on device")

        # A write failing from here on, as a full or failed disk would make it.
        monkeypatch.setattr(GlobalStore, "apply", disk_gone)
        produce(
            bootstrap,
            table_topic,
            [("c1", "v2")],
            key_serializer=STR.serialize,
            value_serializer=STR.serialize,
        )
        assert app.wait(60), "the app kept running on a global table that stopped"
        assert app.state is AppState.ERROR
        assert "global thread" in str(app.status().failure or "")
    finally:
        app.close(30)
