"""Restoration runs beside processing: a ready task is not held up by a restoring one."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import App, StreamsBuilder, serdes
from tests.configs import app_config
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration

RESTORE_RECORDS = 1_000_000


def test_ready_task_processes_while_another_restores_a_million_records(
    bootstrap: str, tmp_path: Path
) -> None:
    app_id = unique_name("restore")
    source, sink = unique_name("in"), unique_name("out")
    store = "counts"
    changelog = f"{app_id}-{store}-changelog"
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    create_topic(bootstrap, changelog, 2, config={"cleanup.policy": "compact"})
    # Partition 0's task has a long history to restore: a million counts.
    produce(
        bootstrap,
        changelog,
        (
            (f"key-{i}".encode(), serdes.INT64.serialize(i % 7 + 1), 0)
            for i in range(RESTORE_RECORDS)
        ),
    )

    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .count(store=store)
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    app = App(
        builder.build(),
        app_config(
            bootstrap, app_id, tmp_path, commit_ms=100, heartbeat_ms=None, **{"cache.max.bytes": 0}
        ),
    )
    # Partition 1's task has nothing to restore and input waiting.
    produce(bootstrap, source, [(f"fresh-{i}", "x", 1) for i in range(100)])
    app.start()
    try:

        def task_state(task_id: str) -> str | None:
            for task in app.status()["tasks"]:
                if task["id"] == task_id:
                    return str(task["state"])
            return None

        wait_until(lambda: task_state("0_0") == "RESTORING", 30, message="0_0 never restored")
        # Output of the ready task arrives while 0_0 is still restoring.
        ready_output = consume_all(bootstrap, sink, expected=100, timeout=60, idle=0.2)
        assert task_state("0_0") == "RESTORING", "restore ended before output: test too weak"
        assert {m.key.decode() for m in ready_output} == {f"fresh-{i}" for i in range(100)}
        progress = next(t for t in app.status()["tasks"] if t["id"] == "0_0")["restore"]
        assert progress["restored"] > 0 or progress["remaining"] > 0

        wait_until(lambda: task_state("0_0") == "RUNNING", 180, message="restore did not finish")
        assert app.status()["restored"] == RESTORE_RECORDS
        # The restored counts continue: key-3 had 4, one more record makes 5.
        produce(bootstrap, source, [("key-3", "x", 0)])
        got = consume_all(bootstrap, sink, expected=101, timeout=60, idle=0.5)
        latest = {m.key.decode(): serdes.INT64.deserialize(m.value) for m in got}
        assert latest["key-3"] == 5
        assert app.store(store).get("key-3") == 5
        assert app.store(store).get("key-10") == 4  # restored, never reprocessed
    finally:
        assert app.close(60)


def test_a_restore_cut_short_continues_from_where_it_stopped(
    bootstrap: str, tmp_path: Path
) -> None:
    """Issue 31, item 10: a task revoked while it restores (a rebalance, a
    close) checkpoints what it applied; restored here again, it continues
    from there instead of the changelog's start."""
    total = 300_000
    app_id = unique_name("restore-cut")
    source, sink = unique_name("in"), unique_name("out")
    changelog = f"{app_id}-counts-changelog"
    create_topic(bootstrap, source, 1)
    create_topic(bootstrap, sink, 1)
    create_topic(bootstrap, changelog, 1, config={"cleanup.policy": "compact"})
    produce(
        bootstrap,
        changelog,
        ((f"key-{i}".encode(), serdes.INT64.serialize(i % 7 + 1), 0) for i in range(total)),
    )

    def make_app() -> App:
        builder = StreamsBuilder()
        (
            builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
            .group_by_key()
            .count(store="counts")
            .to_stream()
            .to(sink, value_serde=serdes.INT64)
        )
        return App(
            builder.build(),
            app_config(
                bootstrap,
                app_id,
                tmp_path,
                threads=None,
                commit_ms=None,
                heartbeat_ms=None,
                # Small fetches: the restore takes long enough to be cut.
                **{"restore.consumer.max.partition.fetch.bytes": 2048},
            ),
        )

    def restore_progress(app: App) -> dict:
        task = next((t for t in app.status()["tasks"] if t["id"] == "0_0"), None)
        return (task or {}).get("restore") or {}

    first = make_app()
    first.start()
    try:
        wait_until(
            lambda: restore_progress(first).get("restored", 0) > 1000,
            60,
            interval=0.01,
            message="0_0 never restored",
        )
    finally:
        assert first.close(60)
    first_restored = first.status()["restored"]
    assert 0 < first_restored < total, f"restore not cut short: {first_restored}"

    second = make_app()
    second.start()
    try:
        wait_until(
            lambda: any(t["state"] == "RUNNING" for t in second.status()["tasks"]),
            120,
            message="0_0 never ran",
        )
        again = second.status()["restores"]["0_0"]["records"]
        # Continued where it stopped (the first run may have applied a few
        # records more than its status said before close).
        assert again <= total - first_restored, (again, first_restored)
        assert again >= total - first_restored - 50_000, (again, first_restored)
        assert second.store("counts").get("key-3") == 4
        assert second.store("counts").get(f"key-{total - 1}") == (total - 1) % 7 + 1
    finally:
        assert second.close(60)
