"""The topics check `audit` and `backfill` make before Spark starts (issue 32), without
a cluster: what it names, and a cluster that does not answer. (The integration test
`test_spark_preflight.py` runs the commands against Kafka.)"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from runtime import StreamsBuilder
from runtime.config import StreamsConfig
from runtime.kafka.topics import TopicError
from runtime.spark import preflight
from runtime.spark.kafka import KafkaSourceError


def test_a_cluster_that_does_not_answer_fails_the_check_in_its_timeout() -> None:
    started = time.monotonic()
    with pytest.raises(KafkaSourceError, match=r"cannot reach the Kafka cluster at '127.0.0.1:9'"):
        preflight.check_audit_topics("127.0.0.1:9", "in", "out", timeout=1.0)
    assert time.monotonic() - started < 5


def fake_cluster(monkeypatch: pytest.MonkeyPatch, existing: set[str]) -> list[list[str]]:
    asked: list[list[str]] = []

    def missing(settings: Mapping[str, Any], topics: Sequence[str], timeout: float) -> list[str]:
        asked.append(list(topics))
        return [t for t in topics if t not in existing]

    monkeypatch.setattr(preflight, "missing_topics", missing)
    return asked


def test_the_audit_names_only_its_missing_topic(monkeypatch: pytest.MonkeyPatch) -> None:
    asked = fake_cluster(monkeypatch, {"orders"})
    with pytest.raises(KafkaSourceError) as caught:
        preflight.check_audit_topics("b:9092", "orders", "orders-copy")
    assert asked == [["orders", "orders-copy"]]
    assert str(caught.value) == (
        "output topic 'orders-copy' does not exist at b:9092: create it with `streams-runtime "
        "topics create MODULE:ATTR --partitions N`, MODULE:ATTR naming the topology that reads "
        "and writes it (or check --bootstrap and the topic names)"
    )
    fake_cluster(monkeypatch, {"orders", "orders-copy"})
    preflight.check_audit_topics("b:9092", "orders", "orders-copy")  # both there: no error


def test_the_backfill_checks_user_topics_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Repartition topics and changelogs are the backfill's to create, as the daemon's."""
    builder = StreamsBuilder()
    (
        builder.stream("lines")
        .group_by(lambda key, value: value)
        .count(store="counts")
        .to_stream()
        .to("word-counts")
    )
    config = StreamsConfig.from_dict({"application.id": "wc", "bootstrap.servers": "b:9092"})
    asked = fake_cluster(monkeypatch, {"lines"})
    with pytest.raises(TopicError) as caught:
        preflight.check_backfill_topics(builder.build(), config, "wc:topology")
    assert asked == [["lines", "word-counts"]]
    assert str(caught.value) == (
        "output topic 'word-counts' (subtopology 1) does not exist; create them with "
        "`streams-runtime topics create wc:topology --partitions N` (same --config/--set as "
        "the backfill)"
    )
