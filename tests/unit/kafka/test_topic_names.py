"""A user topic may be named `<application.id>-...`: the topology, not the name, says
what is internal (pure logic, with a fake admin client)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from runtime import StreamsBuilder, serdes
from runtime.kafka.topics import TopicError, resolve_topics


class FakeAdmin:
    """`list_topics` with the given topics; DescribeConfigs answers each topic's
    `max.message.bytes` from `limits`."""

    def __init__(self, topics: dict[str, int], limits: dict[str, int] | None = None) -> None:
        self.topics = topics
        self.limits = limits or {}

    def list_topics(self, timeout: float) -> Any:
        return SimpleNamespace(
            topics={
                name: SimpleNamespace(partitions=dict.fromkeys(range(count)), error=None)
                for name, count in self.topics.items()
            }
        )

    def describe_configs(self, resources: list[Any], request_timeout: float) -> Any:
        answers = {}
        for resource in resources:
            limit = self.limits.get(resource.name, 1_048_588)
            entry = SimpleNamespace(value=str(limit))
            answers[resource] = SimpleNamespace(
                result=lambda timeout, entry=entry: {"max.message.bytes": entry}
            )
        return answers


def topology(source: str, sink: str) -> Any:
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).to(
        sink, key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    return builder.build()


def test_a_missing_user_topic_with_the_app_prefix_is_reported_as_missing_only() -> None:
    admin = FakeAdmin({"orders-out": 2})
    with pytest.raises(TopicError) as failed:
        resolve_topics(admin, topology("orders-input", "orders-out"), "orders", 1, {})  # type: ignore[arg-type]
    message = str(failed.value)
    assert "source topic 'orders-input'" in message and "does not exist" in message
    assert "no writer" not in message, message


def test_a_user_input_with_the_app_prefix_does_not_limit_the_producer() -> None:
    """The producer's record limit comes from the topics it writes; an input topic
    named like an internal one is not one of them."""
    admin = FakeAdmin({"orders-input": 3, "orders-out": 3}, {"orders-input": 1000})
    layout = resolve_topics(admin, topology("orders-input", "orders-out"), "orders", 1, {})  # type: ignore[arg-type]
    assert layout.partitions["orders-input"] == 3
    assert layout.max_message_bytes == 1_048_588
