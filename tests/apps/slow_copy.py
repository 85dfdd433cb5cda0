"""Copy `$STREAMS_TEST_INPUT` to `$STREAMS_TEST_OUTPUT` slowly: `$STREAMS_TEST_SLEEP_MS`
per record (default 1), so that input queues fill and their partitions pause.

Run as: `streams-runtime run tests.apps.slow_copy:topology --set ...`
"""

from __future__ import annotations

import os
import time

from runtime import StreamsBuilder, Topology, serdes


def topology() -> Topology:
    pause_s = float(os.environ.get("STREAMS_TEST_SLEEP_MS", "1")) / 1000.0
    builder = StreamsBuilder()
    builder.stream(
        os.environ["STREAMS_TEST_INPUT"], key_serde=serdes.BYTES, value_serde=serdes.BYTES
    ).peek(lambda _k, _v: time.sleep(pause_s)).to(
        os.environ["STREAMS_TEST_OUTPUT"], key_serde=serdes.BYTES, value_serde=serdes.BYTES
    )
    return builder.build()
