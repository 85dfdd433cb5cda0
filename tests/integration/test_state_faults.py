"""The state-fault matrix: what an operator or a disk can do to a stopped
app's state directory, and what the next start makes of it.

Every case runs the count app (`tests/apps/count_app.py`'s topology,
in-process) over a two-partition input, stops it cleanly (final commit,
checkpoints written), damages task 0_0's state, starts it again with more
input and checks the exact counts in the output, or, where RocksDB cannot
open what is left, the clear failure (directory and fix named) and that the
fix it names works. Task 0_1 gets no input: its changelog is empty and its
checkpoint names offset 0, the legitimate empty store, which must restore
nothing and warn about nothing in every case.

Why in-process and not a daemon: the cases need the warning lines and the
app's failure, which `App` hands over directly; each start/stop on the
session's Kafka broker takes a few seconds, so the matrix stays bounded
(about 1-2 minutes on two cores). Waits are conditions with deadlines.
"""

from __future__ import annotations

import io
import json
import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, KafkaException, TopicPartition

from runtime import App, AppState, serdes
from runtime.state.checkpoint import CHECKPOINT_FILE, read_checkpoint, write_checkpoint
from runtime.state.rocksdb_store import StoreUnopenableError
from tests.configs import app_config
from tests.kafka_helpers import (
    consume_all,
    create_topic,
    produce,
    unique_name,
    wait_until,
)
from tests.logs import capture_logs, logged_events

pytestmark = pytest.mark.integration

KEYS = 20
FIRST = 10  # records per key before the fault
SECOND = 5  # records per key after it
STORE = "counts"
# The warnings the runtime gives when it does not trust local state; none of
# them may name the legitimately empty task 0_1, in any case.
DISTRUST_EVENTS = (
    "state_store_files_missing",
    "checkpoint_corrupt",
    "checkpoint_unreadable",
    "changelog_position_out_of_range",
)


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    with capture_logs("info") as stream:
        yield stream


events = logged_events


def records(count_per_key: int) -> list[tuple[str, str, int]]:
    return [(f"key-{k}", "x", 0) for _ in range(count_per_key) for k in range(KEYS)]


# --- the faults: each gets task 0_0's directory -------------------------------------


def _store_dir(task_dir: Path) -> Path:
    return task_dir / "rocksdb" / STORE


def _files(task_dir: Path, match: Callable[[str], bool]) -> list[Path]:
    found = [p for p in _store_dir(task_dir).iterdir() if match(p.name)]
    assert found, f"nothing to damage in {sorted(os.listdir(_store_dir(task_dir)))}"
    return found


def store_dir_deleted(task_dir: Path) -> None:
    shutil.rmtree(_store_dir(task_dir))


def store_files_deleted(task_dir: Path) -> None:
    for path in _files(task_dir, lambda name: True):
        path.unlink()


def current_removed(task_dir: Path) -> None:
    for path in _files(task_dir, lambda name: name == "CURRENT"):
        path.unlink()


def manifest_truncated(task_dir: Path) -> None:
    for path in _files(task_dir, lambda name: name.startswith("MANIFEST-")):
        os.truncate(path, 10)


def sst_removed(task_dir: Path) -> None:
    for path in _files(task_dir, lambda name: name.endswith(".sst")):
        path.unlink()


def file_instead_of_directory(task_dir: Path) -> None:
    shutil.rmtree(_store_dir(task_dir))
    _store_dir(task_dir).write_bytes(b"not a database\n")


def checkpoint_truncated(task_dir: Path) -> None:
    path = task_dir / CHECKPOINT_FILE
    os.truncate(path, path.stat().st_size - 2)  # cut inside the last offset


def checkpoint_garbage(task_dir: Path) -> None:
    (task_dir / CHECKPOINT_FILE).write_bytes(b"\x00\xffnot a checkpoint")


def checkpoint_beyond_end(task_dir: Path) -> None:
    path = task_dir / CHECKPOINT_FILE
    offsets = read_checkpoint(path)
    assert offsets, "the clean stop wrote no checkpoint"
    # As if the changelog topic had been deleted and recreated shorter.
    write_checkpoint(path, {tp: position + 1000 for tp, position in offsets.items()})


def no_fault(task_dir: Path) -> None:
    pass


