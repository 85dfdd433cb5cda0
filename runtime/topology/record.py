"""The record that flows through a topology.

A `Record` is created by a source node on a processing thread and handed down
the processor graph of one task; it is never shared between threads. Topic,
partition and offset describe where the input came from and are read-only for
user code: derived records (`with_value`, ...) keep them, so a downstream
processor still knows its input's origin.
"""

from __future__ import annotations

from typing import Any

Headers = list[tuple[str, bytes | None]]


class Record:
    """A key/value pair with its event timestamp (ms), headers and origin.

    `headers` is a list of `(name, bytes or None)` pairs in Kafka's order, or
    None when the input record had none. Sinks write them with the record;
    stateless operators pass them on; aggregations, `to_table`, suppression
    and joins carry them as Kafka Streams does (docs/dsl.md, "Record
    headers"). The list may be shared by several records downstream: to
    change headers, forward `with_headers(new_list)` instead of changing it
    in place.
    """

    __slots__ = ("key", "value", "timestamp", "headers", "_topic", "_partition", "_offset")

    def __init__(
        self,
        key: Any,
        value: Any,
        timestamp: int = 0,
        headers: Headers | None = None,
        topic: str | None = None,
        partition: int | None = None,
        offset: int | None = None,
    ) -> None:
        self.key = key
        self.value = value
        self.timestamp = timestamp
        self.headers = headers
        self._topic = topic
        self._partition = partition
        self._offset = offset

    @property
    def topic(self) -> str | None:
        return self._topic

    @property
    def partition(self) -> int | None:
        return self._partition

    @property
    def offset(self) -> int | None:
        return self._offset

    def with_key(self, key: Any) -> Record:
        return Record(
            key,
            self.value,
            self.timestamp,
            self.headers,
            self._topic,
            self._partition,
            self._offset,
        )

    def with_value(self, value: Any) -> Record:
        return Record(
            self.key,
            value,
            self.timestamp,
            self.headers,
            self._topic,
            self._partition,
            self._offset,
        )

    def with_key_value(self, key: Any, value: Any) -> Record:
        return Record(
            key, value, self.timestamp, self.headers, self._topic, self._partition, self._offset
        )

    def with_timestamp(self, timestamp: int) -> Record:
        return Record(
            self.key,
            self.value,
            timestamp,
            self.headers,
            self._topic,
            self._partition,
            self._offset,
        )

    def with_headers(self, headers: Headers | None) -> Record:
        return Record(
            self.key,
            self.value,
            self.timestamp,
            headers,
            self._topic,
            self._partition,
            self._offset,
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Record):
            return NotImplemented
        return (self.key, self.value, self.timestamp, self.headers) == (
            other.key,
            other.value,
            other.timestamp,
            other.headers,
        )

    def __repr__(self) -> str:
        return (
            f"Record(key={self.key!r}, value={self.value!r}, timestamp={self.timestamp}, "
            f"topic={self._topic!r}, partition={self._partition}, offset={self._offset})"
        )
