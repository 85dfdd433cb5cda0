"""Local state that is gone or damaged while its checkpoint stays, without Kafka:
which stores count as new (their checkpoint position is ignored), which cannot
be opened (a clear `StoreUnopenableError`), checkpoints cut short, and the
wipe of a store whose changelog position is out of range. The same faults on
a real broker: tests/integration/test_state_faults.py."""

from __future__ import annotations

import io
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError

from runtime.state.builders import LayeredStore, StoreSpec, build_store, rocksdb_path
from runtime.state.changelog_reading import sort_changelog_messages
from runtime.state.checkpoint import (
    checkpoint_path,
    drop_checkpoint_entries,
    read_checkpoint,
    write_checkpoint,
)
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.state.restoration import RestorationThread
from runtime.state.rocksdb_store import RocksDBKeyValueStore, StoreUnopenableError
from runtime.state.standby import StandbyTask
from runtime.topology.record import Headers
from tests.logs import capture_logs, logged_events

CHANGELOG = ("app-counts-changelog", 0)


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    with capture_logs("info") as stream:
        yield stream


events = logged_events


def _sink(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    timestamp: int,
    headers: Headers | None,
    partition: int | None,
) -> None:
    pass


def build(task_dir: Path, kind: str = "rocksdb") -> LayeredStore:
    spec = StoreSpec("counts", kind=kind)  # type: ignore[arg-type]
    return build_store(spec, task_dir, "app", 0, None, _sink)


def committed_store(task_dir: Path, keys: int = 50, flush: bool = True) -> None:
    """A store with `keys` entries on disk and a checkpoint naming position `keys`."""
    built = build(task_dir)
    built.restore_batch([(b"k%d" % i, b"v") for i in range(keys)], next_offset=keys)
    db = built.rocksdb
    assert db is not None
    if flush:  # into an SST file, as a clean close leaves it
        db.start_flush()
    built.sync()
    write_checkpoint(checkpoint_path(task_dir), built.checkpoint_offsets())
    built.close()


def store_dir(task_dir: Path) -> Path:
    return rocksdb_path(task_dir, "counts")


# --- which stores are new --------------------------------------------------------------


def test_a_new_store_is_created_and_a_reopened_one_is_not(tmp_path: Path) -> None:
    store = RocksDBKeyValueStore("s", tmp_path / "db")
    assert store.created
    store.close()  # empty: no key was ever written
    again = RocksDBKeyValueStore("s", tmp_path / "db")
    assert not again.created, "an empty database that was there is not new"
    again.close()


def test_leftover_logs_and_options_without_database_files_count_as_new(tmp_path: Path) -> None:
    committed_store(tmp_path)
    for entry in os.listdir(store_dir(tmp_path)):
        if entry == "CURRENT" or entry.startswith("MANIFEST-") or entry.endswith((".sst", ".log")):
            os.unlink(store_dir(tmp_path) / entry)
    assert os.listdir(store_dir(tmp_path)), "LOG, OPTIONS, IDENTITY... are left"
    store = RocksDBKeyValueStore("counts", store_dir(tmp_path))
    assert store.created and list(store.all()) == []
    store.close()


@pytest.mark.parametrize("how", ["directory", "files", "rocksdb_parent"])
def test_files_gone_with_the_checkpoint_left_means_no_checkpoint(
    tmp_path: Path, log_lines: io.StringIO, how: str
) -> None:
    committed_store(tmp_path)
    if how == "directory":
        shutil.rmtree(store_dir(tmp_path))
    elif how == "files":
        for entry in os.listdir(store_dir(tmp_path)):
            os.unlink(store_dir(tmp_path) / entry)
    else:
        shutil.rmtree(tmp_path / "rocksdb")
    built = build(tmp_path)
    offsets = read_checkpoint(checkpoint_path(tmp_path))
    assert offsets == {CHANGELOG: 50}
    assert built.apply_checkpoint(offsets) is None, "restore from the changelog's start"
    assert built.checkpoint_offsets() == {}
    (warning,) = events(log_lines, "state_store_files_missing")
    assert warning["store"] == "counts" and warning["directory"] == str(store_dir(tmp_path))
    assert warning["checkpoint_position"] == 50
    # The entry is gone from the file: a crash during the replay cannot
    # leave the half-restored store behind a checkpoint that vouches for it.
    assert read_checkpoint(checkpoint_path(tmp_path)) is None
    built.close()


