"""Change-logging layer: one record per write, tombstones, offsets for checkpoints."""

from __future__ import annotations

from runtime.state.changelog import ChangeLoggingKeyValueStore, changelog_topic_name
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.topology.record import Headers

Sent = tuple[str, bytes | None, bytes | None, int, Headers | None, int | None]


class RecordingSink:
    """Stands in for TaskContext.send."""

    def __init__(self) -> None:
        self.records: list[Sent] = []

    def __call__(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        self.records.append((topic, key, value, timestamp, headers, partition))


def test_topic_name() -> None:
    assert changelog_topic_name("app", "counts") == "app-counts-changelog"


def test_each_write_is_logged_and_delete_is_a_tombstone() -> None:
    sink = RecordingSink()
    store = ChangeLoggingKeyValueStore(
        InMemoryKeyValueStore("counts"), sink, "app-counts-changelog", 3, clock=lambda: 77
    )
    store.put(b"a", b"1")
    store.put(b"a", b"2")
    store.delete(b"a")
    store.put_at(b"b", b"x", 5)
    assert [(t, p, k, v, ts) for t, k, v, ts, _, p in sink.records] == [
        ("app-counts-changelog", 3, b"a", b"1", 77),
        ("app-counts-changelog", 3, b"a", b"2", 77),
        ("app-counts-changelog", 3, b"a", None, 77),
        ("app-counts-changelog", 3, b"b", b"x", 5),
    ]
    assert store.get(b"a") is None
    assert store.get(b"b") == b"x"
    assert list(store.all()) == [(b"b", b"x")]
    assert store.records_logged == 4


def test_offsets_for_the_checkpoint() -> None:
    store = ChangeLoggingKeyValueStore(InMemoryKeyValueStore("s"), RecordingSink(), "t", 0)
    assert store.checkpoint_offsets() == {}
    store.update_changelog_offset(10)
    assert store.checkpoint_offsets() == {("t", 0): 10}
