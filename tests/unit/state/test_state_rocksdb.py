"""RocksDB store: writes reach disk only at commit, atomically; restoration; iteration."""

from __future__ import annotations

from pathlib import Path

from rocksdict import AccessType, Options, Rdict

from runtime.state.rocksdb_store import RocksDBKeyValueStore


def disk_contents(path: Path) -> dict[bytes, bytes]:
    """What a fresh reader of the database directory sees (read-only, no lock)."""
    options = Options(raw_mode=True)
    db = Rdict(str(path), options, access_type=AccessType.read_only())
    try:
        return dict(db.items())
    finally:
        db.close()


def test_nothing_on_disk_before_commit(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksDBKeyValueStore("s", path)
    store.put(b"k", b"v")
    assert store.get(b"k") == b"v"  # read-your-writes
    assert disk_contents(path) == {}
    assert store.commit() == 1
    assert disk_contents(path) == {b"k": b"v"}
    store.delete(b"k")
    assert store.get(b"k") is None
    assert disk_contents(path) == {b"k": b"v"}
    store.flush()
    assert disk_contents(path) == {}
    store.close()


def test_crash_loses_exactly_the_uncommitted_writes(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksDBKeyValueStore("s", path)
    store.put(b"a", b"1")
    store.put(b"b", b"1")
    store.commit()
    store.put(b"a", b"2")  # overwrite
    store.delete(b"b")  # delete
    store.put(b"c", b"2")  # new key
    store.close()  # no commit: as a crash

    reopened = RocksDBKeyValueStore("s", path)
    assert list(reopened.all()) == [(b"a", b"1"), (b"b", b"1")]
    reopened.close()


def test_commit_with_nothing_pending_is_a_no_op(tmp_path: Path) -> None:
    store = RocksDBKeyValueStore("s", tmp_path / "db")
    assert store.commit() == 0
    store.put(b"a", b"1")
    store.put(b"a", b"2")
    assert store.pending_writes == 1
    assert store.commit() == 1
    assert store.pending_writes == 0
    store.close()


def test_restore_batch_applies_directly_and_pending_writes_stay_on_top(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksDBKeyValueStore("s", path)
    store.put(b"p", b"pending")
    assert store.restore_batch([(b"a", b"1"), (b"b", b"2"), (b"a", None), (b"p", b"old")]) == 4
    assert disk_contents(path) == {b"b": b"2", b"p": b"old"}
    assert store.get(b"p") == b"pending"
    assert list(store.all()) == [(b"b", b"2"), (b"p", b"pending")]
    store.close()


def test_range_over_many_chunks_merges_pending_writes(tmp_path: Path) -> None:
    store = RocksDBKeyValueStore("s", tmp_path / "db")
    expected = {}
    for i in range(0, 5000, 2):
        key = i.to_bytes(4, "big")
        store.put(key, b"d")
        expected[key] = b"d"
    store.commit()
    for i in range(1, 5000, 10):  # new keys interleaved
        key = i.to_bytes(4, "big")
        store.put(key, b"p")
        expected[key] = b"p"
    for i in range(0, 5000, 6):  # deletes of committed keys
        key = i.to_bytes(4, "big")
        store.delete(key)
        expected.pop(key)
    assert list(store.all()) == sorted(expected.items())
    lo, hi = (1000).to_bytes(4, "big"), (3999).to_bytes(4, "big")
    assert list(store.range(lo, hi)) == sorted((k, v) for k, v in expected.items() if lo <= k <= hi)
    assert store.approximate_num_entries() > 0
    store.close()


def test_partly_consumed_iterator_does_not_keep_the_database_open(tmp_path: Path) -> None:
    path = tmp_path / "db"
    store = RocksDBKeyValueStore("s", path)
    for i in range(3000):
        store.put(i.to_bytes(4, "big"), b"v")
    store.commit()
    iterator = store.all()
    next(iterator)
    store.close()
    reopened = RocksDBKeyValueStore("s", path)  # would fail on the LOCK file
    assert reopened.get((5).to_bytes(4, "big")) == b"v"
    reopened.close()
    del iterator
