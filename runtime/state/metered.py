"""The metered layer: counts operations of a store, optionally with latency.

Counting is a few integer additions per call. Latency totals need two clock
reads per call, so they are only taken when `timed=True` (a separate class,
so the untimed path has no branch for it). Counters are plain ints written by
the one thread holding the task; readers (metrics export) read them racily.

Over a caching layer (every aggregation's store, and every store with
caching on) the untimed layer costs nothing per call: the cache counts
every read and write already, so `get`/`put`/`delete` (and the cache's
`get_value`/`put_value`/`use_values`) are the cache's own bound methods, set
on the instance, and `gets`/`puts`/`deletes` are read from the cache's
counters when someone asks (`metrics()`). The figures are the same as if this
layer had counted.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

from runtime.state.cache import CachingKeyValueStore
from runtime.state.store import KeyValue, KeyValueStore


class MeteredKeyValueStore:
    def __init__(self, inner: KeyValueStore) -> None:
        self.inner = inner
        self.gets = 0
        self.puts = 0
        self.deletes = 0
        self.ranges = 0
        self.flushes = 0

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def persistent(self) -> bool:
        return self.inner.persistent

    def get(self, key: bytes) -> bytes | None:
        self.gets += 1
        return self.inner.get(key)

    def put(self, key: bytes, value: bytes) -> None:
        self.puts += 1
        self.inner.put(key, value)

    def delete(self, key: bytes) -> None:
        self.deletes += 1
        self.inner.delete(key)

    def range(self, lo: bytes | None, hi: bytes | None) -> Iterator[KeyValue]:
        self.ranges += 1
        return self.inner.range(lo, hi)

    def all(self) -> Iterator[KeyValue]:
        self.ranges += 1
        return self.inner.all()

    def approximate_num_entries(self) -> int:
        return self.inner.approximate_num_entries()

    def flush(self) -> None:
        self.flushes += 1
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()

    def metrics(self) -> dict[str, float]:
        """A snapshot of the counters (and latency totals, when timed)."""
        return {
            "gets": self.gets,
            "puts": self.puts,
            "deletes": self.deletes,
            "ranges": self.ranges,
            "flushes": self.flushes,
        }


class TimedMeteredKeyValueStore(MeteredKeyValueStore):
    """Also sums the wall time (ns) spent in get/put/delete/flush."""

    def __init__(self, inner: KeyValueStore) -> None:
        super().__init__(inner)
        self.get_ns = 0
        self.put_ns = 0
        self.delete_ns = 0
        self.flush_ns = 0

    def get(self, key: bytes) -> bytes | None:
        start = time.perf_counter_ns()
        value = self.inner.get(key)
        self.get_ns += time.perf_counter_ns() - start
        self.gets += 1
        return value

    def put(self, key: bytes, value: bytes) -> None:
        start = time.perf_counter_ns()
        self.inner.put(key, value)
        self.put_ns += time.perf_counter_ns() - start
        self.puts += 1

    def delete(self, key: bytes) -> None:
        start = time.perf_counter_ns()
        self.inner.delete(key)
        self.delete_ns += time.perf_counter_ns() - start
        self.deletes += 1

    def flush(self) -> None:
        start = time.perf_counter_ns()
        self.inner.flush()
        self.flush_ns += time.perf_counter_ns() - start
        self.flushes += 1

    def metrics(self) -> dict[str, float]:
        snapshot = super().metrics()
        snapshot.update(
            get_ns_total=self.get_ns,
            put_ns_total=self.put_ns,
            delete_ns_total=self.delete_ns,
            flush_ns_total=self.flush_ns,
        )
        return snapshot


class CacheMeteredKeyValueStore(MeteredKeyValueStore):
    """The untimed metered layer over a caching layer: no call of its own.

    Reads and writes go straight to the cache's methods (instance attributes
    shadowing the class's); the counts come from the cache's counters.
    """

    def __init__(self, inner: CachingKeyValueStore) -> None:
        self.inner = inner
        self.ranges = 0
        self.flushes = 0
        self.get = inner.get  # type: ignore[method-assign]
        self.put = inner.put  # type: ignore[method-assign]
        self.delete = inner.delete  # type: ignore[method-assign]
        self.get_value = inner.get_value
        self.put_value = inner.put_value
        self.use_values = inner.use_values

    @property
    def emitting(self) -> Any:
        """The cache's object of the update it is emitting (see CachingKeyValueStore)."""
        assert isinstance(self.inner, CachingKeyValueStore)
        return self.inner.emitting

    @property
    def gets(self) -> int:  # type: ignore[override]
        cache = self.inner
        assert isinstance(cache, CachingKeyValueStore)
        return cache.hits + cache.misses

    @property
    def puts(self) -> int:  # type: ignore[override]
        assert isinstance(self.inner, CachingKeyValueStore)
        return self.inner.puts

    @property
    def deletes(self) -> int:  # type: ignore[override]
        assert isinstance(self.inner, CachingKeyValueStore)
        return self.inner.deletes


def metered(inner: KeyValueStore, timed: bool = False) -> MeteredKeyValueStore:
    """The metered layer over `inner`; `timed` adds latency totals. Untimed
    over a caching layer it adds no call (`CacheMeteredKeyValueStore`)."""
    if timed:
        return TimedMeteredKeyValueStore(inner)
    if isinstance(inner, CachingKeyValueStore):
        return CacheMeteredKeyValueStore(inner)
    return MeteredKeyValueStore(inner)
