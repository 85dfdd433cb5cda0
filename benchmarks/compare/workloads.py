"""The comparison workloads: data, topology, how completeness is checked.

Every workload is the same for both models: the same input bytes on the same
partitions (generated once per session, loaded into a fresh input topic before
every run), the same topology (built in the child from the functions here),
the same configuration.

- ``stateless``: the stateless benchmark's JSON map (``benchmarks.workloads.
  stateless``: its records and its topology, reused as they are).
- ``stateful``: ``group_by_key().count()`` over 10,000 keys in a RocksDB store
  with its changelog, output the running counts (INT64).
- ``io``: a map whose function calls the local echo server (about 1 ms per
  record, waiting with the GIL released); keys spread evenly.
- ``skew``: the ``io`` topology with 80% of the records on partition 0 of 8.
- ``io1``: the ``io`` topology with every record on partition 0 (one busy
  task: the key-parallel scaling workload).
- ``restore``: the ``stateful`` topology; the changelog partition of task 0_0
  holds ``--restore-records`` records (1,000,000 by default) when the run
  starts, so that task restores while records arrive for the other seven.
- ``join``: a windowed stream-stream inner join of two co-partitioned input
  topics (the input topic and ``other_input_topic`` of it), 10,000 keys,
  ``JoinWindows`` of 1 s time difference and 10 s grace; each left record has
  exactly one right partner 100 ms away (``join_expected``). Output: the
  joined value per pair. The backlog counts the records of both topics.
- ``session``: a session-windowed count (1 s inactivity gap, 2 s grace) over
  10,000 keys, each key seen every ~1 s +- 100 ms, so about a third of a key's
  records extend its session and the rest start a new one. Output: the
  running count per session (session-windowed key, INT64; a replaced session
  gets a tombstone).

Records are ``(key, value, partition)``; those of ``join`` and ``session``
also carry ``(timestamp_ms, input)``: the record's event time, and which input
topic it goes to (0: the input topic, 1: ``other_input_topic``). Their event
times start at the wall clock when the data is generated (a broker rejects or
expires far-off timestamps) and advance with the record index, not with the
load, so every run of a session sees the same times.

``output`` says how the reader decides the output is complete: ``count`` (one
output record per input record, or ``expected(backlog)`` of them: the join) or
``sum`` (the sum of the latest count per key equals the input records: count
output is folded per key per commit by the store cache; for ``session`` the
key is the session, and a merged-away session's tombstone counts 0).
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.partitioning.default import default_partition

# key, value, partition; the timed workloads (join, session) add timestamp_ms and
# input (0: the input topic, 1: the other input topic): see the module docstring.
Record = tuple[Any, ...]

STATEFUL_KEYS = 10_000
STORE = "counts"
SESSION_STORE = "sessions"
JOIN_STORE = "joined"
# The join: records at most JOIN_DIFFERENCE_MS apart join; late ones count for
# JOIN_GRACE_MS (generous: the cross-topic order of a backlog is only as good as
# the fetches, see docs/benchmarks.md). Every left record's partner is
# JOIN_OFFSET_MS away; a key recurs every STATEFUL_KEYS / JOIN_PER_MS ms (2.5 s,
# beyond the window), so it finds exactly one.
JOIN_DIFFERENCE_MS = 1000
JOIN_GRACE_MS = 10_000
JOIN_OFFSET_MS = 100
JOIN_PER_MS = 4
# The session count: 1 s inactivity gap, 2 s grace; a key recurs every
# STATEFUL_KEYS / SESSION_PER_MS ms (1 s) with SESSION_JITTER_MS of jitter.
SESSION_GAP_MS = 1000
SESSION_GRACE_MS = 2000
SESSION_PER_MS = 10
SESSION_JITTER_MS = 100


@dataclass(frozen=True)
class Workload:
    name: str
    title: str
    description: str
    output: str  # "count" | "sum"
    records: int  # default backlog records
    feed_rate: float  # records/s of the latency phase (restore: during the restore)
    feed_seconds: float
    make: Callable[[int, int], Record]  # (i, partitions) -> record
    topology: str  # name of a builder below
    echo: bool = False
    restore: bool = False
    # Two input topics (the input topic and other_input_topic of it).
    two_inputs: bool = False
    # The timed workloads have no latency phase: their fed records would need a
    # partner (join) and event times of their own; throughput only.
    latency: bool = True
    # Output records that make the output complete (count mode), from the
    # backlog; None: one per backlog record.
    expected: Callable[[list[Record]], int] | None = None
    # Output value -> group, for workloads whose groups finish at different
    # times (skew: 0 = the hot partition's records, 1 = the cold partitions').
    group_of: Callable[[bytes | None], int] | None = None


# -- data ---------------------------------------------------------------------------


def _stateless_record(i: int, partitions: int) -> Record:
    from benchmarks.workloads.stateless import make_record

    key, value = make_record(i)
    return key, value, default_partition(key, partitions)


def _stateful_key(i: int) -> bytes:
    return f"key-{(i * 7919) % STATEFUL_KEYS:05d}".encode()


def _stateful_record(i: int, partitions: int) -> Record:
    key = _stateful_key(i)
    return key, b"x", default_partition(key, partitions)


def _io_value(i: int) -> bytes:
    return f"reading-{i:08d}-{'v' * (8 + i % 8)}".encode()


def _io_record(i: int, partitions: int) -> Record:
    key = f"dev-{i % 1000:04d}".encode()
    return key, _io_value(i), default_partition(key, partitions)


def _io1_record(i: int, partitions: int) -> Record:
    """The io workload's record, always on partition 0 (one hot task)."""
    key, value, _partition = _io_record(i, partitions)
    return key, value, 0