def test_a_store_emptied_by_its_changelog_keeps_its_checkpoint_quietly(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    """Every key deleted (tombstones) or an empty changelog: the database is
    empty but it is the one the checkpoint was written for."""
    built = build(tmp_path)
    built.restore_batch([(b"a", b"1"), (b"a", None)], next_offset=2)
    built.sync()
    write_checkpoint(checkpoint_path(tmp_path), built.checkpoint_offsets())
    built.close()
    for position in (2, 0):
        write_checkpoint(checkpoint_path(tmp_path), {CHANGELOG: position})
        again = build(tmp_path)
        assert list(again.store.all()) == []
        assert again.apply_checkpoint(read_checkpoint(checkpoint_path(tmp_path))) == position
        again.close()
    assert events(log_lines, "state_store_files_missing") == []


def test_a_new_store_with_a_checkpoint_at_zero_restores_without_a_warning(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    write_checkpoint(checkpoint_path(tmp_path), {CHANGELOG: 0, ("other-changelog", 0): 7})
    built = build(tmp_path)
    assert built.apply_checkpoint(read_checkpoint(checkpoint_path(tmp_path))) is None
    assert events(log_lines, "state_store_files_missing") == []
    assert read_checkpoint(checkpoint_path(tmp_path)) == {("other-changelog", 0): 7}
    built.close()


# --- what cannot be opened -------------------------------------------------------------


def _unlink(match: Callable[[str], bool]) -> Callable[[Path], None]:
    def damage(directory: Path) -> None:
        found = [e for e in os.listdir(directory) if match(e)]
        assert found, sorted(os.listdir(directory))
        for entry in found:
            os.unlink(directory / entry)

    return damage


def _truncate(match: Callable[[str], bool], size: int) -> Callable[[Path], None]:
    def damage(directory: Path) -> None:
        found = [e for e in os.listdir(directory) if match(e)]
        assert found, sorted(os.listdir(directory))
        for entry in found:
            os.truncate(directory / entry, size)

    return damage


def _file_in_place(directory: Path) -> None:
    shutil.rmtree(directory)
    directory.write_text("not a database")


def _parent_is_a_file(directory: Path) -> None:
    shutil.rmtree(directory.parent)
    directory.parent.write_text("not a directory")


UNOPENABLE: dict[str, Callable[[Path], None]] = {
    "current_removed": _unlink(lambda e: e == "CURRENT"),
    "current_truncated": _truncate(lambda e: e == "CURRENT", 0),
    "manifest_removed": _unlink(lambda e: e.startswith("MANIFEST-")),
    "manifest_truncated": _truncate(lambda e: e.startswith("MANIFEST-"), 10),
    "sst_removed": _unlink(lambda e: e.endswith(".sst")),
    "sst_and_wal_removed": _unlink(lambda e: e.endswith((".sst", ".log"))),
    "file_in_place_of_directory": _file_in_place,
    "rocksdb_parent_is_a_file": _parent_is_a_file,
}


@pytest.mark.parametrize("fault", sorted(UNOPENABLE))
def test_damaged_store_fails_naming_its_directory_and_the_fix(
    tmp_path: Path, log_lines: io.StringIO, fault: str
) -> None:
    committed_store(tmp_path)
    UNOPENABLE[fault](store_dir(tmp_path))
    with pytest.raises(StoreUnopenableError) as raised:
        build(tmp_path)
    message = str(raised.value)
    assert str(store_dir(tmp_path)) in message
    assert "delete" in message and "restored from its changelog" in message, message
    assert raised.value.__cause__ is None and raised.value.__suppress_context__
    (logged,) = events(log_lines, "state_store_unopenable")
    assert logged["directory"] == str(store_dir(tmp_path))
    # The fix it names works: the store is new, its checkpoint ignored.
    if fault == "rocksdb_parent_is_a_file":
        os.unlink(tmp_path / "rocksdb")
    elif store_dir(tmp_path).is_dir():
        shutil.rmtree(store_dir(tmp_path))
    else:
        os.unlink(store_dir(tmp_path))
    built = build(tmp_path)
    assert built.apply_checkpoint(read_checkpoint(checkpoint_path(tmp_path))) is None
    built.close()


def test_unreadable_directory_fails_clearly(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Wrong permissions (simulated: the tests may run as root, which reads anything)."""
    committed_store(tmp_path)
    real_listdir = os.listdir

    def listdir(path: Any) -> list[str]:
        if Path(path) == store_dir(tmp_path):
            raise PermissionError(13, "Permission denied", str(path))
        return real_listdir(path)

    monkeypatch.setattr(os, "listdir", listdir)
    with pytest.raises(StoreUnopenableError, match="Permission denied") as raised:
        build(tmp_path)
    assert str(store_dir(tmp_path)) in str(raised.value)


def test_a_store_held_by_someone_else_says_so_rather_than_delete_it(tmp_path: Path) -> None:
    held = RocksDBKeyValueStore("counts", tmp_path / "db")
    try:
        with pytest.raises(StoreUnopenableError, match="same state.dir") as raised:
            RocksDBKeyValueStore("counts", tmp_path / "db")
        assert "delete" not in str(raised.value)
    finally:
        held.close()


# --- checkpoints ---------------------------------------------------------------------


def test_a_checkpoint_cut_inside_its_last_offset_is_corrupt(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    path = checkpoint_path(tmp_path)
    write_checkpoint(path, {CHANGELOG: 1234})
    os.truncate(path, path.stat().st_size - 2)  # "...1234\n" -> "...123": still parses
    assert read_checkpoint(path) is None
    (warning,) = events(log_lines, "checkpoint_corrupt")
    assert warning["path"] == str(path) and "no checkpoint" in warning["meaning"]


def test_binary_garbage_is_reported_as_corrupt(tmp_path: Path, log_lines: io.StringIO) -> None:
    path = checkpoint_path(tmp_path)
    path.write_bytes(b"\x00\xff garbage")
    assert read_checkpoint(path) is None
    assert len(events(log_lines, "checkpoint_corrupt")) == 1


def test_drop_checkpoint_entries(tmp_path: Path) -> None:
    path = checkpoint_path(tmp_path)
    drop_checkpoint_entries(path, [CHANGELOG])  # no file: nothing to do
    assert not path.exists()
    write_checkpoint(path, {CHANGELOG: 5, ("b", 1): 6})
    drop_checkpoint_entries(path, [("b", 0)])  # not there
    assert read_checkpoint(path) == {CHANGELOG: 5, ("b", 1): 6}
    drop_checkpoint_entries(path, [CHANGELOG])
    assert read_checkpoint(path) == {("b", 1): 6}
    drop_checkpoint_entries(path, [("b", 1)])
    assert not path.exists(), "nothing left: no file"


# --- wiping a store whose position the changelog does not have --------------------------


def test_wipe_empties_the_store_and_forgets_its_position(tmp_path: Path) -> None:
    committed_store(tmp_path)
    built = build(tmp_path)
    assert built.apply_checkpoint(read_checkpoint(checkpoint_path(tmp_path))) == 50
    built.wipe()
    assert list(built.store.all()) == [] and built.checkpoint_offsets() == {}
    assert read_checkpoint(checkpoint_path(tmp_path)) is None
    built.restore_batch([(b"a", b"1")], next_offset=1)
    assert built.checkpoint_offsets() == {CHANGELOG: 1}
    built.close()


def test_wipe_of_a_memory_store() -> None:
    store = InMemoryKeyValueStore("m")
    store.put(b"a", b"1")
    store.wipe()
    assert list(store.all()) == [] and store.approximate_num_entries() == 0


class _Message:
    """What sort_changelog_messages reads of a confluent-kafka Message."""

    def __init__(
        self, topic: str, partition: int, offset: int, error: KafkaError | None = None
    ) -> None:
        self._topic, self._partition, self._offset, self._error = topic, partition, offset, error

    def error(self) -> KafkaError | None:
        return self._error

    def topic(self) -> str:
        return self._topic

    def partition(self) -> int:
        return self._partition

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes:
        return b"k"

    def value(self) -> bytes:
        return b"v"


def test_an_out_of_range_position_is_sorted_out_not_warned_about() -> None:
    batch = sort_changelog_messages(
        [
            _Message("c", 0, 7),
            _Message("c", 1, 1020, KafkaError(KafkaError._AUTO_OFFSET_RESET)),
            _Message("c", 0, 8, KafkaError(KafkaError._PARTITION_EOF)),
        ]
    )
    assert batch.out_of_range == [(("c", 1), 1020)]
    assert batch.reached_end == [(("c", 0), 8)]
    assert batch.next_offsets == {("c", 0): 8}


def test_a_standby_out_of_range_is_wiped_and_restarts_from_the_beginning(
    tmp_path: Path, log_lines: io.StringIO
) -> None:
    task_dir = tmp_path / "app" / "0_0"
    committed_store(task_dir)
    standby = StandbyTask("0_0", 0, [StoreSpec("counts")], str(tmp_path), "app")
    assert standby.restore_from == {CHANGELOG: 50}
    # Never connects: assignments are local until a fetch.
    thread = RestorationThread("t", {"bootstrap.servers": "127.0.0.1:9", "group.id": "g"})
    try:
        thread._standbys.start(standby)
        assert thread._out_of_range(CHANGELOG, 50)
        assert not thread._out_of_range(("unknown", 0), 3)
        store = standby.stores["counts"]
        assert list(store.store.all()) == [] and store.checkpoint_offsets() == {}
        assert standby.restore_from == {CHANGELOG: None}
        assert read_checkpoint(checkpoint_path(task_dir)) is None
        (warning,) = events(log_lines, "changelog_position_out_of_range")
        assert warning["standby"] is True and warning["position"] == 50
        assert warning["directory"] == str(store_dir(task_dir))
        assert thread._drop_standby("0_0")
    finally:
        thread._consumer.close()
