"""Named queries for the process-isolation tests (runtime.isolation).

`queries()`: `main` copies `$STREAMS_TEST_MAIN_INPUT` to
`$STREAMS_TEST_MAIN_OUTPUT`; `side` copies the `SIDE` pair and raises on a
value ending in '!' (so a test can make the child's app fail). Strings. The
child process imports this module itself, so the topics come from the
environment it inherits.
"""

from __future__ import annotations

import os

from runtime import StreamsBuilder, Topology, serdes


def _fail_on_mark(value: str) -> str:
    if value.endswith("!"):
        raise RuntimeError(f"marked record {value}")
    return value


def _copy(name: str) -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream(
        os.environ[f"STREAMS_TEST_{name.upper()}_INPUT"],
        key_serde=serdes.STRING,
        value_serde=serdes.STRING,
    )
    if name == "side":
        stream = stream.map_values(_fail_on_mark)
    stream.to(
        os.environ[f"STREAMS_TEST_{name.upper()}_OUTPUT"],
        key_serde=serdes.STRING,
        value_serde=serdes.STRING,
    )
    return builder.build()


def queries() -> dict[str, Topology]:
    return {"main": _copy("main"), "side": _copy("side")}
