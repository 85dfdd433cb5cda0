"""Benchmarks of the streams runtime against raw confluent-kafka baselines.

Run with ``python -m benchmarks <workload> ...`` (see ``benchmarks/README.md``).
Layout:

- ``harness.py``: one broker (Kafka or Tansu) per benchmark session, topic creation, loading
  input once, running each measured run in a fresh child process, counting output.
- ``child.py``: the child-process entry point; runs one named runner and writes
  its result (timings, CPU seconds, peak RSS) as JSON.
- ``raw_loop.py``: the raw consume-transform-produce baseline (no framework).
- ``workloads/``: one module per workload (``stateless`` so far); each registers
  a subcommand and owns its data, its transform and its runtime topology.
- ``report.py``: JSON, markdown table and optional PNG.
- ``profile.py``: py-spy helper and a summary of collapsed stacks.
"""
