"""The models of ``python -m benchmarks peers`` and how each one's child is started.

- ``runtime``: ``runtime.App`` (``benchmarks/compare/child.py``), as in compare;
- ``runtime-p2``: the runtime with ``processes=2`` (a supervisor and two full
  runtimes in the one group, ``runtime.isolation.workers.WorkerPool``), each
  process with N processing threads; CPU, RSS and connections cover all three
  processes (``benchmarks/compare/procfs.py``);
- ``ks-classic``: Kafka Streams 4.3.1, ``num.stream.threads`` = threads, every
  stream thread with its own consumer, producer and restore consumer, polling
  and processing its own tasks;
- ``ks-proc``: the same with Kafka Streams' internal
  ``__processing.threads.enabled__=true``: each stream thread polls and commits,
  one task-executor thread per stream thread processes
  (``benchmarks/peers/kafka_streams/README.md``);
- ``keypar``: the runtime with ``num.threads.per.task`` = threads (key-parallel
  processing inside a task), on the one-partition and skewed I/O workloads only,
  where threads exceed the busy partitions;
- ``quixstreams-p2``: two quixstreams processes in one consumer group, as
  quixstreams scales (``benchmarks/peers/quix_group.py``; threads = 1): the
  stateless and stateful workloads, beside ``runtime-p2``;
- ``quixstreams``: quixstreams (single-threaded; threads = 1 only): the
  stateless, stateful and session workloads. Not the join: its
  ``join_interval`` is no windowed join (a record finds only partners at or
  before its own timestamp, so the pairs it finds depend on the order in which
  the two topics arrive; ``benchmarks/peers/quix_child.py``), and it is not
  compared where it would compute something else. ``QUIX_NOT_RUN`` says why
  per workload, for the report.

``Launcher`` is the ``RunSettings.launch`` of the session: it turns the spec the
harness builds for every model into the command and spec of that model's child.
Configuration: the harness's config (``commit.interval.ms`` and the consumer's
session and heartbeat settings) means the same in Kafka Streams (same names,
``consumer.`` prefix included); quixstreams gets ``commit_interval`` and its
consumer's extra config from it. Everything else is each system's default.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class Model:
    name: str
    title: str
    # compare workload names it can run; None: all of the peers' workloads
    workloads: frozenset[str] | None = None
    # the thread counts it runs at; None: every thread count of the session
    threads: tuple[int, ...] | None = None


MODELS: dict[str, Model] = {
    m.name: m
    for m in (
        Model("runtime", "streams-runtime: shared clients, N processing threads"),
        Model(
            "runtime-p2",
            "streams-runtime, processes=2: 2 processes x N processing threads",
            workloads=frozenset({"stateless", "stateful", "io"}),
        ),
        Model("ks-classic", "Kafka Streams 4.3.1, classic: N stream threads"),
        Model(
            "ks-proc",
            "Kafka Streams 4.3.1, processing threads: N stream threads + N task executors",
        ),
        Model(
            "keypar",
            "streams-runtime, key-parallel: num.threads.per.task = N",
            workloads=frozenset({"io1", "skew"}),
        ),
        Model(
            "quixstreams",
            "quixstreams 3.28.1: one thread",
            workloads=frozenset({"stateless", "stateful", "session"}),
            threads=(1,),
        ),
        Model(
            "quixstreams-p2",
            "quixstreams 3.28.1: 2 processes in one group",
            workloads=frozenset({"stateless", "stateful"}),
            threads=(1,),
        ),
    )
}

# Workloads of the peers' default set that quixstreams does not run, and why
# (the report prints it as the "n/a" of that cell).
QUIX_NOT_RUN = {
    "join": "no windowed stream-stream join: `join_interval` pairs a record only with "
    "partners stamped at or before it, so its pairs depend on the order the two topics "
    "arrive in",
}

KAFKA_STREAMS_MODES = {"ks-classic": "classic", "ks-proc": "processing-threads"}

# Harness config keys that mean the same in Kafka Streams (StreamsConfig accepts
# the "consumer." prefix for its consumers).
_KS_KEYS = ("commit.interval.ms", "consumer.session.timeout.ms", "consumer.heartbeat.interval.ms")


def runs(model: str, workload: str, threads: int) -> bool:
    """Whether ``model`` takes part in ``workload`` at ``threads``."""
    m = MODELS[model]
    if m.workloads is not None and workload not in m.workloads:
        return False
    return m.threads is None or threads in m.threads


@dataclass
class Launcher:
    """``RunSettings.launch``: the command and spec of each model's child.

    ``jar``: the Kafka Streams peer (None if no ks model runs); ``quix_python``:
    the quixstreams virtualenv's interpreter (None if quixstreams does not run);
    ``ks_settings`` / ``quix_settings``: extra config for those peers only;
    ``jvm_opts``: options of the peer's JVM; ``warmup``: records per workload the
    Kafka Streams peer processes in a throw-away instance first (0: a cold JVM).
    """

    jar: Path | None = None
    quix_python: Path | None = None
    ks_settings: dict[str, Any] = field(default_factory=dict)
    quix_settings: dict[str, Any] = field(default_factory=dict)
    jvm_opts: list[str] = field(default_factory=list)
    warmup: dict[str, int] = field(default_factory=dict)

    def __call__(self, model: str, spec: dict[str, Any]) -> tuple[list[str], dict[str, Any]]:
        config = spec.get("config") or {}
        if model in KAFKA_STREAMS_MODES:
            if self.jar is None:
                raise RuntimeError("the Kafka Streams peer was not built")
            ks_config = {k: str(config[k]) for k in _KS_KEYS if k in config}
            ks_config.update({k: str(v) for k, v in self.ks_settings.items()})
            spec = dict(
                spec,
                mode=KAFKA_STREAMS_MODES[model],
                config=ks_config,
                warmup_records=int(self.warmup.get(str(spec.get("workload")), 0)),
            )
            return ["java", *self.jvm_opts, "-jar", str(self.jar)], spec
        if model in ("quixstreams", "quixstreams-p2"):
            if self.quix_python is None:
                raise RuntimeError("the quixstreams virtualenv was not created")
            quix_config = {k: config[k] for k in _KS_KEYS if k in config}
            quix_config.update(self.quix_settings)
            spec = dict(spec, config=quix_config)
            if model == "quixstreams-p2":
                spec["processes"] = 2
                return [str(self.quix_python), "-m", "benchmarks.peers.quix_group"], spec
            return [str(self.quix_python), "-m", "benchmarks.peers.quix_child"], spec
        if model in ("runtime", "runtime-p2", "keypar"):
            return [], spec  # the compare child (an empty command means the default)
        raise ValueError(f"unknown model {model!r}; choose from {', '.join(MODELS)}")
