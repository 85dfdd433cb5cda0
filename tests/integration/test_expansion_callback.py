"""The expansion callback is effectively once: an interrupted one runs again at start-up.

An instance that won an expansion's marker topic and stopped before
recording the callback done (`<marker>-done`) left a marker alone; the next
instance to start runs the callback with the counts the marker names and
records it done. Real Apache Kafka (CreateTopics once per name).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from runtime import App, VirtualPartitioner
from runtime.partitioning.expansion_marker import done_topic, marker_topic
from tests.apps import expansion_app
from tests.kafka_helpers import create_topic, unique_name, wait_until

pytestmark = pytest.mark.integration


def topics(bootstrap: str) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=30).topics)


def test_an_interrupted_callback_runs_at_the_next_start_up(bootstrap: str, tmp_path: Path) -> None:
    source, sink, app_id = unique_name("cb-in"), unique_name("cb-out"), unique_name("callback")
    create_topic(bootstrap, source, 8)
    create_topic(bootstrap, sink, 8)
    finished = marker_topic(app_id, [(source, 2, 4)])
    interrupted = marker_topic(app_id, [(source, 4, 8)])
    for name in (finished, done_topic(finished), interrupted):  # what a crash leaves
        create_topic(bootstrap, name, 1)
    partitioner = VirtualPartitioner(8)
    app = App(
        expansion_app.build(source, sink),
        {
            "application.id": app_id,
            "bootstrap.servers": bootstrap,
            "state.dir": str(tmp_path),
            "static.partitioner": partitioner,
        },
    )
    app.start()  # waits out the 10 s grace for a slow runner first
    try:
        assert partitioner.expansions == [(4, 8)]  # not the finished one
        wait_until(
            lambda: done_topic(interrupted) in topics(bootstrap),
            30,
            message="the re-run was not recorded done",
        )
    finally:
        assert app.close(30)
    again = VirtualPartitioner(8)
    second = App(
        expansion_app.build(source, sink),
        {
            "application.id": app_id,
            "bootstrap.servers": bootstrap,
            "state.dir": str(tmp_path / "b"),
            "static.partitioner": again,
        },
    )
    second.start()
    try:
        assert again.expansions == [], "a callback recorded done ran again"
    finally:
        assert second.close(30)
