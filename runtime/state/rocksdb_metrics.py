"""The RocksDB metrics thread: every store's RocksDB properties, read every
`state.rocksdb.metrics.interval.ms` into one immutable `RocksDBFigures`.

Reading a property is cheap but not free (RocksDB takes a mutex for some of
them, and with hundreds of stores a scrape would pay for all of them), and a
processing or polling thread must never wait for it: so one thread of its
own reads them at an interval, and `App.status()` (metrics, `admin status`)
takes the last snapshot without touching RocksDB. RocksDB's property reads
are thread-safe; each store's `rocksdb_properties` holds that store's lock so
the database cannot close meanwhile (runtime.state.rocksdb_store).

Per store: estimated keys, memtable bytes, table readers' memory outside the
cache, pending compaction bytes, live SST bytes, the delayed write rate
(non-zero while RocksDB slows writes down) and whether writes are stopped;
with `state.rocksdb.statistics`, get and write latency (count and sum, from
RocksDB's histograms). Process-wide (the shared cache, read once, not per
store: `rocksdb.block-cache-usage` of any store reports the whole shared
cache): block-cache usage, pinned usage and capacity, memtables charged by
the write-buffer manager and its limit.

Threads: `RocksDBMetricsThread.run` is its own thread; `figures` any thread
(one reference read); `read_figures` any thread (tests call it directly).
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from runtime.logging import get_logger
from runtime.state.rocksdb_memory import MeteredDatabase, RocksDBMemory

log = get_logger("runtime.state.rocksdb_metrics")

# RocksDB property -> the StoreFigures field it fills.
PROPERTIES: dict[str, str] = {
    "rocksdb.estimate-num-keys": "estimated_keys",
    "rocksdb.cur-size-all-mem-tables": "memtable_bytes",
    "rocksdb.estimate-table-readers-mem": "table_readers_bytes",
    "rocksdb.estimate-pending-compaction-bytes": "pending_compaction_bytes",
    "rocksdb.live-sst-files-size": "live_sst_bytes",
    "rocksdb.actual-delayed-write-rate": "delayed_write_rate",
    "rocksdb.is-write-stopped": "write_stopped",
}
_NAMES = tuple(PROPERTIES)
# "rocksdb.db.get.micros P50 : ... COUNT : 600000 SUM : 710404"
_HISTOGRAM = re.compile(r"^(rocksdb\.db\.(get|write)\.micros) .*COUNT : (\d+) SUM : (\d+)", re.M)


@dataclass(frozen=True)
class StoreFigures:
    """One open RocksDB store at the last read."""

    task: str
    store: str
    estimated_keys: int = 0
    memtable_bytes: int = 0
    table_readers_bytes: int = 0
    pending_compaction_bytes: int = 0
    live_sst_bytes: int = 0
    delayed_write_rate: int = (
        0  # bytes/s RocksDB lets writes through while it slows them; 0: no delay
    )
    write_stopped: int = (
        0  # 1 while RocksDB stops writes (too many L0 files, memtables, pending bytes)
    )
    # With state.rocksdb.statistics: operations and their summed time (s).
    gets: int | None = None
    get_seconds: float | None = None
    writes: int | None = None
    write_seconds: float | None = None


@dataclass(frozen=True)
class RocksDBFigures:
    """All RocksDB stores of the app at one moment (`read_at`, wall clock)."""

    read_at: float
    memory_bytes: int  # the budget: the shared cache's capacity
    write_buffer_limit_bytes: int
    block_cache_usage_bytes: int
    block_cache_pinned_bytes: int
    write_buffer_usage_bytes: int
    # The runtime's own keeping of memtables within their share
    # (RocksDBMemory.relieve_write_buffers): flushes it asked for, writes
    # that waited for flushes and the time they waited, and the waits that
    # gave up because flushing did not bring the memtables down (their
    # budget is too small for the stores' settings: RocksDBMemory._stall).
    forced_flushes: int = 0
    stalls: int = 0
    stall_seconds: float = 0.0
    stalls_without_progress: int = 0
    stores: tuple[StoreFigures, ...] = field(default_factory=tuple)

    @property
    def write_stalls(self) -> int:
        """Stores whose writes RocksDB slows down or stops now."""
        return sum(1 for s in self.stores if s.write_stopped or s.delayed_write_rate)

    def as_dict(self) -> dict[str, Any]:
        """For `AppStatus.state_memory` (JSON)."""
        data = asdict(self)
        data["stores"] = [
            {k: v for k, v in store.items() if v is not None} for store in data["stores"]
        ]
        data["write_stalls"] = self.write_stalls
        return data


def read_figures(memory: RocksDBMemory, now: float | None = None) -> RocksDBFigures:
    """Read every open store of `memory` once (the metrics thread; tests)."""
    stores = []
    for db in sorted(memory.open_stores(), key=lambda d: (d.task_id, d.name)):
        figures = _store_figures(db)
        if figures is not None:
            stores.append(figures)
    settings = memory.settings
    return RocksDBFigures(
        read_at=time.time() if now is None else now,
        memory_bytes=settings.memory_bytes,
        write_buffer_limit_bytes=settings.write_buffer_bytes,
        block_cache_usage_bytes=memory.cache_usage(),
        block_cache_pinned_bytes=memory.cache_pinned_usage(),
        write_buffer_usage_bytes=memory.write_buffer_usage(),
        forced_flushes=memory.forced_flushes,
        stalls=memory.stalls,
        stall_seconds=round(memory.stall_seconds, 3),
        stalls_without_progress=memory.stalls_without_progress,
        stores=tuple(stores),
    )


def _store_figures(db: MeteredDatabase) -> StoreFigures | None:
    try:
        values = db.rocksdb_properties(_NAMES)
        if values is None:  # closed meanwhile
            return None
        fields = {PROPERTIES[name]: value for name, value in values.items()}
        statistics = db.rocksdb_statistics()
    except Exception as exc:  # a store failing to answer must not stop the others
        log.debug("rocksdb_metrics_read_failed", store=db.name, error=str(exc))
        return None
    extra: dict[str, Any] = {}
    if statistics is not None:
        extra = {"gets": 0, "get_seconds": 0.0, "writes": 0, "write_seconds": 0.0}
        for match in _HISTOGRAM.finditer(statistics):
            kind, count, total_us = match.group(2), int(match.group(3)), int(match.group(4))
            extra[f"{kind}s"] = count
            extra[f"{kind}_seconds"] = total_us / 1e6
    return StoreFigures(task=db.task_id, store=db.name, **fields, **extra)


class RocksDBMetricsThread(threading.Thread):
    """Reads the app's RocksDB figures every `interval_s`; `figures` is the last."""

    def __init__(self, name: str, memory: RocksDBMemory, interval_s: float) -> None:
        super().__init__(name=name, daemon=True)
        self._memory = memory
        self._interval_s = interval_s
        self._stop_event = threading.Event()
        self.figures: RocksDBFigures | None = None
        self.reads = 0

    def request_stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while True:
            try:
                self.figures = read_figures(self._memory)
                self.reads += 1
            except Exception as exc:  # never fatal: metrics only
                log.warning("rocksdb_metrics_failed", error=str(exc))
            if self._stop_event.wait(self._interval_s):
                return
