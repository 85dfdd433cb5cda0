"""The compare workloads' topologies as a MODULE:ATTR, for the runtime in several processes.

With `processes` > 1 every processing process imports its topology itself
(runtime.isolation.workers), so the benchmark child cannot hand it a built
`Topology`. It sets the environment the processes inherit instead:
`BENCH_POOL_TOPOLOGY` (a `build_topology` kind), `BENCH_POOL_INPUT`,
`BENCH_POOL_OUTPUT`, and `BENCH_POOL_ECHO` (host:port of the I/O workloads'
echo server, else empty).
"""

from __future__ import annotations

import os
from typing import Any

from benchmarks.compare.workloads import build_topology


def environment(kind: str, input_topic: str, output_topic: str, echo: Any) -> dict[str, str]:
    """What `topology()` reads, for the child to put into its environment."""
    return {
        "BENCH_POOL_TOPOLOGY": kind,
        "BENCH_POOL_INPUT": input_topic,
        "BENCH_POOL_OUTPUT": output_topic,
        "BENCH_POOL_ECHO": f"{echo[0]}:{echo[1]}" if echo else "",
    }


def topology() -> Any:
    echo = os.environ.get("BENCH_POOL_ECHO", "")
    if echo:
        from benchmarks.compare import echo as echo_module

        host, port = echo.rsplit(":", 1)
        echo_module.ADDRESS = (host, int(port))
    return build_topology(
        os.environ["BENCH_POOL_TOPOLOGY"],
        os.environ["BENCH_POOL_INPUT"],
        os.environ["BENCH_POOL_OUTPUT"],
    )
