"""Bounded RocksDB memory (issue 34, item 1) and the RocksDB metrics (item 3),
on real RocksDB: the options a store opens with, the config setter, the
shared cache's bound with many stores, and the figures the metrics thread reads."""

from __future__ import annotations

import os
import sys
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest
from rocksdict import Options

from runtime.config import ConfigError, StreamsConfig
from runtime.state.builders import StoreSpec, build_store
from runtime.state.rocksdb_memory import (
    MIB,
    ConfigSetterError,
    RocksDBMemory,
    RocksDBMemorySettings,
    config_setter_from_name,
    default_memory,
)
from runtime.state.rocksdb_metrics import RocksDBMetricsThread, read_figures
from runtime.state.rocksdb_store import RocksDBKeyValueStore

BASE = {"application.id": "app", "bootstrap.servers": "127.0.0.1:9092"}


# --- config keys ---------------------------------------------------------------------


def test_defaults_bound_memory() -> None:
    config = StreamsConfig.from_dict(BASE)
    assert config.state_rocksdb_memory_bytes == 256 * MIB
    assert config.state_rocksdb_write_buffer_ratio == 0.25
    assert config.state_rocksdb_config_setter is None
    assert config.state_rocksdb_statistics is False
    assert config.state_rocksdb_metrics_interval_ms == 5000


def test_keys_parse_text_as_from_env() -> None:
    config = StreamsConfig.from_dict(
        {
            **BASE,
            "state.rocksdb.memory.bytes": "67108864",
            "state.rocksdb.write.buffer.ratio": " 0.5 ",
            "state.rocksdb.statistics": "true",
        }
    )
    assert config.state_rocksdb_memory_bytes == 64 * MIB
    assert config.state_rocksdb_write_buffer_ratio == 0.5
    assert config.state_rocksdb_statistics is True


def _setter(store: str, options: Options) -> None:
    options.set_max_write_buffer_number(3)


class _SetterClass:
    def __call__(self, store: str, options: Options) -> None:
        pass


@pytest.fixture
def setter_module() -> Any:
    module = types.ModuleType("rocksdb_setter_for_tests")
    module.setter = _setter  # type: ignore[attr-defined]
    module.SetterClass = _SetterClass  # type: ignore[attr-defined]
    module.not_callable = 5  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_config_setter_resolves_functions_and_classes(setter_module: Any) -> None:
    config = StreamsConfig.from_dict(
        {**BASE, "state.rocksdb.config.setter": "rocksdb_setter_for_tests:setter"}
    )
    assert config.state_rocksdb_config_setter is _setter
    shown = config.as_display_dict()["state.rocksdb.config.setter"]
    assert shown == "rocksdb_setter_for_tests:setter"
    made = config_setter_from_name("rocksdb_setter_for_tests:SetterClass")
    assert isinstance(made, _SetterClass)
    # From code, the callable itself.
    config = StreamsConfig.from_dict({**BASE, "state.rocksdb.config.setter": _setter})
    assert config.state_rocksdb_config_setter is _setter


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ("rocksdb_setter_for_tests:missing", "has no 'missing'"),
        ("rocksdb_setter_for_tests:not_callable", "is not callable"),
        ("no_such_module_for_tests:setter", "cannot import"),
        ("just-a-name", "expected 'module:attr'"),
    ],
)
def test_a_bad_setter_fails_at_start_naming_the_key(
    setter_module: Any, value: str, says: str
) -> None:
    with pytest.raises(ConfigError) as info:
        StreamsConfig.from_dict({**BASE, "state.rocksdb.config.setter": value})
    assert info.value.key == "state.rocksdb.config.setter"
    assert says in info.value.reason


# --- the options a store opens with ---------------------------------------------------


def test_memtables_are_sized_from_the_budget() -> None:
    assert RocksDBMemorySettings().memtable_bytes == 16 * MIB  # 64 MiB / 4
    assert RocksDBMemorySettings(memory_bytes=32 * MIB).memtable_bytes == 2 * MIB
    assert RocksDBMemorySettings(memory_bytes=16 * MIB, write_buffer_ratio=0.05).memtable_bytes == (
        1 * MIB
    )
    assert RocksDBMemorySettings(memory_bytes=64 << 30).memtable_bytes == 16 * MIB


def test_a_store_opens_with_the_shared_cache_and_small_memtables(tmp_path: Path) -> None:
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=32 * MIB))
    store = RocksDBKeyValueStore("counts", tmp_path / "0_1" / "rocksdb" / "counts", memory)
    try:
        assert store.task_id == "0_1"
        props = store.rocksdb_properties(("rocksdb.block-cache-capacity",))
        assert props == {"rocksdb.block-cache-capacity": 32 * MIB}
        options = (tmp_path / "0_1" / "rocksdb" / "counts").glob("OPTIONS-*")
        text = max(options).read_text()
        assert "write_buffer_size=2097152" in text  # 32 MiB x 0.25 / 4
        assert "max_write_buffer_number=2" in text
        assert "arena_block_size=65536" in text
        assert "cache_index_and_filter_blocks=true" in text
        assert "filter_policy=bloomfilter" in text.lower().replace(":", "").replace(".", "")
        assert memory.open_stores() == [store]
    finally:
        store.close()
    assert memory.open_stores() == []
    assert store.rocksdb_properties(("rocksdb.estimate-num-keys",)) is None