def _skew_is_hot(i: int) -> bool:
    """Four records in five go to the hot partition."""
    return i % 5 != 4


def _skew_record(i: int, partitions: int) -> Record:
    """80% on partition 0, the rest round-robin over the others."""
    key = f"dev-{i % 1000:04d}".encode()
    partition = 0 if _skew_is_hot(i) or partitions == 1 else 1 + i // 5 % (partitions - 1)
    return key, _io_value(i), partition


def _skew_group(value: bytes | None) -> int:
    """0 for a record _skew_record put on the hot partition, 1 for a cold one.

    The echo topology keeps the value, which carries the record's index.
    """
    i = int(value[8:16]) if value else 0
    return 0 if _skew_is_hot(i) else 1


def _restore_feed_record(i: int, partitions: int) -> Record:
    """Stateful records for every partition but 0 (the restoring task's)."""
    j = i
    while True:
        key = _stateful_key(j)
        partition = default_partition(key, partitions)
        if partition != 0 or partitions == 1:
            return key, b"x", partition
        j += STATEFUL_KEYS + 1


# Event times of the timed workloads start here: the wall clock at import (the
# harness generates the data once per workload session, so every run sees the same
# times), rounded to the second.
_EVENT_TIME_BASE_MS = int(time.time()) * 1000


def other_input_topic(input_topic: str) -> str:
    """The second input topic of a two-input workload (the join's right side).

    Derived from the input topic so that every model's child (the runtime's,
    Kafka Streams' ``Topologies.java``, quixstreams') finds it without another
    spec field; the name keeps the run's application id, so the harness
    deletes it with the run's other topics.
    """
    return f"{input_topic}-other"


def _join_record(i: int, partitions: int) -> Record:
    """Even i: left record n = i // 2; odd i: its right partner (backlog interleaved).

    Left n: key ``key-NNNNN`` (10,000 keys), event time base + n / 4 ms; its
    right partner: the same key, JOIN_OFFSET_MS later (earlier for odd n).
    """
    n, side = divmod(i, 2)
    key = _stateful_key(n)
    ts = _EVENT_TIME_BASE_MS + n // JOIN_PER_MS
    if side:
        ts += JOIN_OFFSET_MS if n % 2 == 0 else -JOIN_OFFSET_MS
        value = f"right-{n:08d}".encode()
    else:
        value = f"left-{n:08d}-{'v' * (8 + n % 8)}".encode()
    return key, value, default_partition(key, partitions), ts, side


def join_expected(backlog: list[Record]) -> int:
    """Inner-join results of the backlog: (left, right) pairs of one key at most
    JOIN_DIFFERENCE_MS apart (both bounds inclusive, as Kafka Streams)."""
    rights: dict[bytes, list[int]] = {}
    for key, _value, _partition, ts, side in backlog:
        if side:
            rights.setdefault(key, []).append(ts)
    for times in rights.values():
        times.sort()
    pairs = 0
    for key, _value, _partition, ts, side in backlog:
        if not side:
            times = rights.get(key, [])
            lo = bisect.bisect_left(times, ts - JOIN_DIFFERENCE_MS)
            hi = bisect.bisect_right(times, ts + JOIN_DIFFERENCE_MS)
            pairs += hi - lo
    return pairs


def _session_record(i: int, partitions: int) -> Record:
    """Key ``key-NNNNN`` (10,000 keys, each every 10,000 records), event time
    base + i / 10 ms +- up to SESSION_JITTER_MS: consecutive records of a key are
    800-1,200 ms apart, so about a third of them fall within the 1 s gap."""
    key = _stateful_key(i)
    # Knuth's multiplicative hash: a jitter uncorrelated between a key's records.
    jitter = (i * 2654435761) % 4294967296 % (2 * SESSION_JITTER_MS + 1) - SESSION_JITTER_MS
    ts = _EVENT_TIME_BASE_MS + SESSION_JITTER_MS + i // SESSION_PER_MS + jitter
    return key, b"x", default_partition(key, partitions), ts, 0


def restore_changelog_record(i: int) -> tuple[bytes, bytes]:
    """The i-th record of task 0_0's changelog: a distinct key and an INT64 count."""
    return f"restored-{i:08d}".encode(), (i % 7 + 1).to_bytes(8, "big", signed=True)


# -- topologies (built in the child) ------------------------------------------------


