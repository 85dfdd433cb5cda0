"""The state benchmark's data, topology and store layouts (same for every side).

Input: ``records`` records over ``keys`` string keys (``key-NNNNNN``), each on
the partition Kafka's default partitioner gives its key (murmur2, as Kafka
Streams' producers and the runtime's sinks do), value ``x``, with event
timestamps spread evenly over ``span_ms`` so the windowed store holds several
windows per key. The topology, the same on every side:

    stream(input, STRING, STRING)
      -> group_by_key().count(store="counts")
      -> group_by_key().windowed_by(tumbling window_ms).count(store="windowed-counts")

Both aggregations read the source directly (no repartition): one subtopology,
so one task per input partition holding both stores. No sink: the stores'
changelogs are the output (what restoration replays).

Called by the harness's main thread (data) and by the runtime's child
(topology).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

COUNT_STORE = "counts"
WINDOW_STORE = "windowed-counts"
# What the runtime accepts when it has no `state.store.layout` key (issue 34, item 2).
PER_TASK = "per-task"
LAYOUT_KEY = "state.store.layout"


def key_of(i: int, keys: int) -> bytes:
    return f"key-{(i * 7919) % keys:06d}".encode()


def records(
    total: int,
    keys: int,
    partitions: int,
    base_ms: int,
    span_ms: int,
    first: int = 0,
    count: int | None = None,
    feed_rate: float = 0.0,
) -> Iterator[Any]:
    """(key, value, partition, timestamp ms) of input records `first` to
    `first + count` (default: the whole backlog of `total`), in order. The
    backlog's event times spread over `span_ms` from `base_ms` (which ends
    about when it is loaded); records past it (the steady feed) go on from
    there at `feed_rate` records a second, about the wall clock's pace."""
    from runtime.partitioning.default import default_partition

    step = span_ms / max(total, 1)
    feed_step = 1000.0 / feed_rate if feed_rate > 0 else step
    partition_of: dict[bytes, int] = {}
    for i in range(first, first + (total if count is None else count)):
        key = key_of(i, keys)
        partition = partition_of.get(key)
        if partition is None:
            partition = partition_of[key] = default_partition(key, partitions)
        if i < total:
            timestamp = base_ms + int(i * step)
        else:
            timestamp = base_ms + span_ms + int((i - total) * feed_step)
        yield key, b"x", partition, timestamp


def event_end_ms(fed: int, feed_rate: float, base_ms: int, span_ms: int) -> int:
    """The event time just past the last record, the steady feed's included."""
    return base_ms + span_ms + (int(fed * 1000.0 / feed_rate) if fed else 0) + 1


def accepted_layouts() -> tuple[str, ...]:
    """The store layouts this runtime accepts: the choices of `state.store.layout`,
    or only the per-task layout while that key does not exist."""
    from runtime.config import KEYS

    key = KEYS.get(LAYOUT_KEY)
    if key is None or not key.choices:
        return (PER_TASK,)
    return tuple(key.choices)


def layout_config(layout: str) -> dict[str, str]:
    """The runtime config selecting ``layout`` (nothing while the key does not exist)."""
    from runtime.config import KEYS

    if LAYOUT_KEY not in KEYS:
        if layout != PER_TASK:
            raise ValueError(f"this runtime has no {LAYOUT_KEY} key: only {PER_TASK} exists")
        return {}
    return {LAYOUT_KEY: layout}


def build_topology(input_topic: str, window_ms: int) -> Any:
    from runtime import StreamsBuilder, serdes
    from runtime.topology.windows import TimeWindows

    builder = StreamsBuilder()
    stream = builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
    grouped = stream.group_by_key()
    grouped.count(store=COUNT_STORE)
    grouped.windowed_by(TimeWindows.of_size_with_no_grace(window_ms)).count(store=WINDOW_STORE)
    return builder.build()
