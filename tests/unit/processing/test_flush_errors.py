"""A user function a commit's cache flush runs fails to the handler, not the polling thread.

A real StreamTask with a cached table feeding a `map_values` that raises on a
poison value (no broker): `prepare_commit` emits the cache, as the committer
does on the polling thread.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from runtime import StreamsBuilder, serdes
from runtime.error_handlers import HEADER_OFFSET, HEADER_TOPIC
from runtime.processing.errors import ErrorPolicy, TaskFailedError
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.state.cache_budget import CacheBudget


class Msg:
    def __init__(self, key: str, value: str, offset: int) -> None:
        self._key, self._value, self._offset = key, value, offset

    def key(self) -> bytes:
        return self._key.encode()

    def value(self) -> bytes:
        return self._value.encode()

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self._offset)

    def headers(self) -> None:
        return None


def check(value: str) -> str:
    if value == "boom":
        raise ValueError("poison")
    return value.upper()


def task(tmp_path: Path, processing: str) -> StreamTask:
    builder = StreamsBuilder()
    builder.table("t", key_serde=serdes.STRING, value_serde=serdes.STRING, store="s").map_values(
        check
    ).to_stream().to("out", key_serde=serdes.STRING, value_serde=serdes.STRING)
    settings = TaskSettings(
        "flush",
        serdes.BYTES,
        serdes.BYTES,
        ErrorPolicy("log_and_fail", processing, "dlq"),
        {"t": 1, "out": 1, "dlq": 1, "flush-s-changelog": 1},
        str(tmp_path),
        CacheBudget(1 << 20),
    )
    t = StreamTask(builder.build().subtopologies[0], 0, ["t"], settings)
    for offset, (key, value) in enumerate([("a", "x"), ("b", "boom"), ("c", "y")]):
        t.queues["t"].records.append(Msg(key, value, offset))  # type: ignore[arg-type]
    assert t.process(deadline=float("inf")) == 3
    return t


def test_dead_letter_queue_takes_the_flushed_entry_and_the_others_flow_on(tmp_path: Path) -> None:
    t = task(tmp_path, "dead_letter_queue")
    try:
        batch = t.prepare_commit()
        by_topic: dict[str, list[tuple[bytes | None, bytes | None]]] = {}
        dead = []
        for topic, _, key, value, _, headers, *_ in batch.output:
            by_topic.setdefault(topic, []).append((key, value))
            if topic == "dlq":
                dead.append(dict(headers or []))
        assert by_topic["out"] == [(b"a", b"X"), (b"c", b"Y")]
        assert by_topic["dlq"] == [(b"b", b"boom")]
        assert dead[0][HEADER_TOPIC] == b"flush-s-changelog"
        assert dead[0][HEADER_OFFSET] == b"-1"
        assert (t.dead_lettered_count, t.skipped_count) == (1, 1)
        assert not t.emitting_at_commit
    finally:
        t.close()


def test_log_and_fail_names_the_task(tmp_path: Path) -> None:
    t = task(tmp_path, "log_and_fail")
    try:
        with pytest.raises(TaskFailedError) as info:
            t.prepare_commit()
        assert info.value.task_id == t.id
        assert not t.emitting_at_commit
    finally:
        t.close()
