"""Remote state test app: exactly_once_v2-style pass-through plus two stores.

`$STREAMS_TEST_INPUT` (value = sequence number) is copied to
`$STREAMS_TEST_OUTPUT`, counted per key into `$STREAMS_TEST_COUNTS` (store
`remote-counts`), and the latest value per key is kept in `remote-latest`.
Two stores make a snapshot of two RocksDB checkpoints, uploaded one after the
other: a kill between them leaves a partial snapshot.
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
    grouped = stream.group_by_key()
    grouped.count(store="remote-counts").to_stream().to(
        os.environ["STREAMS_TEST_COUNTS"], value_serde=serdes.INT64
    )
    grouped.reduce(lambda _old, new: new, store="remote-latest")
    return builder.build()
