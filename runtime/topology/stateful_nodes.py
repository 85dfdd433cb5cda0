"""Runtime nodes of the stateful DSL: aggregations, tables and stream-table joins.

Store-writing nodes (`TableSourceNode`, `AggregateNode`, `WindowAggregateNode`)
never forward from `process`. They write their store, and the store's flush
listener (registered in `init` with `TaskContext.register_flush_listener`)
forwards one `Record(key, new value, timestamp)` per update the store's cache
emits: with caching on, one per key per commit (or at eviction); with caching
off, one per write, at once. A deleted key arrives as value None (a tombstone).

Threads: `init`, `process` and `close` run on the processing thread holding the
task, like every node. The flush listener runs there too when the cache evicts
or caching is off, and on the polling thread at commit, while every task is
locked; either way no other thread touches the task's graph meanwhile.

Keys and values are serialized with the serdes the DSL gave the node, or the
task's configured defaults (resolved once in `init`).

Headers: a forwarded update carries the headers of the record whose write
made it (Kafka Streams' record context), known when that record was the last
write of this node (`LastWrite`): always with caching off; with caching on,
a key flushed at commit or evicted gets them only if the last record this
node wrote was that key's, else None.

Aggregations read and write their store's values as objects when the store
can (`use_values`: a caching layer below, see `runtime.state.cache`), so a
key updated many times between commits is deserialized and serialized once
per commit, not per record; otherwise through bytes. `count` and `reduce`
take a direct path (no fold call, no MISSING); `aggregate` folds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from runtime.state.cache import UNSET
from runtime.topology.context import TaskContext
from runtime.topology.nodes import Node, StoreNode, _not_initialized, resolve_serde
from runtime.topology.record import Record
from runtime.topology.windows import TimeWindows, Windowed

# fold(key, value, aggregate or MISSING) -> new aggregate (None deletes the key)
Fold = Callable[[Any, Any, Any], Any]
# A KTable step over (key, value) -> new value or None (filtered out / deleted).
TableStep = Callable[[Any, Any], Any]


class _Missing:
    """The aggregate of a key that has none yet (None is a legal aggregate value)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()


def count_fold(key: Any, value: Any, agg: Any) -> int:
    return 1 if agg is MISSING else agg + 1


class ReduceFold:
    """The first value is the aggregate; later ones are `reducer(agg, value)`."""

    __slots__ = ("reducer",)

    def __init__(self, reducer: Callable[[Any, Any], Any]) -> None:
        self.reducer = reducer

    def __call__(self, key: Any, value: Any, agg: Any) -> Any:
        return value if agg is MISSING else self.reducer(agg, value)


def reduce_fold(reducer: Callable[[Any, Any], Any]) -> Fold:
    """The first value is the aggregate; later ones are `reducer(agg, value)`."""
    return ReduceFold(reducer)


def aggregate_fold(
    initializer: Callable[[], Any], aggregator: Callable[[Any, Any, Any], Any]
) -> Fold:
    """`aggregator(key, value, agg)`, starting from `initializer()`."""

    def fold(key: Any, value: Any, agg: Any) -> Any:
        return aggregator(key, value, initializer() if agg is MISSING else agg)

    return fold


# How an aggregation node applies a record (chosen from its fold at init).
_FOLD, _COUNT, _REDUCE = 0, 1, 2


def _fold_kind(fold: Fold) -> tuple[int, Callable[[Any, Any], Any] | None]:
    if fold is count_fold:
        return _COUNT, None
    if type(fold) is ReduceFold:
        return _REDUCE, fold.reducer
    return _FOLD, None


