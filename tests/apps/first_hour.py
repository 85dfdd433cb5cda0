"""Topologies of a user's first hour (issue 20), topic names from the environment.

`STREAMS_TEST_INPUT`, `STREAMS_TEST_OUTPUT` and, for the join,
`STREAMS_TEST_TABLE`. Run as `streams-runtime run tests.apps.first_hour:<name>`.
"""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def _topics() -> tuple[str, str]:
    return os.environ["STREAMS_TEST_INPUT"], os.environ["STREAMS_TEST_OUTPUT"]


def dict_to_bytes_sink() -> Topology:
    """The issue's first serde mistake: a dict written with the default BYTES serde."""
    source, sink = _topics()
    builder = StreamsBuilder()
    builder.stream(source, value_serde=serdes.STRING).map_values(lambda v: {"x": v}).to(sink)
    return builder.build()


def group_by_without_key_serde() -> Topology:
    """The second: `group_by` returning a str, no `key_serde`, default BYTES."""
    source, sink = _topics()
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by(lambda key, word: word)
        .count(store="counts")
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    return builder.build()


def stream_table_join() -> Topology:
    """A stream joined with a table: the two source topics are co-partitioned."""
    source, sink = _topics()
    builder = StreamsBuilder()
    table = builder.table(
        os.environ["STREAMS_TEST_TABLE"], key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING).join(
        table, lambda value, other: f"{value}+{other}"
    ).to(sink)
    return builder.build()
