"""Windowed store: composite key layout, ordering, fetch ranges, expiry."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.state.rocksdb_store import RocksDBKeyValueStore
from runtime.state.windowed_store import (
    ReadOnlyWindowStore,
    WindowStore,
    split_window_key,
    window_key,
)


@pytest.fixture
def windows(tmp_path: Path) -> Iterator[WindowStore]:
    store = WindowStore(
        RocksDBKeyValueStore("w", tmp_path / "w"), window_size_ms=10, retention_ms=100
    )
    yield store
    store.close()


def test_window_key_layout() -> None:
    composite = window_key(b"key", 0x0102)
    assert composite == b"key" + b"\x00" * 6 + b"\x01\x02"
    assert split_window_key(composite) == (b"key", 0x0102)
    assert window_key(b"k", 255) < window_key(b"k", 256)  # big-endian keeps time order
    with pytest.raises(ValueError):
        window_key(b"k", -1)


def test_fetch_is_ordered_by_start_and_inclusive(windows: WindowStore) -> None:
    for start in (30, 0, 20, 10, 1000):
        windows.put(b"a", start, b"a%d" % start)
    windows.put(b"b", 10, b"b10")
    assert list(windows.fetch(b"a", 10, 30)) == [(10, b"a10"), (20, b"a20"), (30, b"a30")]
    assert list(windows.fetch(b"a", 0, 1_000_000)) == [
        (0, b"a0"),
        (10, b"a10"),
        (20, b"a20"),
        (30, b"a30"),
        (1000, b"a1000"),
    ]
    assert list(windows.fetch(b"a", 11, 19)) == []
    assert list(windows.fetch(b"a", 30, 10)) == []
    assert windows.get(b"a", 20) == b"a20"
    assert windows.get(b"a", 21) is None
    windows.flush()
    assert list(windows.fetch(b"b", 0, 100)) == [(10, b"b10")]


def test_fetch_ignores_keys_that_extend_the_fetched_key(windows: WindowStore) -> None:
    # b"a" + start bytes can sort between b"a"'s windows when a key starts with b"a\x00".
    windows.put(b"a", 5, b"mine")
    windows.put(b"a\x00", 1, b"other")
    windows.put(b"a" + b"\x00" * 8, 0, b"other2")
    windows.put(b"", 7, b"empty-key")
    assert list(windows.fetch(b"a", 0, 2**63)) == [(5, b"mine")]
    assert list(windows.fetch(b"", 0, 100)) == [(7, b"empty-key")]


def test_fetch_all_orders_by_key_then_start(windows: WindowStore) -> None:
    windows.put(b"b", 20, b"1")
    windows.put(b"a", 30, b"2")
    windows.put(b"a", 10, b"3")
    windows.put(b"c", 50, b"4")
    assert list(windows.fetch_all(10, 30)) == [(b"a", 10, b"3"), (b"a", 30, b"2"), (b"b", 20, b"1")]
    assert [k for k, _, _ in windows.all()] == [b"a", b"a", b"b", b"c"]


def test_put_none_deletes_a_window(windows: WindowStore) -> None:
    windows.put(b"a", 10, b"x")
    windows.put(b"a", 10, None)
    assert windows.get(b"a", 10) is None


def test_expire_drops_windows_before_the_bound(tmp_path: Path) -> None:
    base = RocksDBKeyValueStore("w", tmp_path / "w")
    windows = WindowStore(base, window_size_ms=10, retention_ms=50)
    for start in range(0, 100, 10):
        windows.put(b"k", start, b"v")
        windows.put(b"j", start, b"v")
    windows.flush()
    assert windows.expire(40) == 8  # 0, 10, 20, 30 of two keys
    assert [s for s, _ in windows.fetch(b"k", 0, 1000)] == [40, 50, 60, 70, 80, 90]
    assert windows.expire(40) == 0
    assert windows.expire(45) == 2  # the windows starting at 40
    scans = []
    real_all = base.all
    base.all = lambda: (scans.append(1), real_all())[1]  # type: ignore[method-assign]
    assert windows.expire(50) == 0  # the earliest start is 50: no scan needed
    assert scans == []
    windows.put(b"k", 100, b"v")
    assert windows.expire(60) == 2
    assert scans == [1]
    windows.flush()
    windows.close()
    reopened = RocksDBKeyValueStore("w", tmp_path / "w")
    assert sorted({split_window_key(k)[1] for k, _ in reopened.all()}) == [60, 70, 80, 90, 100]
    reopened.close()


def test_reads_never_show_expired_windows(tmp_path: Path) -> None:
    windows = WindowStore(InMemoryKeyValueStore("w"), window_size_ms=10, retention_ms=10)
    windows.put(b"k", 0, b"old")
    windows.put(b"k", 20, b"new")
    windows.expire(10)
    assert windows.get(b"k", 0) is None
    assert list(windows.fetch(b"k", 0, 100)) == [(20, b"new")]
    assert list(windows.fetch_all(0, 100)) == [(b"k", 20, b"new")]
    assert windows.expired_count == 1


def test_window_settings_are_validated(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        WindowStore(InMemoryKeyValueStore("w"), window_size_ms=0, retention_ms=10)
    with pytest.raises(ValueError):
        WindowStore(InMemoryKeyValueStore("w"), window_size_ms=10, retention_ms=5)


def test_read_only_window_view(windows: WindowStore) -> None:
    windows.put(b"a", 10, b"x")
    view = ReadOnlyWindowStore(windows)
    assert view.name == "w"
    assert view.get(b"a", 10) == b"x"
    assert list(view.fetch(b"a", 0, 10)) == [(10, b"x")]
    assert list(view.fetch_all(0, 10)) == [(b"a", 10, b"x")]
    assert list(view.all()) == [(b"a", 10, b"x")]
