"""Client configs: the runtime's forced settings and KIP-848's group protocol."""

from __future__ import annotations

from dataclasses import replace

import pytest
from confluent_kafka import Consumer

from runtime.config import ConfigError, StreamsConfig
from runtime.kafka.clients import consumer_config


def config(**extra: object) -> StreamsConfig:
    return StreamsConfig.from_dict(
        {"application.id": "app", "bootstrap.servers": "127.0.0.1:1", **extra}
    )


def test_offsets_are_never_committed_automatically_whatever_the_user_says() -> None:
    # The config refuses it (issue 31); the builder forces it all the same.
    with pytest.raises(ConfigError, match="consumer.enable.auto.commit"):
        config(**{"consumer.enable.auto.commit": True})
    unchecked = replace(config(), consumer_overrides={"enable.auto.commit": True})
    settings = consumer_config(unchecked, "range", {})
    assert settings["enable.auto.commit"] is False
    assert settings["enable.auto.offset.store"] is False


def test_classic_protocol_uses_the_client_side_assignor() -> None:
    settings = consumer_config(config(), "cooperative-sticky", {})
    assert settings["partition.assignment.strategy"] == "cooperative-sticky"
    assert "group.remote.assignor" not in settings


def test_consumer_group_protocol_moves_assignment_to_the_broker() -> None:
    cfg = config(**{"consumer.group.protocol": "consumer", "consumer.session.timeout.ms": 6000})
    copartitioned = consumer_config(cfg, "range", {})
    assert copartitioned["group.remote.assignor"] == "range"
    assert "partition.assignment.strategy" not in copartitioned
    assert "session.timeout.ms" not in copartitioned
    assert consumer_config(cfg, "cooperative-sticky", {})["group.remote.assignor"] == "uniform"
    Consumer(copartitioned).close()  # librdkafka accepts the result


def test_a_chosen_remote_assignor_wins() -> None:
    cfg = config(
        **{"consumer.group.protocol": "consumer", "consumer.group.remote.assignor": "uniform"}
    )
    assert consumer_config(cfg, "range", {})["group.remote.assignor"] == "uniform"


def test_the_prefetch_is_sized_to_the_input_buffers() -> None:
    """A pause drops librdkafka's prefetch for the partition: it holds at most
    a quarter of the buffer's bound, and a fetch brings 256 KiB a partition
    (runtime.kafka.clients.input_prefetch)."""
    settings = consumer_config(config(**{"buffered.records.per.partition": 3000}), "range", {})
    assert settings["max.partition.fetch.bytes"] == 262_144
    assert settings["queued.min.messages"] == 750
    Consumer({**settings, "group.id": "g"}).close()  # librdkafka takes them


def test_named_queries_keep_small_fetches() -> None:
    """A light query's record waits in the consumer's one queue behind what a
    heavy query's refill fetched: an app of named queries fetches 64 KiB a
    partition and queues half the bound (as the queries benchmark measured)."""
    cfg = config(**{"buffered.records.per.partition": 3000})
    settings = consumer_config(cfg, "range", {}, named_queries=True)
    assert settings["max.partition.fetch.bytes"] == 65_536
    assert settings["queued.min.messages"] == 1500


def test_a_configured_partition_fetch_size_wins() -> None:
    cfg = config(
        **{"consumer.max.partition.fetch.bytes": 1_048_576, "consumer.queued.min.messages": 9}
    )
    settings = consumer_config(cfg, "range", {})
    assert settings["max.partition.fetch.bytes"] == 1_048_576
    assert settings["queued.min.messages"] == 9
