"""Exactly-once test app: a pass-through and a per-key count of the same input.

`$STREAMS_TEST_INPUT` (value = sequence number) is copied to
`$STREAMS_TEST_OUTPUT` and counted per key into `$STREAMS_TEST_COUNTS`.
"""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def topology() -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream(
        os.environ["STREAMS_TEST_INPUT"], key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    stream.to(os.environ["STREAMS_TEST_OUTPUT"])
    (
        stream.group_by_key()
        .count(store="eos-counts")
        .to_stream()
        .to(os.environ["STREAMS_TEST_COUNTS"], value_serde=serdes.INT64)
    )
    return builder.build()
