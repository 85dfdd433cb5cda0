"""Stream-stream join test app: each "L:<n>" record joined with its "R:<n>".

One input topic, `$STREAMS_TEST_INPUT`: keys `k<j>`, values `L:<n>` or
`R:<n>`, the two sides of one sequence number stamped with the same event
time and the sequences 250 ms apart, so within the join window (100 ms)
each left record meets exactly its own right record. The inner join goes to
`$STREAMS_TEST_OUTPUT` as `L:<n>|R:<n>`.
"""

from __future__ import annotations

import os

from runtime import JoinWindows, StreamsBuilder, Topology, serdes


def topology() -> Topology:
    builder = StreamsBuilder()
    source = builder.stream(
        os.environ["STREAMS_TEST_INPUT"], key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    left = source.filter(lambda key, value: value.startswith("L"))
    right = source.filter(lambda key, value: value.startswith("R"))
    (
        left.join(
            right,
            lambda lv, rv: f"{lv}|{rv}",
            windows=JoinWindows.of_time_difference_and_grace(100, 10_000),
            value_serde=serdes.STRING,
            other_value_serde=serdes.STRING,
        ).to(os.environ["STREAMS_TEST_OUTPUT"], value_serde=serdes.STRING)
    )
    return builder.build()
