"""The comparison harness (parent process): one broker per workload, runs in child processes.

Per workload: ``harness.BenchSession`` starts one broker (``--broker``); the input
is generated once (identical bytes and partitions for every run); the echo
server is started for the I/O-bound workloads. Then ``repeats`` rounds, each
over every thread count, each thread count running both models back to back,
the order of the two alternating from one pair to the next.

One run (``run_one``):

1. fresh topics for this run: input (loaded with the workload's records),
   output, and for ``restore`` the store's changelog with ``restore_records``
   on partition 0 (the harness loads it; nothing is timed yet);
2. wait (up to ``quiet_wait``) until other processes are quiet, start the child,
   a reader of the output topic and a /proc sampler of the child;
3. the child joins the group and reports ``ready`` (all partitions assigned,
   balanced, unchanged for ``settle_s``; nothing processed yet); ``go``;
4. throughput phase: until the reader has seen the whole backlog's output
   (``count``: one record per input; ``sum``: latest counts add up);
   records/s = backlog / (seen - go); CPU seconds of the child over the same
   window from /proc;
5. latency phase: a feeder produces ``feed_rate`` records/s for
   ``feed_seconds`` with their timestamp set to the wall clock at produce time;
   latency = the reader's wall clock when it receives the output record minus
   the record's timestamp (the output keeps the input's timestamp);
6. ``stop``; the child closes its model and reports; topics are deleted.

``restore`` differs: no backlog; at ``go`` the restore starts and the feeder
sends records for partitions 1-7 until the restore is done (plus one second).
Its figures: the restore's duration, records processed by the other tasks
while it ran (per second), and the latency of the records fed meanwhile.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import queue
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition

from benchmarks import interrupt
from benchmarks.compare import procfs
from benchmarks.compare.workloads import (
    STORE,
    Record,
    Workload,
    other_input_topic,
    restore_changelog_record,
)
from benchmarks.harness import (
    REPO_ROOT,
    BenchSession,
    client_config,
    system_busy_seconds,
    wait_for_quiet,
)

NOISY_OTHER_CORES = 0.25


def _self_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a list; NaN when empty."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100.0 * len(ordered)))
    return ordered[rank - 1]


# -- loading --------------------------------------------------------------------------


def load(
    bootstrap: str, topic: str, records: Any, count_hint: int = 0, other_topic: str | None = None
) -> float:
    """Produce ``(key, value, partition)`` records; returns seconds taken.

    Records of the timed workloads, ``(key, value, partition, timestamp_ms,
    input)``, go with that timestamp to ``topic`` (input 0) or ``other_topic``
    (input 1).
    """
    producer = Producer(
        client_config(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 2_000_000,
                "queue.buffering.max.kbytes": 2_097_151,
                "enable.idempotence": True,
            }
        )
    )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    started = time.perf_counter()
    produce = producer.produce
    for n, record in enumerate(records, 1):
        key, value, partition = record[0], record[1], record[2]
        extra: dict[str, Any] = {}
        target = topic
        if len(record) > 3:
            extra["timestamp"] = record[3]
            if record[4]:
                assert other_topic is not None, "a two-input record without the other topic"
                target = other_topic
        while True:
            try:
                produce(target, value, key, partition=partition, on_delivery=on_delivery, **extra)
                break
            except BufferError:
                producer.poll(0.05)
        if n % 20000 == 0:
            producer.poll(0)
    remaining = producer.flush(180)
    seconds = time.perf_counter() - started
    producer.close()
    if remaining or errors:
        raise RuntimeError(f"loading {topic} failed: {remaining} unflushed, errors {errors[:3]}")
    return seconds


def restore_records(count: int) -> Any:
    for i in range(count):
        key, value = restore_changelog_record(i)
        yield key, value, 0


# -- the output reader and the feeder (threads of the harness) ------------------------------


class Reader(threading.Thread):
    """Reads the output topic from the beginning while the run goes on.

    ``progress``: output records seen (mode ``count``) or the sum of the latest
    count per key (mode ``sum``). Latency samples are taken for records whose
    timestamp is at or after ``latency_from_ms``: (timestamp, received wall ms).
    """

    def __init__(self, bootstrap: str, topic: str, partitions: int, mode: str) -> None:
        super().__init__(name="bench-reader", daemon=True)
        self.mode = mode
        self.progress = 0
        self.records = 0
        self.latest: dict[bytes, int] = {}
        self.latency_from_ms = float("inf")
        self.samples: list[tuple[int, float]] = []
        self.error: str | None = None
        self.last_receive = time.monotonic()
        # When the first output record arrived (monotonic; None before): the start of
        # the "first to last output record" throughput figure.
        self.first_receive: float | None = None
        self._stop_event = threading.Event()
        # Optional split of the output into groups (count mode), each with the
        # monotonic time its expected count was reached: for skew, when the
        # records of the cold partitions were all through.
        self.group_of: Callable[[bytes | None], int] | None = None
        self.group_expected: dict[int, int] = {}
        self.group_counts: dict[int, int] = {}
        self.group_done: dict[int, float] = {}
        self._target: tuple[int, threading.Event, list[float]] | None = None
        self._lock = threading.Lock()
        self._consumer = Consumer(
            client_config(
                {
                    "bootstrap.servers": bootstrap,
                    "group.id": f"bench-compare-reader-{os.getpid()}-{time.monotonic_ns()}",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                    # Hand over records as soon as they are there: the reader's own
                    # wait is part of the measured latency.
                    "fetch.wait.max.ms": 2,
                    "fetch.min.bytes": 1,
                }
            )
        )
        self._consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)]
        )

    def wait_for(self, target: int, timeout: float) -> float | None:
        """Block until progress >= target; the monotonic time it was reached, or None."""
        event = threading.Event()
        reached: list[float] = []
        with self._lock:
            if self.progress >= target:
                return time.monotonic()
            self._target = (target, event, reached)
        event.wait(timeout)
        with self._lock:
            self._target = None
        return reached[0] if reached else None

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        consume = self._consumer.consume
        latest = self.latest
        try:
            while not self._stop_event.is_set():
                batch = consume(10000, 0.002)
                if not batch:
                    continue
                now_ms = time.time() * 1000.0
                received = time.monotonic()
                self.last_receive = received
                if self.first_receive is None:
                    self.first_receive = received
                since = self.latency_from_ms
                samples = self.samples
                total = 0
                for message in batch:
                    if message.error() is not None:
                        continue
                    total += 1
                    timestamp = message.timestamp()[1]
                    if timestamp >= since:
                        samples.append((timestamp, now_ms))
                    group_of = self.group_of
                    if group_of is not None:
                        group = group_of(message.value())
                        n = self.group_counts.get(group, 0) + 1
                        self.group_counts[group] = n
                        if n == self.group_expected.get(group):
                            self.group_done[group] = received
                    if self.mode == "sum":
                        value = message.value()
                        count = int.from_bytes(value, "big", signed=True) if value else 0
                        key = message.key()
                        self.progress += count - latest.get(key, 0)
                        latest[key] = count
                self.records += total
                if self.mode == "count":
                    self.progress = self.records
                with self._lock:
                    target = self._target
                    if target is not None and self.progress >= target[0] and not target[1].is_set():
                        target[2].append(received)
                        target[1].set()
        except KafkaException as exc:
            self.error = str(exc)
        finally:
            self._consumer.close()

    def latencies(self, from_ms: float, to_ms: float = float("inf")) -> list[float]:
        return [now - ts for ts, now in list(self.samples) if from_ms <= ts <= to_ms]


class Feeder(threading.Thread):
    """Produces records at a fixed rate, each stamped with the wall clock at produce time."""

    def __init__(
        self,
        bootstrap: str,
        topic: str,
        make: Callable[[int], Record],
        rate: float,
        count: int | None,
    ) -> None:
        super().__init__(name="bench-feeder", daemon=True)
        self._make = make
        self._topic = topic
        self._rate = rate
        self._count = count
        self.fed = 0
        self.first_ms: float | None = None
        self.last_ms: float | None = None
        self.error: str | None = None
        self._stop_event = threading.Event()
        # Set by the harness when the timed feed may begin (start() first: the
        # thread warms its producer up meanwhile).
        self.begin = threading.Event()
        # Set once warmed up: the harness waits on it before timing the feed.
        self.warm = threading.Event()
        self._producer = Producer(
            client_config(
                {"bootstrap.servers": bootstrap, "linger.ms": 0, "enable.idempotence": True}
            )
        )

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        producer = self._producer
        produce = producer.produce
        make = self._make
        topic = self._topic
        limit = self._count if self._count is not None else 1 << 62
        j = 0
        try:
            # Connected, with the topic's leaders and a producer id, before the
            # first timed record: a cold producer holds its first records ~0.5 s.
            producer.list_topics(topic, timeout=10)
            time.sleep(0.3)
            self.warm.set()
            while not self.begin.wait(0.1):
                if self._stop_event.is_set():
                    return
            started = time.monotonic()
            while j < limit and not self._stop_event.is_set():
                due = min(limit, int((time.monotonic() - started) * self._rate) + 1)
                while j < due:
                    key, value, partition = make(j)
                    now_ms = int(time.time() * 1000)
                    if self.first_ms is None:
                        self.first_ms = now_ms
                    produce(topic, value, key, partition=partition, timestamp=now_ms)
                    self.last_ms = now_ms
                    j += 1
                self.fed = j
                producer.poll(0)
                time.sleep(0.001)
            self.fed = j
            if producer.flush(30):
                self.error = "feeder: records not acknowledged"
        except Exception as exc:  # noqa: BLE001 - reported with the run
            self.error = f"{type(exc).__name__}: {exc}"
        finally:
            # Release its connections now, not when the object is collected
            # (a producer outliving the broker logs reconnect attempts).
            with contextlib.suppress(Exception):
                producer.close()


class Sampler(threading.Thread):
    """Samples the child's broker connections, RSS and thread count every 0.25 s."""

    def __init__(self, pid: int, broker_port: int) -> None:
        super().__init__(name="bench-sampler", daemon=True)
        self.pid = pid
        self.port = broker_port
        self.max_connections = 0
        self.max_rss_mb = 0.0
        self.max_threads = 0
        self.timeline: list[tuple[float, int, float]] = []
        self._stop_event = threading.Event()

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(0.25):
            members = procfs.tree(self.pid)  # one /proc scan per sample
            connections = procfs.broker_connections(self.pid, self.port, members)
            rss = procfs.memory_mb(self.pid, members).get("VmRSS", 0.0)
            self.max_connections = max(self.max_connections, connections)
            self.max_rss_mb = max(self.max_rss_mb, rss)
            self.max_threads = max(self.max_threads, procfs.thread_count(self.pid, members))
            self.timeline.append((time.monotonic(), connections, rss))


