"""The caching layer and the one process-wide cache budget (`cache.max.bytes`).

Between commits, a store's cache holds the last write per key (dirty entries)
and values read from the inner store (clean entries). Repeated writes to a key
are folded: at `flush` (commit) each dirty key is emitted once, in the order of
its last write: written to the inner store (through the change-logging layer,
so one changelog record per key) and handed to `on_flush` (one downstream
update per key). The emitted entries stay as clean entries (Kafka Streams'
ThreadCache keeps them too): a key updated every commit interval is then read
from RocksDB once, not once per interval (in the count microbenchmark with
10,000 keys the per-interval re-reads were the largest single cost, 18% of
the CPU).

Budget: ONE `CacheBudget` for every store of every task in the process; it is
not divided per processing thread, so adding or removing a thread changes
nothing. A store can only evict its own entries (another store belongs to
another task, possibly on another thread), so when the budget is exceeded the
writing store evicts its own least-recently-used entries, emitting the dirty
ones early, until the budget holds or its cache is empty (then its writes pass
through). What a store keeps across a commit is bounded by its fair share,
`cache.max.bytes` over the caching stores open in the process (`keep_share`):
after the flush it drops its least-recently-used clean entries beyond that.
An idle task therefore pins at most its share, and a busy store always has at
least its share plus whatever idle stores leave free. Tombstones are not kept
(a read of a deleted key goes to RocksDB, which answers from its memtable).
`cache.max.bytes=0` turns caching off: each write is emitted at once.
With `skip_unseen_deletes` (set by the session aggregation, as Kafka
Streams' CachingSessionStore) a cached delete of a key the inner store does
not hold (written and deleted within one commit) is neither written nor
emitted; `drop` deletes a key without emitting it (expiry).

Kept entries stay right because nothing else writes the store of a running
active task: restoration and standby updates touch stores of tasks that are
not processing, and a rewind (an aborted transaction, a task's failure
policy) closes the task, whose cache goes with it, before its stores are
opened again.

Values as objects: the node that owns a store (an aggregation) binds its
value serde once (`use_values`) and then reads and writes values, not bytes
(`get_value`, `put_value`), so a key updated many times between commits is
neither deserialized nor serialized per update. An entry holds its value's
bytes, its object, or both; bytes are made on demand (a byte-level `get`,
`range`/`all`, interactive queries) and at emission (flush or eviction), once
per emitted entry. Only serdes with a `fixed_size` (INT64: every value is 8
bytes) keep an object without its bytes: an entry is charged its serialized
size as of its last serialization (`entry_size`), re-measured whenever it is
serialized again, and for a fixed-size serde that size cannot change between
serializations, so the charge is exact and the bound holds. A small Python int
(28-36 bytes) is covered by the per-entry overhead charged. With any other
serde, `put_value` serializes at once (a value's size may grow, as a list
aggregate's does, and the charge must follow it) and keeps the bytes only;
`get_value` then deserializes per read, as a byte-level caller would.

Threads: a store's layer as the store (see the package docstring); only
`CacheBudget` is shared, and it locks.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

from runtime.state.cache_budget import CacheBudget
from runtime.state.changelog import ChangeLoggingKeyValueStore, wall_clock_ms
from runtime.state.store import KeyValue, KeyValueStore, SortedKeys, merge_overlay

# Accounted per cache entry on top of key and value bytes: the Python objects
# of an entry (dict slot, entry object, bytes headers) cost about this much.
ENTRY_OVERHEAD_BYTES = 64

# on_flush(key, new value or None for a delete, old value or None, timestamp)
FlushListener = Callable[[bytes, bytes | None, bytes | None, int], None]


def entry_size(key: bytes, value: bytes | None) -> int:
    """The bytes a cache entry is charged against the budget."""
    return len(key) + (len(value) if value is not None else 0) + ENTRY_OVERHEAD_BYTES


class _Unset:
    """An entry's bytes not made yet, or its object not read yet."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = _Unset()


class _Entry:
    """One cached key. `value`: the bytes, None for a delete not yet emitted,
    or UNSET (only the object is held); `obj`: the value as an object, None
    for a delete, or UNSET (not deserialized yet). At least one is set."""

    __slots__ = ("value", "obj", "dirty", "timestamp", "size")

    def __init__(self, value: Any, obj: Any, dirty: bool, timestamp: int, size: int) -> None:
        self.value = value
        self.obj = obj
        self.dirty = dirty
        self.timestamp = timestamp
        self.size = size