def build_topology(kind: str, input_topic: str, output_topic: str) -> Any:
    from runtime import StreamsBuilder, serdes

    if kind == "stateless":
        from benchmarks.workloads.stateless import build_topology as stateless_topology

        return stateless_topology(input_topic, output_topic)
    builder = StreamsBuilder()
    if kind == "count":
        (
            builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
            .group_by_key()
            .count(store=STORE)
            .to_stream()
            .to(output_topic, value_serde=serdes.INT64)
        )
    elif kind == "join":
        from runtime.topology.windows import JoinWindows

        left = builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
        right = builder.stream(
            other_input_topic(input_topic), key_serde=serdes.STRING, value_serde=serdes.STRING
        )
        (
            left.join(
                right,
                join_values,
                windows=JoinWindows.of_time_difference_and_grace(JOIN_DIFFERENCE_MS, JOIN_GRACE_MS),
                store=JOIN_STORE,
            ).to(output_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
        )
    elif kind == "session":
        from runtime.topology.session_windows import SessionWindows

        (
            builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
            .group_by_key()
            .windowed_by(
                SessionWindows.of_inactivity_gap_with_grace(SESSION_GAP_MS, SESSION_GRACE_MS)
            )
            .count(store=SESSION_STORE)
            .to_stream()
            .to(output_topic, value_serde=serdes.INT64)
        )
    elif kind == "echo":
        from benchmarks.compare.echo import echo_call

        (
            builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
            .map_values(echo_call)
            .to(output_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
        )
    else:
        raise ValueError(f"unknown topology {kind!r}")
    return builder.build()


def join_values(left: str, right: str) -> str:
    """The join's joiner (the same in every model): both values, ``|`` between."""
    return f"{left}|{right}"


WORKLOADS: dict[str, Workload] = {
    w.name: w
    for w in (
        Workload(
            "stateless",
            "stateless JSON map",
            "json.loads -> add a field -> json.dumps (the stateless benchmark's topology and "
            "data), ~106-byte values, string keys",
            "count",
            200_000,
            4000.0,
            2.0,
            _stateless_record,
            "stateless",
        ),
        Workload(
            "stateful",
            "stateful count, 10,000 keys",
            "group_by_key().count() into RocksDB with changelog (cache on, defaults), "
            "10,000 string keys, output the counts (INT64)",
            "sum",
            500_000,
            4000.0,
            2.0,
            _stateful_record,
            "count",
        ),
        Workload(
            "io",
            "I/O-bound (~1 ms per record)",
            "map_values calls a local TCP echo server that answers after 1 ms "
            "(the wait releases the GIL); keys spread evenly over 8 partitions",
            "count",
            6_000,
            400.0,
            2.0,
            _io_record,
            "echo",
            echo=True,
        ),
        Workload(
            "io1",
            "I/O-bound on one partition (~1 ms per record)",
            "the I/O-bound topology with every record on partition 0: one task, so "
            "threads beyond one help only in key-parallel mode (1,000 keys)",
            "count",
            3_000,
            400.0,
            2.0,
            _io1_record,
            "echo",
            echo=True,
        ),
        Workload(
            "skew",
            "skewed: 80% on 1 of 8 partitions, ~1 ms per record",
            "the I/O-bound topology with 80% of the records on partition 0, the rest "
            "round-robin over partitions 1-7",
            "count",
            4_000,
            400.0,
            2.0,
            _skew_record,
            "echo",
            echo=True,
            group_of=_skew_group,
        ),
        Workload(
            "join",
            "stream-stream join, 10,000 keys",
            "a windowed inner join of two co-partitioned topics (JoinWindows: 1 s time "
            "difference, 10 s grace; both window stores in RocksDB with changelogs), each left "
            "record with one right partner 100 ms away; output the joined value per pair; the "
            "backlog and records/s count the records of both topics",
            "count",
            500_000,
            0.0,
            0.0,
            _join_record,
            "join",
            two_inputs=True,
            latency=False,
            expected=join_expected,
        ),
        Workload(
            "session",
            "session-windowed count, 10,000 keys",
            "group_by_key().windowed_by(session windows: 1 s inactivity gap, 2 s grace)"
            ".count() in RocksDB with changelog (each model's default caching: Kafka Streams' "
            "record cache folds updates per commit, the runtime's session store has no cache), "
            "each key every ~1 s +- "
            "100 ms so about a third of its records extend a session; output the running count "
            "per session (INT64)",
            "sum",
            500_000,
            0.0,
            0.0,
            _session_record,
            "session",
            latency=False,
        ),
        Workload(
            "restore",
            "restoration under load",
            "the stateful count; task 0_0's changelog holds the restore records when the "
            "run starts; records arrive at a fixed rate for partitions 1-7 while it restores",
            "sum",
            0,
            4000.0,
            0.0,
            _restore_feed_record,
            "count",
            restore=True,
        ),
    )
}


def generate(workload: Workload, start: int, count: int, partitions: int) -> list[Record]:
    make = workload.make
    return [make(i, partitions) for i in range(start, start + count)]