# -- one run -------------------------------------------------------------------------------


@dataclass
class RunSettings:
    """Everything a run needs besides the model and thread count."""

    workload: Workload
    partitions: int
    backlog: list[Record]
    feed_rate: float
    feed_seconds: float
    restore_records: int
    config: dict[str, Any]
    log_dir: str
    session_id: str
    quiet_wait: float
    echo: tuple[str, int] | None = None
    echo_pid: int | None = None
    # Output records (count) or the sum of the latest counts (sum) that make the
    # backlog's output complete; None: one per backlog record.
    output_target: int | None = None
    restore_mode: str = "blocking"
    settle_s: float = 0.5
    threads_per_task: int = 0  # model keypar: num.threads.per.task (0: = threads)
    extra: dict[str, Any] = field(default_factory=dict)
    # (model, spec) -> (argv of the child without the spec, the spec it gets): how a
    # model other than runtime/baseline runs (benchmarks.peers: a JVM, another
    # virtualenv). None: ``python -m benchmarks.compare.child`` with the spec as is.
    launch: Callable[[str, dict[str, Any]], tuple[list[str], dict[str, Any]]] | None = None


class _Loader(threading.Thread):
    def __init__(self, fn: Callable[[], None]) -> None:
        super().__init__(name="bench-loader", daemon=True)
        self._fn = fn
        self.error: str | None = None

    def run(self) -> None:
        try:
            self._fn()
        except Exception as exc:  # noqa: BLE001 - reported by the run
            self.error = f"{type(exc).__name__}: {exc}"