class KeySelectNode(Node):
    """`select_key`'s and `group_by`'s key selector: `fn(key, value) -> new key`,
    value unchanged."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        self._emit(record.with_key(self.fn(record.key, record.value)))


class NullKeyFilterNode(Node):
    """Before a repartition sink: drops records without a key (counted `null_key`)."""

    __slots__ = ("_dropped",)

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        if record.key is None:
            self._dropped("null_key")
            return
        self._emit(record)


class LastWrite:
    """The last write of a store-writing node: `(key bytes, headers)` or None.

    Set before each write of a record with headers (one tuple, so a reader
    on another key-parallel thread never sees one record's key with another's
    headers); a flushed update whose key matches it carries those headers.
    Shared by the nodes that write one store (a cogroup's).
    """

    __slots__ = ("current",)

    def __init__(self) -> None:
        self.current: tuple[bytes | None, Any] | None = None

    def headers_of(self, key: bytes) -> Any:
        current = self.current
        return current[1] if current is not None and current[0] == key else None


class _StoreWriterNode(StoreNode):
    """A node that owns one store of the task and forwards the store's updates."""

    __slots__ = (
        "_get_value",
        "_put_value",
        "_last_write",
    )

    def __init__(self, name: str, store: str, key_serde: Any, value_serde: Any) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self._last_write = LastWrite()
        # The store's get_value/put_value, when it holds values as objects.
        self._get_value: Callable[..., Any] | None = None
        self._put_value: Callable[..., None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        ctx.register_flush_listener(self.store_name, self.on_flush)

    def _bind_values(self, ctx: TaskContext) -> None:
        """Read and write the store's values as objects if it can (aggregations)."""
        use_values = getattr(self._store, "use_values", None)
        value = resolve_serde(self.value_serde, ctx.default_value_serde, self.name, "value")
        if use_values is not None and use_values(value):
            self._get_value = self._store.get_value
            self._put_value = self._store.put_value

    def _emitted_value(self, new: bytes | None) -> Any:
        """The value of the update being emitted: the cache's object when it
        has one (no deserialization), else `new` deserialized."""
        if new is None:
            return None
        if self._get_value is not None:
            obj = self._store.emitting
            if obj is not UNSET:
                return obj
        return self._value_de(new)

    def on_flush(self, key: bytes, new: bytes | None, old: bytes | None, timestamp: int) -> None:
        """The store emitted `key`'s update: forward it (see the module docstring)."""
        headers = self._last_write.headers_of(key)
        self._emit(Record(self._key_de(key), self._emitted_value(new), timestamp, headers))

    def _writing(self, key_bytes: bytes | None, headers: Any) -> None:
        """Note the record about to be written (its headers go with the update)."""
        last = self._last_write
        if headers is not None or last.current is not None:
            last.current = None if headers is None else (key_bytes, headers)

    def close(self) -> None:
        self._store = None
        self._get_value = None


class TableSourceNode(_StoreWriterNode):
    """`StreamsBuilder.table`: upserts each record into the store (None deletes)."""

    __slots__ = ()

    def process(self, record: Record) -> None:
        key = record.key
        if key is None:
            self._dropped("null_key")
            return
        value = record.value
        key_bytes = self._key_ser(key)
        self._writing(key_bytes, record.headers)
        if value is None:
            self._store.delete(key_bytes)
        else:
            self._store.put(key_bytes, self._value_ser(value))


class AggregateNode(_StoreWriterNode):
    """`count`/`reduce`/`aggregate` of a grouped stream into a key-value store.

    Records with a null key (`null_key`) or a null value (`null_value`) are
    dropped and counted, as in Kafka Streams. An aggregate of None deletes
    the key.
    """

    __slots__ = ("fold", "_kind", "_reducer")

    def __init__(self, name: str, store: str, key_serde: Any, value_serde: Any, fold: Fold) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.fold = fold
        self._kind, self._reducer = _fold_kind(fold)

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._bind_values(ctx)

    def process(self, record: Record) -> None:
        key = record.key
        if key is None:
            self._dropped("null_key")
            return
        value = record.value
        if value is None:
            self._dropped("null_value")
            return
        key_bytes = self._key_ser(key)
        headers = record.headers  # _writing, inlined: this is the hottest stateful path
        last = self._last_write
        if headers is not None or last.current is not None:
            last.current = None if headers is None else (key_bytes, headers)
        get_value = self._get_value
        if get_value is not None:
            old = get_value(key_bytes)
            kind = self._kind
            if kind == _COUNT:
                agg = 1 if old is None else old + 1
            elif kind == _REDUCE:
                agg = value if old is None else self._reducer(old, value)  # type: ignore[misc]
            else:
                agg = self.fold(key, value, MISSING if old is None else old)
            self._put_value(key_bytes, agg)  # None deletes
            return
        store = self._store
        data = store.get(key_bytes)
        agg = self.fold(key, value, MISSING if data is None else self._value_de(data))
        if agg is None:
            store.delete(key_bytes)
        else:
            store.put(key_bytes, self._value_ser(agg))


class WindowAggregateNode(_StoreWriterNode):
    """Windowed `count`/`reduce`/`aggregate` into a window store, on event time.

    Each record updates every window containing its timestamp. Stream time is
    the task's (`TaskContext.stream_time`, at least this record's timestamp);
    a window is closed once `end <= stream time - grace`, and a record for a
    closed window is not applied there (counted `late`, once per window, as
    Kafka Streams' dropped-records sensor). Windows older than the retention
    (size + grace) are expired from the store as stream time advances.
    Forwarded keys are `Windowed(key, start, end)`.

    Stream time here is the node's own, as Kafka Streams' window aggregation
    keeps it: the largest timestamp of the records it applied. Records it
    drops (null key or value) do not advance it, though they advance the
    task's; with the task's, a dropped record with a future timestamp closed
    windows that Kafka Streams keeps open (found by the differential tests).
    It starts at -1 in every new instance (after a restart too, as in Kafka
    Streams).

    Null values: a windowed `count` counts them (Kafka Streams' windowed
    aggregation drops only null keys, and its count ignores the value);
    windowed `reduce`/`aggregate` drop them (`null_value`), where Kafka
    Streams would call the reducer or aggregator with null: a deliberate
    difference (docs/differential.md), so that user functions never see None
    as a value, as in the non-windowed aggregations of both.
    """

    __slots__ = ("fold", "windows", "_size", "_grace", "_retention", "_observed", "_count")

    def __init__(
        self,
        name: str,
        store: str,
        key_serde: Any,
        value_serde: Any,
        fold: Fold,
        windows: TimeWindows,
    ) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.fold = fold
        self.windows = windows
        self._size = windows.size_ms
        self._grace = windows.grace_ms
        self._retention = windows.retention_ms
        self._observed = -1
        self._count = fold is count_fold

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._bind_values(ctx)
        self._observed = -1

    def process(self, record: Record) -> None:
        key = record.key
        if key is None:
            self._dropped("null_key")
            return
        value = record.value
        if value is None and not self._count:
            self._dropped("null_value")
            return
        timestamp = record.timestamp
        if timestamp < 0:
            self._dropped("negative_timestamp")
            return
        stream_time = self._observed
        if timestamp > stream_time:
            stream_time = self._observed = timestamp
        close_time = stream_time - self._grace
        size = self._size
        store = self._store
        key_bytes = self._key_ser(key)
        self._writing(key_bytes, record.headers)
        fold = self.fold
        get_value = self._get_value
        for start in self.windows.window_starts(timestamp):
            if start + size <= close_time:
                self._dropped("late")
                continue
            if get_value is not None:
                old = get_value(key_bytes, start)
                self._put_value(key_bytes, start, fold(key, value, MISSING if old is None else old))
                continue
            data = store.get(key_bytes, start)
            agg = fold(key, value, MISSING if data is None else self._value_de(data))
            store.put(key_bytes, start, None if agg is None else self._value_ser(agg))
        store.expire(stream_time - self._retention)

    def on_flush(self, key: bytes, new: bytes | None, old: bytes | None, timestamp: int) -> None:
        # Store keys are composite: key bytes + window start (8 bytes big-endian).
        start = int.from_bytes(key[-8:], "big")
        value = self._emitted_value(new)
        key_bytes = key[:-8]
        windowed = Windowed(self._key_de(key_bytes), start, start + self._size)
        self._emit(Record(windowed, value, timestamp, self._last_write.headers_of(key_bytes)))


class TableFilterNode(Node):
    """`KTable.filter`/`filter_not`: a filtered-out update becomes a tombstone.

    Without old values the node cannot know whether downstream saw the key
    before, so (as Kafka Streams then) it forwards `(key, None)` for every
    update the predicate rejects; tombstones pass through untested.
    """

    __slots__ = ("predicate", "keep")

    def __init__(self, name: str, predicate: Callable[[Any, Any], Any], keep: bool) -> None:
        super().__init__(name)
        self.predicate = predicate
        self.keep = keep

    def process(self, record: Record) -> None:
        value = record.value
        if value is None or bool(self.predicate(record.key, value)) == self.keep:
            self._emit(record)
        else:
            self._emit(record.with_value(None))


class TableMapValuesNode(Node):
    """`KTable.map_values`: `fn(value)` for updates, tombstones pass as None."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        value = record.value
        self._emit(record if value is None else record.with_value(self.fn(value)))


@dataclass(frozen=True)
class TableValueGetter:
    """How to read a KTable's current value for a key (stream-table joins).

    The table's nearest materialized ancestor store, its serdes, and the
    `filter`/`map_values` steps between that store and the table, applied on
    read (so filtered or mapped tables need no store of their own).
    """

    store: str
    key_serde: Any
    value_serde: Any
    steps: tuple[TableStep, ...] = ()

    def then(self, step: TableStep) -> TableValueGetter:
        return TableValueGetter(self.store, self.key_serde, self.value_serde, (*self.steps, step))

    def bind(self, ctx: TaskContext, node: str) -> Callable[[Any], Any]:
        """`get(key) -> value or None` over this task's store (call in `init`)."""
        store = ctx.state_store(self.store)
        key_ser = resolve_serde(self.key_serde, ctx.default_key_serde, node, "key").serialize
        value_de = resolve_serde(
            self.value_serde, ctx.default_value_serde, node, "value"
        ).deserialize
        steps = self.steps
        get_bytes = store.get

        def get(key: Any) -> Any:
            data = get_bytes(key_ser(key))
            if data is None:
                return None
            value = value_de(data)
            for step in steps:
                if value is None:
                    return None
                value = step(key, value)
            return value

        return get


def filter_step(predicate: Callable[[Any, Any], Any], keep: bool) -> TableStep:
    def step(key: Any, value: Any) -> Any:
        return value if bool(predicate(key, value)) == keep else None

    return step


def map_values_step(fn: Callable[[Any], Any]) -> TableStep:
    def step(key: Any, value: Any) -> Any:
        return fn(value)

    return step


class StreamTableJoinNode(Node):
    """`KStream.join`/`left_join` with a KTable: look the record's key up in the table.

    Inner join: records whose key is absent from the table produce nothing.
    Left join: they produce `joiner(value, None)`, and so do records with a
    null key (Kafka Streams 3.7+). Records with a null value are dropped
    (`null_value`), and inner-join records with a null key (`null_key`).
    """

    __slots__ = ("getter", "joiner", "left", "_get", "_dropped")

    def __init__(
        self,
        name: str,
        getter: TableValueGetter,
        joiner: Callable[[Any, Any], Any],
        left: bool,
    ) -> None:
        super().__init__(name)
        self.getter = getter
        self.joiner = joiner
        self.left = left
        self._get: Callable[[Any], Any] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._get = self.getter.bind(ctx, self.name)
        self._dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        value = record.value
        if value is None:
            self._dropped("null_value")
            return
        key = record.key
        if key is None:
            if not self.left:
                self._dropped("null_key")
                return
            table_value = None
        else:
            table_value = self._get(key)
            if table_value is None and not self.left:
                return
        self._emit(record.with_value(self.joiner(value, table_value)))
