"""The RocksDB memory of one app: one block cache and one write-buffer budget
shared by every RocksDB store, the options each store opens with, and the
registry of open stores the metrics thread reads.

Why: a RocksDB database opened with default options has its own 32 MiB block
cache (rocksdict/RocksDB's default LRU), up to two 64 MiB memtables and
index and filter blocks held outside any cache, so the memory of a process
grows with the number of stores (tasks x stores per task: 512 with 256
partitions and two stores) without a bound. Here every store of an app
charges the same `Cache` of `state.rocksdb.memory.bytes`; its memtables are
counted by one `WriteBufferManager` of `state.rocksdb.write.buffer.ratio` of
that budget, which charges them to the same cache (RocksDB's "cost memtables
to the block cache"), so data blocks, index and filter blocks (cached, not
held by table readers) and memtables share one limit whatever the task
count. Kafka Streams users write the same by hand in a RocksDBConfigSetter;
here it is the default, and `state.rocksdb.config.setter` is the hook for the
rest (called per store with the store's name and its `rocksdict.Options`,
after the runtime's own settings).

What the budget does not bound (said in docs/state.md with the measurement):
RocksDB's per-database constant (table cache, LOG file, version set, about
one arena block per memtable in use), blocks pinned by open iterators
(the cache is not strict: a pinned entry may take it over its capacity for a
while), compaction and flush buffers, and everything on the Python side
(the pending overlay of each store until its commit, the record cache of
`cache.max.bytes`).

Per store: a memtable (`write_buffer_size`) of a quarter of the write-buffer
budget, at least 1 MiB and at most 16 MiB, two of them at most, in 64 KiB
arena blocks (RocksDB's default block, an eighth of the memtable, is taken at
a store's first write, so hundreds of idle stores would hold hundreds of MiB
otherwise); a 10-bit Bloom filter per key (partitioned, two-level index, top
level pinned), which Kafka Streams also uses: a count's first record of a key
finds it absent without reading a data block.

Threads: `RocksDBMemory` is built once per app by the thread calling
`App.start` (`default_memory()` for stores built outside an app: tests, the
topology test driver); `options` is called by whichever thread opens a store
(its owner at that moment); `register`/`unregister` by the same, and
`open_stores` by the metrics thread, under one lock. `Cache` and
`WriteBufferManager` are RocksDB's own thread-safe objects.
"""

from __future__ import annotations

import importlib
import re
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from rocksdict import BlockBasedIndexType, BlockBasedOptions, Cache, Options, WriteBufferManager

from runtime.logging import get_logger

log = get_logger("runtime.state.rocksdb_memory")

MIB = 1 << 20
DEFAULT_MEMORY_BYTES = 256 * MIB
"""`state.rocksdb.memory.bytes`: large enough for a few hundred stores' index
and filter blocks plus a useful share of hot data blocks, small enough that a
daemon with 256 tasks fits a 1 GiB container with its Python heap; the same
order as one Kafka Streams store's defaults (a 50 MiB cache and three 16 MiB
memtables), here for all stores together."""
DEFAULT_WRITE_BUFFER_RATIO = 0.25
MIN_MEMORY_BYTES = 16 * MIB
MIN_MEMTABLE_BYTES = 1 * MIB
MAX_MEMTABLE_BYTES = 16 * MIB
ARENA_BLOCK_BYTES = 64 * 1024
BLOOM_BITS_PER_KEY = 10
STALL_LIMIT_S = 5.0
# A stall ends early when the memtables' usage has not gone down for this
# long: flushing cannot bring it under the share (see `_stall`).
STALL_NO_PROGRESS_S = 2.0
# ...and then no writer stalls again for this long (a commit of hundreds of
# stores would otherwise wait that long once per store).
STALL_BACKOFF_S = 30.0

ConfigSetter = Callable[[str, Options], object]
"""`state.rocksdb.config.setter`: `setter(store_name, options)` changes the
`rocksdict.Options` a store opens with (its return value is ignored)."""

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")


def config_setter_from_name(name: str) -> ConfigSetter:
    """Resolve `module:attr` to a config setter: a function (or any callable)
    taking `(store_name, options)`, or a class made with no arguments whose
    instances are such callables. Nothing is called but the class. Raises
    ValueError saying what is wrong (the config key is named by the caller)."""
    shown = repr(name if len(name) <= 80 else name[:77] + "...")
    module_name, sep, attr = name.strip().partition(":")
    if not sep or not _DOTTED.fullmatch(module_name) or not _DOTTED.fullmatch(attr):
        raise ValueError(f"{shown}: expected 'module:attr' (dotted names)")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{shown}: cannot import {module_name!r}: {exc}") from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(f"{shown}: module {module_name!r} has no {attr!r}") from None
    if isinstance(target, type):
        target = target()
    return check_config_setter(target, shown)


def check_config_setter(target: Any, shown: str) -> ConfigSetter:
    """`target` if it can be called as `target(store_name, options)`; else ValueError."""
    if not callable(target):
        raise ValueError(f"{shown} is not callable: expected setter(store_name, options)")
    return target


