"""Static partitioners: keys never move, and sinks use them for every keyed record."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import StreamsBuilder, VirtualPartitioner, serdes
from runtime.config import ConfigError, StreamsConfig
from runtime.partitioning.default import default_partition
from runtime.partitioning.static import static_partitioner_from_name
from runtime.topology.testing import RecordingTaskContext

keys = st.binary(max_size=32) | st.text(max_size=16) | st.integers(-(2**63), 2**63 - 1)


def as_bytes(key: Any) -> bytes:
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode()
    return int(key).to_bytes(8, "big", signed=True)


@given(key=keys, virtual=st.integers(1, 64), extra=st.integers(0, 1000))
def test_a_key_never_moves_when_the_topic_grows(key: Any, virtual: int, extra: int) -> None:
    partitioner = VirtualPartitioner(virtual)
    at_start = partitioner.static_partition("t", key, virtual)
    assert partitioner.static_partition("t", key, virtual + extra) == at_start
    # Before any expansion: exactly Kafka's default partitioner on the serialized key.
    assert at_start == default_partition(as_bytes(key), virtual)


@given(key=st.text(max_size=8), partition=st.integers(0, 99))
def test_a_placement_rule_wins_over_hashing(key: str, partition: int) -> None:
    partitioner = VirtualPartitioner(4, place=lambda k: partition if k.startswith("x") else None)
    placed = partitioner.static_partition("t", "x" + key, 100)
    assert placed == partition
    assert partitioner.static_partition("t", "y" + key, 100) < 4


def test_fewer_partitions_than_virtual_ones_is_refused() -> None:
    with pytest.raises(ValueError, match="fewer than the 8 virtual partitions"):
        VirtualPartitioner(8).static_partition("small", b"k", 4)
    with pytest.raises(TypeError, match="key_bytes"):
        VirtualPartitioner(4).static_partition("t", 1.5, 4)
    with pytest.raises(ValueError):
        VirtualPartitioner(0)


def test_config_resolves_module_attr_and_refuses_what_is_not_a_partitioner() -> None:
    base = {"application.id": "a", "bootstrap.servers": "localhost:9092"}
    config = StreamsConfig.from_dict(
        {**base, "static.partitioner": "tests.apps.expansion_app:partitioner"}
    )
    assert isinstance(config.static_partitioner, VirtualPartitioner)
    assert config.as_display_dict()["static.partitioner"] == "tests.apps.expansion_app:partitioner"
    for bad, reason in [
        ("os:system", "no static_partition"),
        ("json", "module:attr"),
        ("tests.apps.expansion_app:nothing", "has no"),
        (42, "expected"),
    ]:
        with pytest.raises(ConfigError, match=reason) as info:
            StreamsConfig.from_dict({**base, "static.partitioner": bad})
        assert info.value.key == "static.partitioner"


class WithClass:
    def static_partition(self, topic: str, key: Any, num_partitions: int) -> int:
        return 0


def test_a_class_is_made_with_no_arguments() -> None:
    assert isinstance(static_partitioner_from_name(f"{__name__}:WithClass"), WithClass)


def sink_graph(partitioner: Any = None) -> Any:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING).to(
        "out", partitioner=partitioner
    )
    return builder.build().subtopologies[0]


def test_the_static_partitioner_replaces_a_sinks_own_and_skips_null_keys() -> None:
    static = VirtualPartitioner(2, place=lambda k: 5 if k == "new" else None)
    ctx = RecordingTaskContext(static_partitioner=static, partitions={"out": 8})
    graph = ctx.instantiate(sink_graph(partitioner=lambda k, v, n: 7))
    for key in ("new", "old", None):
        ctx.process(graph, "in", key, "v")
    partitions = [s.partition for s in ctx.sent]
    assert partitions == [5, default_partition(b"old", 2), None]


def test_a_partition_out_of_range_names_the_sink_and_the_fix() -> None:
    static = VirtualPartitioner(2, place=lambda k: 6)
    ctx = RecordingTaskContext(static_partitioner=static, partitions={"out": 4})
    graph = ctx.instantiate(sink_graph())
    with pytest.raises(ValueError, match="returned 6 for topic 'out' with 4 partitions.*expand"):
        ctx.process(graph, "in", "k", "v")
