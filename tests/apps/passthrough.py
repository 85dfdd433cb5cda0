"""Copy every record of `$STREAMS_TEST_INPUT` to `$STREAMS_TEST_OUTPUT` unchanged (bytes).

Run as: `streams-runtime run tests.apps.passthrough:topology --set ...`
"""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def topology() -> Topology:
    builder = StreamsBuilder()
    builder.stream(
        os.environ["STREAMS_TEST_INPUT"], key_serde=serdes.BYTES, value_serde=serdes.BYTES
    ).to(os.environ["STREAMS_TEST_OUTPUT"], key_serde=serdes.BYTES, value_serde=serdes.BYTES)
    return builder.build()