@dataclass(frozen=True)
class RocksDBMemorySettings:
    """What the `state.rocksdb.*` keys say (defaults: the keys' defaults)."""

    memory_bytes: int = DEFAULT_MEMORY_BYTES
    write_buffer_ratio: float = DEFAULT_WRITE_BUFFER_RATIO
    config_setter: ConfigSetter | None = None
    statistics: bool = False

    @property
    def write_buffer_bytes(self) -> int:
        """The memtables' share of the budget (charged to the same cache)."""
        return int(self.memory_bytes * self.write_buffer_ratio)

    @property
    def memtable_bytes(self) -> int:
        """One store's `write_buffer_size`: a quarter of the memtables' share,
        between 1 and 16 MiB."""
        quarter = self.write_buffer_bytes // 4
        return max(MIN_MEMTABLE_BYTES, min(MAX_MEMTABLE_BYTES, quarter))


class MeteredDatabase(Protocol):
    """What the metrics thread reads from an open store (RocksDBKeyValueStore)."""

    @property
    def task_id(self) -> str: ...

    @property
    def name(self) -> str: ...

    def rocksdb_properties(self, names: tuple[str, ...]) -> dict[str, int] | None: ...

    def rocksdb_statistics(self) -> str | None: ...

    def flushable_memtable_bytes(self) -> int: ...

    def request_flush(self) -> None: ...


