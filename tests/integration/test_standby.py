"""Standby replicas: a task moving to the instance that kept it warm restores
(almost) nothing."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from runtime import App, StreamsBuilder, serdes
from tests.configs import app_config
from tests.kafka_helpers import (
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration


def counting_app(bootstrap: str, app_id: str, source: str, sink: str, state_dir: Path) -> App:
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
            state_dir,
            threads=1,
            **{
                "num.standby.replicas": 1,
                # Every update reaches the changelog: a long history to not restore.
                "cache.max.bytes": 0,
            },
        ),
    )


def running_tasks(app: App) -> set[str]:
    return {t["id"] for t in app.status()["tasks"] if t["state"] == "RUNNING"}


def test_standby_takes_over_with_nothing_to_restore(bootstrap: str, tmp_path: Path) -> None:
    app_id = unique_name("standby")
    source, sink = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    records = [(f"k{i % 40}", "x") for i in range(4000)]
    produce(bootstrap, source, records)
    a = counting_app(bootstrap, app_id, source, sink, tmp_path / "a")
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b")
    a.start()
    b.start()
    changelog = f"{app_id}-counts-changelog"
    try:
        wait_until(
            lambda: (
                running_tasks(a) | running_tasks(b) == {"0_0", "0_1", "0_2", "0_3"}
                and running_tasks(a)
                and running_tasks(b)
            ),
            90,
            message="the two instances never shared the four tasks",
        )
        expected = Counter(k for k, _ in records)

        def counts_done() -> bool:
            latest = {}
            for m in consume_all(bootstrap, sink, idle=0.5):
                latest[m.key.decode()] = serdes.INT64.deserialize(m.value)
            return latest == dict(expected)

        wait_until(counts_done, 60, interval=1.0, message="counts never complete")

        # Each instance keeps a standby of each task the other runs, caught up.
        def standbys_current() -> bool:
            ends = end_offsets(bootstrap, changelog)
            for mine, other in ((a, b), (b, a)):
                standbys = mine.status()["standbys"]
                if set(standbys) != running_tasks(other):
                    return False
                for task_id, positions in standbys.items():
                    partition = int(task_id.split("_")[1])
                    if positions.get(f"{changelog}-{partition}") != ends[partition]:
                        return False
            return True

        wait_until(standbys_current, 60, interval=0.5, message="standbys never caught up")
        b_tasks = running_tasks(b)
        restored_before = a.status()["restored"]
        changelog_size = sum(end_offsets(bootstrap, changelog)[int(t[-1])] for t in b_tasks)

        assert b.close(30)
        wait_until(
            lambda: running_tasks(a) == {"0_0", "0_1", "0_2", "0_3"},
            90,
            message="a never took over b's tasks",
        )
        restored = a.status()["restored"] - restored_before
        # Only what b wrote in its final commit, after the standby's last
        # update, may need restoring: far less than the changelogs hold.
        assert restored <= 40, (restored, changelog_size)
        assert changelog_size > 1000

        more = [(f"k{i % 40}", "x") for i in range(400)]
        produce(bootstrap, source, more)
        expected.update(k for k, _ in more)
        wait_until(counts_done, 60, interval=1.0, message="counts wrong after the take-over")
        assert a.store("counts").get("k7") == expected["k7"]
    finally:
        a.close(30)
        b.close(30)
