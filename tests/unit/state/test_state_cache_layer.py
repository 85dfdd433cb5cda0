"""Caching layer: folding per key, flush order, the shared budget, pass-through."""

from __future__ import annotations

import pytest

from runtime.state.cache import CachingKeyValueStore, entry_size
from runtime.state.cache_budget import CacheBudget
from runtime.state.changelog import ChangeLoggingKeyValueStore
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.topology.record import Headers


class Recorder:
    """Collects changelog records (as TaskContext.send) and downstream updates."""

    def __init__(self) -> None:
        self.changelog: list[tuple[bytes | None, bytes | None, int]] = []
        self.downstream: list[tuple[bytes, bytes | None, bytes | None, int]] = []

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        self.changelog.append((key, value, timestamp))

    def on_flush(self, key: bytes, value: bytes | None, old: bytes | None, timestamp: int) -> None:
        self.downstream.append((key, value, old, timestamp))


class Clock:
    def __init__(self) -> None:
        self.now = 0

    def __call__(self) -> int:
        return self.now


def cached_store(
    budget: CacheBudget, rec: Recorder, name: str = "s", clock: Clock | None = None, **kwargs: bool
) -> CachingKeyValueStore:
    clock = clock or Clock()
    logged = ChangeLoggingKeyValueStore(
        InMemoryKeyValueStore(name), rec.send, f"app-{name}-changelog", 0, clock
    )
    return CachingKeyValueStore(logged, budget, rec.on_flush, clock, **kwargs)


def test_repeated_writes_fold_into_one_record_and_one_update() -> None:
    rec = Recorder()
    clock = Clock()
    store = cached_store(CacheBudget(10_000), rec, clock=clock)
    for i, value in enumerate([b"1", b"2", b"3"]):
        clock.now = 100 + i
        store.put(b"k", value)
    assert store.get(b"k") == b"3"
    assert rec.changelog == [] and rec.downstream == []
    store.flush()
    assert rec.changelog == [(b"k", b"3", 102)]  # timestamp of the last write
    assert rec.downstream == [(b"k", b"3", None, 102)]
    assert store.get(b"k") == b"3"  # now from the inner store


def test_flush_emits_in_order_of_last_write() -> None:
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec)
    store.put(b"a", b"1")
    store.put(b"b", b"1")
    store.put(b"c", b"1")
    store.put(b"a", b"2")
    store.get(b"b")  # a read does not change the flush order
    store.flush()
    assert [k for k, _, _ in rec.changelog] == [b"b", b"c", b"a"]
    assert [k for k, _, _, _ in rec.downstream] == [b"b", b"c", b"a"]


def test_put_then_delete_folds_into_a_tombstone() -> None:
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec)
    store.put(b"a", b"1")
    store.delete(b"a")
    assert store.get(b"a") is None
    assert list(store.all()) == []
    store.flush()
    assert rec.changelog == [(b"a", None, 0)]
    assert rec.downstream == [(b"a", None, None, 0)]


def test_put_then_delete_of_a_new_key_folds_into_nothing_when_skipping_unseen() -> None:
    """As Kafka Streams' CachingSessionStore: a key written and deleted within
    one commit, never in the inner store, is neither written nor forwarded."""
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec)
    store.skip_unseen_deletes = True
    store.put(b"a", b"1")
    store.delete(b"a")
    assert store.get(b"a") is None
    assert list(store.all()) == []
    store.flush()
    assert rec.changelog == []
    assert rec.downstream == []


def test_put_then_delete_of_a_stored_key_folds_into_a_tombstone() -> None:
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec)
    store.skip_unseen_deletes = True
    store.put(b"a", b"0")
    store.flush()
    store.put(b"a", b"1")
    store.delete(b"a")
    store.flush()
    assert rec.changelog == [(b"a", b"0", 0), (b"a", None, 0)]
    assert rec.downstream == [(b"a", b"0", None, 0), (b"a", None, None, 0)]


