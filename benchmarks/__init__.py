"""Benchmarks of the streams runtime against raw confluent-kafka baselines.

Run with ``python -m benchmarks <workload> ...`` (see ``benchmarks/README.md``).
Layout:

- ``harness.py``: one broker (Kafka or Tansu) per benchmark session, topic creation, loading
  input once, running each measured run in a fresh child process, counting output.
- ``child.py``: the child-process entry point; runs one named runner and writes
  its result (timings, CPU seconds, peak RSS) as JSON.
- ``raw_loop.py``: the raw consume-transform-produce baseline (no framework);
  also a model of the compare harness (``raw``).
- ``workloads/``: the subcommands (``workloads.WORKLOADS``); ``stateless`` lives
  there, the others in their own modules and packages (``quick.py``: every
  headline ratio at reduced size; ``compare/``; ``peers/``; ...).
- ``report.py``: JSON, markdown table and optional PNG.
- ``outputs.py``: where results go (``benchmarks/results/local/`` unless
  ``--update-results``).
- ``interrupt.py``: Ctrl-C ends an invocation once, cleanly.
- ``profile.py``: py-spy helper and a summary of collapsed stacks.
"""
