"""The consolidated layout on real RocksDB: a column family per store name
with the tasks' keys under their prefixes, one commit batch with the
positions, restore batches with their position, wipe, cleanup of a task's
state, the upgrade from per-task directories and from the layout's first
version (a column family per task-store), the figures per column family."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from runtime.config import ConfigError, StreamsConfig
from runtime.state.builders import LayeredStore, StoreSpec, build_task_stores, rocksdb_path
from runtime.state.checkpoint import checkpoint_path, read_checkpoint, write_checkpoint
from runtime.state.cleanup import CleanupThread
from runtime.state.column_family_store import ColumnFamilyStore
from runtime.state.consolidated import ConsolidatedStores, consolidated_directory
from runtime.state.consolidated_families import (
    is_legacy_family,
    prefix_end,
    store_family_name,
    store_of_family,
    task_prefix,
)
from runtime.state.rocksdb_store import RocksDBKeyValueStore

TOPIC = "app-counts-changelog"


def _sink(*_args: object, **_kwargs: object) -> None:
    return None


def _open(db_dir: Path, task_dir: Path, stores: ConsolidatedStores) -> dict[str, LayeredStore]:
    return build_task_stores(
        [StoreSpec("counts", caching=False), StoreSpec("mem", kind="memory", changelog=False)],
        task_dir,
        "app",
        0,
        None,
        _sink,
        consolidated=stores,
    )


def _close(built: dict[str, LayeredStore]) -> None:
    for store in built.values():
        store.close()


def test_directory_names() -> None:
    assert consolidated_directory("/s", "app") == Path("/s/app/consolidated")
    assert consolidated_directory("/s", "app", 3) == Path("/s/app/consolidated-p3")


def test_one_batch_holds_every_task_and_its_positions(tmp_path: Path) -> None:
    db_dir = tmp_path / "app" / "consolidated"
    stores = ConsolidatedStores(db_dir)
    a = _open(db_dir, tmp_path / "app" / "0_0", stores)
    b = _open(db_dir, tmp_path / "app" / "0_1", stores)
    assert isinstance(a["counts"].base, ColumnFamilyStore)
    a["counts"].store.put(b"k", b"1")
    b["counts"].store.put(b"j", b"2")
    a["counts"].flush()
    b["counts"].flush()
    a["counts"].positions.commit({(TOPIC, 0): 7})  # type: ignore[union-attr]
    b["counts"].positions.commit({(TOPIC, 1): 9})  # type: ignore[union-attr]
    # Staged, not written: still readable through the overlay.
    assert a["counts"].store.get(b"k") == b"1"
    assert stores.read_positions("0_0") is None
    assert stores.write_commit() == 2
    assert stores.commits == 1
    assert a["counts"].base.pending_writes == 0
    # Nothing moved: no batch at all.
    a["counts"].positions.commit({(TOPIC, 0): 7})  # type: ignore[union-attr]
    assert stores.write_commit() == 0
    assert stores.commits == 1
    _close(a)
    _close(b)
    stores.close()
    assert not checkpoint_path(tmp_path / "app" / "0_0").exists()

    again = ConsolidatedStores(db_dir)
    assert again.read_positions("0_0") == {(TOPIC, 0): 7}
    assert again.read_positions("0_1") == {(TOPIC, 1): 9}
    a = _open(db_dir, tmp_path / "app" / "0_0", again)
    assert not a["counts"].base.created  # type: ignore[union-attr]
    assert a["counts"].store.get(b"k") == b"1"
    assert a["counts"].store.get(b"j") is None  # the other task's family
    _close(a)
    again.close()


def test_uncommitted_writes_are_not_on_disk(tmp_path: Path) -> None:
    db_dir = tmp_path / "db"
    stores = ConsolidatedStores(db_dir)
    a = _open(db_dir, tmp_path / "0_0", stores)
    a["counts"].store.put(b"k", b"1")
    a["counts"].flush()  # staged; the commit's batch never written (a crash)
    _close(a)
    stores.close()
    again = ConsolidatedStores(db_dir)
    a = _open(db_dir, tmp_path / "0_0", again)
    assert a["counts"].store.get(b"k") is None
    _close(a)
    again.close()


def test_restore_batch_carries_its_position_and_wipe_forgets_it(tmp_path: Path) -> None:
    db_dir = tmp_path / "db"
    stores = ConsolidatedStores(db_dir)
    a = _open(db_dir, tmp_path / "0_0", stores)
    counts = a["counts"]
    assert counts.restore_batch([(b"x", b"1"), (b"y", b"2"), (b"x", None)], 3) == 3
    assert stores.read_positions("0_0") == {(TOPIC, 0): 3}
    assert [k for k, _ in counts.store.all()] == [b"y"]
    counts.wipe()
    assert stores.read_positions("0_0") is None
    assert list(counts.store.all()) == []
    assert counts.base.created  # type: ignore[union-attr]
    _close(a)
    stores.close()


def test_created_family_ignores_a_position(tmp_path: Path) -> None:
    db_dir = tmp_path / "db"
    stores = ConsolidatedStores(db_dir)
    stores.write_positions("0_0", {(TOPIC, 0): 50})
    a = _open(db_dir, tmp_path / "0_0", stores)
    assert a["counts"].apply_checkpoint(stores.read_positions("0_0")) is None
    assert stores.read_positions("0_0") is None
    _close(a)
    stores.close()


def test_drop_task_refused_while_open_then_drops_data_and_positions(tmp_path: Path) -> None:
    db_dir = tmp_path / "db"
    stores = ConsolidatedStores(db_dir)
    a = _open(db_dir, tmp_path / "0_0", stores)
    a["counts"].restore_batch([(b"x", b"1")], 1)
    assert stores.task_ids() == {"0_0"}
    assert not stores.drop_task("0_0")
    _close(a)
    assert stores.drop_task("0_0")
    assert stores.task_ids() == set()
    assert stores.read_positions("0_0") is None
    a = _open(db_dir, tmp_path / "0_0", stores)
    assert a["counts"].store.get(b"x") is None
    assert list(a["counts"].store.all()) == []
    _close(a)
    stores.close()
    # The drop was one synced batch: still gone after a reopen.
    again = ConsolidatedStores(db_dir)
    assert again.task_ids() == set()
    again.close()


def test_cleanup_drops_families_of_tasks_not_owned_for_the_delay(tmp_path: Path) -> None:
    app_dir = tmp_path / "app"
    stores = ConsolidatedStores(app_dir / "consolidated")
    for task in ("0_0", "0_1"):
        built = _open(app_dir, app_dir / task, stores)
        built["counts"].restore_batch([(b"x", b"1")], 1)
        _close(built)
    owned = frozenset({"0_1"})
    cleanup = CleanupThread("c", app_dir, 1000, lambda: owned, consolidated=stores)
    assert cleanup.clean_once(now=100.0) == []
    assert "0_0" in cleanup.clean_once(now=101.5)
    assert stores.task_ids() == {"0_1"}
    assert stores.read_positions("0_0") is None
    assert stores.read_positions("0_1") == {(TOPIC, 0): 1}
    stores.close()


def test_upgrade_from_per_task_copies_once_and_removes_the_old_directory(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    task_dir = tmp_path / "app" / "0_0"
    old = RocksDBKeyValueStore("counts", rocksdb_path(task_dir, "counts"))
    old.put(b"a", b"1")
    old.put(b"b", b"2")
    old.commit()
    old.close()
    write_checkpoint(checkpoint_path(task_dir), {(TOPIC, 0): 42})

    stores = ConsolidatedStores(tmp_path / "app" / "consolidated")
    built = _open(tmp_path, task_dir, stores)
    assert not (task_dir / "rocksdb").exists()
    assert read_checkpoint(checkpoint_path(task_dir)) is None
    assert stores.read_positions("0_0") == {(TOPIC, 0): 42}
    counts = built["counts"]
    assert not counts.base.created  # type: ignore[union-attr]
    assert counts.apply_checkpoint(stores.read_positions("0_0")) == 42
    assert dict(counts.store.all()) == {b"a": b"1", b"b": b"2"}
    _close(built)
    # Once: a second open finds nothing to move and keeps what is there.
    built = _open(tmp_path, task_dir, stores)
    assert dict(built["counts"].store.all()) == {b"a": b"1", b"b": b"2"}
    _close(built)
    stores.close()


def test_upgrade_without_checkpoint_removes_the_stores_and_claims_nothing(tmp_path: Path) -> None:
    task_dir = tmp_path / "0_0"
    old = RocksDBKeyValueStore("counts", rocksdb_path(task_dir, "counts"))
    old.put(b"a", b"1")
    old.commit()
    old.close()
    stores = ConsolidatedStores(tmp_path / "consolidated")
    built = _open(tmp_path, task_dir, stores)
    assert not (task_dir / "rocksdb").exists()
    assert stores.read_positions("0_0") is None
    assert built["counts"].store.get(b"a") is None
    _close(built)
    stores.close()


def test_names_and_prefixes() -> None:
    assert store_family_name("counts") == "store.counts"
    assert store_of_family("store.counts") == "counts"
    assert store_of_family("offsets") is None
    assert is_legacy_family("1_3/counts")
    assert not is_legacy_family("store.counts") and not is_legacy_family("offsets")
    assert task_prefix("1_3") == b"1_3\x00"
    assert prefix_end(task_prefix("1_3")) == b"1_3\x01"
    # No task's range holds another task's keys, whatever their ids.
    assert not (task_prefix("0_1") <= task_prefix("0_12") < prefix_end(task_prefix("0_1")))
    with pytest.raises(ValueError):
        task_prefix("0\x001")


def test_consolidated_takes_remote_state() -> None:
    base = {"application.id": "a", "bootstrap.servers": "localhost:9092"}
    assert StreamsConfig.from_dict(
        {**base, "state.store.layout": "consolidated"}
    ).state_store_layout == ("consolidated")
    config = StreamsConfig.from_dict(
        {**base, "state.store.layout": "consolidated", "state.remote.url": "s3://bucket/prefix"}
    )
    assert config.state_remote_url == "s3://bucket/prefix"
    with pytest.raises(ConfigError) as info:
        StreamsConfig.from_dict({**base, "state.store.layout": "one-big"})
    assert info.value.key == "state.store.layout"


def test_metrics_thread_reads_each_column_family(tmp_path: Path) -> None:
    from runtime.state.rocksdb_memory import RocksDBMemory
    from runtime.state.rocksdb_metrics import read_figures

    memory = RocksDBMemory()
    stores = ConsolidatedStores(tmp_path / "db", memory)
    a = _open(tmp_path, tmp_path / "0_0", stores)
    for i in range(100):
        a["counts"].store.put(str(i).encode(), b"v")
    a["counts"].flush()
    stores.write_commit()
    b = _open(tmp_path, tmp_path / "0_1", stores)
    b["counts"].restore_batch([(b"x", b"1")], 1)
    # One figure per column family (per store name, every task together).
    figures = {f["store"]: f for f in read_figures(memory).as_dict()["stores"]}
    assert set(figures) == {"counts", "offsets"}
    assert figures["counts"]["task"] == "*"
    assert figures["counts"]["estimated_keys"] == 101
    assert figures["offsets"]["estimated_keys"] == 1  # 0_1 restored to a position
    _close(a)
    _close(b)
    # The figures stay while the database is open (the tasks' keys stay too).
    assert {f["store"] for f in read_figures(memory).as_dict()["stores"]} == set(figures)
    stores.close()
    assert read_figures(memory).as_dict()["stores"] == []


def test_upgrade_supersedes_what_an_older_consolidated_run_left(tmp_path: Path) -> None:
    task_dir = tmp_path / "0_0"
    stores = ConsolidatedStores(tmp_path / "consolidated")
    built = _open(tmp_path, task_dir, stores)
    built["counts"].restore_batch([(b"stale", b"1")], 5)
    _close(built)
    # Then a per-task run on the same state.dir left its own state.
    old = RocksDBKeyValueStore("counts", rocksdb_path(task_dir, "counts"))
    old.put(b"fresh", b"2")
    old.commit()
    old.close()
    write_checkpoint(checkpoint_path(task_dir), {(TOPIC, 0): 9})
    built = _open(tmp_path, task_dir, stores)
    assert dict(built["counts"].store.all()) == {b"fresh": b"2"}
    assert stores.read_positions("0_0") == {(TOPIC, 0): 9}
    _close(built)
    stores.close()


def test_a_column_family_memtable_can_be_flushed_by_the_relief(tmp_path: Path) -> None:
    from runtime.state.rocksdb_memory import RocksDBMemory
    from runtime.state.rocksdb_metrics import read_figures

    memory = RocksDBMemory()
    stores = ConsolidatedStores(tmp_path / "db", memory)
    a = _open(tmp_path, tmp_path / "0_0", stores)
    a["counts"].restore_batch([(str(i).encode(), b"v" * 100) for i in range(1000)], 1000)
    (family,) = [db for db in memory.open_stores() if db.name == "counts"]
    assert family.task_id == "*"
    assert family.flushable_memtable_bytes() > 100_000
    family.request_flush()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        counts = {f["store"]: f for f in read_figures(memory).as_dict()["stores"]}["counts"]
        if counts["live_sst_bytes"] > 0 and counts["memtable_bytes"] < 100_000:
            break
        time.sleep(0.02)
    assert counts["live_sst_bytes"] > 0, counts
    assert dict(a["counts"].store.all())[b"999"] == b"v" * 100
    _close(a)
    stores.close()


def test_tasks_keep_to_their_own_prefix(tmp_path: Path) -> None:
    """Task ids that are prefixes of one another ("0_1", "0_12"): reads,
    ranges, counts, wipes and drops of one never touch the other."""
    stores = ConsolidatedStores(tmp_path / "db")
    one = _open(tmp_path, tmp_path / "0_1", stores)
    twelve = _open(tmp_path, tmp_path / "0_12", stores)
    one["counts"].restore_batch([(b"", b"empty"), (b"a", b"1"), (b"\xff", b"2")], 3)
    twelve["counts"].restore_batch([(b"a", b"12"), (b"b", b"13")], 2)
    one["counts"].store.put(b"c", b"3")  # pending, in the overlay
    assert dict(one["counts"].store.all()) == {b"": b"empty", b"a": b"1", b"c": b"3", b"\xff": b"2"}
    assert list(one["counts"].store.range(b"a", b"c")) == [(b"a", b"1"), (b"c", b"3")]
    assert list(one["counts"].store.range(None, b"")) == [(b"", b"empty")]
    assert one["counts"].store.approximate_num_entries() == 4
    assert twelve["counts"].store.get(b"a") == b"12"
    assert twelve["counts"].store.approximate_num_entries() == 2
    assert stores.task_ids() == {"0_1", "0_12"}
    one["counts"].wipe()
    assert list(one["counts"].store.all()) == []
    assert dict(twelve["counts"].store.all()) == {b"a": b"12", b"b": b"13"}
    _close(one)
    twelve["counts"].restore_batch([(b"c", b"14")], 3)
    assert stores.drop_task("0_1")
    assert dict(twelve["counts"].store.all()) == {b"a": b"12", b"b": b"13", b"c": b"14"}
    assert stores.read_positions("0_12") == {(TOPIC, 0): 3}
    _close(twelve)
    stores.close()


def test_a_database_of_the_first_version_is_converted_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A column family per task-store (`<task>/<store>`): its keys move under
    the task's prefix, its positions stay valid, the family goes."""
    from rocksdict import Options, Rdict

    db_dir = tmp_path / "db"
    options = Options(raw_mode=True)
    options.create_if_missing(True)
    options.create_missing_column_families(True)
    old = Rdict(str(db_dir), options)
    for task, keys in (("0_0", {b"a": b"1", b"b": b"2"}), ("0_1", {b"a": b"9"})):
        family = old.create_column_family(f"{task}/counts", Options(raw_mode=True))
        for key, value in keys.items():
            family[key] = value
    offsets = old.create_column_family("offsets", Options(raw_mode=True))
    offsets[b"0_0\x00" + TOPIC.encode() + b"\x000"] = (2).to_bytes(8, "big")
    del family, offsets
    old.close()

    stores = ConsolidatedStores(db_dir)
    assert not [n for n in Rdict.list_cf(str(db_dir)) if is_legacy_family(n)]
    assert stores.read_positions("0_0") == {(TOPIC, 0): 2}
    assert stores.task_ids() == {"0_0", "0_1"}
    a = _open(tmp_path, tmp_path / "0_0", stores)
    assert not a["counts"].base.created  # type: ignore[union-attr]
    assert a["counts"].apply_checkpoint(stores.read_positions("0_0")) == 2
    assert dict(a["counts"].store.all()) == {b"a": b"1", b"b": b"2"}
    _close(a)
    b = _open(tmp_path, tmp_path / "0_1", stores)
    assert dict(b["counts"].store.all()) == {b"a": b"9"}
    _close(b)
    stores.close()
    again = ConsolidatedStores(db_dir)
    a = _open(tmp_path, tmp_path / "0_0", again)
    assert dict(a["counts"].store.all()) == {b"a": b"1", b"b": b"2"}
    _close(a)
    again.close()
