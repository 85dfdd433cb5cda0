"""Partition expansion test app: an idempotent per-key count through a repartition topic.

Keys `k<i>` hash over 4 virtual partitions (where Kafka's default
partitioner puts them on a 4-partition topic); keys `p<N>/<name>` are placed
on partition N by the static partitioner (`place`): the keys an expansion
opens new partitions for. Values are per-key sequence numbers (1, 2, ...).
The aggregate keeps the highest sequence number seen per key and counts only
higher ones, so a record processed again (at-least-once replay) is not
counted twice but shows in `replays`; a lost record shows as `count < seq`.

`topology()` reads `$STREAMS_TEST_INPUT` and writes `$STREAMS_TEST_OUTPUT`
(for `streams-runtime expand` in a subprocess); tests build it with `build`.
"""

from __future__ import annotations

import os
from typing import Any

from runtime import StreamsBuilder, Topology, VirtualPartitioner, serdes

VIRTUAL_PARTITIONS = 4
REPARTITION = "by-key"  # the repartition topic is <application.id>-by-key-repartition
STORE = "seq-counts"


def place(key: Any) -> int | None:
    """`p<N>/...` -> N; other keys are hashed."""
    if isinstance(key, str) and key.startswith("p") and "/" in key:
        return int(key[1 : key.index("/")])
    return None


def new_partitioner() -> VirtualPartitioner:
    return VirtualPartitioner(VIRTUAL_PARTITIONS, place=place)


partitioner = new_partitioner()


def fold(key: str, value: str, aggregate: dict[str, int]) -> dict[str, int]:
    seq = int(value)
    if seq <= aggregate["seq"]:
        return {**aggregate, "replays": aggregate["replays"] + 1}
    return {"seq": seq, "count": aggregate["count"] + 1, "replays": aggregate["replays"]}


def build(source: str, sink: str) -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(lambda key, value: key, key_serde=serdes.STRING, name=REPARTITION)
        .aggregate(
            lambda: {"seq": 0, "count": 0, "replays": 0},
            fold,
            store=STORE,
            value_serde=serdes.JSON,
        )
        .to_stream()
        .to(sink, value_serde=serdes.JSON)
    )
    return builder.build()


def topology() -> Topology:
    return build(os.environ["STREAMS_TEST_INPUT"], os.environ["STREAMS_TEST_OUTPUT"])