def test_the_config_setter_sees_each_store(tmp_path: Path) -> None:
    seen: list[str] = []

    def setter(name: str, options: Options) -> None:
        seen.append(name)
        options.set_max_write_buffer_number(4)

    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=32 * MIB, config_setter=setter))
    for name in ("a", "b"):
        RocksDBKeyValueStore(name, tmp_path / name, memory).close()
    assert seen == ["a", "b"]
    assert "max_write_buffer_number=4" in max((tmp_path / "a").glob("OPTIONS-*")).read_text()


def test_a_failing_setter_names_the_key_and_store(tmp_path: Path) -> None:
    def setter(name: str, options: Options) -> None:
        raise KeyError("oops")

    memory = RocksDBMemory(RocksDBMemorySettings(config_setter=setter))
    with pytest.raises(ConfigSetterError, match="state.rocksdb.config.setter failed for store 'x'"):
        RocksDBKeyValueStore("x", tmp_path / "x", memory)
    assert memory.open_stores() == []


def test_stores_built_outside_an_app_share_the_process_default(tmp_path: Path) -> None:
    spec = StoreSpec("s", kind="rocksdb", changelog=False)
    built = build_store(spec, tmp_path / "0_0", "app", 0, None, None)
    try:
        assert built.rocksdb is not None
        assert built.rocksdb in default_memory().open_stores()
    finally:
        built.close()


def test_wipe_and_reopen_keep_the_store_registered(tmp_path: Path) -> None:
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=16 * MIB))
    store = RocksDBKeyValueStore("s", tmp_path / "s", memory)
    store.put(b"k", b"v")
    store.commit()
    store.wipe()
    assert memory.open_stores() == [store]
    props = store.rocksdb_properties(("rocksdb.estimate-num-keys",))
    assert props == {"rocksdb.estimate-num-keys": 0}
    store.close()
    store.close()
    assert memory.open_stores() == []


# --- the bound, on real RocksDB ------------------------------------------------------


def test_many_stores_stay_within_the_shared_budget(tmp_path: Path) -> None:
    """128 stores, each written in commits (10,000 keys of 200 bytes: 2 MB,
    256 MB in all), then read back: the shared cache, memtables included,
    never holds more than the 32 MiB budget plus what pinned entries may
    add (checked after every commit round, and on a reader thread meanwhile;
    see `over` below), and the memtables stay within their share."""
    budget = 32 * MIB
    # RocksDB's LRU cache is sharded (64 shards of 512 KiB at 32 MiB) and not
    # strict: a shard whose entries are all pinned (memtable reservations of
    # 256 KiB, blocks being read) goes over its part. Measured: alone, never
    # over; on a loaded machine 0.4% over, and once 0.7 MiB (2.2%) over in a
    # CI run with three test workers. A constant, not a share of the budget:
    # the overshoot is a few shards' pinned entries whatever the budget.
    over = MIB
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=budget, write_buffer_ratio=0.25))
    stores = [
        RocksDBKeyValueStore(f"s{i}", tmp_path / f"0_{i}" / "rocksdb" / f"s{i}", memory)
        for i in range(128)
    ]
    peaks = {"cache": 0, "memtables": 0}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            peaks["cache"] = max(peaks["cache"], memory.cache_usage())
            peaks["memtables"] = max(peaks["memtables"], memory.write_buffer_usage())
            time.sleep(0.001)

    watcher = threading.Thread(target=watch)
    watcher.start()
    value = os.urandom(200)
    try:
        for round_ in range(10):
            for store in stores:
                for k in range(1000):
                    store.put((round_ * 1000 + k).to_bytes(8, "big"), value)
                store.commit()
            assert memory.cache_usage() <= budget + over
        for store in stores:
            for k in range(0, 10_000, 7):
                assert store.get(k.to_bytes(8, "big")) == value
        assert memory.cache_usage() <= budget + over
        figures = read_figures(memory)
    finally:
        stop.set()
        watcher.join()
        for store in stores:
            store.close()
    assert 0 < peaks["cache"] <= budget + over, peaks
    assert memory.forced_flushes > 0
    # The write-buffer manager flushes past 90% of its share; one memtable
    # being filled may overshoot it briefly by its arena blocks.
    assert peaks["memtables"] <= budget * 0.25 * 1.25, peaks
    assert len(figures.stores) == 128
    assert sum(s.estimated_keys for s in figures.stores) >= 128 * 9_000
    assert figures.block_cache_usage_bytes <= figures.memory_bytes + over
    assert figures.memory_bytes == budget


