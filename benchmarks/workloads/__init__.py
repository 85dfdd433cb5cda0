"""Benchmark workloads: one module per workload, each a ``python -m benchmarks`` subcommand.

A workload module provides ``NAME``, ``add_arguments(parser)`` and ``main(args) -> int``,
and its child-process runners are listed in ``benchmarks.child.RUNNERS``. To add one
(stateful, I/O-bound, skewed, restoration, a thread-per-client baseline), write the
module and add it to ``WORKLOADS``.
"""

from __future__ import annotations

WORKLOADS = {
    "stateless": "benchmarks.workloads.stateless",
    # Every headline ratio (runtime vs baseline and vs the raw loop, stateless and
    # stateful, 1 and 2 threads) at reduced size in a few minutes (benchmarks/quick.py).
    "quick": "benchmarks.quick",
    # The runtime against the thread-per-client baseline, five workloads
    # (benchmarks/compare/; its runs use their own child entry point).
    "compare": "benchmarks.compare.main",
    # The runtime against Kafka Streams and quixstreams (benchmarks/peers/).
    "peers": "benchmarks.peers.main",
    # Join rebalance time, classic vs KIP-848 group protocol (benchmarks/rebalance.py).
    "rebalance": "benchmarks.rebalance",
    # exactly_once_v2 over at_least_once throughput (benchmarks/eos.py).
    "eos": "benchmarks.eos",
    # Live partition expansion, 4 -> 8, while input flows (benchmarks/expand.py).
    "expand": "benchmarks.expand",
    # Remote state: restore from snapshot + tail vs the full changelog, and the
    # upload cost on the processing rate (benchmarks/remote_state.py).
    "remote-state": "benchmarks.remote_state",
    # Scale out 1 -> 3 and in 3 -> 2 under load with a large store, learners
    # (task.assignment=runtime) against the group's assignor (benchmarks/scale.py).
    "scale": "benchmarks.scale",
    # Named queries: a light query's latency beside a CPU-bound one, alone /
    # equal priority / higher priority / weights 3:1 (benchmarks/queries.py).
    "queries": "benchmarks.queries",
    # Many tasks with two stores each: RSS, commit time, store open, restore,
    # records/s, per store layout and against Kafka Streams (benchmarks/state/).
    "state": "benchmarks.state.main",
}