def _unbound(data: Any) -> Any:
    raise RuntimeError("the store's value serde is not bound: call use_values(serde) first")


class CachingKeyValueStore:
    """Folds writes per key between commits; see the module docstring.

    `inner` is usually a `ChangeLoggingKeyValueStore`; each emitted entry then
    carries the timestamp of its last write to the changelog. `clock` gives
    that timestamp (in the runtime: the record being processed). With
    `send_old_values`, `on_flush` also gets the inner store's previous value
    (one extra inner read per emitted entry).

    Counters (plain ints, written by the thread holding the task, read
    racily): `hits`/`misses` of byte and value reads alike (together: every
    read), `puts`/`deletes` of every write, `evictions`, `emitted`. The
    metered layer above reads its figures from them instead of counting again.
    `emitting` is the object of the entry being handed to `on_flush` (UNSET
    when only its bytes are known), for a listener that would otherwise
    deserialize the bytes it was given.
    """

    def __init__(
        self,
        inner: KeyValueStore,
        budget: CacheBudget,
        on_flush: FlushListener | None = None,
        clock: Callable[[], int] = wall_clock_ms,
        send_old_values: bool = False,
    ) -> None:
        self.inner = inner
        self._logged = inner if isinstance(inner, ChangeLoggingKeyValueStore) else None
        self._budget = budget
        self._on_flush = on_flush
        self._clock = clock
        self._send_old_values = send_old_values and on_flush is not None
        self._pass_through = not budget.enabled
        self._closed = False
        if not self._pass_through:
            budget.open_store()
        # LRU order: oldest first. Dirty keys in the order of their last write.
        self._entries: OrderedDict[bytes, _Entry] = OrderedDict()
        self._dirty: dict[bytes, None] = {}
        self._keys = SortedKeys()
        self._bytes = 0
        self._serde: Any = None
        self._ser: Callable[[Any], Any] = _unbound
        self._de: Callable[[Any], Any] = _unbound
        self._objects = False  # entries may hold an object without its bytes
        self._fixed_size = 0
        self._holds: Callable[[Any], bool] = bool
        self.emitting: Any = UNSET
        # Cached deletes of keys the inner store lacks are dropped (see the
        # module docstring); the key-value aggregations keep Kafka Streams'
        # behaviour of their own store here as it was (every delete goes out).
        self.skip_unseen_deletes = False
        self.hits = 0
        self.misses = 0
        self.puts = 0
        self.deletes = 0
        self.evictions = 0
        self.emitted = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    @property
    def cached_bytes(self) -> int:
        return self._bytes

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    # --- values as objects -----------------------------------------------------

    def use_values(self, serde: Any) -> bool:
        """Bind the serde of this store's values, for `get_value`/`put_value`;
        returns True (the store reads and writes objects).

        Called once by the node that owns the store (at its `init`); binding
        the same serde again is a no-op, another one is refused (the entries'
        objects would be serialized with the wrong serde)."""
        if self._serde is not None:
            if self._serde is not serde:
                raise ValueError(
                    f"store {self.name!r}: value serde already bound to {self._serde!r}"
                )
            return True
        self._serde = serde
        self._ser = serde.serialize
        self._de = serde.deserialize
        fixed = getattr(serde, "fixed_size", None)
        holds = getattr(serde, "holds", None)
        if isinstance(fixed, int) and not isinstance(fixed, bool) and fixed > 0 and holds:
            self._objects = True
            self._fixed_size = fixed
            self._holds = holds
        return True

    def get_value(self, key: bytes) -> Any:
        """The value of `key` as an object, or None.

        With a fixed-size serde an entry is deserialized once and its object
        kept; otherwise each call deserializes the entry's bytes."""
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            obj = entry.obj
            if obj is UNSET:
                value = entry.value
                obj = None if value is None else self._de(value)
                if self._objects:
                    entry.obj = obj
            return obj
        self.misses += 1
        value = self.inner.get(key)
        if value is None:
            return None
        obj = self._de(value)
        if not self._pass_through:
            size = entry_size(key, value)
            self._entries[key] = _Entry(value, obj if self._objects else UNSET, False, 0, size)
            self._keys.add(key)
            self._bytes += size
            if self._budget.charge(size):
                self._evict()
        return obj

    def put_value(self, key: bytes, obj: Any) -> None:
        """Write `key`'s value as an object; None deletes the key.

        A value a fixed-size serde `holds` is kept as the object and
        serialized when the entry is emitted or read as bytes; any other is
        serialized now, so a serde error is raised here, by the write that
        caused it, as with a byte-level `put`."""
        if obj is None:
            self.deletes += 1
            self._write(key, None)
            return
        self.puts += 1
        if self._objects and not self._pass_through and self._holds(obj):
            entry = self._entries.get(key)
            if entry is None or entry.value is None:  # new, or replacing a delete
                self._write(key, UNSET, obj, len(key) + self._fixed_size + ENTRY_OVERHEAD_BYTES)
                return
            # Charged as a fixed-size value already: no trip to the budget.
            self._entries.move_to_end(key)
            entry.value = UNSET
            entry.obj = obj
            entry.timestamp = self._clock()
            dirty = self._dirty
            if entry.dirty:
                del dirty[key]  # re-insert: dirty order is order of last write
            else:
                entry.dirty = True
            dirty[key] = None
            return
        value = self._ser(obj)
        if value is None:
            raise ValueError(f"store {self.name!r}: value serde gave None for {obj!r}")
        self._write(key, value, obj if self._objects else UNSET)

    # --- bytes ---------------------------------------------------------------

    def _bytes_of(self, key: bytes, entry: _Entry) -> bytes | None:
        """The bytes of a cached entry, made now from its object if need be.

        A serialization re-measures the entry: its charge becomes its size
        now (for a fixed-size serde it was that already, unless the bytes it
        replaced had another length). Not for an entry already evicted."""
        value = entry.value
        if value is UNSET:
            value = entry.value = self._ser(entry.obj)
            size = entry_size(key, value)
            delta = size - entry.size
            if delta:
                entry.size = size
                self._bytes += delta
                self._budget.charge(delta)
        return value

    def get(self, key: bytes) -> bytes | None:
        entry = self._entries.get(key)
        if entry is not None:
            self._entries.move_to_end(key)
            self.hits += 1
            return self._bytes_of(key, entry)
        self.misses += 1
        value = self.inner.get(key)
        if value is not None and not self._pass_through:
            size = entry_size(key, value)
            self._entries[key] = _Entry(value, UNSET, False, 0, size)
            self._keys.add(key)
            self._bytes += size
            if self._budget.charge(size):
                self._evict()
        return value

    def put(self, key: bytes, value: bytes) -> None:
        if value is None:
            raise ValueError("put(key, None): use delete(key)")
        self.puts += 1
        self._write(key, value)

    def delete(self, key: bytes) -> None:
        self.deletes += 1
        self._write(key, None)

    def _write(self, key: bytes, value: Any, obj: Any = UNSET, size: int = -1) -> None:
        """Write bytes (None: delete; UNSET: only `obj`, charged `size`)."""
        timestamp = self._clock()
        if value is None:
            obj = None
        if self._pass_through:
            if value is UNSET:
                value = self._ser(obj)
            self._emit(key, value, timestamp, obj)
            return
        if size < 0:
            size = entry_size(key, value)
        entries = self._entries
        entry = entries.get(key)
        if entry is None:
            entries[key] = _Entry(value, obj, True, timestamp, size)
            self._keys.add(key)
            delta = size
        else:
            entries.move_to_end(key)
            delta = size - entry.size
            entry.value = value
            entry.obj = obj
            entry.dirty = True
            entry.timestamp = timestamp
            entry.size = size
        dirty = self._dirty
        if key in dirty:
            del dirty[key]  # re-insert: dirty order is order of last write
        dirty[key] = None
        self._bytes += delta
        # An update of the same size (a count, most aggregates) leaves the
        # budget as it was: no trip through its lock.
        if delta and self._budget.charge(delta):
            self._evict()

    def _evict(self) -> None:
        """Evict own LRU entries while the shared budget is exceeded."""
        entries = self._entries
        budget = self._budget
        while entries and budget.over():
            key, entry = entries.popitem(last=False)
            self._keys.discard(key)
            self._bytes -= entry.size
            budget.charge(-entry.size)
            self.evictions += 1
            if entry.dirty:
                entry.dirty = False
                self._dirty.pop(key, None)
                value = entry.value
                if value is UNSET:  # evicted already: nothing to re-measure
                    value = self._ser(entry.obj)
                self._emit(key, value, entry.timestamp, entry.obj)

    def _emit(self, key: bytes, value: bytes | None, timestamp: int, obj: Any = UNSET) -> None:
        """Write one folded update down and hand it to `on_flush`.

        With `skip_unseen_deletes`, a cached delete of a key the inner store
        does not hold either (written and deleted within one commit: a session
        merged away) is neither written nor handed on, as Kafka Streams'
        CachingSessionStore skips it. With caching off every write passes as
        it is (the output stays per write).
        """
        old = self.inner.get(key) if self._send_old_values else None
        if value is None and self.skip_unseen_deletes and not self._pass_through:
            if not self._send_old_values and self.inner.get(key) is None:
                return
            if self._send_old_values and old is None:
                return
        logged = self._logged
        if logged is not None:
            if value is None:
                logged.delete_at(key, timestamp)
            else:
                logged.put_at(key, value, timestamp)
        elif value is None:
            self.inner.delete(key)
        else:
            self.inner.put(key, value)
        self.emitted += 1
        on_flush = self._on_flush
        if on_flush is not None:
            self.emitting = obj
            try:
                on_flush(key, value, old, timestamp)
            finally:
                self.emitting = UNSET

    def drop(self, key: bytes) -> None:
        """Delete `key` without emitting it: out of the cache, and from the
        inner store directly (through the change-logging layer, so the
        changelog still gets its tombstone), with no `on_flush`.

        For expiry (a session store's sweep): Kafka Streams drops expired
        segments without forwarding anything. An update still dirty here is
        emitted first: Kafka Streams' cache would forward it at the commit
        (its write into the expired segment is skipped, the forward is not)."""
        entry = self._entries.pop(key, None)
        if entry is not None:
            if entry.dirty and entry.value is not None:
                self._emit(key, self._bytes_of(key, entry), entry.timestamp, entry.obj)
            self._keys.discard(key)
            self._dirty.pop(key, None)
            self._bytes -= entry.size
            self._budget.charge(-entry.size)
        self.deletes += 1
        logged = self._logged
        if logged is not None:
            logged.delete_at(key, self._clock())
        else:
            self.inner.delete(key)

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        if not self._entries:
            return self.inner.range(lo, hi)
        entries = self._entries
        bytes_of = self._bytes_of
        overlay = [(k, bytes_of(k, entries[k])) for k in self._keys.between(lo, hi)]
        return merge_overlay(overlay, self.inner.range(lo, hi))

    def all(self) -> Iterator[KeyValue]:
        return self.range(None, None)

    def approximate_num_entries(self) -> int:
        return self.inner.approximate_num_entries()

    def flush_cache(self) -> None:
        """Emit every dirty entry (order of last write); keep them clean, up to
        this store's share of the budget (see the module docstring)."""
        entries = self._entries
        while self._dirty:
            # Swap, not pop-first: on_flush may write to this store again.
            batch, self._dirty = self._dirty, {}
            for key in batch:
                entry = entries.get(key)
                if entry is None or not entry.dirty:
                    continue  # evicted (and emitted) meanwhile
                entry.dirty = False
                value = self._bytes_of(key, entry)
                self._emit(key, value, entry.timestamp, entry.obj)
                if value is None and not entry.dirty:  # a tombstone: not kept
                    del entries[key]
                    self._keys.discard(key)
                    self._bytes -= entry.size
                    self._budget.charge(-entry.size)
        self._trim_to(self._budget.keep_share)

    def _trim_to(self, keep: int) -> None:
        """Drop least-recently-used clean entries until at most `keep` bytes stay.

        Called after a flush, when no entry is dirty, unless `on_flush` wrote
        this store again: a dirty entry is never dropped (it would be lost), so
        the trim stops at the first one."""
        if self._bytes <= keep:
            return
        entries = self._entries
        released = 0
        while entries and self._bytes - released > keep:
            key, entry = next(iter(entries.items()))
            if entry.dirty:
                break
            del entries[key]
            self._keys.discard(key)
            released += entry.size
        if released:
            self._bytes -= released
            self._budget.charge(-released)

    def flush(self) -> None:
        self.flush_cache()
        self.inner.flush()

    def _drop_entries(self) -> None:
        released = self._bytes
        self._entries.clear()
        self._dirty.clear()
        self._keys.clear()
        self._bytes = 0
        if released:
            self._budget.charge(-released)

    def close(self) -> None:
        """Drop the cache (dirty entries are lost, like a crash) and close inner."""
        self._drop_entries()
        if not self._closed and not self._pass_through:
            self._budget.close_store()
        self._closed = True
        self.inner.close()
