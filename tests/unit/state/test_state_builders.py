"""build_store: the layers, paths, commit, restoration and checkpoint offsets."""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime.state.builders import (
    LayeredStore,
    StoreSpec,
    build_store,
    build_task_stores,
    rocksdb_path,
    task_checkpoint_offsets,
    task_directory,
)
from runtime.state.cache_budget import CacheBudget
from runtime.state.checkpoint import checkpoint_path, read_checkpoint, write_checkpoint
from runtime.state.metered import TimedMeteredKeyValueStore
from runtime.state.rocksdb_store import RocksDBKeyValueStore
from runtime.state.store import ReadOnlyKeyValueStore
from runtime.state.windowed_store import (
    ReadOnlyWindowStore,
    WindowStore,
    split_window_key,
    window_key,
)
from runtime.topology.record import Headers


class Task:
    """Stands in for the task: `send` collects output, `on_flush` downstream updates."""

    def __init__(self) -> None:
        self.output: list[tuple[str, bytes | None, bytes | None, int, int | None]] = []
        self.updates: list[tuple[bytes, bytes | None]] = []
        self.now = 1000

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        self.output.append((topic, key, value, timestamp, partition))

    def on_flush(self, key: bytes, value: bytes | None, old: bytes | None, timestamp: int) -> None:
        self.updates.append((key, value))

    def clock(self) -> int:
        return self.now


def build(
    spec: StoreSpec, task_dir: Path, task: Task, budget: CacheBudget | None = None
) -> LayeredStore:
    return build_store(
        spec,
        task_dir,
        "app",
        2,
        budget if budget is not None else CacheBudget(1_000_000),
        task.send,
        task.on_flush,
        task.clock,
    )


def test_spec_validation() -> None:
    StoreSpec("ok")
    StoreSpec("w", kind="window", window_size_ms=10, retention_ms=10)
    for bad in (
        dict(name=""),
        dict(name="a/b"),
        dict(name="x", kind="lsm"),
        dict(name="w", kind="window"),
        dict(name="w", kind="window", window_size_ms=10, retention_ms=5),
        dict(name="kv", window_size_ms=10),
    ):
        with pytest.raises(ValueError):
            StoreSpec(**bad)  # type: ignore[arg-type]


def test_rocksdb_store_layers_commit_and_checkpoint(tmp_path: Path) -> None:
    task_dir = task_directory(tmp_path, "app", "0_2")
    assert task_dir == tmp_path / "app" / "0_2"
    task = Task()
    built = build(StoreSpec("counts"), task_dir, task)
    assert built.persistent and built.changelog_topic == "app-counts-changelog"
    store = built.store
    assert not isinstance(store, WindowStore)
    store.put(b"k", b"1")
    store.put(b"k", b"2")
    assert store.get(b"k") == b"2"
    assert task.output == [] and task.updates == []
    built.flush()
    assert task.output == [("app-counts-changelog", b"k", b"2", 1000, 2)]
    assert task.updates == [(b"k", b"2")]
    assert rocksdb_path(task_dir, "counts").is_dir()
    # The runtime hands back the changelog position after the producer flush.
    assert built.checkpoint_offsets() == {}
    built.update_changelog_offset(1)
    offsets = task_checkpoint_offsets([built])
    assert offsets == {("app-counts-changelog", 2): 1}
    write_checkpoint(checkpoint_path(task_dir), offsets)
    store.put(b"k", b"3")  # not committed
    built.close()

    again = build(StoreSpec("counts"), task_dir, Task())
    assert again.apply_checkpoint(read_checkpoint(checkpoint_path(task_dir))) == 1
    assert again.checkpoint_offsets() == offsets
    assert again.store.get(b"k") == b"2"  # the uncommitted 3 is gone
    again.close()


def test_restore_bypasses_changelog_and_downstream(tmp_path: Path) -> None:
    task = Task()
    built = build(StoreSpec("counts"), tmp_path, task)
    assert built.apply_checkpoint(None) is None
    assert built.restore_batch([(b"a", b"1"), (b"b", b"2"), (b"b", None)], next_offset=3) == 3
    assert task.output == [] and task.updates == []
    assert built.checkpoint_offsets() == {("app-counts-changelog", 2): 3}
    assert list(built.store.all()) == [(b"a", b"1")]
    built.sync()
    built.close()


def test_memory_store_is_logged_but_never_checkpointed(tmp_path: Path) -> None:
    task = Task()
    built = build(StoreSpec("mem", kind="memory"), tmp_path, task)
    assert not built.persistent
    built.store.put(b"k", b"v")
    built.flush()
    assert task.output == [("app-mem-changelog", b"k", b"v", 1000, 2)]
    built.update_changelog_offset(1)
    assert built.checkpoint_offsets() == {}
    assert built.apply_checkpoint({("app-mem-changelog", 2): 1}) is None
    assert not (tmp_path / "rocksdb").exists()
    built.close()


def test_no_changelog_no_cache_no_listener_is_just_metered(tmp_path: Path) -> None:
    built = build_store(
        StoreSpec("plain", changelog=False, caching=False), tmp_path, "app", 0, None, None
    )
    assert built.changelog is None and built.cache is None
    assert built.metered.inner is built.base
    built.store.put(b"k", b"v")
    built.flush()
    assert built.checkpoint_offsets() == {}
    assert built.metrics()["puts"] == 1
    built.close()


def test_caching_off_forwards_every_write(tmp_path: Path) -> None:
    task = Task()
    built = build(StoreSpec("counts"), tmp_path, task, budget=CacheBudget(0))
    built.store.put(b"k", b"1")
    built.store.put(b"k", b"2")
    assert [v for _, _, v, _, _ in task.output] == [b"1", b"2"]
    assert task.updates == [(b"k", b"1"), (b"k", b"2")]
    built.flush()
    built.close()


