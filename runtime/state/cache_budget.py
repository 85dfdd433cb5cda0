"""The one process-wide budget of the store caches (`cache.max.bytes`).

Every caching store of every task charges its entries here, so the caches'
memory is bounded whatever the task and thread counts; the budget also
counts the caching stores open, which gives each store its share of what
may stay cached across a commit (runtime.state.cache). Thread-safe: charged
by every processing thread and by the polling thread at commit.
"""

from __future__ import annotations

import threading


class CacheBudget:
    """Bytes held by all caches of the process, against `cache.max.bytes`.

    Thread-safe: charged by every processing thread (and the polling thread
    at commit). `used` and `over()` are racy reads, fine for decisions that
    are re-checked under `charge`.
    """

    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("cache.max.bytes must be >= 0")
        self._max = max_bytes
        self._used = 0
        self._stores = 0
        self._lock = threading.Lock()

    @property
    def max_bytes(self) -> int:
        return self._max

    @property
    def enabled(self) -> bool:
        return self._max > 0

    @property
    def used(self) -> int:
        return self._used

    def charge(self, delta: int) -> bool:
        """Add `delta` bytes (negative: release); True when now over the budget."""
        with self._lock:
            self._used += delta
            return self._used > self._max

    def over(self) -> bool:
        return self._used > self._max

    def open_store(self) -> None:
        """A caching store opened: one more share of the budget."""
        with self._lock:
            self._stores += 1

    def close_store(self) -> None:
        with self._lock:
            self._stores = max(0, self._stores - 1)

    @property
    def keep_share(self) -> int:
        """Bytes one store may keep across a commit: the budget over the caching
        stores open now (a racy read: the count changes only as tasks open and
        close)."""
        return self._max // max(1, self._stores)
