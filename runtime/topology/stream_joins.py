"""Runtime nodes of stream-stream joins (`KStream.join/left_join/outer_join` of two streams).

A windowed join keeps each side's recent records in a window store of its
own and looks a record up in the other side's store. The graph, per side
(Kafka Streams' shape):

    side's stream -> JoinWindowNode (remember the record) -> StreamJoinNode
                     (look up the other side) -> merge -> downstream

`JoinWindowNode` forwards the record first, then puts it into this side's
store (so a record never meets itself). `StreamJoinNode` fetches the other
side's records of the same key within `[t - before, t + after]` and emits
`joiner(left, right)` per match, stamped with the larger timestamp.

Left and outer joins hold a record that found no partner in a shared
key-value store ("outer store"), and emit `joiner(left, None)` (or
`joiner(None, right)`) only when its window has closed, that is when stream
time passed `t + after + grace` (right records: `t + before + grace`):
a partner arriving meanwhile removes it. That is Kafka Streams' fix of
spurious left/outer results (3.1+); its store's key is
`timestamp (8 bytes) + side (0 right, 1 left) + key bytes`, so one scan in
time order finds every closed entry. A record that finds no partner after its
window's end has passed (`t + after < stream time`) is emitted at once.

Stream time here is the join's own (`JoinTimeTracker`, shared by both sides
of one task, as Kafka Streams'): the largest timestamp either side has seen;
it is not restored after a restart (neither is Kafka Streams'): the first
record after one scans the outer store.

Store values: window stores keep every record of a key at one timestamp
(Kafka Streams' "retain duplicates"): the value is the list of serialized
values, each prefixed by its 4-byte length. Both kinds of stores are
change-logged and not cached (Kafka Streams' join stores are not either).

Threads: as every node, the processing thread holding the task. The time
tracker is shared across keys, so these nodes opt out of key-parallel
processing (`key_parallel=False`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from runtime.topology.context import TaskContext
from runtime.topology.nodes import Node, _not_initialized, resolve_serde
from runtime.topology.record import Record
from runtime.topology.windows import JoinWindows

_LEFT, _RIGHT = b"\x01", b"\x00"


def encode_values(values: list[bytes]) -> bytes:
    """Several serialized values as one: each prefixed by its length (4 bytes)."""
    return b"".join(len(v).to_bytes(4, "big") + v for v in values)


def decode_values(data: bytes) -> list[bytes]:
    out = []
    i = 0
    while i < len(data):
        n = int.from_bytes(data[i : i + 4], "big")
        out.append(data[i + 4 : i + 4 + n])
        i += 4 + n
    return out


def outer_key(timestamp: int, left: bool, key: bytes) -> bytes:
    """The outer store's key: timestamp, side, key (Kafka Streams' layout)."""
    return timestamp.to_bytes(8, "big") + (_LEFT if left else _RIGHT) + key


def split_outer_key(data: bytes) -> tuple[int, bool, bytes]:
    return int.from_bytes(data[:8], "big"), data[8:9] == _LEFT, data[9:]


class JoinTimeTracker:
    """One task's join stream time, and the earliest timestamp in its outer store.

    `min_time` None: unknown (after a restart, or after a scan found the
    store empty): the next chance scans the store.
    """

    __slots__ = ("stream_time", "min_time")

    def __init__(self) -> None:
        self.stream_time = -1
        self.min_time: int | None = None


class JoinTimeTrackers:
    """The trackers of one join, per task (both sides' nodes hold this object)."""

    def __init__(self) -> None:
        self._by_task: dict[str, JoinTimeTracker] = {}

    def get(self, task_id: str) -> JoinTimeTracker:
        tracker = self._by_task.get(task_id)
        if tracker is None:
            tracker = self._by_task[task_id] = JoinTimeTracker()
        return tracker

    def remove(self, task_id: str) -> None:
        self._by_task.pop(task_id, None)


def _window_observed(store: Any) -> int:
    """The largest record timestamp in a join window store (-1 when empty)."""
    latest = -1
    for _key, start, _value in store.all():
        if start > latest:
            latest = start
    return latest


class JoinWindowNode(Node):
    """Forwards each record, then remembers it in this side's window store.

    Records with a null key or value are not stored (they never join). The
    store keeps records for the join's retention (size + grace) behind the
    largest timestamp it has seen, as Kafka Streams' window store.
    """

    __slots__ = (
        "store_name",
        "key_serde",
        "value_serde",
        "retention",
        "_store",
        "_ser",
        "_observed",
    )

    def __init__(
        self, name: str, store: str, key_serde: Any, value_serde: Any, retention_ms: int
    ) -> None:
        super().__init__(name)
        self.store_name = store
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.retention = retention_ms
        self._store: Any = None
        self._ser: tuple[Callable[[Any], bytes | None], Callable[[Any], bytes | None]] | None = None
        self._observed = -1

    def init(self, ctx: TaskContext) -> None:
        self._store = ctx.state_store(self.store_name)
        key = resolve_serde(self.key_serde, ctx.default_key_serde, self.name, "key")
        value = resolve_serde(self.value_serde, ctx.default_value_serde, self.name, "value")
        self._ser = (key.serialize, value.serialize)
        self._observed = _window_observed(self._store)
        if self._observed >= 0:
            self._store.expire(self._observed - self.retention + 1)

    def process(self, record: Record) -> None:
        self._emit(record)
        key, value = record.key, record.value
        if key is None or value is None:
            return
        timestamp = record.timestamp
        if timestamp > self._observed:
            self._observed = timestamp
        bound = self._observed - self.retention + 1
        if timestamp < bound:
            return  # expired on arrival: Kafka Streams' store drops it too
        assert self._ser is not None
        key_bytes = self._ser[0](key)
        value_bytes = self._ser[1](value)
        assert key_bytes is not None and value_bytes is not None
        store = self._store
        old = store.get(key_bytes, timestamp)
        store.put(key_bytes, timestamp, (old or b"") + encode_values([value_bytes]))
        store.expire(bound)

    def close(self) -> None:
        self._store = None


class StreamJoinNode(Node):
    """One side of a windowed stream-stream join: look up the other side's store.

    `left`: this node processes the left stream. `outer`: a record of this
    side without partner is emitted with None (left join: the left side;
    outer join: both). `outer_store`: the shared store of pending unmatched
    records (left and outer joins), None for an inner join.
    """

    __slots__ = (
        "joiner",
        "windows",
        "left",
        "outer",
        "other_store_name",
        "outer_store_name",
        "trackers",
        "key_serde",
        "this_serde",
        "other_serde",
        "_before",
        "_after",
        "_other",
        "_outer",
        "_tracker",
        "_task",
        "_dropped",
        "_key_ser",
        "_key_de",
        "_this_ser",
        "_this_de",
        "_other_de",
    )

    def __init__(
        self,
        name: str,
        joiner: Callable[[Any, Any], Any],
        windows: JoinWindows,
        left: bool,
        outer: bool,
        other_store: str,
        outer_store: str | None,
        trackers: JoinTimeTrackers,
        serdes: tuple[Any, Any, Any],
    ) -> None:
        super().__init__(name)
        self.joiner = joiner
        self.windows = windows
        self.left = left
        self.outer = outer
        self.other_store_name = other_store
        self.outer_store_name = outer_store
        self.trackers = trackers
        self.key_serde, self.this_serde, self.other_serde = serdes
        # This side's reach: a left record looks `before` back and `after`
        # ahead in the right store; a right record the other way round.
        self._before = windows.before_ms if left else windows.after_ms
        self._after = windows.after_ms if left else windows.before_ms
        self._other: Any = None
        self._outer: Any = None
        self._tracker = JoinTimeTracker()
        self._task = ""
        self._dropped: Callable[[str], None] = _not_initialized
        self._key_ser: Callable[[Any], bytes | None] = _not_initialized
        self._key_de: Callable[[bytes | None], Any] = _not_initialized
        self._this_ser: Callable[[Any], bytes | None] = _not_initialized
        self._this_de: Callable[[bytes | None], Any] = _not_initialized
        self._other_de: Callable[[bytes | None], Any] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._other = ctx.state_store(self.other_store_name)
        if self.outer_store_name is not None:
            self._outer = ctx.state_store(self.outer_store_name)
        self._task = ctx.task_id
        self._tracker = self.trackers.get(ctx.task_id)
        self._dropped = ctx.record_dropped
        key = resolve_serde(self.key_serde, ctx.default_key_serde, self.name, "key")
        this = resolve_serde(self.this_serde, ctx.default_value_serde, self.name, "value")
        other = resolve_serde(self.other_serde, ctx.default_value_serde, self.name, "value")
        self._key_ser, self._key_de = key.serialize, key.deserialize
        self._this_ser, self._this_de = this.serialize, this.deserialize
        self._other_de = other.deserialize

    def _join(self, this: Any, other: Any) -> Any:
        return self.joiner(this, other) if self.left else self.joiner(other, this)

    def process(self, record: Record) -> None:
        tracker = self._tracker
        timestamp = record.timestamp
        if timestamp > tracker.stream_time:
            tracker.stream_time = timestamp
        key, value = record.key, record.value
        if value is not None and key is None and self.outer:
            # Kafka Streams 3.7+ (KIP-962): a left/outer record without a key
            # cannot join and is emitted at once.
            self._emit(record.with_value(self._join(value, None)))
            return
        if key is None or value is None:
            self._dropped("null_key" if key is None else "null_value")
            return
        if self._outer is not None and timestamp == tracker.stream_time:
            self._emit_closed(record)
        key_bytes = self._key_ser(key)
        assert key_bytes is not None
        time_from = max(0, timestamp - self._before)
        time_to = max(0, timestamp + self._after)
        matched = False
        for other_ts, data in self._other.fetch(key_bytes, time_from, time_to):
            matched = True
            if self._outer is not None:
                # The other record found a partner: it is no longer pending.
                self._outer.delete(outer_key(other_ts, not self.left, key_bytes))
            out_ts = timestamp if timestamp > other_ts else other_ts
            for other_bytes in decode_values(data):
                joined = self._join(value, self._other_de(other_bytes))
                self._emit(Record(key, joined, out_ts, record.headers))
        if matched or not self.outer:
            return
        if self._outer is None or time_to < tracker.stream_time:
            self._emit(record.with_value(self._join(value, None)))
            return
        if tracker.min_time is None or timestamp < tracker.min_time:
            tracker.min_time = timestamp
        this_bytes = self._this_ser(value)
        assert this_bytes is not None
        pending = outer_key(timestamp, self.left, key_bytes)
        old = self._outer.get(pending)
        self._outer.put(pending, (old or b"") + encode_values([this_bytes]))

    def _emit_closed(self, record: Record) -> None:
        """Emit the pending unmatched records whose windows have closed, in
        timestamp order, and forget them (Kafka Streams' emitNonJoinedOuterRecords)."""
        tracker = self._tracker
        grace = self.windows.grace_ms
        stream_time = tracker.stream_time
        if tracker.min_time is not None and tracker.min_time + self._after + grace >= stream_time:
            return  # nothing pending can have closed yet
        tracker.min_time = None
        left_open = right_open = False
        emitted: list[bytes] = []
        for composite, data in self._scan_outer():
            timestamp, left, key_bytes = split_outer_key(composite)
            tracker.min_time = timestamp
            if left_open and right_open:
                break
            # A left record's window reaches `after` ahead, a right one's `before`.
            reach = self.windows.after_ms if left else self.windows.before_ms
            if timestamp + reach + grace >= stream_time:
                if left:
                    left_open = True
                else:
                    right_open = True
                continue
            key = self._key_de(key_bytes)
            for item in decode_values(data):
                if left:
                    joined = self.joiner(self._value_of(True, item), None)
                else:
                    joined = self.joiner(None, self._value_of(False, item))
                self._emit(Record(key, joined, timestamp, record.headers))
            emitted.append(composite)
        for composite in emitted:
            self._outer.delete(composite)

    def _scan_outer(self) -> Iterator[tuple[bytes, bytes]]:
        # Store iterators see the writes made before they were created, so
        # deleting the emitted entries afterwards is safe.
        return iter(self._outer.all())

    def _value_of(self, left: bool, data: bytes) -> Any:
        return self._this_de(data) if left == self.left else self._other_de(data)

    def close(self) -> None:
        self.trackers.remove(self._task)
        self._other = None
        self._outer = None
