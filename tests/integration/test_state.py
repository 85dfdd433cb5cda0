"""Stateful processing on the real broker: word count, checkpoints, restoration."""

from __future__ import annotations

import shutil
from collections import Counter
from pathlib import Path

import pytest

from runtime import App, AppState, StreamsBuilder, serdes
from runtime.state.checkpoint import CHECKPOINT_FILE, read_checkpoint
from tests.configs import app_config
from tests.kafka_helpers import (
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

WORDS = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "honeydew"]


def lines(start: int, count: int) -> list[tuple[str, str]]:
    return [
        (f"line-{i}", " ".join(WORDS[(i * 7 + j) % len(WORDS)] for j in range(i % 5 + 1)))
        for i in range(start, start + count)
    ]


def word_count_topology(source: str, sink: str, store: str):  # type: ignore[no-untyped-def]
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .flat_map_values(lambda line: line.lower().split())
        .group_by(lambda key, word: word, key_serde=serdes.STRING)
        .count(store=store)
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    return builder.build()


def latest_counts(bootstrap: str, topic: str) -> dict[str, int]:
    latest: dict[str, int] = {}
    for m in sorted(consume_all(bootstrap, topic, idle=1.0), key=lambda m: (m.partition, m.offset)):
        latest[m.key.decode()] = serdes.INT64.deserialize(m.value)
    return latest


def expected_counts(records: list[tuple[str, str]]) -> dict[str, int]:
    return dict(Counter(w for _, line in records for w in line.split()))


class WordCountRun:
    def __init__(self, bootstrap: str, state_dir: Path, threads: int = 3) -> None:
        self.bootstrap = bootstrap
        self.source, self.sink = unique_name("lines"), unique_name("counts")
        self.store = "word-counts"
        self.app_id = unique_name("wc")
        self.state_dir = state_dir
        self.threads = threads
        create_topic(bootstrap, self.source, 4)
        create_topic(bootstrap, self.sink, 4)

    def app(self, state_dir: Path | None = None, **extra: object) -> App:
        return App(
            word_count_topology(self.source, self.sink, self.store),
            app_config(
                self.bootstrap,
                self.app_id,
                state_dir or self.state_dir,
                threads=self.threads,
                commit_ms=300,
                heartbeat_ms=None,
                **extra,
            ),
        )

    def wait_for_counts(self, expected: dict[str, int], timeout: float = 90) -> None:
        def matches() -> bool:
            return latest_counts(self.bootstrap, self.sink) == expected

        wait_until(matches, timeout, interval=1.0, message=f"counts never became {expected}")


def test_word_count_is_exact_over_four_partitions_and_three_threads(
    bootstrap: str, tmp_path: Path
) -> None:
    run = WordCountRun(bootstrap, tmp_path)
    batch = lines(0, 3000)
    produce(bootstrap, run.source, batch)
    app = run.app()
    app.start()
    try:
        run.wait_for_counts(expected_counts(batch))
        assert app.state is AppState.RUNNING
        # The repartition topic and the changelog were created by the runtime.
        changelog = f"{run.app_id}-{run.store}-changelog"
        assert consume_all(bootstrap, changelog, idle=0.5)
    finally:
        assert app.close(30)


def test_restart_with_local_state_replays_nothing_beyond_the_checkpoint(
    bootstrap: str, tmp_path: Path, on_kafka: bool
) -> None:
    run = WordCountRun(bootstrap, tmp_path, threads=2)
    first, second = lines(0, 1500), lines(1500, 1500)
    produce(bootstrap, run.source, first)
    app = run.app()
    app.start()
    try:
        run.wait_for_counts(expected_counts(first))
    finally:
        assert app.close(30)

    produce(bootstrap, run.source, second)
    again = run.app()
    again.start()
    try:
        run.wait_for_counts(expected_counts(first + second))
        if on_kafka:
            # Tansu's ListOffsets(latest) names the last batch's base offset
            # + 1 (tests/kafka_helpers.py): its checkpoints are lower, safely,
            # and a restart replays the last batch.
            assert again.status()["restored"] == 0
    finally:
        assert again.close(30)


def test_restart_without_local_state_restores_from_the_changelog(
    bootstrap: str, tmp_path: Path
) -> None:
    run = WordCountRun(bootstrap, tmp_path / "first", threads=2)
    first, second = lines(0, 1500), lines(1500, 1500)
    produce(bootstrap, run.source, first)
    app = run.app()
    app.start()
    try:
        run.wait_for_counts(expected_counts(first))
    finally:
        assert app.close(30)
    shutil.rmtree(tmp_path / "first")

    produce(bootstrap, run.source, second)
    again = run.app(tmp_path / "second")
    again.start()
    try:
        run.wait_for_counts(expected_counts(first + second))
        # Every word's count was restored from the changelog.
        assert again.status()["restored"] >= len(WORDS)
    finally:
        assert again.close(30)


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_checkpoints_name_acknowledged_changelog_positions_only(
    bootstrap: str, tmp_path: Path, guarantee: str, on_kafka: bool
) -> None:
    """Changelog positions are asked of the broker once per commit (no success
    delivery reports): a checkpoint never names a position past the changelog's
    end, under at_least_once it is exactly the end (the restart restores
    nothing), and under exactly_once_v2 (last stable offset: at most the
    last transaction's records lower) the restart's counts stay exact."""
    run = WordCountRun(bootstrap, tmp_path, threads=2)
    first, second = lines(0, 1500), lines(1500, 300)
    produce(bootstrap, run.source, first)
    app = run.app(**{"processing.guarantee": guarantee})
    app.start()
    try:
        run.wait_for_counts(expected_counts(first))
    finally:
        assert app.close(30)
    changelog = f"{run.app_id}-{run.store}-changelog"
    ends = end_offsets(bootstrap, changelog)
    positions: dict[int, int] = {}
    for path in (tmp_path / run.app_id).glob(f"*/{CHECKPOINT_FILE}"):
        for (topic, partition), position in (read_checkpoint(path) or {}).items():
            assert topic == changelog
            positions[partition] = position
    assert sorted(positions) == sorted(ends), "every changelog partition is checkpointed"
    for partition, position in positions.items():
        assert 0 <= position <= ends[partition], (partition, position, ends)
        if guarantee == "at_least_once" and on_kafka:
            assert position == ends[partition], "the end the output was acknowledged to"

    produce(bootstrap, run.source, second)
    again = run.app(**{"processing.guarantee": guarantee})
    again.start()
    try:
        run.wait_for_counts(expected_counts(first + second))
        if guarantee == "at_least_once" and on_kafka:
            assert again.status()["restored"] == 0
    finally:
        assert again.close(30)
