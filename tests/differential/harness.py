"""The differential harness: one input, two implementations, outputs compared.

For a set of topologies named in `tests.differential.topologies` (Python) and
`peers.DifferentialTopologies` (Java, the benchmarks' Maven peer project),
`run_pair` writes a seeded input into one topic, runs every topology twice on
the same broker, once in Kafka Streams (one JVM for all of them, one
`KafkaStreams` instance each) and once in this runtime (one in-process `App`
each), both with caching off and a short commit interval, waits until every
application has committed the end of each topic it reads (its input and its
repartition topics), stops both, and reads every output topic back.

`compare` then says where the outputs differ: per key, the sequence of
(value, timestamp) in output order, and the partition each key was written to.
Kafka Streams promises order per key (records of one key go through one task
and one output partition), so that is what must match; the interleaving of
different keys across partitions is not a promise of either.

Why caching off: with a cache, which intermediate updates reach the output
depends on when commits happen, in both implementations. Without it every
update is emitted, and the output is a function of the input alone.

Threads: everything runs on the test's thread, except the apps' own threads.
"""

from __future__ import annotations

import random
import subprocess
import time
from collections import defaultdict
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from benchmarks.peers import build as peers_build
from runtime import App
from runtime.kafka.clients import lookup_retriable
from runtime.lifecycle import AppState
from tests.configs import app_config
from tests.differential import topologies
from tests.kafka_helpers import (
    Msg,
    _admin,
    consume_all,
    create_topic,
    end_offsets,
    unique_name,
    wait_until,
)

