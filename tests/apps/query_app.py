"""A query for `admin query add tests.apps.query_app:topology --name N`:
copies `$STREAMS_TEST_QUERY_INPUT` (default `query-in`) to
`$STREAMS_TEST_QUERY_OUTPUT` (default `query-out`), strings."""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def topology() -> Topology:
    builder = StreamsBuilder()
    builder.stream(
        os.environ.get("STREAMS_TEST_QUERY_INPUT", "query-in"),
        key_serde=serdes.STRING,
        value_serde=serdes.STRING,
    ).to(
        os.environ.get("STREAMS_TEST_QUERY_OUTPUT", "query-out"),
        key_serde=serdes.STRING,
        value_serde=serdes.STRING,
    )
    return builder.build()