def test_a_stall_that_flushing_cannot_end_gives_up_and_is_not_repeated(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A setter whose memtables hold memory from their start (a memtable Bloom
    filter of 10% of 64 MiB) puts four empty stores over a 16 MiB share,
    which no flush can lower. Before the fix each store's commit waited the
    whole stall limit (four one-key commits: 20 s); now the first commit
    waits until the usage has not gone down for the no-progress time, and
    no commit waits again within the back-off."""
    monkeypatch.setattr("runtime.state.rocksdb_memory.STALL_NO_PROGRESS_S", 0.3)

    def bloom_setter(_name: str, options: Options) -> None:
        options.set_write_buffer_size(64 * MIB)
        options.set_memtable_prefix_bloom_ratio(0.1)
        options.set_memtable_whole_key_filtering(True)

    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=64 * MIB, config_setter=bloom_setter))
    stores = [
        RocksDBKeyValueStore(f"s{i}", tmp_path / f"s{i}", memory, task_id=f"0_{i}")
        for i in range(4)
    ]
    try:
        assert memory.write_buffer_usage() > memory.settings.write_buffer_bytes
        started = time.monotonic()
        for round_ in range(3):
            for store in stores:
                store.put(b"k%d" % round_, b"v")
                store.commit()
        took = time.monotonic() - started
        assert memory.stalls_without_progress == 1
        assert memory.stalls == 1
        assert took < 3.0, took  # one short stall, not twelve of 5 s
        # What /metrics and `admin status` read (the metrics thread's figures).
        assert read_figures(memory).as_dict()["stalls_without_progress"] == 1
        for store in stores:
            assert store.get(b"k2") == b"v"
    finally:
        for store in stores:
            store.close()


def test_a_stall_that_flushes_end_waits_for_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The give-up needs no progress: usage that goes down keeps the stall
    waiting (a fake usage falling by 16 KiB per reading from 1 MiB over:
    about 64 readings 2 ms apart, far longer than the no-progress time)."""
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=64 * MIB))
    share = memory.settings.write_buffer_bytes
    readings = iter(range(share + MIB, 0, -16 * 1024))
    monkeypatch.setattr(memory, "write_buffer_usage", lambda: next(readings))
    monkeypatch.setattr("runtime.state.rocksdb_memory.STALL_NO_PROGRESS_S", 0.01)
    started = time.monotonic()
    memory._stall(share)
    assert time.monotonic() - started > 0.05
    assert memory.stalls == 1 and memory.stalls_without_progress == 0


# --- the metrics thread -------------------------------------------------------------


def test_figures_of_open_stores(tmp_path: Path) -> None:
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=16 * MIB, statistics=True))
    a = RocksDBKeyValueStore("a", tmp_path / "0_0" / "rocksdb" / "a", memory)
    b = RocksDBKeyValueStore("b", tmp_path / "1_0" / "rocksdb" / "b", memory)
    for k in range(500):
        a.put(k.to_bytes(4, "big"), b"x" * 100)
    a.commit()
    a.get(b"\x00\x00\x00\x01")
    figures = read_figures(memory, now=123.0)
    b.close()
    a.close()
    by_store = {(s.task, s.store): s for s in figures.stores}
    assert set(by_store) == {("0_0", "a"), ("1_0", "b")}
    fa = by_store[("0_0", "a")]
    assert fa.estimated_keys == 500
    assert fa.memtable_bytes > 50_000
    assert fa.write_stopped == 0 and fa.delayed_write_rate == 0
    assert fa.writes == 1 and fa.gets is not None and fa.gets >= 1
    assert figures.write_buffer_usage_bytes >= fa.memtable_bytes
    assert figures.block_cache_usage_bytes >= figures.write_buffer_usage_bytes
    data = figures.as_dict()
    assert data["read_at"] == 123.0 and data["write_stalls"] == 0
    assert data["memory_bytes"] == 16 * MIB
    assert {s["store"] for s in data["stores"]} == {"a", "b"}


def test_statistics_off_leaves_latency_out(tmp_path: Path) -> None:
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=16 * MIB))
    store = RocksDBKeyValueStore("a", tmp_path / "a", memory)
    (figures,) = read_figures(memory).stores
    store.close()
    assert figures.gets is None and figures.write_seconds is None
    assert "gets" not in read_figures(memory).as_dict()


def test_the_metrics_thread_reads_at_its_interval_and_stops(tmp_path: Path) -> None:
    memory = RocksDBMemory(RocksDBMemorySettings(memory_bytes=16 * MIB))
    store = RocksDBKeyValueStore("a", tmp_path / "a", memory)
    thread = RocksDBMetricsThread("rocksdb-metrics-test", memory, 0.02)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while thread.reads < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread.reads >= 3
        assert thread.figures is not None and len(thread.figures.stores) == 1
        store.close()  # a store closing under the reader is simply left out
        deadline = time.monotonic() + 10
        while thread.figures.stores and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread.figures.stores == ()
    finally:
        thread.request_stop()
        thread.join(5)
    assert not thread.is_alive()
