"""The runtime against the thread-per-client baseline (``python -m benchmarks compare``).

- ``workloads.py``: the five workloads (data, topology, completeness check);
- ``session.py``: the harness side: topics, loading, one child per run, the
  output reader (throughput and latency), the feeder, /proc sampling;
- ``child.py``: one run of one model (``runtime.App`` or
  ``benchmarks.baseline.BaselineApp``) in a fresh process;
- ``echo.py``: the I/O-bound workloads' echo server and client call;
- ``procfs.py``: CPU, memory and broker connections of a process from /proc;
- ``report.py``: summaries, JSON, markdown, PNG plots;
- ``main.py``: the command line.
"""
