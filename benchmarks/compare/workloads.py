"""The five comparison workloads: data, topology, how completeness is checked.

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

``output`` says how the reader decides the output is complete: ``count`` (one
output record per input record) or ``sum`` (the sum of the latest count per
key equals the input records: count output is folded per key per commit by
the store cache).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.partitioning.default import default_partition

Record = tuple[bytes, bytes, int]  # key, value, partition

STATEFUL_KEYS = 10_000
STORE = "counts"


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
