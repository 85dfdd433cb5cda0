"""Remote-state snapshots of the consolidated layout on real RocksDB: the
capture pins the committed state and exports only the task's range later,
the install replaces the task's range and position in one batch, and a
snapshot moves between layouts (per-task checkpoint into a consolidated
store, consolidated export into a per-task store)."""

from __future__ import annotations

from pathlib import Path

from runtime.state.builders import LayeredStore, StoreSpec, build_task_stores
from runtime.state.consolidated import ConsolidatedStores
from runtime.state.remote.capture import SnapshotCapture, UploadJob
from runtime.state.snapshot_export import read_database

TOPIC = "app-counts-changelog"


def _sink(*_args: object, **_kwargs: object) -> None:
    return None


def _open(task_dir: Path, partition: int, stores: ConsolidatedStores | None) -> LayeredStore:
    built = build_task_stores(
        [StoreSpec("counts", caching=False)],
        task_dir,
        "app",
        partition,
        None,
        _sink,
        consolidated=stores,
    )
    return built["counts"]


def _commit(
    store: LayeredStore, stores: ConsolidatedStores | None, items: dict[bytes, bytes], position: int
) -> None:
    for key, value in items.items():
        store.store.put(key, value)
    store.flush()
    assert store.changelog is not None
    store.changelog.update_changelog_offset(position)
    if stores is not None:
        store.positions.commit(store.checkpoint_offsets())  # type: ignore[union-attr]
        stores.write_commit()


def _contents(directory: Path) -> dict[bytes, bytes]:
    return {k: v for chunk in read_database(directory) for k, v in chunk}


class _Task:
    def __init__(self, task_id: str, store: LayeredStore) -> None:
        self.id = task_id
        self.stores = {"counts": store}
        self.checkpoints = 0

    def write_checkpoint(self) -> None:
        self.checkpoints += 1


def test_capture_pins_the_commit_and_exports_only_the_tasks_range(tmp_path: Path) -> None:
    stores = ConsolidatedStores(tmp_path / "app" / "consolidated")
    a = _open(tmp_path / "app" / "0_0", 0, stores)
    b = _open(tmp_path / "app" / "0_1", 1, stores)
    _commit(a, stores, {b"k1": b"1", b"k2": b"2"}, 5)
    _commit(b, stores, {b"other": b"x"}, 3)
    jobs: list[UploadJob] = []
    now = [0.0]
    capture = SnapshotCapture(
        1.0,
        tmp_path / "staging",
        jobs.append,
        lambda: frozenset(),
        lambda _task_id: None,
        clock=lambda: now[0],
    )
    task = _Task("0_0", a)
    capture.after_commit([task])  # first seen: only scheduled
    assert jobs == []
    now[0] = 10.0
    capture.after_commit([task])
    assert len(jobs) == 1 and task.checkpoints == 1
    job = jobs[0]
    assert job.offsets == {(TOPIC, 0): 5}
    assert len(job.exports) == 1
    assert not (job.directory / "counts").exists()  # deferred: nothing written yet
    # A later commit changes the task's state before the upload runs ...
    _commit(a, stores, {b"k1": b"changed", b"k3": b"3"}, 7)
    for export in job.exports:
        export()
    # ... and the export still holds the state of the capture's commit, only this task's keys.
    assert not any(p.name.startswith("LOG") for p in (job.directory / "counts").iterdir())
    assert _contents(job.directory / "counts") == {b"k1": b"1", b"k2": b"2"}
    # The export read the capture's checkpoint of the whole database (scratch).
    assert (job.directory / ".consolidated-checkpoint" / "CURRENT").exists()
    a.close()
    b.close()
    stores.close()


def test_install_replaces_the_range_and_position_in_one_batch(tmp_path: Path) -> None:
    stores = ConsolidatedStores(tmp_path / "app" / "consolidated")
    a = _open(tmp_path / "app" / "0_0", 0, stores)
    b = _open(tmp_path / "app" / "0_1", 1, stores)
    _commit(a, stores, {b"k1": b"1", b"k2": b"2"}, 5)
    _commit(b, stores, {b"k1": b"b's"}, 3)
    a.base.checkpoint_to(tmp_path / "snap")  # type: ignore[union-attr]
    _commit(a, stores, {b"k1": b"later", b"k9": b"9"}, 8)
    a.install_snapshot(tmp_path / "snap", 5)
    assert dict(a.store.all()) == {b"k1": b"1", b"k2": b"2"}
    assert stores.read_positions("0_0") == {(TOPIC, 0): 5}
    assert a.checkpoint_offsets() == {(TOPIC, 0): 5}
    assert dict(b.store.all()) == {b"k1": b"b's"}  # the other task is untouched
    assert stores.read_positions("0_1") == {(TOPIC, 1): 3}
    a.close()
    b.close()
    stores.close()
    # Durable: a reopened database holds the same.
    stores = ConsolidatedStores(tmp_path / "app" / "consolidated")
    a = _open(tmp_path / "app" / "0_0", 0, stores)
    assert dict(a.store.all()) == {b"k1": b"1", b"k2": b"2"}
    assert stores.read_positions("0_0") == {(TOPIC, 0): 5}
    a.close()
    stores.close()


def test_install_of_a_broken_snapshot_writes_nothing(tmp_path: Path) -> None:
    stores = ConsolidatedStores(tmp_path / "app" / "consolidated")
    a = _open(tmp_path / "app" / "0_0", 0, stores)
    _commit(a, stores, {b"k1": b"1"}, 5)
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "000007.sst").write_bytes(b"not rocksdb")
    try:
        a.install_snapshot(tmp_path / "broken", 9)
    except Exception:  # noqa: BLE001 - rocksdict raises plain Exception
        pass
    else:
        raise AssertionError("a directory without a database installed")
    assert dict(a.store.all()) == {b"k1": b"1"}
    assert stores.read_positions("0_0") == {(TOPIC, 0): 5}
    assert a.checkpoint_offsets() == {}  # the position is unknown to its owner now
    a.close()
    stores.close()


def test_snapshots_move_between_layouts(tmp_path: Path) -> None:
    # per-task checkpoint -> consolidated store
    per_task = _open(tmp_path / "pt" / "0_0", 0, None)
    _commit(per_task, None, {b"a": b"1", b"b": b"2"}, 4)
    per_task.base.checkpoint_to(tmp_path / "from-per-task")  # type: ignore[union-attr]
    stores = ConsolidatedStores(tmp_path / "app" / "consolidated")
    cons = _open(tmp_path / "app" / "0_0", 0, stores)
    cons.install_snapshot(tmp_path / "from-per-task", 4)
    assert dict(cons.store.all()) == {b"a": b"1", b"b": b"2"}
    assert stores.read_positions("0_0") == {(TOPIC, 0): 4}
    # consolidated export -> per-task store
    _commit(cons, stores, {b"c": b"3"}, 6)
    cons.base.checkpoint_to(tmp_path / "from-consolidated")  # type: ignore[union-attr]
    per_task.install_snapshot(tmp_path / "from-consolidated", 6)
    assert dict(per_task.store.all()) == {b"a": b"1", b"b": b"2", b"c": b"3"}
    assert per_task.checkpoint_offsets() == {(TOPIC, 0): 6}
    per_task.close()
    cons.close()
    stores.close()
