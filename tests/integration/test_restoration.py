"""Restoration runs beside processing: a ready task is not held up by a restoring one."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import App, StreamsBuilder, serdes
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
        {
            "application.id": app_id,
            "bootstrap.servers": bootstrap,
            "processing.threads": 2,
            "commit.interval.ms": 100,
            "cache.max.bytes": 0,
            "state.dir": str(tmp_path),
            "consumer.session.timeout.ms": 6000,
        },
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