def test_drop_deletes_without_forwarding_but_emits_a_pending_update() -> None:
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec)
    store.put(b"a", b"1")
    store.flush()
    store.drop(b"a")  # stored: deleted silently
    store.put(b"b", b"2")
    store.drop(b"b")  # pending: goes out first, as Kafka Streams' cache would
    store.flush()
    assert list(store.all()) == []
    assert rec.downstream == [(b"a", b"1", None, 0), (b"b", b"2", None, 0)]
    assert rec.changelog == [(b"a", b"1", 0), (b"a", None, 0), (b"b", b"2", 0), (b"b", None, 0)]


def test_range_merges_cache_over_inner_store() -> None:
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec)
    store.put(b"a", b"1")
    store.put(b"c", b"1")
    store.flush()
    store.put(b"b", b"2")
    store.delete(b"c")
    store.put(b"a", b"3")
    assert list(store.all()) == [(b"a", b"3"), (b"b", b"2")]
    assert list(store.range(b"b", None)) == [(b"b", b"2")]


def test_over_budget_evicts_lru_entries_early() -> None:
    rec = Recorder()
    size = entry_size(b"k1", b"v")
    budget = CacheBudget(2 * size)
    store = cached_store(budget, rec)
    store.put(b"k1", b"v")
    store.put(b"k2", b"v")
    assert rec.changelog == []
    store.get(b"k1")  # k1 is now more recently used than k2
    store.put(b"k3", b"v")
    assert rec.changelog == [(b"k2", b"v", 0)]  # evicted before any flush
    assert rec.downstream == [(b"k2", b"v", None, 0)]
    assert budget.used == 2 * size
    assert store.evictions == 1
    store.flush()
    assert [k for k, _, _ in rec.changelog] == [b"k2", b"k1", b"k3"]
    # Emitted entries stay, clean, within the store's share (the whole
    # budget: the only store).
    assert budget.used == 2 * size and store.dirty_count == 0


def test_evicting_a_clean_entry_emits_nothing() -> None:
    rec = Recorder()
    size = entry_size(b"k1", b"v")
    store = cached_store(CacheBudget(size), rec)
    store.put(b"k1", b"v")
    store.flush()
    rec.changelog.clear()
    rec.downstream.clear()
    assert store.get(b"k1") == b"v"  # kept across the commit, clean
    assert (store.hits, store.misses) == (1, 0)
    store.put(b"k2", b"v")  # evicts clean k1: nothing to emit
    assert rec.changelog == []
    store.flush()
    assert rec.changelog == [(b"k2", b"v", 0)]


def test_budget_is_shared_by_all_stores() -> None:
    rec1, rec2 = Recorder(), Recorder()
    size = entry_size(b"k1", b"v")
    budget = CacheBudget(3 * size)
    one = cached_store(budget, rec1, "one")
    two = cached_store(budget, rec2, "two")
    for key in (b"k1", b"k2", b"k3"):
        one.put(key, b"v")
    assert budget.used == 3 * size and rec1.changelog == []
    # The budget is full: store two can only evict its own entries, so its
    # write passes through at once; store one keeps its cache.
    two.put(b"x1", b"v")
    assert rec2.changelog == [(b"x1", b"v", 0)]
    assert rec1.changelog == []
    assert budget.used == 3 * size
    one.flush()  # keeps only its share: 3 entries // 2 stores = 1 entry
    assert one.cached_bytes == size and budget.used == size
    two.put(b"x1", b"w")
    two.put(b"x1", b"z")
    assert rec2.changelog == [(b"x1", b"v", 0)]  # now cached again
    assert budget.used == 2 * size
    two.flush()
    assert rec2.changelog == [(b"x1", b"v", 0), (b"x1", b"z", 0)]
    assert budget.used == 2 * size


