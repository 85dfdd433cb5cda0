"""Count records per key of `$STREAMS_TEST_INPUT` (string keys) into
`$STREAMS_TEST_OUTPUT` (INT64 counts); the store `counts` is changelogged.

Run as: `streams-runtime run tests.apps.count_app:topology --set ...`
"""

from __future__ import annotations

import os

from rocksdict import Options

from runtime import StreamsBuilder, Topology, serdes


def topology() -> Topology:
    builder = StreamsBuilder()
    (
        builder.stream(
            os.environ["STREAMS_TEST_INPUT"], key_serde=serdes.STRING, value_serde=serdes.STRING
        )
        .group_by_key()
        .count(store="counts")
        .to_stream()
        .to(os.environ["STREAMS_TEST_OUTPUT"], value_serde=serdes.INT64)
    )
    return builder.build()


def rocksdb_setter(store_name: str, options: Options) -> None:
    """`state.rocksdb.config.setter=tests.apps.count_app:rocksdb_setter`: a
    visible change (three memtables at most) in each store's OPTIONS file."""
    options.set_max_write_buffer_number(3)