def test_logged_store_without_sink_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError):
        build_store(StoreSpec("s"), tmp_path, "app", 0, None, None)
    # The database was closed again: it can be opened.
    RocksDBKeyValueStore("s", rocksdb_path(tmp_path, "s")).close()


def test_window_store_through_the_layers(tmp_path: Path) -> None:
    task = Task()
    spec = StoreSpec("win", kind="window", window_size_ms=10, retention_ms=30)
    built = build(spec, tmp_path, task)
    windows = built.store
    assert isinstance(windows, WindowStore)
    windows.gc_slack_ms = 0  # physical deletion at every bound, as the assertions below expect
    windows.put(b"k", 0, b"a")
    windows.put(b"k", 0, b"b")
    windows.put(b"k", 10, b"c")
    built.flush()
    assert [(split_window_key(k), v) for _, k, v, _, _ in task.output if k is not None] == [
        ((b"k", 0), b"b"),
        ((b"k", 10), b"c"),
    ]
    # An expired window written in this commit interval is still emitted at the
    # flush (its last update), never read back, and removed by the next expiry.
    windows.put(b"k", 5, b"late-update")
    windows.put(b"k", 40, b"d")
    assert windows.expire(20) == 2  # starts 0 and 10 (on disk); 5 is still in the cache
    assert list(windows.fetch(b"k", 0, 100)) == [(40, b"d")]
    built.flush()
    assert task.updates[-2:] == [
        (window_key(b"k", 5), b"late-update"),
        (window_key(b"k", 40), b"d"),
    ]
    assert windows.get(b"k", 5) is None
    assert windows.expire(21) == 1
    assert [split_window_key(k) for k, _ in built.base.all()] == [(b"k", 40)]
    assert isinstance(built.read_only(), ReadOnlyWindowStore)
    built.close()


def test_build_task_stores_and_read_only_views(tmp_path: Path) -> None:
    task = Task()
    stores = build_task_stores(
        [StoreSpec("a"), StoreSpec("b", kind="memory", timed_metrics=True)],
        tmp_path,
        "app",
        2,
        CacheBudget(1000),
        task.send,
        lambda name: task.on_flush if name == "a" else None,
        task.clock,
    )
    assert set(stores) == {"a", "b"}
    assert isinstance(stores["b"].metered, TimedMeteredKeyValueStore)
    stores["b"].store.put(b"k", b"v")
    assert stores["b"].metrics()["put_ns_total"] > 0
    view = stores["a"].read_only()
    assert isinstance(view, ReadOnlyKeyValueStore)
    for built in stores.values():
        built.flush()
        built.close()


def test_build_task_stores_closes_what_it_opened_on_failure(tmp_path: Path) -> None:
    task = Task()
    with pytest.raises(ValueError):
        build_task_stores([StoreSpec("a"), StoreSpec("a")], tmp_path, "app", 0, None, task.send)
    RocksDBKeyValueStore("a", rocksdb_path(tmp_path, "a")).close()


def test_expiry_scans_once_per_window_not_per_record_between_commits(tmp_path: Path) -> None:
    """A backlog whose commit interval spans more event time than the retention:
    records expire windows written since the last flush (still in the cache).
    The store is scanned when the bound passes a window start, not on every
    record (before the fix: once per record, a whole-store scan each)."""
    task = Task()
    spec = StoreSpec("win", kind="window", window_size_ms=100, retention_ms=100)
    built = build(spec, tmp_path, task)
    windows = built.store
    assert isinstance(windows, WindowStore)
    windows.gc_slack_ms = 0  # physical deletion at every bound, as the assertions below expect
    for start in range(0, 1000, 100):  # a flushed history: 10 windows
        windows.put(b"k", start, b"old")
    built.flush()
    scans: list[int] = []
    real_all = built.base.all
    built.base.all = lambda: (scans.append(1), real_all())[1]  # type: ignore[method-assign]
    for time in range(1000, 3000):  # one record per ms, no flush in between
        windows.put(b"k", time - time % 100, b"new")
        windows.expire(time - 100)
    assert len(scans) <= 21, len(scans)  # 20 window starts crossed, not 2,000 records
    built.flush()
    windows.expire(2900)
    assert [split_window_key(k)[1] for k, _ in built.base.all()] == [2900]
    built.close()


def test_expired_windows_are_hidden_at_once_and_deleted_a_slack_later(tmp_path: Path) -> None:
    """Reads hide a window as soon as the bound passes it; the scan that frees
    its space runs only once the bound passed the earliest start by the slack
    (Kafka Streams' segment interval), so a store whose earliest start moves
    with every record is not scanned whole per record."""
    base = RocksDBKeyValueStore("w", tmp_path / "w")
    windows = WindowStore(base, 10, 100, gc_slack_ms=50)
    try:
        for start in range(0, 100, 10):
            windows.put(b"k", start, b"v")
        windows.flush()
        assert windows.expire(1) == 1  # the earliest start is not known yet: a full scan
        assert windows.expire(35) == 0  # 35 <= earliest (10) + 50: no scan
        assert windows.get(b"k", 30) is None  # ... yet hidden
        assert [start for start, _ in windows.fetch(b"k", 0, 100)] == [40, 50, 60, 70, 80, 90]
        assert windows.expire(61) == 6  # past 10 + 50: one scan deletes 10..60
        assert windows.expired_count == 7
        assert [start for start, _ in windows.fetch(b"k", 0, 100)] == [70, 80, 90]
    finally:
        windows.close()
