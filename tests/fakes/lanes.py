"""Records and an input queue as runtime.processing.key_lanes sees them (no Kafka)."""

from __future__ import annotations

from collections import deque

TOPIC = "in"


class Rec:
    """A consumed record: key, offset, timestamp (1_000 + offset), topic."""

    __slots__ = ("_key", "_offset")

    def __init__(self, key: bytes | None, offset: int) -> None:
        self._key, self._offset = key, offset

    def key(self) -> bytes | None:
        return self._key

    def offset(self) -> int:
        return self._offset

    def timestamp(self) -> tuple[int, int]:
        return (1, 1_000 + self._offset)

    def topic(self) -> str:
        return TOPIC


class Queue:
    """The task's input queue as the lanes see it: pull from the head, put back."""

    def __init__(self, count: int, keys: int = 1000) -> None:
        self.records: deque[Rec] = deque(Rec(f"k{i % keys}".encode(), i) for i in range(count))

    def pull(self, limit: int) -> list[Rec]:
        return [self.records.popleft() for _ in range(min(limit, len(self.records)))]

    def unpull(self, records: list[Rec]) -> None:
        self.records.extendleft(reversed(records))
