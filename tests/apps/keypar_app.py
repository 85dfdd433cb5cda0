"""Key-parallel test app: a slow (~1 ms) pass-through and a per-key count.

`$STREAMS_TEST_INPUT` (value = sequence number) is copied, after a ~1 ms wait
per record (the GIL released, as an I/O call would), to
`$STREAMS_TEST_OUTPUT`, and counted per key into `$STREAMS_TEST_COUNTS`. Run
with `num.threads.per.task` > 1 it exercises key-parallel processing.
"""

from __future__ import annotations

import os
import time

from runtime import StreamsBuilder, Topology, serdes


def slow_copy(value: str) -> str:
    time.sleep(0.001)
    return value


def build(input_topic: str, output_topic: str, counts_topic: str) -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.map_values(slow_copy).to(
        output_topic, key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    (
        stream.group_by_key()
        .count(store="keypar-counts")
        .to_stream()
        .to(counts_topic, value_serde=serdes.INT64)
    )
    return builder.build()


def topology() -> Topology:
    return build(
        os.environ["STREAMS_TEST_INPUT"],
        os.environ["STREAMS_TEST_OUTPUT"],
        os.environ["STREAMS_TEST_COUNTS"],
    )