# Event times start an hour before the run, on a minute boundary: records
# older than the topics' retention (7 days by default) would be deleted by
# the broker while the test reads them (a fixed date in the past did).
BASE_TIMESTAMP = (int(time.time()) // 60 - 60) * 60_000
PARTITIONS = 2
PARALLEL = 6  # apps started, closed and read back at once
WAVE = 10  # topologies run at once (per side); see run_pair
KEEP = {"retention.ms": "-1"}  # the test's topics keep their records, whatever their time

Record = tuple[str | None, str | None, int]  # key, value, timestamp


def generate(
    seed: int,
    count: int,
    *,
    letters: str = "LRST",
    keys: int = 6,
    late_share: float = 0.1,
    base: int = BASE_TIMESTAMP,
) -> list[Record]:
    """A seeded input: string keys (some null), values `<letter><n>` (some null).

    Timestamps advance by 0-400 ms per record; a `late_share` of the records
    go back by up to 9 s instead (out of order; beyond the 2-3 s graces of the
    topologies, so some are late). About 3 % of the keys and 5 % of the values
    are null (null keys are dropped by aggregations, null values are
    tombstones for tables).
    """
    rng = random.Random(seed)
    now = base
    out: list[Record] = []
    for i in range(count):
        now += rng.randrange(0, 400)
        timestamp = now - rng.randrange(0, 9_000) if rng.random() < late_share else now
        key = None if rng.random() < 0.03 else f"k{rng.randrange(keys)}"
        value = None if rng.random() < 0.05 else f"{rng.choice(letters)}{i}"
        out.append((key, value, timestamp))
    return out


def input_headers(value: str | None) -> list[tuple[str, bytes | None]]:
    """The headers of an input record: its value's letter ("letter", None for a
    null value). Topologies that compare headers (`compare(..., headers=True)`)
    check that both implementations carry them the same way."""
    return [("letter", None if value is None else value[:1].encode())]


def produce_input(bootstrap: str, topic: str, records: list[Record]) -> None:
    """Write `records` in order with their timestamps and `input_headers`, keys
    partitioned as the Java client does (murmur2; null keys to partition 0, so
    the run is repeatable)."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "enable.idempotence": True,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
        }
    )
    errors: list[object] = []

    def on_delivery(err: object, _msg: object) -> None:
        if err is not None:
            errors.append(err)

    for key, value, timestamp in records:
        extra = {} if key is not None else {"partition": 0}
        producer.produce(
            topic,
            key=None if key is None else key.encode(),
            value=None if value is None else value.encode(),
            timestamp=timestamp,
            headers=input_headers(value),
            on_delivery=on_delivery,
            **extra,
        )
    if producer.flush(60):
        raise RuntimeError(f"input to {topic!r} not delivered in time")
    if errors:
        raise RuntimeError(f"{len(errors)} input records to {topic!r} failed; first: {errors[0]}")
    written = sum(end_offsets(bootstrap, topic).values())
    if written != len(records):
        raise RuntimeError(f"{topic!r} holds {written} records, {len(records)} were written")


@dataclass
class Run:
    """One topology's two runs: application ids and output topics per side."""

    name: str
    ks_app: str
    py_app: str
    ks_out: str
    py_out: str
    ks_records: list[Msg] = field(default_factory=list)
    py_records: list[Msg] = field(default_factory=list)
    # Times the runtime's app went from RUNNING back to REBALANCING (partitions
    # lost or moved): under at_least_once the records after its last commit
    # are processed again, and an aggregate may count them twice (Kafka
    # Streams' too), so its output is then no function of the input alone.
    py_rebalances: int = 0
    # Why this topology's wave could not run to the end (None: it did).
    error: str | None = None


def _internal_topics_read(names: Iterable[str], app_id: str) -> list[str]:
    """The internal topics an application reads back: repartition topics, and
    a foreign-key join's subscription and response topics (`...-topic`;
    without them the run could stop before the last answer's round trip).
    Changelogs are written, not read, while running."""
    return sorted(
        t for t in names if t.startswith(f"{app_id}-") and t.endswith(("-repartition", "-topic"))
    )


class CommitProbe:
    """Which applications have committed the end of every topic they read.

    Asked every half second while a wave runs. Asking with fresh clients (an
    admin and two consumers per application and question) put hundreds of
    connections a second on the broker of a loaded CI machine, and the apps'
    own start-up checks then timed out. So: the input's end offsets are
    learnt once (it is written whole before any app starts), topics are
    listed once per round, each group keeps one consumer that only fetches
    offsets (it never joins), and an application that has caught up is not
    asked again: its input is static, so once it has committed the end of
    everything it reads, nothing new reaches it.

    Threads: the test's thread only.
    """

    def __init__(self, bootstrap: str, input_topic: str, app_ids: list[str]) -> None:
        self._bootstrap = bootstrap
        self._input = input_topic
        self._input_ends = end_offsets(bootstrap, input_topic)
        self._admin = _admin(bootstrap)
        self._pending = list(app_ids)
        self._groups: dict[str, Consumer] = {}

    def behind(self) -> list[str]:
        """What the applications still running have not committed, one line each (empty: done)."""
        names = self._admin.list_topics(timeout=10).topics
        lines: list[str] = []
        for app_id in list(self._pending):
            line = self._lag(app_id, names)
            if line is None:
                self._pending.remove(app_id)
                self._groups.pop(app_id).close()
            else:
                lines.append(line)
        return lines

    def close(self) -> None:
        for consumer in self._groups.values():
            consumer.close()
        self._groups.clear()

    def _lag(self, app_id: str, names: Iterable[str]) -> str | None:
        if app_id not in self._groups:
            self._groups[app_id] = Consumer(
                {
                    "bootstrap.servers": self._bootstrap,
                    "group.id": app_id,
                    "enable.auto.commit": False,
                    "enable.auto.offset.store": False,
                    "log_level": 0,
                }
            )
        # The input first: until it is committed, the internal topics need no look.
        topics = [self._input, *_internal_topics_read(names, app_id)]
        for topic in topics:
            ends = self._input_ends if topic == self._input else end_offsets(self._bootstrap, topic)
            committed = self._committed(app_id, topic, ends)
            if any(committed.get(p, -1) < end for p, end in ends.items() if end > 0):
                return f"{app_id} on {topic}: committed {committed}, ends {ends}"
        return None

    def _committed(self, app_id: str, topic: str, ends: dict[int, int]) -> dict[int, int]:
        try:
            result = self._groups[app_id].committed(
                [TopicPartition(topic, p) for p in ends], timeout=10
            )
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if isinstance(err, KafkaError) and lookup_retriable(err):
                return {}  # the coordinator moved or is loading: asked again next round
            raise
        return {tp.partition: tp.offset for tp in result if tp.error is None and tp.offset >= 0}


class KafkaStreamsSide:
    """The JVM running every topology's Kafka Streams twin (`peers.DifferentialTopologies`)."""

    def __init__(self, bootstrap: str, state_dir: Path, specs: list[str], log: Path) -> None:
        jar = peers_build.kafka_streams_jar()
        self._log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [
                "java",
                "-Xmx512m",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
                "-cp",
                str(jar),
                "peers.DifferentialTopologies",
                bootstrap,
                str(state_dir),
                *specs,
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        self.log_path = log

    def wait_ready(self, timeout: float = 330.0) -> None:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + timeout
        line = self.proc.stdout.readline().strip()  # the JVM has its own 300 s deadline
        if line != "ready" or time.monotonic() > deadline:
            raise AssertionError(
                f"Kafka Streams side did not start ({line!r}); log: {self.log_path}"
            )

    def stop(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        try:
            self.proc.stdin.write("stop\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._log.close()


def run_pair(
    bootstrap: str, names: list[str], records: list[Record], work: Path, prefix: str
) -> dict[str, Run]:
    """Run `names` on both sides over `records`; returns each topology's outputs.

    The topologies run in waves of `WAVE` (each wave its own Kafka Streams
    JVM and its own apps), not all at once: 38 applications per side starting
    together on a loaded two-core CI machine left the broker unanswered for
    tens of seconds, and one app that could not start failed every
    comparison. A wave that fails names its error on its own runs
    (`Run.error`), and the other waves still run.
    """
    input_topic = unique_name(f"{prefix}-in")
    create_topic(bootstrap, input_topic, PARTITIONS, KEEP)
    produce_input(bootstrap, input_topic, records)
    if "global_join" in names:  # its table, whole before any app starts
        create_topic(bootstrap, input_topic + topologies.GLOBAL_SUFFIX, PARTITIONS, KEEP)
        table = topologies.global_table_records(records)
        produce_input(bootstrap, input_topic + topologies.GLOBAL_SUFFIX, table)
    runs: dict[str, Run] = {}
    for name in names:
        base = unique_name(f"{prefix}-{name.replace('_', '-')}")
        run = Run(name, f"{base}-ks", f"{base}-py", f"{base}-ks-out", f"{base}-py-out")
        create_topic(bootstrap, run.ks_out, PARTITIONS, KEEP)
        create_topic(bootstrap, run.py_out, PARTITIONS, KEEP)
        runs[name] = run
    waves = [names[i : i + WAVE] for i in range(0, len(names), WAVE)]
    for number, wave in enumerate(waves):
        wave_runs = [runs[name] for name in wave]
        try:
            _run_wave(bootstrap, input_topic, wave_runs, work / f"wave-{number}")
        except Exception as exc:  # noqa: BLE001 - said on each of the wave's runs
            for run in wave_runs:
                run.error = f"{type(exc).__name__}: {exc}"
    return runs


def _run_wave(bootstrap: str, input_topic: str, runs: list[Run], work: Path) -> None:
    """Both sides of `runs` at once, until each app has committed all it reads; then read back."""
    work.mkdir(parents=True, exist_ok=True)
    ks = KafkaStreamsSide(
        bootstrap,
        work / "ks-state",
        [f"{r.name}:{r.ks_app}:{input_topic}:{r.ks_out}" for r in runs],
        work / "kafka-streams.log",
    )
    apps: list[App] = []

    def start(run: Run) -> App:
        config = app_config(
            bootstrap,
            run.py_app,
            work / "py-state" / run.name,
            threads=1,
            commit_ms=100,
            **{"cache.max.bytes": 0},
        )
        app = App(topologies.build(run.name, input_topic, run.py_out), config)

        def on_change(new: AppState, old: AppState) -> None:
            if old is AppState.RUNNING and new is AppState.REBALANCING:
                run.py_rebalances += 1

        app.set_state_listener(on_change)
        app.start()
        return app

    # Apps start, close and are read back a few at a time: each waits mostly
    # on the broker (start-up checks, the final commit).
    pool = ThreadPoolExecutor(PARALLEL)
    probe: CommitProbe | None = None
    try:
        futures = [pool.submit(start, run) for run in runs]
        for future in futures:
            exc = future.exception()
            if exc is None:
                apps.append(future.result())
        failed = next((f.exception() for f in futures if f.exception() is not None), None)
        if failed is not None:
            raise failed
        ks.wait_ready()
        probe = CommitProbe(
            bootstrap, input_topic, [app_id for r in runs for app_id in (r.ks_app, r.py_app)]
        )
        behind: list[str] = []

        def all_caught_up() -> bool:
            assert probe is not None
            behind[:] = probe.behind()
            return not behind

        try:
            wait_until(all_caught_up, timeout=180, interval=0.5)
        except AssertionError:
            raise AssertionError("not every application caught up:\n" + "\n".join(behind)) from None
    finally:
        if probe is not None:
            probe.close()
        list(pool.map(lambda app: app.close(30), apps))
        ks.stop()

    def read(run: Run) -> None:
        run.ks_records = consume_all(bootstrap, run.ks_out, timeout=30)
        run.py_records = consume_all(bootstrap, run.py_out, timeout=30)

    try:
        list(pool.map(read, runs))
    finally:
        pool.shutdown()


Item = tuple[bytes | None, int, tuple[tuple[str, bytes | None], ...]]  # value, timestamp, headers


def by_key(records: list[Msg]) -> dict[bytes | None, list[Item]]:
    """(value, timestamp, headers) per key, in output order (offset order of
    the key's partition)."""
    out: dict[bytes | None, list[Item]] = defaultdict(list)
    for m in sorted(records, key=lambda m: (m.partition, m.offset)):
        out[m.key].append((m.value, m.timestamp, tuple(m.headers or ())))
    return dict(out)


def _order(item: Item) -> tuple[bytes, int, str]:
    return (item[0] or b"", item[1], repr(item[2]))


def _final_row(records: list[tuple[Any, int, Any]]) -> list[tuple[Any, int, Any]]:
    """A key's last record, or nothing when that is a tombstone (no row)."""
    return [] if not records or records[-1][0] is None else records[-1:]


def compare(
    run: Run, *, timestamps: bool = True, final_only: bool = False, headers: bool = False
) -> list[str]:
    """The differences between the two sides' outputs, one line each (empty: equal).

    `timestamps=False` compares values only: for aggregations, whose results
    Kafka Streams stamps with the largest timestamp the aggregate has seen and
    this runtime with the timestamp of the record that updated it (a known
    difference, docs/differential.md). `final_only` compares each key's last
    value only (the final table, a final tombstone counting as no row): for
    aggregations behind a repartition topic
    written by several upstream tasks, whose intermediate updates depend on
    how the tasks' records interleave there, in either implementation.
    `headers=True` compares each record's headers too (in order).
    """
    ks, py = by_key(run.ks_records), by_key(run.py_records)
    problems: list[str] = []
    for key in sorted(set(ks) | set(py), key=lambda k: (k is not None, k or b"")):
        want, got = ks.get(key, []), py.get(key, [])
        keep_time = timestamps and not final_only
        want = [(v, t if keep_time else 0, h if headers else ()) for v, t, h in want]
        got = [(v, t if keep_time else 0, h if headers else ()) for v, t, h in got]
        if final_only:
            # The final table: a row deleted last and a row never written are
            # the same state (whether a join emits a tombstone for a row it
            # never wrote depends on how the foreign-key answers interleave).
            want, got = _final_row(want), _final_row(got)
        if key is None:
            # Records without a key have no partition (Kafka Streams' producer
            # spreads them), so no order either: compared as a multiset.
            want, got = sorted(want, key=_order), sorted(got, key=_order)
        if want != got:
            first = next(
                (i for i, (a, b) in enumerate(zip(want, got, strict=False)) if a != b),
                min(len(want), len(got)),
            )
            problems.append(
                f"key {key!r}: Kafka Streams wrote {len(want)} records, the runtime "
                f"{len(got)}; first difference at #{first}: "
                f"{want[first : first + 3]} vs {got[first : first + 3]}"
            )
    ks_parts = {m.key: m.partition for m in run.ks_records}
    py_parts = {m.key: m.partition for m in run.py_records}
    for key in (ks_parts.keys() & py_parts.keys()) - {None}:
        if ks_parts[key] != py_parts[key]:
            problems.append(
                f"key {key!r}: partition {ks_parts[key]} in Kafka Streams, {py_parts[key]} here"
            )
    return problems