# fault -> the warning event that must name task 0_0's store, or None.
RECOVERABLE: dict[str, tuple[Callable[[Path], None], str | None]] = {
    "no_fault": (no_fault, None),
    "store_dir_deleted": (store_dir_deleted, "state_store_files_missing"),
    "store_files_deleted": (store_files_deleted, "state_store_files_missing"),
    "checkpoint_truncated": (checkpoint_truncated, "checkpoint_corrupt"),
    "checkpoint_garbage": (checkpoint_garbage, "checkpoint_corrupt"),
    "checkpoint_beyond_end": (checkpoint_beyond_end, "changelog_position_out_of_range"),
}
UNOPENABLE: dict[str, Callable[[Path], None]] = {
    "current_removed": current_removed,
    "manifest_truncated": manifest_truncated,
    "sst_removed": sst_removed,
    "file_instead_of_directory": file_instead_of_directory,
}


class CountRun:
    """One application id, its topics and state directory, started as often as needed."""

    def __init__(self, bootstrap: str, state_dir: Path, on_kafka: bool) -> None:
        self.bootstrap = bootstrap
        # Tansu's ListOffsets(latest) names the last batch's base offset + 1
        # (tests/kafka_helpers.py): its checkpoints are lower, safely, so a
        # clean restart replays the last batch there; exact replay figures
        # are checked on Kafka only.
        self.on_kafka = on_kafka
        self.app_id = unique_name("faults")
        self.source, self.sink = unique_name("in"), unique_name("out")
        self.state_dir = state_dir
        self.produced = 0
        create_topic(bootstrap, self.source, 2)
        create_topic(bootstrap, self.sink, 2)

    @property
    def task_dir(self) -> Path:
        return self.state_dir / self.app_id / "0_0"

    def app(self) -> App:
        os.environ["STREAMS_TEST_INPUT"] = self.source
        os.environ["STREAMS_TEST_OUTPUT"] = self.sink
        from tests.apps.count_app import topology

        return App(
            topology(),
            app_config(
                self.bootstrap,
                self.app_id,
                self.state_dir,
                threads=1,
                commit_ms=100,
                heartbeat_ms=None,
            ),
        )

    def produce(self, per_key: int) -> None:
        self.produced += produce(self.bootstrap, self.source, records(per_key))

    def wait_processed(self, app: App) -> None:
        """Until the group committed every input record (output acknowledged first).

        Asked through a consumer of the app's group that never joins it, not
        the admin client's ListConsumerGroupOffsets: librdkafka's admin path
        dereferences a missing consumer group on a coordinator error
        (librdkafka#5040) and crashed this test against a just-started broker.
        """
        reader = Consumer({"bootstrap.servers": self.bootstrap, "group.id": self.app_id})

        def done() -> bool:
            assert app.state is not AppState.ERROR, app.failure
            try:
                (committed,) = reader.committed([TopicPartition(self.source, 0)], timeout=5)
            except KafkaException:  # e.g. the group coordinator still loading: ask again
                return False
            return committed.offset == self.produced

        try:
            wait_until(done, 45, interval=0.2, message="input never fully processed")
        finally:
            reader.close()

    def latest_counts(self) -> dict[str, int]:
        latest: dict[str, int] = {}
        for m in consume_all(self.bootstrap, self.sink, idle=0.2):
            assert m.key is not None and m.value is not None
            count = serdes.INT64.deserialize(m.value)
            assert count is not None
            latest[m.key.decode()] = count
        return latest

    def first_run(self) -> None:
        self.produce(FIRST)
        app = self.app()
        app.start()
        try:
            self.wait_processed(app)
            # Task 0_1 restores its empty changelog and commits once running;
            # closed while restoring it would write no checkpoint.
            wait_until(
                lambda: (
                    sorted((t["id"], t["state"]) for t in app.status()["tasks"])
                    == [("0_0", "RUNNING"), ("0_1", "RUNNING")]
                ),
                30,
                message="tasks never both running",
            )
        finally:
            assert app.close(30)
        assert (self.task_dir / CHECKPOINT_FILE).exists()
        if not self.on_kafka:
            return
        assert read_checkpoint(self.state_dir / self.app_id / "0_1" / CHECKPOINT_FILE) == {
            (f"{self.app_id}-{STORE}-changelog", 1): 0
        }, "task 0_1 is the legitimately empty store"

    def run_to_counts(self, expected: int) -> Any:
        """Start, process everything produced, check the exact counts, stop;
        returns the last status."""
        app = self.app()
        app.start()
        try:
            self.wait_processed(app)
            assert self.latest_counts() == {f"key-{k}": expected for k in range(KEYS)}
            status = app.status()
        finally:
            assert app.close(30)
        return status


