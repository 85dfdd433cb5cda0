"""Topologies of a user's first day (issue 32), topic names from the environment.

`STREAMS_TEST_INPUT`, `STREAMS_TEST_OUTPUT`. Run as
`streams-runtime run tests.apps.first_day:<name>`.
"""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def json_copy() -> Topology:
    """JSON values in, the same out: a record that is no JSON fails to deserialize."""
    source, sink = os.environ["STREAMS_TEST_INPUT"], os.environ["STREAMS_TEST_OUTPUT"]
    builder = StreamsBuilder()
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.JSON).to(
        sink, key_serde=serdes.STRING, value_serde=serdes.JSON
    )
    return builder.build()
