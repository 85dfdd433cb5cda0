"""Workload "queries": isolation between named queries in one app (issue 17).

One Apache Kafka node started by the harness; per case a fresh
application.id, fresh topics (2 partitions each) and a fresh daemon
(``python -m runtime run benchmarks.queries:topologies``, a separate process,
so the probe's Python threads do not share the app's GIL), with one
processing thread, ``task.timeslice.ms`` 5 (``--timeslice-ms``; the runtime's
default is 100) and ``commit.interval.ms`` 30000
(a commit flushes every task's output, the heavy one's too: not what is
measured here), as the latency test in tests/integration/test_named_queries.py.

Queries: *light* copies its input to its output; *heavy* does the same but
spins on the CPU (holding the GIL) ``--heavy-record-ms`` (0.5) ms per record,
over a backlog produced before the daemon starts (large enough not to run
out; the remaining lag is recorded). Cases (the default run orders them
heavy-alone, equal, weights-3-1, light-alone, light-priority,
priority-sched-idle, spare-thread-sched-idle, process-priority, light-alone: see
``DEFAULT_CASES``):

1. ``light-alone``: the light query only.
2. ``heavy-alone``: the heavy query only (its throughput baseline).
3. ``equal``: light + heavy, equal priority and weight.
4. ``light-priority``: light + heavy, ``query.light.priority`` 10.
5. ``weights-3-1``: light + heavy + heavy2 (a second heavy backlog), equal
   priority, ``query.heavy.weight`` 3, ``query.heavy2.weight`` 1 (light 1).
6. ``priority-sched-idle``: ``light-priority`` with
   ``sched.idle.lower.priorities`` true: the heavy query's batches run in
   Linux's SCHED_IDLE class, so any other thread of the machine (the light
   query's, the clients', the broker's) takes the CPU from them at once.
7. ``spare-thread-sched-idle``: the same with ``processing.threads`` 2 and
   ``query.heavy.max.threads`` 1: a thread the heavy query may not take, so
   the light record never waits for a heavy record (0.5 ms) to end.
8. ``process-priority``: ``light-priority`` with ``query.heavy.isolation``
   ``process``: the daemon runs the heavy query in a child process of its
   own (own clients, threads and GIL) at nice 19.

Diagnostic cases, only when named in ``--cases`` (knobs set in the daemon's
process by ``topologies()``):

- ``priority-no-preempt``: ``light-priority`` with preemption by priority
  turned off (``BENCH_NO_PREEMPTION``): batches end only at their time slice,
  as before preemption existed; the before/after comparison in one session.
- ``priority-switch-5ms``: ``light-priority`` with ``gil.switch.interval.us``
  5000 (Python's own switch interval), i.e. without the automatic 0.5 ms an
  app takes while its queries' priorities differ: how much of the light
  query's latency is the polling thread waiting for the GIL the CPU-bound
  batches hold. ``BENCH_SWITCH_INTERVAL`` in the environment sets
  ``sys.setswitchinterval`` for every case, as in the compare suite.
- ``priority-fetch1m``: ``light-priority`` with the app consumer's
  ``max.partition.fetch.bytes`` at librdkafka's 1 MiB instead of the 64 KiB an
  app takes while its queries' priorities differ: a resumed partition of the
  heavy query then brings some 15,000 of its small records per fetch, and the
  light record waits behind them in the consumer's one queue.
  ``priority-fetch256k``: the same at 256 KiB.
- ``heavy-other-process``: the light and the heavy query each in a daemon of
  its own (two applications): the isolation the operating system gives, the
  floor for any one-process design on this machine (the heavy daemon holds a
  core; the broker, the probe and the light daemon share the other).
  ``heavy-other-process-idle`` and ``-nice``: the heavy daemon started under
  ``chrt --idle 0`` / ``nice -n 19``: priority between processes by the OS.
- ``priority-bulk-refill``: ``light-priority`` with the input refill an app
  used before git ecda57f whatever the priorities (``BENCH_BULK_REFILL``):
  a paused heavy partition resumes at half its 5,000-record buffer and the
  polling thread routes 1,000-record batches, so the light record can wait
  behind several of them (see ``query_shares.input_refill``).
- (``sched.idle.lower.priorities`` was on by default for a few commits;
  results of then, ``queries-schedidle-final.md`` and ``queries-final-d.md``,
  call the off case ``priority-no-sched-idle`` and run ``light-priority`` with
  it on.)
- ``priority-no-commit``: ``light-priority`` with ``commit.interval.ms``
  600000 (no commit in the window): whether the light query's stalls are
  commits (they were not). ``$BENCH_GC_LOG=<path>`` in the environment makes
  the daemon append each cyclic-GC collection of 5 ms or more to <path>;
  ``STREAMS_KAFKA_JVM_OPTS="-Xlog:gc:file=<path>:time"`` logs the broker's
  pauses; ``light.window_started_at`` in the JSON lines them up.

The light query's end-to-end latency: a probe in this process produces one
record every ``--probe-interval-ms`` (20) ms to the light input, its value the
wall-clock time (``time.time()``) just before ``produce()``; a separate
consumer (read_committed, ``fetch.wait.max.ms`` 5) reads the light output and
takes ``time.time()`` when ``poll()`` returns the record, minus that value
(before git e78a450 the reader used ``consume(100, 0.05)``, which returns only
at its timeout below 100 records: every sample had up to 50 ms of the reader's
own wait, 25 ms on average, in it).
Only records sent during the ``--window-s`` (30) s window count (after a 3 s
warm-up; and a discarded 10 s light-priority run precedes the cases, as a fresh
broker's first minute is slow and the first run of both queries often stalls once); the window ends when they are all back (or are counted missing).
The heavy queries' throughput: the daemon's own processed count (admin
``queries``) at the window's start and end, over the window's length; busy
shares from the same counters (busy seconds).

Placement (``--placement``): *split* (the default) pins the broker's threads
and this process's (the probe) to the first half of the CPUs and the daemons to
the second half (on 2 cores: one each), as with a broker on a machine of its
own, which is how a stream-processing app runs in production. *shared* lets
everything use every CPU: then the heavy query's CPU-bound thread competes with
the broker's request handlers, GC and JIT threads for the same two cores, and
the light query's tail shows the broker's delays (fetches answered after 60-70
ms, young-GC pauses of 15-24 ms, a first stall of 0.1-0.8 s that pinning made
go away); ``results/queries-final-e.md`` and earlier ran that way.

Writes ``<out>/queries[-TAG].json``, ``.md`` and ``.png`` (the light query's
latency over time, one panel per case). About 7-8 minutes with the defaults;
``--quick`` (5 s windows) is a smoke run. The machine may be shared: every
case runs once, in sequence, so load from elsewhere hits them unevenly.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.report import pyplot

NAME = "queries"
REPO = Path(__file__).resolve().parents[1]
PARTITIONS = 2
WARMUP_S = 3.0
CASES: dict[str, dict[str, Any]] = {
    "light-alone": {"queries": ["light"], "config": {}},
    "heavy-alone": {"queries": ["heavy"], "config": {}},
    "equal": {"queries": ["light", "heavy"], "config": {}},
    "light-priority": {"queries": ["light", "heavy"], "config": {"query.light.priority": 10}},
    "weights-3-1": {
        "queries": ["light", "heavy", "heavy2"],
        "config": {"query.heavy.weight": 3, "query.heavy2.weight": 1},
    },
    # The heavy query's batches in SCHED_IDLE (`sched.idle.lower.priorities`, off
    # by default; see the module docstring for results that ran it on by default).
    "priority-sched-idle": {
        "queries": ["light", "heavy"],
        "config": {"query.light.priority": 10, "sched.idle.lower.priorities": True},
    },
    # The same with a processing thread the heavy query may not take: the light
    # query never waits for a heavy record to end.
    "spare-thread-sched-idle": {
        "queries": ["light", "heavy"],
        "config": {
            "query.light.priority": 10,
            "sched.idle.lower.priorities": True,
            "processing.threads": 2,
            "query.heavy.max.threads": 1,
        },
    },
    # The heavy query in a child process of the daemon (query.<name>.isolation
    # = process), at nice 19 since the light query's priority is higher.
    "process-priority": {
        "queries": ["light", "heavy"],
        "config": {"query.light.priority": 10, "query.heavy.isolation": "process"},
    },
}
# The default run: the cases read for throughput and shares first (a
# session's first minutes are slow for latency: the first light-alone case
# came out at 8.8-13.3 ms p99 in eight sessions, later ones 4.8-7.3), then the
# latency cases, light-alone twice (the ratios use the median of its runs).
DEFAULT_CASES = [
    "heavy-alone",
    "equal",
    "weights-3-1",
    "light-alone",
    "light-priority",
    "priority-sched-idle",
    "spare-thread-sched-idle",
    "process-priority",
    "light-alone",
]
CASES["priority-no-preempt"] = {
    "queries": ["light", "heavy"],
    "config": {"query.light.priority": 10},
    "env": {"BENCH_NO_PREEMPTION": "1"},
}
CASES["priority-fetch1m"] = {
    "queries": ["light", "heavy"],
    "config": {"query.light.priority": 10, "consumer.max.partition.fetch.bytes": 1048576},
}
CASES["priority-fetch256k"] = {
    "queries": ["light", "heavy"],
    "config": {"query.light.priority": 10, "consumer.max.partition.fetch.bytes": 262144},
}
CASES["priority-no-commit"] = {
    "queries": ["light", "heavy"],
    "config": {"query.light.priority": 10, "commit.interval.ms": 600000},
}
CASES["heavy-other-process"] = {
    "queries": ["light", "heavy"],
    "config": {},
    "processes": [["light"], ["heavy"]],
}
# The same, the heavy daemon in SCHED_IDLE / at nice 19 (priority by the OS).
CASES["heavy-other-process-idle"] = {
    "queries": ["light", "heavy"],
    "config": {},
    "processes": [["light"], ["heavy"]],
    "launch": [[], ["chrt", "--idle", "0"]],
}
CASES["heavy-other-process-nice"] = {
    "queries": ["light", "heavy"],
    "config": {},
    "processes": [["light"], ["heavy"]],
    "launch": [[], ["nice", "-n", "19"]],
}
CASES["priority-bulk-refill"] = {
    "queries": ["light", "heavy"],
    "config": {"query.light.priority": 10},
    "env": {"BENCH_BULK_REFILL": "1"},
}
# The automatic GIL switch interval (0.1 ms while priorities differ) against others.
for _us in (500, 200, 100, 50):
    CASES[f"priority-switch-{_us}us"] = {
        "queries": ["light", "heavy"],
        "config": {"query.light.priority": 10, "gil.switch.interval.us": _us},
    }
# A processing thread the heavy query may not take: the light query never
# waits for a heavy record to end (only for the GIL).
CASES["priority-spare-thread"] = {
    "queries": ["light", "heavy"],
    "config": {
        "query.light.priority": 10,
        "processing.threads": 2,
        "query.heavy.max.threads": 1,
    },
}
# Two processing threads, two CPU-bound queries: what a short switch interval
# costs when CPU-bound threads hand the GIL to each other.
for _us in (500, 100):
    CASES[f"two-heavy-switch-{_us}us"] = {
        "queries": ["light", "heavy", "heavy2"],
        "config": {
            "query.light.priority": 10,
            "processing.threads": 2,
            "gil.switch.interval.us": _us,
        },
    }
CASES["priority-switch-5ms"] = {
    "queries": ["light", "heavy"],
    "config": {"query.light.priority": 10, "gil.switch.interval.us": 5000},
}

# Environment knobs of diagnostic cases, kept out of the other cases' daemons.
_CASE_KNOBS = {k for c in CASES.values() for k in c.get("env", {})}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--window-s", type=float, default=30.0, help="measurement window (30)")
    parser.add_argument(
        "--heavy-record-ms", type=float, default=0.5, help="heavy CPU per record (0.5 ms)"
    )
    parser.add_argument(
        "--probe-interval-ms", type=float, default=20.0, help="light record every N ms (20)"
    )
    parser.add_argument("--threads", type=int, default=1, help="processing.threads (1)")
    parser.add_argument(
        "--timeslice-ms", type=int, default=5, help="task.timeslice.ms (5; the default is 100)"
    )
    parser.add_argument(
        "--cases",
        default=",".join(DEFAULT_CASES),
        help=f"comma-separated, of {', '.join(CASES)} (default: {','.join(DEFAULT_CASES)})",
    )
    parser.add_argument(
        "--placement",
        choices=("split", "shared"),
        default="split",
        help="split (default): the broker and the probe on one half of the CPUs, the "
        "daemons on the other, as with a broker on its own machine; shared: all on all",
    )
    parser.add_argument("--quick", action="store_true", help="5 s windows: a smoke run")
    add_output_arguments(parser)
    parser.add_argument("--tag", default="", help="suffix of the result files")


def _split_cpus() -> dict[str, set[int]]:
    """The CPUs this process may use, halved: the first half for the broker
    and the probe, the second for the daemons (one each on 2 cores)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        raise SystemExit("--placement split needs 2 CPUs or more; use --placement shared")
    half = len(cpus) // 2
    return {"broker": set(cpus[:half]), "app": set(cpus[half:])}


