"""The caching layer holding values as objects (`use_values`, `get_value`, `put_value`)."""

from __future__ import annotations

import pytest

from runtime.state.builders import StoreSpec, build_store
from runtime.state.cache import UNSET, CachingKeyValueStore, entry_size
from runtime.state.cache_budget import CacheBudget
from runtime.state.changelog import ChangeLoggingKeyValueStore
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.state.metered import CacheMeteredKeyValueStore
from runtime.topology import serdes
from runtime.topology.record import Headers


def b8(n: int) -> bytes:
    return n.to_bytes(8, "big", signed=True)


class Recorder:
    def __init__(self) -> None:
        self.changelog: list[tuple[bytes | None, bytes | None, int]] = []
        self.downstream: list[tuple[bytes, bytes | None, object]] = []
        self.store: CachingKeyValueStore | None = None

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
        assert self.store is not None
        self.downstream.append((key, value, self.store.emitting))


def make(budget: int, serde: object = serdes.INT64) -> tuple[CachingKeyValueStore, Recorder]:
    rec = Recorder()
    now = iter(range(1, 10**6))
    logged = ChangeLoggingKeyValueStore(
        InMemoryKeyValueStore("s"), rec.send, "app-s-changelog", 0, lambda: 0
    )
    store = CachingKeyValueStore(logged, CacheBudget(budget), rec.on_flush, lambda: next(now))
    assert store.use_values(serde)
    rec.store = store
    return store, rec


def test_counts_fold_as_objects_and_serialize_once_at_flush() -> None:
    store, rec = make(10_000)
    for _ in range(5):
        old = store.get_value(b"k")
        store.put_value(b"k", 1 if old is None else old + 1)
    store.put_value(b"j", 7)
    assert store.get_value(b"k") == 5
    assert rec.changelog == []
    store.flush_cache()
    # Order of last write; one record per key; the listener sees the object.
    assert rec.changelog == [(b"k", b8(5), 5), (b"j", b8(7), 6)]
    assert rec.downstream == [(b"k", b8(5), 5), (b"j", b8(7), 7)]
    assert store.dirty_count == 0  # emitted; kept as clean entries
    assert store.get_value(b"k") == 5
    assert store.inner.get(b"k") == b8(5)  # and written to the inner store


def test_charge_is_the_serialized_size_and_the_budget_holds() -> None:
    store, _ = make(10_000)
    store.put_value(b"k", 1)
    store.put_value(b"k", 2**40)
    assert store.cached_bytes == entry_size(b"k", b8(0))
    budget = store._budget
    assert budget.used == store.cached_bytes


def test_eviction_emits_the_serialized_object_early() -> None:
    size = entry_size(b"a", b8(0))
    store, rec = make(2 * size)
    store.put_value(b"a", 1)
    store.put_value(b"b", 2)
    assert rec.changelog == []
    store.put_value(b"c", 3)  # over the budget: evicts a (LRU)
    assert [(k, v) for k, v, _ in rec.changelog] == [(b"a", b8(1))]
    assert rec.downstream[0][2] == 1
    assert store._budget.used <= 2 * size


def test_byte_reads_and_range_see_unflushed_objects() -> None:
    store, _ = make(10_000)
    store.put(b"a", b8(1))
    store.put_value(b"b", 2)
    store.put_value(b"c", 3)
    store.put_value(b"c", None)  # delete
    assert store.get(b"b") == b8(2)
    assert list(store.range(None, None)) == [(b"a", b8(1)), (b"b", b8(2))]
    assert store.get_value(b"a") == 1
    assert store.get_value(b"c") is None


def test_a_serde_without_fixed_size_serializes_at_put() -> None:
    store, rec = make(10_000, serdes.STRING)
    store.put_value(b"k", "x")
    with pytest.raises(TypeError):
        store.put_value(b"k", 5)  # the error belongs to the write that caused it
    assert store.get_value(b"k") == "x"
    store.flush_cache()
    assert rec.downstream == [(b"k", b"x", UNSET)]


def test_values_int64_does_not_hold_cannot_be_deferred() -> None:
    store, _ = make(10_000)
    with pytest.raises(TypeError):
        store.put_value(b"k", "not an int")
    with pytest.raises(Exception):  # noqa: B017 (struct.error)
        store.put_value(b"k", 2**64)


def test_binding_another_serde_is_refused() -> None:
    store, _ = make(10_000)
    assert store.use_values(serdes.INT64)
    with pytest.raises(ValueError):
        store.use_values(serdes.STRING)


def test_pass_through_writes_objects_at_once() -> None:
    store, rec = make(0)
    store.put_value(b"k", 3)
    assert rec.changelog == [(b"k", b8(3), 1)]
    assert rec.downstream == [(b"k", b8(3), 3)]


def test_metered_layer_over_a_cache_adds_no_call_and_counts_right(tmp_path: object) -> None:
    built = build_store(
        StoreSpec("s", kind="memory", changelog=False),
        str(tmp_path),
        "app",
        0,
        CacheBudget(10_000),
        None,
    )
    metered = built.metered
    assert isinstance(metered, CacheMeteredKeyValueStore)
    assert metered.get == built.cache.get  # type: ignore[union-attr]
    metered.put(b"a", b"1")
    metered.delete(b"a")
    metered.get(b"a")
    metered.use_values(serdes.INT64)  # type: ignore[attr-defined]
    metered.put_value(b"b", 1)  # type: ignore[attr-defined]
    metered.get_value(b"b")  # type: ignore[attr-defined]
    figures = built.metrics()
    assert (figures["gets"], figures["puts"], figures["deletes"]) == (2, 2, 1)
