"""The real peers of the runtime in the benchmarks: Kafka Streams (Java) and quixstreams.

``python -m benchmarks peers`` (``main.py``) runs them beside the runtime with
the compare harness (``benchmarks/compare/``): same broker, same input bytes,
same measurement. See ``benchmarks/peers/README.md``.

- ``models.py``: the models (runtime, ks-classic, ks-proc, quixstreams) and
  the command each child runs;
- ``build.py``: builds the Kafka Streams jar and the quixstreams virtualenv
  on demand into a cache outside the repository;
- ``kafka_streams/``: the Kafka Streams peer (a Maven project);
- ``quix_child.py``: the quixstreams peer (runs in its own virtualenv);
- ``report.py``: summaries, ratios against every peer, targets, plots;
- ``main.py``: the command line.

Imports nothing at package level: ``quix_child`` runs in a virtualenv without
the runtime's dependencies.
"""
