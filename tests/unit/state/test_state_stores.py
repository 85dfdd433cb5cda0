"""The key-value store contract, for every store kind and with the layers on top."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.state.cache import CachingKeyValueStore
from runtime.state.cache_budget import CacheBudget
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.state.metered import metered
from runtime.state.rocksdb_store import RocksDBKeyValueStore
from runtime.state.store import KeyValueStore, ReadOnlyKeyValueStore, SortedKeys, StoreClosedError


@pytest.fixture(params=["rocksdb", "memory", "cached-rocksdb", "metered-memory"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KeyValueStore]:
    kind = request.param
    s: KeyValueStore
    if kind == "rocksdb":
        s = RocksDBKeyValueStore("s", tmp_path / "s")
    elif kind == "memory":
        s = InMemoryKeyValueStore("s")
    elif kind == "cached-rocksdb":
        s = CachingKeyValueStore(RocksDBKeyValueStore("s", tmp_path / "s"), CacheBudget(10_000))
    else:
        s = metered(InMemoryKeyValueStore("s"))
    yield s
    s.close()


def test_put_get_delete(store: KeyValueStore) -> None:
    assert store.get(b"a") is None
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    store.put(b"a", b"3")
    assert store.get(b"a") == b"3"
    assert store.get(b"b") == b"2"
    store.delete(b"a")
    store.delete(b"missing")
    assert store.get(b"a") is None
    assert store.name == "s"


def test_put_none_is_refused(store: KeyValueStore) -> None:
    with pytest.raises(ValueError):
        store.put(b"a", None)  # type: ignore[arg-type]


def test_range_is_inclusive_and_ordered_before_and_after_flush(store: KeyValueStore) -> None:
    for k in [b"d", b"a", b"c", b"b", b"e", b"\xff", b"\x00"]:
        store.put(k, k * 2)
    store.delete(b"c")

    def check() -> None:
        assert [k for k, _ in store.range(b"b", b"d")] == [b"b", b"d"]
        assert list(store.range(b"a", b"a")) == [(b"a", b"aa")]
        assert [k for k, _ in store.range(None, b"b")] == [b"\x00", b"a", b"b"]
        assert [k for k, _ in store.range(b"e", None)] == [b"e", b"\xff"]
        assert [k for k, _ in store.all()] == [b"\x00", b"a", b"b", b"d", b"e", b"\xff"]
        assert list(store.range(b"x", b"y")) == []

    check()
    store.flush()
    check()
    # Writes after the flush are merged into what is already stored.
    store.put(b"c", b"new")
    store.delete(b"d")
    store.put(b"bb", b"x")
    assert [k for k, _ in store.range(b"b", b"d")] == [b"b", b"bb", b"c"]
    assert store.get(b"c") == b"new"
    assert store.approximate_num_entries() >= 1


def test_iterator_snapshots_writes_made_before_it(store: KeyValueStore) -> None:
    store.put(b"a", b"1")
    store.put(b"b", b"2")
    iterator = store.all()
    store.put(b"c", b"3")
    store.delete(b"a")
    assert [k for k, _ in iterator] == [b"a", b"b"]


def test_closed_store_refuses_use(tmp_path: Path) -> None:
    for s in (RocksDBKeyValueStore("s", tmp_path / "s"), InMemoryKeyValueStore("m")):
        s.close()
        with pytest.raises(StoreClosedError):
            s.get(b"a")


def test_read_only_view(tmp_path: Path) -> None:
    s = InMemoryKeyValueStore("m")
    s.put(b"k", b"v")
    view = ReadOnlyKeyValueStore(s)
    assert view.get(b"k") == b"v"
    assert list(view.all()) == [(b"k", b"v")]
    assert list(view.range(b"a", b"z")) == [(b"k", b"v")]
    assert view.approximate_num_entries() == 1
    assert not hasattr(view, "put")


def test_sorted_keys_add_discard_readd() -> None:
    keys = SortedKeys([b"b"])
    keys.add(b"a")
    keys.add(b"c")
    keys.discard(b"b")
    assert keys.between(None, None) == [b"a", b"c"]
    keys.add(b"b")
    keys.discard(b"c")
    keys.add(b"c")
    keys.discard(b"a")
    assert keys.between(None, None) == [b"b", b"c"]
    assert keys.between(b"bb", b"z") == [b"c"]
    keys.add(b"a")
    assert keys.between(b"a", b"b") == [b"a", b"b"]