def _only_0_0(found: list[dict[str, object]], run: CountRun) -> None:
    """No distrust warning names the legitimately empty task 0_1."""
    for event in found:
        assert "0_1" not in json.dumps(event), event


@pytest.mark.parametrize("fault", sorted(RECOVERABLE))
def test_recoverable_fault_restores_exact_counts(
    bootstrap: str, tmp_path: Path, log_lines: io.StringIO, on_kafka: bool, fault: str
) -> None:
    if fault == "checkpoint_beyond_end" and not on_kafka:
        pytest.skip(
            "Tansu answers a fetch beyond a partition's end with nothing, neither "
            "OFFSET_OUT_OF_RANGE nor end-of-partition: the restore waits for ever"
        )
    inject, warning = RECOVERABLE[fault]
    run = CountRun(bootstrap, tmp_path, on_kafka)
    run.first_run()
    assert not events(log_lines, *DISTRUST_EVENTS), "a clean first run distrusts nothing"
    inject(run.task_dir)
    run.produce(SECOND)

    status = run.run_to_counts(FIRST + SECOND)

    found = events(log_lines, *DISTRUST_EVENTS)
    _only_0_0(found, run)
    restores: dict[str, dict[str, Any]] = status["restores"]
    assert restores["0_1"]["records"] == 0, "the empty changelog is no reason to replay"
    if warning is None:
        assert found == []
        if on_kafka:
            assert restores["0_0"]["records"] == 0, "a clean restart replays nothing"
        return
    assert [e["event"] for e in found] == [warning], found
    text = json.dumps(found[0])
    assert str(run.task_dir) in text, f"the warning names no directory: {text}"
    if warning != "checkpoint_corrupt":  # that one names the file, not a store
        assert STORE in text
    assert restores["0_0"]["records"] >= KEYS, "replayed from the changelog's start"

    # Healed: the next clean restart trusts its checkpoint again.
    log_lines.truncate(0)
    log_lines.seek(0)
    run.produce(1)
    status = run.run_to_counts(FIRST + SECOND + 1)
    assert events(log_lines, *DISTRUST_EVENTS) == []
    if on_kafka:
        assert status["restores"]["0_0"]["records"] == 0


@pytest.mark.parametrize("fault", sorted(UNOPENABLE))
def test_unopenable_store_fails_clearly_and_its_fix_works(
    bootstrap: str, tmp_path: Path, log_lines: io.StringIO, on_kafka: bool, fault: str
) -> None:
    run = CountRun(bootstrap, tmp_path, on_kafka)
    run.first_run()
    UNOPENABLE[fault](run.task_dir)
    run.produce(SECOND)

    app = run.app()
    app.start()
    try:
        assert app.wait(45), "the app kept running on a store it cannot open"
        assert app.state is AppState.ERROR
        failure = app.failure
    finally:
        app.close(30)
    assert isinstance(failure, StoreUnopenableError), repr(failure)
    message = str(failure)
    store_dir = run.task_dir / "rocksdb" / STORE
    assert str(store_dir) in message
    assert "delete" in message and "changelog" in message, message
    assert "Traceback" not in log_lines.getvalue(), "a raw traceback reached the log"
    assert events(log_lines, "state_store_unopenable"), "no log line names the store"

    # The fix the message names: delete the directory; the store comes back
    # from its changelog, with the warning that its files were missing.
    if store_dir.is_dir():
        shutil.rmtree(store_dir)
    else:
        store_dir.unlink()
    log_lines.truncate(0)
    log_lines.seek(0)
    run.run_to_counts(FIRST + SECOND)
    found = events(log_lines, *DISTRUST_EVENTS)
    _only_0_0(found, run)
    assert [e["event"] for e in found] == ["state_store_files_missing"], found
