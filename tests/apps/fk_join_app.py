"""Foreign-key join test app: orders joined with their customers.

One input topic, `$STREAMS_TEST_INPUT`: keys `o<n>` are orders (value
`c<j>:<seq>`, the customer and a sequence number that grows with every
update), keys `c<j>` are customers (value: a name); null values delete.
The inner foreign-key join of orders with customers goes to
`$STREAMS_TEST_OUTPUT` as `c<j>:<seq>+<name>`.
"""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def topology() -> Topology:
    builder = StreamsBuilder()
    source = builder.stream(
        os.environ["STREAMS_TEST_INPUT"], key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    orders = source.filter(lambda key, value: key.startswith("o")).to_table()
    customers = source.filter(lambda key, value: key.startswith("c")).to_table()
    (
        orders.join(
            customers,
            lambda order: order.split(":")[0],
            lambda order, customer: f"{order}+{customer}",
            value_serde=serdes.STRING,
        )
        .to_stream()
        .to(os.environ["STREAMS_TEST_OUTPUT"], value_serde=serdes.STRING)
    )
    return builder.build()