class RocksDBMemory:
    """One block cache and one write-buffer manager for all stores of an app."""

    def __init__(self, settings: RocksDBMemorySettings | None = None) -> None:
        self.settings = settings or RocksDBMemorySettings()
        self.cache = Cache(self.settings.memory_bytes)
        self.write_buffers = WriteBufferManager.new_write_buffer_manager_with_cache(
            self.settings.write_buffer_bytes, False, self.cache
        )
        self._lock = threading.Lock()
        self._open: dict[int, MeteredDatabase] = {}
        self._relief = threading.Lock()
        self.forced_flushes = 0  # memtables flushed by `relieve_write_buffers`
        self.stalls = 0  # writes that waited for memtables to flush
        self.stall_seconds = 0.0
        self.stalls_without_progress = 0  # stalls ended because flushing did not help
        self._stall_again_at = 0.0  # monotonic; see `_stall`

    # --- options (the thread opening a store) --------------------------------

    def options(self, store_name: str, create: bool, setter: bool = True) -> Options:
        """The options store `store_name` opens with: the shared cache and
        write-buffer manager, small memtables, then the config setter's changes
        (`setter=False`: not for a store, the consolidated layout's database
        and its `offsets` column family, runtime.state.consolidated).

        Raises what the setter raises (the app stops naming the key: see
        `ConfigSetterError`)."""
        settings = self.settings
        options = Options(raw_mode=True)
        options.create_if_missing(create)
        table = BlockBasedOptions()
        table.set_block_cache(self.cache)
        table.set_cache_index_and_filter_blocks(True)
        table.set_pin_top_level_index_and_filter(True)
        table.set_index_type(BlockBasedIndexType.two_level_index_search())
        table.set_partition_filters(True)
        table.set_bloom_filter(BLOOM_BITS_PER_KEY, False)
        options.set_block_based_table_factory(table)
        options.set_write_buffer_manager(self.write_buffers)
        options.set_write_buffer_size(settings.memtable_bytes)
        options.set_max_write_buffer_number(2)
        options.set_arena_block_size(ARENA_BLOCK_BYTES)
        if settings.statistics:
            options.enable_statistics()
        if setter and settings.config_setter is not None:
            try:
                settings.config_setter(store_name, options)
            except Exception as exc:
                raise ConfigSetterError(store_name, exc) from exc
        return options

    # --- the registry of open stores -----------------------------------------

    def register(self, store: MeteredDatabase) -> None:
        """A store opened (its owner's thread)."""
        with self._lock:
            self._open[id(store)] = store

    def unregister(self, store: MeteredDatabase) -> None:
        """A store closed for good (its owner's thread); idempotent."""
        with self._lock:
            self._open.pop(id(store), None)

    def open_stores(self) -> list[MeteredDatabase]:
        """The stores open now (a copy; any thread)."""
        with self._lock:
            return list(self._open.values())

    # --- keeping memtables within their share --------------------------------

    def relieve_write_buffers(self) -> int:
        """Keep all stores' memtables within their share; returns how many
        memtables this call asked to flush.

        Past 90% of the share, the largest memtables are flushed, down to
        half of it. Why: RocksDB's write-buffer manager only flushes the store
        being written to, so the memtables of stores written once and then
        idle (with hundreds of tasks, most of them at any moment) would stay
        in memory whatever the budget: measured, 128 stores of a 32 MiB
        budget held 135 MiB of memtables. The flushes run on RocksDB's
        background threads (`flush(wait=False)`); a store whose flush is
        still pending is skipped. Past the whole share (writes faster than
        RocksDB flushes), the caller waits until flushes bring it back, at
        most `STALL_LIMIT_S`: a write stall of our own, counted in
        `stall_seconds` (RocksDB's own `allow_stall` could wait for ever
        on memtables of idle stores nobody flushes). A stall that flushing
        cannot end (see `_stall`) is not repeated for `STALL_BACKOFF_S`.

        Called after a store's write (a commit: the polling thread; a
        restored batch: the restoration thread) by the thread that wrote;
        under the share it costs one read of the manager's counter."""
        share = self.settings.write_buffer_bytes
        if self.write_buffer_usage() < share * 0.9:
            return 0
        asked = self._flush_largest(share)
        if self.write_buffer_usage() > share and time.monotonic() >= self._stall_again_at:
            self._stall(share)
        return asked

    def _flush_largest(self, share: int) -> int:
        if not self._relief.acquire(blocking=False):
            return 0  # another writer is choosing right now
        try:
            usage = self.write_buffer_usage()
            sizes = [(db.flushable_memtable_bytes(), db) for db in self.open_stores()]
            sizes.sort(key=lambda pair: pair[0], reverse=True)
            asked = 0
            for active, db in sizes:
                if usage <= share // 2 or active < ARENA_BLOCK_BYTES:
                    break
                db.request_flush()
                usage -= active
                asked += 1
            self.forced_flushes += asked
            return asked
        finally:
            self._relief.release()

    def _stall(self, share: int) -> None:
        """Wait until flushes bring the memtables under `share`, at most
        `STALL_LIMIT_S`.

        Ends early, with a warning that says what to change, when the usage
        has not gone down for `STALL_NO_PROGRESS_S`: memory that flushing
        does not release holds it above the share. Found with a config
        setter giving each store 64 MiB memtables with a memtable Bloom
        filter: the filter is allocated with every new memtable, so 16
        stores' empty memtables alone exceeded a 64 MiB share, and every
        store's commit waited the whole 5 s (a 600,000-record backlog was
        not processed in 15 minutes). After such a stall no writer stalls
        for `STALL_BACKOFF_S`."""
        started = time.monotonic()
        deadline = started + STALL_LIMIT_S
        next_flush = started + 0.05
        lowest = self.write_buffer_usage()
        lowered_at = started
        gave_up = False
        while (usage := self.write_buffer_usage()) > share:
            now = time.monotonic()
            if usage < lowest:
                lowest, lowered_at = usage, now
            if now >= deadline:
                break
            if now - lowered_at >= STALL_NO_PROGRESS_S:
                gave_up = True
                break
            if now >= next_flush:  # memtables whose flush ended may hold more
                self._flush_largest(share)
                next_flush = now + 0.05
            time.sleep(0.002)
        with self._lock:
            self.stalls += 1
            self.stall_seconds += time.monotonic() - started
            if not gave_up:
                return
            self.stalls_without_progress += 1
            self._stall_again_at = time.monotonic() + STALL_BACKOFF_S
        log.warning(
            "rocksdb_memtables_over_budget",
            usage_mib=round(usage / MIB, 1),
            share_mib=round(share / MIB, 1),
            stores=len(self._open),
            next_stall_after_s=STALL_BACKOFF_S,
            hint="flushing does not bring the memtables under their share of "
            "state.rocksdb.memory.bytes (state.rocksdb.write.buffer.ratio): memory every "
            "memtable holds from its start (a memtable Bloom filter, a large arena block set "
            "by state.rocksdb.config.setter) times the open stores exceeds it; raise "
            "state.rocksdb.memory.bytes or state.rocksdb.write.buffer.ratio, or make the "
            "setter's write_buffer_size, memtable_prefix_bloom_ratio or arena_block_size "
            "smaller",
        )

    # --- shared figures (any thread; RocksDB's counters) ----------------------

    def cache_usage(self) -> int:
        """Bytes charged to the shared block cache: data, index and filter
        blocks and the memtables' reservations."""
        return int(self.cache.get_usage())

    def cache_pinned_usage(self) -> int:
        return int(self.cache.get_pinned_usage())

    def write_buffer_usage(self) -> int:
        """Bytes of memtables of all stores (the write-buffer manager's count)."""
        return int(self.write_buffers.get_usage())


class ConfigSetterError(RuntimeError):
    """`state.rocksdb.config.setter` raised while a store's options were built."""

    def __init__(self, store: str, cause: BaseException) -> None:
        self.store = store
        super().__init__(
            f"state.rocksdb.config.setter failed for store {store!r}: "
            f"{type(cause).__name__}: {cause}"
        )


_default: RocksDBMemory | None = None
_default_lock = threading.Lock()


def default_memory() -> RocksDBMemory:
    """The process's memory for stores built outside an app (tests, the
    topology test driver): default settings, created on first use."""
    global _default
    with _default_lock:
        if _default is None:
            _default = RocksDBMemory()
        return _default