def test_clean_entries_survive_a_commit_without_a_store_read() -> None:
    rec = Recorder()
    budget = CacheBudget(10_000)
    store = cached_store(budget, rec)
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    store.flush()
    reads: list[bytes] = []
    inner_get = store.inner.get
    store.inner.get = lambda key: reads.append(key) or inner_get(key)  # type: ignore[method-assign]
    assert store.get(b"a") == b"1" and store.get(b"b") == b"2"
    assert reads == []  # both answered by the cache
    store.put(b"a", b"3")  # a kept entry becomes dirty again: one more record
    store.flush()
    assert rec.changelog[-1] == (b"a", b"3", 0)
    assert list(store.all()) == [(b"a", b"3"), (b"b", b"2")]


def test_a_commit_keeps_no_tombstone() -> None:
    rec = Recorder()
    budget = CacheBudget(10_000)
    store = cached_store(budget, rec)
    store.put(b"a", b"1")
    store.delete(b"b")
    store.flush()
    assert store.cached_bytes == entry_size(b"a", b"1") == budget.used
    assert store.get(b"b") is None


def test_the_share_kept_follows_the_open_stores() -> None:
    size = entry_size(b"k1", b"v")
    budget = CacheBudget(4 * size)
    one = cached_store(budget, Recorder(), "one")
    two = cached_store(budget, Recorder(), "two")
    assert budget.keep_share == 2 * size
    for key in (b"k1", b"k2", b"k3", b"k4"):
        one.put(key, b"v")
    one.get(b"k1")  # the most recently used keys stay
    one.flush()
    assert one.cached_bytes == 2 * size
    assert [k for k, _ in one.all()] == [b"k1", b"k2", b"k3", b"k4"]  # the store has all
    assert one.hits == 1 and one.get(b"k4") == b"v" and one.get(b"k1") == b"v"
    assert one.hits == 3  # k4 and k1 were kept; k2 and k3 were dropped
    two.close()
    assert budget.keep_share == 4 * size
    two.close()  # twice: counted once
    assert budget.keep_share == 4 * size


def test_zero_budget_passes_every_write_through() -> None:
    rec = Recorder()
    budget = CacheBudget(0)
    assert not budget.enabled
    store = cached_store(budget, rec)
    store.put(b"k", b"1")
    store.put(b"k", b"2")
    store.delete(b"k")
    assert rec.changelog == [(b"k", b"1", 0), (b"k", b"2", 0), (b"k", None, 0)]
    assert [(k, v) for k, v, _, _ in rec.downstream] == [(b"k", b"1"), (b"k", b"2"), (b"k", None)]
    assert store.get(b"k") is None
    assert budget.used == 0


def test_send_old_values_gives_the_previous_stored_value() -> None:
    rec = Recorder()
    store = cached_store(CacheBudget(10_000), rec, send_old_values=True)
    store.put(b"k", b"1")
    store.flush()
    store.put(b"k", b"2")
    store.put(b"k", b"3")
    store.flush()
    assert [(v, old) for _, v, old, _ in rec.downstream] == [(b"1", None), (b"3", b"1")]


def test_close_drops_dirty_entries_and_releases_the_budget() -> None:
    rec = Recorder()
    budget = CacheBudget(10_000)
    store = cached_store(budget, rec)
    store.put(b"k", b"1")
    store.close()
    assert rec.changelog == [] and rec.downstream == []
    assert budget.used == 0


def test_on_flush_may_write_to_the_same_store() -> None:
    rec = Recorder()
    budget = CacheBudget(10_000)
    store = cached_store(budget, rec)

    def listener(key: bytes, value: bytes | None, old: bytes | None, ts: int) -> None:
        rec.on_flush(key, value, old, ts)
        if key == b"a":
            store.put(b"derived", b"from-a")

    store._on_flush = listener
    store.put(b"a", b"1")
    store.flush()
    assert [k for k, _, _ in rec.changelog] == [b"a", b"derived"]
    assert store.dirty_count == 0 and budget.used == store.cached_bytes
    assert store.get(b"derived") == b"from-a"


def test_budget_rejects_negative_size() -> None:
    with pytest.raises(ValueError):
        CacheBudget(-1)
