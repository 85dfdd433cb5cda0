"""A task's checkpoint file at commits: deferred at regular commits until its
changelogs moved `CHECKPOINT_DELTA_RECORDS`, always written at a commit before
the task leaves, and never naming a position its store does not hold."""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Message

from runtime import StreamsBuilder, serdes
from runtime.processing.errors import ErrorPolicy
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.state.checkpoint import (
    CHECKPOINT_DELTA_RECORDS,
    checkpoint_due,
    checkpoint_path,
    read_checkpoint,
)

CHANGELOG = ("app-counts-changelog", 0)


def test_due_when_partitions_change_or_moved_far_enough() -> None:
    assert checkpoint_due({}, {CHANGELOG: 0})
    assert not checkpoint_due({CHANGELOG: 5}, {CHANGELOG: 5 + CHECKPOINT_DELTA_RECORDS - 1})
    assert checkpoint_due({CHANGELOG: 5}, {CHANGELOG: 5 + CHECKPOINT_DELTA_RECORDS})
    other = ("app-other-changelog", 0)
    assert checkpoint_due({CHANGELOG: 5}, {CHANGELOG: 5, other: 0})
    # The delta is the task's: two changelogs moving half each add up.
    half = CHECKPOINT_DELTA_RECORDS // 2
    assert checkpoint_due({CHANGELOG: 0, other: 0}, {CHANGELOG: half, other: half})


def _counting_task(tmp_path: Path) -> StreamTask:
    builder = StreamsBuilder()
    builder.stream("in").group_by_key().count("counts").to_stream().to("out")
    settings = TaskSettings(
        "app",
        serdes.STRING,
        serdes.STRING,
        ErrorPolicy("log_and_fail", "log_and_fail", None),
        {"in": 1, "out": 1, "app-counts-changelog": 1},
        str(tmp_path),
        None,
    )
    return StreamTask(builder.build().subtopologies[0], 0, ["in"], settings)


def _process(task: StreamTask, first: int, count: int) -> None:
    for offset in range(first, first + count):
        task.queues["in"].records.append(
            Message(topic="in", partition=0, offset=offset, key=b"k", value=b"v", timestamp=(1, 5))
        )
    task.process(float("inf"))


def _commit(task: StreamTask, changelog_end: int, checkpoint_now: bool) -> None:
    task.prepare_commit()
    task.post_commit({CHANGELOG: changelog_end}, True, checkpoint_now)


def test_regular_commits_defer_the_file_and_a_leaving_commit_writes_it(tmp_path: Path) -> None:
    task = _counting_task(tmp_path)
    path = checkpoint_path(task.directory)
    try:
        _process(task, 0, 10)
        _commit(task, 1, checkpoint_now=False)  # a changelog appeared: written
        assert read_checkpoint(path) == {CHANGELOG: 1}
        _process(task, 10, 10)
        _commit(task, 2, checkpoint_now=False)
        assert read_checkpoint(path) == {CHANGELOG: 1}, "one record moved: deferred"
        _commit(task, 1 + CHECKPOINT_DELTA_RECORDS, checkpoint_now=False)
        assert read_checkpoint(path) == {CHANGELOG: 1 + CHECKPOINT_DELTA_RECORDS}
        _process(task, 20, 5)
        _commit(task, 3 + CHECKPOINT_DELTA_RECORDS, checkpoint_now=True)
        assert read_checkpoint(path) == {CHANGELOG: 3 + CHECKPOINT_DELTA_RECORDS}
    finally:
        task.close()
    # What the store holds is at least what the checkpoint names: reopened,
    # the count is the last commit's.
    again = _counting_task(tmp_path)
    try:
        store = again.stores["counts"]
        assert serdes.INT64.deserialize(store.store.get(b"k")) == 25
    finally:
        again.close()