class Child:
    """A running child process with its event stream.

    ``argv``: the command without the spec (default: ``python -m
    benchmarks.compare.child``); the spec, with ``event_fd`` added, is its last
    argument. The process is the child itself (no shell in between), so /proc
    figures of ``pid`` are the model's.
    """

    def __init__(self, spec: dict[str, Any], log_path: str, argv: list[str] | None = None) -> None:
        read_fd, write_fd = os.pipe()
        spec = dict(spec, event_fd=write_fd)
        env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in close()
        command = argv or [sys.executable, "-m", "benchmarks.compare.child"]
        self.proc = subprocess.Popen(
            [*command, json.dumps(spec)],
            stdin=subprocess.PIPE,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            cwd=REPO_ROOT,
            env=env,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        self.pid = self.proc.pid
        self.events: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        self.pending: list[dict[str, Any]] = []
        self._reader = threading.Thread(target=self._read, args=(read_fd,), daemon=True)
        self._reader.start()
        # Stopped by the harness on Ctrl-C even where the run's own clean-up
        # did not get that far (benchmarks.interrupt).
        interrupt.register_child(self.pid, self._stop_after_interrupt)

    def _stop_after_interrupt(self) -> None:
        if self.proc.poll() is None:
            self.send("stop")
        self.close(20)

    def _read(self, fd: int) -> None:
        with os.fdopen(fd, "r") as stream:
            for line in stream:
                with contextlib.suppress(ValueError):
                    self.events.put(json.loads(line))
        self.events.put({"event": "eof", "t": time.monotonic()})

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()

    def wait_event(self, kind: str, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise TimeoutError(f"no '{kind}' from the child within {timeout:.0f} s")
            try:
                event = self.events.get(timeout=remaining)
            except queue.Empty:
                continue
            if event["event"] == kind:
                return event
            if event["event"] in ("failed", "eof"):
                raise RuntimeError(f"child {event['event']}: {event.get('error', '')}")
            self.pending.append(event)

    def poll_event(self, kind: str) -> dict[str, Any] | None:
        """A ``kind`` event if one arrived (non-blocking); raises if the child failed."""
        while True:
            try:
                event = self.events.get_nowait()
            except queue.Empty:
                break
            if event["event"] in ("failed", "eof"):
                raise RuntimeError(f"child {event['event']}: {event.get('error', '')}")
            self.pending.append(event)
        for event in self.pending:
            if event["event"] == kind:
                self.pending.remove(event)
                return event
        return None

    def close(self, timeout: float = 60.0) -> None:
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        finally:
            self._log.close()
            interrupt.unregister_child(self.pid)


def _tail(path: str, max_bytes: int = 3000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


def run_one(
    session: BenchSession, settings: RunSettings, model: str, threads: int, repeat: int
) -> dict[str, Any]:
    """One measured run of ``model`` with ``threads`` threads. Never raises for a failed run."""
    wl = settings.workload
    label = f"{model}-t{threads}-r{repeat}"
    app_id = f"cmp-{wl.name}-{settings.session_id}-{label}"
    input_topic = f"{app_id}-in"
    output_topic = f"{app_id}-out"
    partitions = settings.partitions
    log_path = os.path.join(settings.log_dir, f"{wl.name}-{label}.log")
    run: dict[str, Any] = {
        "workload": wl.name,
        "model": model,
        "threads": threads,
        "repeat": repeat,
        "log": log_path,
        "backlog": len(settings.backlog),
        "input_topic": input_topic,
    }
    if settings.output_target is not None:
        run["output_target"] = settings.output_target
    run_started = time.monotonic()
    child: Child | None = None
    reader: Reader | None = None
    sampler: Sampler | None = None
    try:
        session.create_topic(input_topic, partitions)
        other_topic = other_input_topic(input_topic) if wl.two_inputs else None
        if other_topic is not None:
            session.create_topic(other_topic, partitions)
        session.create_topic(output_topic, partitions)
        changelog = f"{app_id}-{STORE}-changelog"
        if wl.restore:
            _create_compacted(session, changelog, partitions)
            run["restore_records"] = settings.restore_records
        if settings.quiet_wait > 0:
            # The threshold the help, the READMEs and the reports state (the
            # harness's default, 0.15, was used here unsaid).
            waited, busy = wait_for_quiet(
                session, settings.quiet_wait, threshold_cores=NOISY_OTHER_CORES, window_s=0.5
            )
            run["quiet_wait_s"] = round(waited, 1)
            run["other_cores_before"] = round(busy, 2)

        # The input (and the changelog to restore) is loaded while the child
        # starts and joins the group; nothing is processed or restored before
        # `go`, which waits for the load.
        def load_inputs() -> None:
            run["load_s"] = load(
                session.bootstrap, input_topic, settings.backlog, other_topic=other_topic
            )
            if wl.restore:
                run["restore_load_s"] = load(
                    session.bootstrap, changelog, restore_records(settings.restore_records)
                )

        loader = _Loader(load_inputs)
        loader.start()

        spec = {
            "model": model,
            "workload": wl.name,
            "threads": threads,
            "partitions": partitions,
            "bootstrap": session.bootstrap,
            "application_id": app_id,
            "input_topic": input_topic,
            "output_topic": output_topic,
            "topology": wl.topology,
            "inputs": 2 if wl.two_inputs else 1,
            "config": settings.config,
            "backlog": len(settings.backlog),
            "gate_restore": wl.restore,
            "restore_task": "0_0" if wl.restore else None,
            "restore_mode": settings.restore_mode,
            "settle_s": settings.settle_s,
            "threads_per_task": settings.threads_per_task,
            "echo": list(settings.echo) if settings.echo else None,
        }
        reader = Reader(session.bootstrap, output_topic, partitions, wl.output)
        if wl.group_of is not None:
            reader.group_of = wl.group_of
            for record in settings.backlog:
                group = wl.group_of(record[1])
                reader.group_expected[group] = reader.group_expected.get(group, 0) + 1
        reader.start()
        argv = None
        if settings.launch is not None:
            argv, spec = settings.launch(model, spec)
        child = Child(spec, log_path, argv)
        sampler = Sampler(child.pid, int(session.bootstrap.rsplit(":", 1)[1]))
        sampler.start()
        ready = child.wait_event("ready", 180)
        loader.join(300)
        if loader.is_alive() or loader.error:
            raise RuntimeError(f"loading the input failed: {loader.error or 'timed out'}")
        run["join_s"] = ready["join_s"]
        run["ready_s"] = ready["ready_s"]
        run["baseline_assignment"] = ready.get("assignment")
        port = int(session.bootstrap.rsplit(":", 1)[1])
        run["connections_at_ready"] = procfs.broker_connections(child.pid, port)
        run["os_threads_at_ready"] = procfs.thread_count(child.pid)

        feeder = None
        if wl.restore:
            # Created (connected, warmed up) before go; started right after it.
            feeder = Feeder(
                session.bootstrap,
                input_topic,
                lambda j: wl.make(j, partitions),
                settings.feed_rate,
                None,
            )
            feeder.start()
            feeder.warm.wait(15)
        marks0 = _marks(session, child.pid, settings.echo_pid)
        child.send("go")
        go = time.monotonic()
        go_wall_ms = time.time() * 1000.0
        child.wait_event("go", 30)

        if feeder is not None:
            _restore_phase(session, settings, run, child, reader, feeder, go_wall_ms, marks0)
        else:
            _throughput_and_latency(session, settings, run, child, reader, go, marks0)

        memory = procfs.memory_mb(child.pid)
        run["peak_rss_mb"] = memory.get("VmHWM", float("nan"))
        run["connections_max"] = sampler.max_connections
        run["os_threads_max"] = sampler.max_threads
        child.send("stop")
        result = child.wait_event("result", 90)
        run["close_s"] = result.get("close_s")
        run["closed_cleanly"] = result.get("closed_cleanly")
        run["status"] = result.get("status")
        # Whatever the final commit still wrote (folded counts), then check completeness.
        _settle_reader(reader)
        _check_output(run, wl, reader)
    except Exception as exc:  # noqa: BLE001 - one failed run must not end the session
        run["error"] = f"{type(exc).__name__}: {exc}"
        if child is not None:
            run["error"] += f"\n--- log tail ({log_path}) ---\n{_tail(log_path)}"
    finally:
        if child is not None:
            if child.proc.poll() is None:
                child.send("stop")
            child.close(60)
        if sampler is not None:
            sampler.stop()
        if reader is not None:
            reader.stop()
            reader.join(10)
        with contextlib.suppress(Exception):
            session.check_broker()
        _delete_run_topics(session, app_id)
        run["wall_s"] = time.monotonic() - run_started
    return run


def _create_compacted(session: BenchSession, name: str, partitions: int) -> None:
    from confluent_kafka.admin import NewTopic

    assert session.admin is not None
    futures = session.admin.create_topics(
        [NewTopic(name, partitions, 1, config={"cleanup.policy": "compact"})],
        operation_timeout=30,
    )
    futures[name].result(30)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        topic = session.admin.list_topics(name, timeout=5).topics.get(name)
        if topic is not None and not topic.error and len(topic.partitions) == partitions:
            return
        time.sleep(0.05)
    raise RuntimeError(f"changelog topic {name} did not appear")


def _delete_run_topics(session: BenchSession, app_id: str) -> None:
    assert session.admin is not None
    with contextlib.suppress(Exception):
        # Every topic of the run has the app id in its name (quixstreams puts it
        # in the middle of its changelog topics' names).
        topics = [t for t in session.admin.list_topics(timeout=10).topics if app_id in t]
        if topics:
            for future in session.admin.delete_topics(topics, operation_timeout=30).values():
                with contextlib.suppress(Exception):
                    future.result(30)


def _marks(session: BenchSession, pid: int, echo_pid: int | None) -> dict[str, float]:
    return {
        "t": time.monotonic(),
        "child_cpu": procfs.cpu_seconds(pid),
        "broker_cpu": session.broker_cpu_seconds(),
        "system_busy": system_busy_seconds(),
        "harness_cpu": _self_cpu(),
        "echo_cpu": procfs.cpu_seconds(echo_pid) if echo_pid else 0.0,
    }


def _window(run: dict[str, Any], before: dict[str, float], after: dict[str, float]) -> None:
    """CPU figures between two marks; flags the run noisy if others were busy."""
    d = {k: after[k] - before[k] for k in before}
    run["cpu_s"] = d["child_cpu"]
    run["broker_cpu_s"] = d["broker_cpu"]
    run["harness_cpu_s"] = d["harness_cpu"]
    run["echo_cpu_s"] = d["echo_cpu"]
    other = d["system_busy"] - d["child_cpu"] - d["broker_cpu"] - d["harness_cpu"] - d["echo_cpu"]
    run["other_cpu_s"] = other
    run["noisy"] = other > NOISY_OTHER_CORES * max(d["t"], 1e-6)


def _throughput_and_latency(
    session: BenchSession,
    settings: RunSettings,
    run: dict[str, Any],
    child: Child,
    reader: Reader,
    go: float,
    marks0: dict[str, float],
) -> None:
    backlog = len(settings.backlog)
    target = backlog if settings.output_target is None else settings.output_target
    count = int(settings.feed_rate * settings.feed_seconds)
    feeder = None
    if count > 0:
        # Warms up in its own thread during the throughput phase; feeds later.
        feeder = Feeder(
            session.bootstrap,
            run["input_topic"],
            lambda j: settings.workload.make(backlog + j, settings.partitions),
            settings.feed_rate,
            count,
        )
        feeder.start()
    try:
        timeout = max(120.0, backlog / 300.0)
        done = _wait_reader(reader, child, target, timeout)
        if done is None:
            raise TimeoutError(
                f"output incomplete after {timeout:.0f} s: {reader.progress} of {target}"
            )
        marks1 = _marks(session, child.pid, settings.echo_pid)
        seconds = done - go
        run["seconds"] = seconds
        run["records_per_s"] = backlog / seconds
        first = reader.first_receive
        if first is not None and settings.workload.output == "count" and done > first:
            # From the first to the last output record seen by the reader: without the
            # model's start-up after `go` (first fetch, first batch through, linger).
            # Count workloads only: folded counts arrive per commit, so their first
            # output says nothing about when processing started.
            run["first_output_s"] = first - go
            run["records_per_s_first_to_last"] = backlog / (done - first)
        if reader.group_done:
            run["group_done_s"] = {str(g): t - go for g, t in sorted(reader.group_done.items())}
        _window(run, marks0, marks1)
        run["cpu_s_per_million"] = run["cpu_s"] / backlog * 1e6
        run["rss_mb_at_done"] = procfs.memory_mb(child.pid).get("VmRSS", float("nan"))
        # The child checks its processed count every 50 ms: its "processed_all" may
        # still be on its way when the reader has seen the last output (it was
        # then missing from the run, and processed/s with it).
        processed_all = _poll_for(child, "processed_all", 1.0)
        if processed_all is not None:
            child.pending.append(processed_all)
        if feeder is not None:
            _latency_phase(settings, run, child, reader, feeder, count, target)
    finally:
        if feeder is not None:
            feeder.stop()
        # The child saw its processed count reach the backlog (checked every
        # 50 ms): the processing-only rate, without waiting for the output.
        processed_all = child.poll_event("processed_all")
        if processed_all is not None:
            run["processed_all_s"] = processed_all["t"] - go
            run["records_per_s_processed"] = backlog / max(1e-6, processed_all["t"] - go)


def _latency_phase(
    settings: RunSettings,
    run: dict[str, Any],
    child: Child,
    reader: Reader,
    feeder: Feeder,
    count: int,
    target: int,
) -> None:
    """A fixed offered rate, well below every run's capacity, after the backlog
    (whose output is complete at ``target``)."""
    from_ms = time.time() * 1000.0
    reader.latency_from_ms = from_ms
    feeder.begin.set()
    feeder.join(settings.feed_seconds * 3 + 30)
    if feeder.error:
        raise RuntimeError(feeder.error)
    reached = _wait_reader(reader, child, target + count, 60)
    latencies = reader.latencies(from_ms)
    run["latency"] = _latency_figures(latencies, settings.feed_rate, count)
    if reached is None:
        run["latency"]["incomplete"] = f"{reader.progress - target} of {count} fed records seen"


def _poll_for(child: Child, kind: str, seconds: float) -> dict[str, Any] | None:
    """A ``kind`` event from the child within ``seconds``, else None (raises if it failed)."""
    deadline = time.monotonic() + seconds
    while True:
        event = child.poll_event(kind)
        if event is not None or time.monotonic() >= deadline:
            return event
        time.sleep(0.01)


def _wait_reader(reader: Reader, child: Child, target: int, timeout: float) -> float | None:
    """Wait for the reader in short steps, so a failed child ends the wait early."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        reached = reader.wait_for(target, min(1.0, max(0.0, deadline - time.monotonic())))
        if reached is not None:
            return reached
        child.poll_event("__none__")  # raises if the child failed or exited
        if reader.error:
            raise RuntimeError(f"reader: {reader.error}")
    return None


def _latency_figures(latencies: list[float], rate: float, fed: int) -> dict[str, Any]:
    return {
        "p50_ms": percentile(latencies, 50),
        "p99_ms": percentile(latencies, 99),
        "max_ms": max(latencies) if latencies else float("nan"),
        "samples": len(latencies),
        "fed": fed,
        "feed_rate": rate,
    }


def _restore_phase(
    session: BenchSession,
    settings: RunSettings,
    run: dict[str, Any],
    child: Child,
    reader: Reader,
    feeder: Feeder,
    go_wall_ms: float,
    marks0: dict[str, float],
) -> None:
    reader.latency_from_ms = go_wall_ms
    feeder.begin.set()
    try:
        timeout = max(180.0, settings.restore_records / 5000.0)
        done = child.wait_event("restore_done", timeout)
    finally:
        end_wall_ms = time.time() * 1000.0
        marks1 = _marks(session, child.pid, settings.echo_pid)
        # Keep feeding a little after the restore, then stop and drain.
        time.sleep(1.0)
        feeder.stop()
        feeder.join(60)
    if feeder.error:
        raise RuntimeError(feeder.error)
    restore_s = done["restore_s"]
    run["restore_s"] = restore_s
    run["restore_times"] = done.get("restore_times")
    _window(run, marks0, marks1)
    before = done["processed_at_go"]
    after = done["processed"]
    others = [t for t in after if t != "0_0"]
    processed = sum(after[t] - before.get(t, 0) for t in others)
    run["processed_during_restore"] = processed
    run["records_per_s"] = processed / restore_s if restore_s > 0 else float("nan")
    run["seconds"] = restore_s
    run["fed_total"] = feeder.fed
    run["feed_rate"] = settings.feed_rate
    run["offered_per_s"] = settings.feed_rate
    reached = _wait_reader(reader, child, feeder.fed, 60)
    latencies = reader.latencies(go_wall_ms, end_wall_ms)
    run["latency"] = _latency_figures(latencies, settings.feed_rate, feeder.fed)
    run["latency"]["window"] = "records fed while the restore ran"
    if reached is None:
        run["latency"]["incomplete"] = f"{reader.progress} of {feeder.fed} fed records seen"


def latency_floor(
    session: BenchSession, workload: Workload, partitions: int, rate: float, seconds: float
) -> dict[str, Any]:
    """The latency of the measuring path alone: feeder -> broker -> reader, no model.

    Records go straight into a topic the reader reads; whatever a model adds in
    the runs comes on top of this.
    """
    topic = f"cmp-floor-{workload.name}-{time.monotonic_ns()}"
    session.create_topic(topic, partitions)
    try:
        load(session.bootstrap, topic, [(b"warm-up", b"", p) for p in range(partitions)])
        reader = Reader(session.bootstrap, topic, partitions, "count")
        reader.start()
        try:
            reader.wait_for(partitions, 30)
            count = max(1, int(rate * seconds))
            feeder = Feeder(
                session.bootstrap,
                topic,
                lambda j: workload.make(j, partitions),
                rate,
                count,
            )
            feeder.start()
            feeder.warm.wait(15)
            from_ms = time.time() * 1000.0
            reader.latency_from_ms = from_ms
            feeder.begin.set()
            feeder.join(seconds * 3 + 30)
            reader.wait_for(partitions + count, 30)
            return _latency_figures(reader.latencies(from_ms), rate, count)
        finally:
            reader.stop()
            reader.join(10)
    finally:
        session.delete_topic(topic)


def _settle_reader(reader: Reader, idle_s: float = 0.3, max_s: float = 10.0) -> None:
    deadline = time.monotonic() + max_s
    while time.monotonic() < deadline and time.monotonic() - reader.last_receive < idle_s:
        time.sleep(0.05)


def _check_output(run: dict[str, Any], wl: Workload, reader: Reader) -> None:
    target = run.get("output_target", run["backlog"])
    expected = target + int((run.get("latency") or {}).get("fed", 0))
    run["output_expected"] = expected
    run["output_progress"] = reader.progress
    run["output_records"] = reader.records
    run["correct"] = reader.progress == expected
    if not run["correct"]:
        what = "output records" if wl.output == "count" else "sum of the latest counts"
        run["error"] = f"{what}: {reader.progress}, expected {expected}"