def _cpu_list(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _log_gc_pauses(path: str) -> None:
    """Diagnostic (``$BENCH_GC_LOG``): append every cyclic-GC collection of
    5 ms or more to `path` (wall clock at its end, generation, duration,
    objects collected), to tell the collector's pauses from other stalls."""
    import gc

    started: dict[str, float] = {}

    def note(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started["t"] = time.perf_counter()
            return
        took = time.perf_counter() - started.get("t", time.perf_counter())
        if took >= 0.005:
            with open(path, "a") as f:
                f.write(
                    f"{time.time():.3f} gen{info['generation']} {took * 1000:.1f}ms "
                    f"collected {info['collected']}\n"
                )

    gc.callbacks.append(note)


def topologies() -> dict[str, Any]:
    """The mapping the daemon runs (``$BENCH_QUERIES``: comma-separated names);
    query N reads ``$BENCH_QUERY_<N>_INPUT`` and writes ``$BENCH_QUERY_<N>_OUTPUT``;
    names starting with ``heavy`` spin ``$BENCH_HEAVY_RECORD_S`` s per record.
    Called in the daemon's process, at start-up, where it also applies the
    diagnostic knobs ``$BENCH_SWITCH_INTERVAL``, ``$BENCH_NO_PREEMPTION`` and
    ``$BENCH_BULK_REFILL``."""
    from runtime import StreamsBuilder, serdes

    if os.environ.get("BENCH_SWITCH_INTERVAL"):
        sys.setswitchinterval(float(os.environ["BENCH_SWITCH_INTERVAL"]))
    if os.environ.get("BENCH_NO_PREEMPTION"):
        from runtime.processing.task_manager import TaskManager

        TaskManager._preempt_for_priority = lambda self: None  # type: ignore[method-assign]

    if os.environ.get("BENCH_BULK_REFILL"):
        from runtime.processing import query_shares

        # input_refill as before git ecda57f: resume at half the buffer, 1,000-record batches.
        query_shares.PRIORITY_REFILL_RECORDS = 1_000_000
        query_shares.PRIORITY_MAX_POLL_RECORDS = 1_000_000

    if os.environ.get("BENCH_GC_LOG"):
        _log_gc_pauses(os.environ["BENCH_GC_LOG"])

    per_record = float(os.environ.get("BENCH_HEAVY_RECORD_S", "0.0005"))

    def work(value: str) -> str:
        end = time.perf_counter() + per_record
        while time.perf_counter() < end:
            pass
        return value

    queries = {}
    for name in os.environ["BENCH_QUERIES"].split(","):
        builder = StreamsBuilder()
        stream = builder.stream(
            os.environ[f"BENCH_QUERY_{name.upper()}_INPUT"],
            key_serde=serdes.STRING,
            value_serde=serdes.STRING,
        )
        if name.startswith("heavy"):
            stream = stream.map_values(work)
        stream.to(
            os.environ[f"BENCH_QUERY_{name.upper()}_OUTPUT"],
            key_serde=serdes.STRING,
            value_serde=serdes.STRING,
        )
        queries[name] = builder.build()
    return queries


class Probe:
    """A writer thread (one record per interval, value = send wall time) and a
    reader thread on the output (latency = read wall time - value)."""

    def __init__(self, bootstrap: str, source: str, out: str, interval_s: float) -> None:
        from confluent_kafka import Consumer

        from benchmarks.harness import client_config

        self.bootstrap, self.source, self.out, self.interval_s = bootstrap, source, out, interval_s
        self.samples: list[tuple[float, float]] = []  # (send time, latency s)
        self.sent: list[float] = []
        self._stop = threading.Event()
        self._consumer = Consumer(
            client_config(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"probe-{uuid.uuid4().hex[:8]}",
                    "enable.auto.commit": False,
                    "fetch.wait.max.ms": 5,
                    "isolation.level": "read_committed",
                }
            )
        )
        self._threads = [
            threading.Thread(target=self._write, name="probe-writer", daemon=True),
            threading.Thread(target=self._read, name="probe-reader", daemon=True),
        ]

    def start(self) -> None:
        for t in self._threads:
            t.start()

    def close(self) -> None:
        self._stop.set()
        for t in self._threads:
            t.join(10)
        self._consumer.close()

    def _write(self) -> None:
        from confluent_kafka import Producer

        from benchmarks.harness import client_config

        producer = Producer(client_config({"bootstrap.servers": self.bootstrap, "linger.ms": 0}))
        next_at = time.monotonic()
        while not self._stop.is_set():
            now = time.time()
            producer.produce(self.source, key=b"k", value=repr(now).encode())
            self.sent.append(now)
            producer.poll(0)
            next_at += self.interval_s
            self._stop.wait(max(0.0, next_at - time.monotonic()))
        producer.flush(5)

    def _read(self) -> None:
        from confluent_kafka import OFFSET_BEGINNING, TopicPartition

        self._consumer.assign(
            [TopicPartition(self.out, p, OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        while not self._stop.is_set():
            # consume(n, timeout) returns only with n records or at the
            # timeout: a record read that way waited up to 50 ms for nothing.
            # poll() returns with the first record, then take what queued.
            first = self._consumer.poll(0.05)
            if first is None:
                continue
            for m in [first, *self._consumer.consume(100, 0)]:
                value = m.value()
                if m.error() is None and value is not None:
                    now = time.time()
                    sent = float(value.decode())
                    self.samples.append((sent, now - sent))


def _produce_backlog(bootstrap: str, topic: str, count: int) -> None:
    from confluent_kafka import Producer

    from benchmarks.harness import client_config

    producer = Producer(client_config({"bootstrap.servers": bootstrap, "linger.ms": 20}))
    for i in range(count):
        while True:
            try:
                producer.produce(topic, key=f"k{i % 13}".encode(), value=f"h{i}".encode())
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10_000 == 0:
            producer.poll(0)
    if producer.flush(60):
        raise RuntimeError(f"backlog of {topic} not all delivered")


def _wait(predicate: Any, timeout: float, what: str, interval: float = 0.2) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} not within {timeout:.0f} s")
        time.sleep(interval)


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def run_case(
    session: Any, name: str, args: argparse.Namespace, window_s: float, backlog: int
) -> dict[str, Any]:
    from runtime.admin.client import request

    case = CASES[name]
    queries: list[str] = case["queries"]
    app_id = f"qb-{name}-{uuid.uuid4().hex[:6]}"
    env = {
        k: v
        for k, v in os.environ.items()
        # Another case's knobs must not leak into this one.
        if not k.startswith("STREAMS_RUNTIME_") and k not in _CASE_KNOBS
    }
    env.update(
        PYTHONPATH=str(REPO),
        BENCH_QUERIES=",".join(queries),
        BENCH_HEAVY_RECORD_S=str(args.heavy_record_ms / 1000.0),
        **case.get("env", {}),
    )
    for q in queries:
        for side in ("input", "output"):
            topic = f"{app_id}-{q}-{side[:3]}"
            session.create_topic(topic, PARTITIONS)
            env[f"BENCH_QUERY_{q.upper()}_{side.upper()}"] = topic
    for q in queries:
        if q.startswith("heavy"):
            _produce_backlog(session.bootstrap, env[f"BENCH_QUERY_{q.upper()}_INPUT"], backlog)
    workdir = Path(tempfile.mkdtemp(prefix="qb"))  # AF_UNIX paths are <= 107 bytes
    # One daemon runs every query, or (case "processes") one daemon per group.
    groups: list[list[str]] = case.get("processes", [queries])
    daemons: list[tuple[subprocess.Popen[bytes], str, Path]] = []
    for index, group in enumerate(groups):
        sock = str(workdir / f"admin{index}.sock")
        sets: dict[str, Any] = {
            "application.id": app_id if len(groups) == 1 else f"{app_id}-p{index}",
            "bootstrap.servers": session.bootstrap,
            "processing.threads": args.threads,
            "task.timeslice.ms": args.timeslice_ms,
            "commit.interval.ms": 30000,
            "consumer.fetch.wait.max.ms": 5,
            "consumer.session.timeout.ms": 6000,
            "producer.linger.ms": 1,
            "state.dir": workdir / f"state{index}",
            "admin.socket": sock,
            **case["config"],
        }
        launch = case.get("launch", [[]] * len(groups))[index]
        if args.app_cpus:
            launch = ["taskset", "-c", _cpu_list(args.app_cpus), *launch]
        argv = [*launch, sys.executable, "-m", "runtime", "run", "benchmarks.queries:topologies"]
        for key, value in sets.items():
            argv += ["--set", f"{key}={value}"]
        log_path = workdir / f"daemon{index}.log"
        with open(log_path, "wb") as log:
            proc = subprocess.Popen(
                argv,
                cwd=REPO,
                env={**env, "BENCH_QUERIES": ",".join(group)},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        daemons.append((proc, sock, log_path))

    def status() -> dict[str, Any]:
        return {q["name"]: q for _, sock, _ in daemons for q in request(sock, "queries")["queries"]}

    probe = None
    if "light" in queries:
        probe = Probe(
            session.bootstrap,
            env["BENCH_QUERY_LIGHT_INPUT"],
            env["BENCH_QUERY_LIGHT_OUTPUT"],
            args.probe_interval_ms / 1000.0,
        )
    try:
        for proc, sock, log_path in daemons:
            _wait(
                lambda: os.path.exists(sock) or proc.poll() is not None,  # noqa: B023 - waited here
                60,
                "the admin socket",
            )
            if proc.poll() is not None:
                raise RuntimeError("the daemon exited: " + log_path.read_text()[-2000:])
        expected_tasks = PARTITIONS * len(queries)
        _wait(
            lambda: sum(q["tasks"] for q in status().values()) == expected_tasks,
            60,
            "every task assigned",
        )
        if probe:
            probe.start()
        time.sleep(WARMUP_S)  # warm-up: connections, first fetches (a fixed span, not a wait)
        before = status()
        start_wall, start_mono = time.time(), time.monotonic()
        time.sleep(window_s)  # the measurement window itself
        after = status()
        window = time.monotonic() - start_mono
        end_wall = start_wall + window
        samples: list[tuple[float, float]] = []
        missing = 0
        if probe:
            sent = [t for t in list(probe.sent) if start_wall <= t < end_wall]
            with contextlib.suppress(TimeoutError):  # counted as missing below
                _wait(
                    lambda: (
                        sum(1 for s, _ in list(probe.samples) if start_wall <= s < end_wall)
                        >= len(sent)
                    ),
                    30,
                    "the probe's records back",
                )
            samples = sorted(
                (s, lat) for s, lat in list(probe.samples) if start_wall <= s < end_wall
            )
            missing = len(sent) - len(samples)
        for _, sock, _ in daemons:
            request(sock, "shutdown")
        exit_codes = [proc.wait(60) for proc, _, _ in daemons]
    finally:
        if probe:
            probe.close()
        for proc, _, _ in daemons:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        # The daemons' state and logs go, unless one failed (its log is kept).
        if all(proc.returncode == 0 for proc, _, _ in daemons):
            shutil.rmtree(workdir, ignore_errors=True)
        else:
            print(f"a daemon failed; its log is under {workdir}", file=sys.stderr)
    result: dict[str, Any] = {
        "case": name,
        "queries": queries,
        "config": case["config"],
        "env": case.get("env", {}),
        "window_s": window,
        "daemon_exit": exit_codes[0] if len(exit_codes) == 1 else exit_codes,
        "load_average": os.getloadavg()[0],
        "per_query": {},
    }
    for q in queries:
        b, a = before[q], after[q]
        result["per_query"][q] = {
            "records_per_s": (a["processed"] - b["processed"]) / window,
            "busy_s": a["busy_seconds"] - b["busy_seconds"],
            "lag_end": a.get("lag"),
            # The daemon's own figure: batch end minus its last record's timestamp.
            "daemon_p99_latency_ms": a.get("p99_latency_ms"),
            "state": a.get("state"),
            "priority": a.get("priority"),
            "weight": a.get("weight"),
        }
    total_busy = sum(v["busy_s"] for v in result["per_query"].values())
    for v in result["per_query"].values():
        v["busy_share"] = v["busy_s"] / total_busy if total_busy else 0.0
    if probe:
        lat = [lat for _, lat in samples]
        result["light"] = {
            "n": len(lat),
            "missing": missing,
            "p50_ms": _quantile(lat, 0.5) * 1000 if lat else None,
            "p90_ms": _quantile(lat, 0.9) * 1000 if lat else None,
            "p99_ms": _quantile(lat, 0.99) * 1000 if lat else None,
            "max_ms": max(lat) * 1000 if lat else None,
            # Wall clock (time.time()) of the window's start: lines the
            # series up with other logs (a broker's GC log, ...).
            "window_started_at": start_wall,
            # For the plot: seconds since the window's start, latency in ms.
            "series": [[round(s - start_wall, 4), round(lat * 1000, 3)] for s, lat in samples],
        }
    if "heavy2" in queries:
        hb = result["per_query"]["heavy"]["busy_s"]
        h2 = result["per_query"]["heavy2"]["busy_s"]
        result["heavy_busy_ratio"] = hb / h2 if h2 else None
    return result


def _median_of(runs: list[dict[str, Any]], case: str, pick: Any) -> float | None:
    values = [pick(r) for r in runs if r["case"] == case]
    values = [v for v in values if v]
    return statistics.median(values) if values else None


def summarize(result: dict[str, Any]) -> dict[str, Any]:
    """One row per run, in run order ("case #2" for a case's second run);
    ratios against the median of the session's light-alone (heavy-alone)
    runs: alone's p99 itself moves by a third from run to run here."""
    ok = [r for r in result["runs"] if "error" not in r]
    alone = {
        q: _median_of(ok, "light-alone", lambda r, q=q: (r.get("light") or {}).get(f"{q}_ms"))
        for q in ("p50", "p99")
    }
    heavy_alone = _median_of(
        ok, "heavy-alone", lambda r: r["per_query"].get("heavy", {}).get("records_per_s")
    )
    rows = {}
    seen: dict[str, int] = {}
    for r in ok:
        seen[r["case"]] = seen.get(r["case"], 0) + 1
        label = r["case"] if seen[r["case"]] == 1 else f"{r['case']} #{seen[r['case']]}"
        row: dict[str, Any] = {}
        light = r.get("light")
        if light and light.get("n"):
            row["light_p50_ms"], row["light_p99_ms"] = light["p50_ms"], light["p99_ms"]
            if alone["p50"] and alone["p99"]:
                row["light_p50_ratio"] = light["p50_ms"] / alone["p50"]
                row["light_p99_ratio"] = light["p99_ms"] / alone["p99"]
        for q in ("heavy", "heavy2"):
            if q in r["per_query"]:
                rate = r["per_query"][q]["records_per_s"]
                row[f"{q}_records_per_s"] = rate
                if heavy_alone:
                    row[f"{q}_ratio"] = rate / heavy_alone
                row[f"{q}_busy_share"] = r["per_query"][q]["busy_share"]
        if r.get("heavy_busy_ratio") is not None:
            row["heavy_busy_ratio"] = r["heavy_busy_ratio"]
        rows[label] = row
    return rows


def main(args: argparse.Namespace) -> int:
    from benchmarks.harness import BenchSession, machine_info

    # benchmarks/results/local/ unless --update-results or --out (benchmarks/outputs.py).
    args.out = output_dir(args)
    from benchmarks.report import choose

    cases = choose(args.cases, CASES, "case")
    window_s = 5.0 if args.quick else args.window_s
    # Enough backlog that a heavy query alone does not run out before the window ends.
    max_rate = 1000.0 / args.heavy_record_ms
    backlog = int(max_rate * (window_s + WARMUP_S + 15) * 1.2)
    name = f"{NAME}-{args.tag}" if args.tag else NAME
    result: dict[str, Any] = {
        "name": name,
        "cases": cases,
        "window_s": window_s,
        "warmup_s": WARMUP_S,
        "heavy_record_ms": args.heavy_record_ms,
        "heavy_backlog": backlog,
        "probe_interval_ms": args.probe_interval_ms,
        "threads": args.threads,
        "timeslice_ms": args.timeslice_ms,
        "machine": machine_info("kafka"),
        "load_average_start": os.getloadavg()[0],
        "runs": [],
    }
    placement = _split_cpus() if args.placement == "split" else None
    args.app_cpus = placement["app"] if placement else None  # read by run_case
    result["placement"] = {k: sorted(v) for k, v in placement.items()} if placement else "shared"
    started = time.monotonic()
    log_dir = os.path.join(args.out, "logs", name)
    with BenchSession(log_dir, "kafka") as session:
        if placement:
            # The broker's threads (taskset -a: all of them; threads it starts
            # later inherit) and this process's (the probe, the backlog
            # producer: threads started from here on inherit) on one half.
            subprocess.run(
                [
                    "taskset",
                    "-a",
                    "-p",
                    "-c",
                    _cpu_list(placement["broker"]),
                    str(session.broker_pid),
                ],
                check=True,
                stdout=subprocess.DEVNULL,
            )
            os.sched_setaffinity(0, placement["broker"])
        # A discarded run of both queries first: the first minute on a fresh
        # broker (and a cold page cache) showed latencies of up to a second
        # that decay, and the first case running both queries often stalled
        # 0.1-0.8 s once (even after a heavy-alone case), which would inflate
        # whichever case came first. The first light-alone case of a session
        # still comes out slow (p99 8.8-13.3 ms in 8 sessions against 4.8-7.3
        # for the later ones, also after a discarded light-alone run): run
        # light-alone three times or more; the ratios use their median.
        try:
            warm = run_case(session, "light-priority", args, min(window_s, 10.0), backlog)
            result["warmup"] = {k: v for k, v in warm.get("light", {}).items() if k != "series"}
        except Exception as exc:  # noqa: BLE001 - recorded, the session goes on
            result["warmup"] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"  warm-up (discarded): {result['warmup']}", flush=True)
        for case in cases:
            try:
                run = run_case(session, case, args, window_s, backlog)
            except Exception as exc:  # noqa: BLE001 - recorded, the session goes on
                run = {"case": case, "error": f"{type(exc).__name__}: {exc}"}
            result["runs"].append(run)
            print(f"  {case}: {_line(run)}", flush=True)
    result["session_s"] = time.monotonic() - started
    result["load_average_end"] = os.getloadavg()[0]
    result["summary"] = summarize(result)
    for path in write(args.out, name, result):
        print(f"wrote {path}")
    return 1 if any("error" in r for r in result["runs"]) else 0


def _line(run: dict[str, Any]) -> str:
    if "error" in run:
        return f"FAILED {run['error']}"
    parts = []
    light = run.get("light")
    if light and light["n"]:
        parts.append(
            f"light p50 {light['p50_ms']:.1f} ms p99 {light['p99_ms']:.1f} ms "
            f"(n {light['n']}, missing {light['missing']})"
        )
    for q, v in run["per_query"].items():
        if q.startswith("heavy"):
            parts.append(f"{q} {v['records_per_s']:.0f} rec/s busy {v['busy_share']:.2f}")
    return "; ".join(parts)


def _placement_line(placement: Any) -> str:
    if placement == "shared":
        return (
            "Placement: shared (the broker, the probe and the daemons all on every CPU; "
            "the CPU-bound query competes with the broker's threads)."
        )
    return (
        f"Placement: split (the broker and the probe on CPU(s) {_cpu_list(placement['broker'])}, "
        f"the daemons on CPU(s) {_cpu_list(placement['app'])}, as with a broker on a machine "
        "of its own)."
    )


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{suffix}"


def markdown(result: dict[str, Any]) -> str:
    m = result["machine"]
    s = result["summary"]
    lines = [
        "# Named queries: the light query's latency beside a CPU-bound one (issue 17)",
        "",
        f"Broker: {m.get('broker', 'Apache Kafka, one KRaft node')}; {m.get('nproc')} cores "
        f"({m.get('cpu', '?')}), Python {m.get('python')}, librdkafka {m.get('librdkafka')}, "
        f"{m.get('date')}, git {m.get('git_head', '?')}.",
        "",
        f"The app is a separate daemon, {result['threads']} processing thread(s), "
        f"`task.timeslice.ms` {result.get('timeslice_ms', 5)}, `commit.interval.ms` 30000. Heavy: "
        f"{result['heavy_record_ms']} ms of CPU per record over a backlog of "
        f"{result['heavy_backlog']:,} records. Light: one record every "
        f"{result['probe_interval_ms']:.0f} ms; latency = the probe consumer's `time.time()` "
        "when `poll()` returns the output record minus `time.time()` just before the "
        f"input's `produce()`; {result['window_s']:.0f} s window per case after "
        f"{result['warmup_s']:.0f} s warm-up. Ratios are to the median of the session's "
        "light-alone (heavy-alone) runs. Runs in sequence, after a "
        "discarded 10 s light-priority run (a fresh broker's first minute is slow, and "
        "the first run of both queries often stalled once).",
        "",
        _placement_line(result.get("placement", "shared")),
        "",
        "| case | light p50 ms | light p99 ms | p50 / alone | p99 / alone | heavy rec/s | "
        "heavy / alone | heavy busy share | heavy:heavy2 busy |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for case, row in s.items():
        heavy = _fmt(row.get("heavy_records_per_s"), ".0f")
        if "heavy2_records_per_s" in row:
            heavy += f" (heavy2 {row['heavy2_records_per_s']:.0f})"
        ratio = _fmt(row.get("heavy_ratio"), ".2f", "x")
        if "heavy2_ratio" in row:
            ratio += f" ({row['heavy2_ratio']:.2f}x)"
        lines.append(
            f"| {case} | {_fmt(row.get('light_p50_ms'), '.1f')} | "
            f"{_fmt(row.get('light_p99_ms'), '.1f')} | {_fmt(row.get('light_p50_ratio'), '.2f', 'x')} | "
            f"{_fmt(row.get('light_p99_ratio'), '.2f', 'x')} | {heavy} | {ratio} | "
            f"{_fmt(row.get('heavy_busy_share'), '.2f')} | "
            f"{_fmt(row.get('heavy_busy_ratio'), '.2f')} |"
        )
    failed = [r for r in result["runs"] if "error" in r]
    if failed:
        lines += ["", "Failed: " + "; ".join(f"{r['case']}: {r['error']}" for r in failed)]
    details = []
    for r in result["runs"]:
        if "error" in r:
            continue
        lags = ", ".join(f"{q} {v['lag_end']}" for q, v in r["per_query"].items())
        missing = (
            f"; light records missing {r['light']['missing']} of {r['light']['n'] + r['light']['missing']}"
            if "light" in r
            else ""
        )
        knobs = "".join(f"; {k}={v}" for k, v in r.get("env", {}).items())
        details.append(
            f"- {r['case']}: lag at the end {lags}{missing}; load average "
            f"{r['load_average']:.1f}{knobs}"
        )
    lines += [
        "",
        "Issue 17's targets: light p99 with priority within 1.5x of alone; weights 3:1 "
        "give busy-time shares 3:1 within 10%.",
        "",
        *details,
        "",
        f"Load average (1 min) at start {result['load_average_start']:.1f}, at end "
        f"{result['load_average_end']:.1f}: the machine is shared with other jobs, so "
        "these figures are noisy (one sample per case).",
        "",
    ]
    return "\n".join(lines)


def plot(out_dir: str, name: str, result: dict[str, Any]) -> str | None:
    plt = pyplot()
    if plt is None:
        return None
    runs = [r for r in result["runs"] if r.get("light", {}).get("series")]
    if not runs:
        return None
    fig, axes = plt.subplots(len(runs), 1, figsize=(8, 2.0 * len(runs)), sharex=True, sharey=True)
    if len(runs) == 1:
        axes = [axes]
    for ax, r in zip(axes, runs, strict=True):
        xs = [p[0] for p in r["light"]["series"]]
        ys = [p[1] for p in r["light"]["series"]]
        ax.plot(xs, ys, ".", markersize=2, color="#3b75af")
        ax.axhline(r["light"]["p99_ms"], color="#c44", linestyle="--", linewidth=1, label="p99")
        ax.axhline(statistics.median(ys), color="#444", linestyle=":", linewidth=1, label="p50")
        ax.set_yscale("log")
        ax.set_title(
            f"{r['case']}: p50 {r['light']['p50_ms']:.1f} ms, p99 {r['light']['p99_ms']:.1f} ms",
            fontsize=9,
        )
        ax.set_ylabel("ms")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[-1].set_xlabel("seconds into the measurement window")
    fig.suptitle("light query end-to-end latency (log scale)", fontsize=10)
    fig.tight_layout()
    path = os.path.join(out_dir, f"{name}.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write(out_dir: str, name: str, result: dict[str, Any]) -> list[str]:
    from benchmarks.report import write_files

    def draw() -> list[str]:
        png = plot(out_dir, name, result)
        return [png] if png else []

    return write_files(out_dir, name, result, markdown, draw)
