"""Producing rows from Spark's Python workers: one `RowProducer` per Spark task.

Apart from `runtime.spark.kafka` (reading: offsets, ranges, records) because
it is the write side: a producer that fails the Spark task loudly when any
record was not acknowledged. Nothing here imports Spark.

Threads: a `RowProducer` belongs to the Spark task (one thread) that made it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from confluent_kafka import KafkaError, KafkaException, Message, Producer


class DeliveryError(RuntimeError):
    """Records the producer could not deliver: the Spark task fails with it."""


class RowProducer:
    """Produces records and fails loudly: `close()` raises DeliveryError if any
    record was not acknowledged. One per Spark task."""

    def __init__(self, settings: Mapping[str, Any], flush_timeout: float = 120.0) -> None:
        self._producer = Producer(dict(settings))
        self._flush_timeout = flush_timeout
        self.errors = 0
        self.first_error: str | None = None
        self.count = 0

    def _on_delivery(self, err: KafkaError | None, msg: Message) -> None:
        if err is not None:
            self.errors += 1
            if self.first_error is None:
                self.first_error = f"{msg.topic()}-{msg.partition()}: {err.str()}"

    def produce(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        partition: int | None = None,
        timestamp: int | None = None,
        headers: Sequence[tuple[str, bytes | None]] | None = None,
    ) -> None:
        kwargs: dict[str, Any] = {"key": key, "value": value, "on_delivery": self._on_delivery}
        if partition is not None and partition >= 0:
            kwargs["partition"] = partition
        if timestamp is not None and timestamp >= 0:
            kwargs["timestamp"] = timestamp
        if headers:
            kwargs["headers"] = list(headers)
        producer = self._producer
        while True:
            try:
                producer.produce(topic, **kwargs)
                break
            except BufferError:
                producer.poll(0.05)
            except KafkaException as exc:
                raise DeliveryError(f"cannot produce to {topic!r}: {exc}") from exc
        self.count += 1
        if self.count % 10000 == 0:
            producer.poll(0)
            if self.errors:
                self._raise()

    def close(self) -> int:
        """Flush; the number of records delivered, or DeliveryError."""
        remaining = self._producer.flush(self._flush_timeout)
        if remaining:
            raise DeliveryError(
                f"{remaining} of {self.count} records not delivered within "
                f"{self._flush_timeout:.0f}s (broker unreachable?)"
            )
        if self.errors:
            self._raise()
        return self.count

    def _raise(self) -> None:
        raise DeliveryError(
            f"{self.errors} of {self.count} records failed delivery; first: {self.first_error}"
        )


def header_pairs(headers: Iterable[Any] | None) -> list[tuple[str, bytes | None]]:
    """Headers from Spark rows/Arrow (dicts or (key, value) pairs) -> producer pairs."""
    if not headers:
        return []
    out = []
    for h in headers:
        if isinstance(h, dict):
            key, value = h.get("key"), h.get("value")
        else:
            key, value = h[0], h[1]
        if isinstance(value, str):
            value = value.encode("utf-8")
        out.append((str(key), None if value is None else bytes(value)))
    return out
