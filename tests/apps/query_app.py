"""Named-query apps for tests.

`topology`: a query for `admin query add tests.apps.query_app:topology --name
N`, copying `$STREAMS_TEST_QUERY_INPUT` (default `query-in`) to
`$STREAMS_TEST_QUERY_OUTPUT` (default `query-out`), strings.
`latency_queries`: the mapping `streams-runtime run` starts for the priority
test (a light and a CPU-heavy query).
"""

from __future__ import annotations

import os
import time

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


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def latency_queries() -> dict[str, Topology]:
    """Two named queries for the priority test: `light` copies
    `$STREAMS_TEST_LIGHT_INPUT` to `$STREAMS_TEST_LIGHT_OUTPUT`; `heavy` does
    the same for the `HEAVY` pair, busy on the CPU (holding the GIL) for
    `$STREAMS_TEST_HEAVY_RECORD_S` (default 0.0002) s per record."""
    per_record = float(os.environ.get("STREAMS_TEST_HEAVY_RECORD_S", "0.0002"))

    def work(value: str) -> str:
        _spin(per_record)
        return value

    queries = {}
    for name in ("light", "heavy"):
        builder = StreamsBuilder()
        stream = builder.stream(
            os.environ[f"STREAMS_TEST_{name.upper()}_INPUT"],
            key_serde=serdes.STRING,
            value_serde=serdes.STRING,
        )
        if name == "heavy":
            stream = stream.map_values(work)
        stream.to(
            os.environ[f"STREAMS_TEST_{name.upper()}_OUTPUT"],
            key_serde=serdes.STRING,
            value_serde=serdes.STRING,
        )
        queries[name] = builder.build()
    return queries
