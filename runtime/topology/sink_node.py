"""The sink node: serializes a task's records and hands them to `TaskContext.send`.

Apart from `nodes.py` because of what a sink adds to the plain per-record
path: partitioning (a `StreamPartitioner`, the app's static partitioner, or
the default), and the messages that tell a user what to do when a value
cannot be written (the topic, the serde and the fix).

Threads: as every node (see `runtime.topology.nodes`): only the processing
thread holding the task's lock calls it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.murmur2 import partition_python
from runtime.topology import serdes as _serdes
from runtime.topology.context import TaskContext
from runtime.topology.errors import SerializationError
from runtime.topology.nodes import Node, Partitioner, _not_initialized, resolve_serde
from runtime.topology.record import Record


class SinkNode(Node):
    """Serializes records and hands them to `TaskContext.send`.

    `topic` is the name as written (relative for internal topics); the full
    name is resolved at `init`. `partitioner(key, value, num_partitions)` gets
    the deserialized key and value, as Kafka's StreamPartitioner, and returns a
    partition or None for default partitioning. The app's static partitioner,
    when configured, replaces it for every keyed record (null keys go
    round-robin): `static_partition(topic, key, num_partitions)`.

    Windowed keys (a `serdes.windowed` key serde) without either are
    partitioned by their inner key's bytes, as Kafka Streams'
    WindowedStreamPartitioner does: every window of a key lands in one
    partition, the one the plain key would (found by the differential tests).
    """

    __slots__ = (
        "topic",
        "internal",
        "key_serde",
        "value_serde",
        "partitioner",
        "origin",
        "full_topic",
        "_key_ser",
        "_value_ser",
        "_send",
        "_partition_count",
        "_inner_key_ser",
        "_static",
        "_known_count",
        "_resolved",
    )

    def __init__(
        self,
        name: str,
        topic: str,
        internal: bool = False,
        key_serde: Any = None,
        value_serde: Any = None,
        partitioner: Partitioner | None = None,
        origin: str | None = None,
    ) -> None:
        super().__init__(name)
        self.topic = topic
        self.internal = internal
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.partitioner = partitioner
        # The DSL call that made this sink ("to", "through", "repartition",
        # "group_by"), for the fix a serialization error suggests.
        self.origin = origin
        self.full_topic = topic
        # (key serde, value serde) as resolved at init, for error messages.
        self._resolved: tuple[Any, Any] = (None, None)
        self._key_ser: Callable[[Any], bytes | None] = _not_initialized
        self._value_ser: Callable[[Any], bytes | None] = _not_initialized
        self._send: Callable[..., None] = _not_initialized
        self._partition_count: Callable[[str], int] = _not_initialized
        self._static: Callable[[str, Any, int], int] | None = None
        self._inner_key_ser: Callable[[Any], bytes | None] | None = None
        self._known_count: Callable[[str], int] | None = None

    def add_child(self, child: Node) -> None:
        raise ValueError(f"sink {self.name!r} cannot have children")

    def init(self, ctx: TaskContext) -> None:
        self.full_topic = ctx.resolve_topic(self.topic, self.internal)
        key = resolve_serde(self.key_serde, ctx.default_key_serde, self.name, "key")
        value = resolve_serde(self.value_serde, ctx.default_value_serde, self.name, "value")
        self._resolved = (key, value)
        self._key_ser = key.serialize
        self._value_ser = value.serialize
        self._send = ctx.send
        self._partition_count = ctx.partition_count
        static = getattr(ctx, "static_partitioner", None)  # optional (see TaskContext)
        self._static = static.static_partition if static is not None else None
        self._known_count = getattr(static, "known_partition_count", None)
        if isinstance(key, _serdes.TimeWindowedSerde) and key.inner is not None:
            self._inner_key_ser = key.inner.serialize

    def process(self, record: Record) -> None:
        key = record.key
        value = record.value
        partition = None
        if self._static is not None:
            if key is not None:
                partition = self._static_partition(key)
        elif self.partitioner is not None:
            num_partitions = self._partition_count(self.full_topic)
            partition = self.partitioner(key, value, num_partitions)
            if partition is not None and not 0 <= partition < num_partitions:
                raise ValueError(
                    f"sink {self.name!r}: partitioner returned {partition} for topic "
                    f"{self.full_topic!r} with {num_partitions} partitions"
                )
        elif self._inner_key_ser is not None and key is not None:
            inner = self._inner_key_ser(key.key)
            if inner is not None:
                partition = partition_python(inner, self._partition_count(self.full_topic))
        # try costs nothing until something raises (CPython 3.11+).
        try:
            key_bytes = self._key_ser(key)
        except Exception as exc:
            raise self._serialization_error("key", key, exc) from exc
        try:
            value_bytes = self._value_ser(value)
        except Exception as exc:
            raise self._serialization_error("value", value, exc) from exc
        self._send(
            self.full_topic, key_bytes, value_bytes, record.timestamp, record.headers, partition
        )

    def _static_partition(self, key: Any) -> int:
        """The static partitioner's partition for `key`, checked: a key must
        always have one (None would fall back to hashing, which moves keys)."""
        assert self._static is not None
        num_partitions = self._partition_count(self.full_topic)
        partition = self._static(self.full_topic, key, num_partitions)
        if (
            isinstance(partition, bool)
            or not isinstance(partition, int)
            or not 0 <= partition < num_partitions
        ) and not self._proven(partition):
            raise ValueError(
                f"sink {self.name!r}: static partitioner returned {partition!r} for topic "
                f"{self.full_topic!r} with {num_partitions} partitions (expected 0 to "
                f"{num_partitions - 1}; expand this topic first if the key belongs to a "
                "new partition)"
            )
        return partition

    def _proven(self, partition: Any) -> bool:
        """True for a partition beyond the count in force that the static
        partitioner knows exists: `FirstSeenPartitioner` during an expansion,
        when another instance that had accepted the larger count decided the
        key first (the producer learns the partition when it is produced)."""
        known = self._known_count
        return (
            known is not None
            and isinstance(partition, int)
            and not isinstance(partition, bool)
            and 0 <= partition < known(self.full_topic)
        )

    def _serialization_error(self, part: str, obj: Any, exc: Exception) -> SerializationError:
        """One line: where, which serde (and where it came from), what it got, the fix."""
        serde = self._resolved[0 if part == "key" else 1]
        given = self.key_serde if part == "key" else self.value_serde
        source = f"default.{part}.serde" if given is None else "given in the topology"
        kind = type(obj).__name__
        if self.internal:
            where = f"repartition topic {self.full_topic!r} (node {self.name!r})"
        else:
            where = f"sink {self.name!r} writing topic {self.full_topic!r}"
        message = (
            f"{where}: {part} serde {serde!r} ({source}) cannot serialize "
            f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} "
            f"({type(exc).__name__}: {exc}); fix: {self._fix(part, obj)}"
        )
        return SerializationError(
            message,
            topic=self.full_topic,
            node=self.name,
            part=part,
            serde=serde,
            cause=exc,
            certain=isinstance(exc, TypeError) and _is_builtin(serde),
        )

    def _fix(self, part: str, obj: Any) -> str:
        suggested = _serde_for(obj)
        if suggested is None:
            return (
                f"turn the {part} into str, int, bytes or JSON data before this sink "
                f"(e.g. with map_values), or give {part}_serde a serde for "
                f"{type(obj).__name__}"
            )
        serde_expr, config_name = suggested
        if self.internal:
            call = {
                "repartition": "the repartition()/join() that makes this topic",
                "group_by": "the group_by()/group_by_key() that feeds this aggregation",
            }.get(self.origin or "", "the call that makes this topic")
            return (
                f"pass {part}_serde={serde_expr} to {call}, "
                f"or --set default.{part}.serde={config_name}"
            )
        call = self.origin or "to"
        return (
            f".{call}({self.topic!r}, {part}_serde={serde_expr}), "
            f"or --set default.{part}.serde={config_name}"
        )


def _is_builtin(serde: Any) -> bool:
    return isinstance(
        serde,
        _serdes.BytesSerde
        | _serdes.StringSerde
        | _serdes.Int64Serde
        | _serdes.JsonSerde
        | _serdes.TimeWindowedSerde,
    )


def _serde_for(obj: Any) -> tuple[str, str] | None:
    """The built-in serde for a Python value (`serdes.X`, config name), or None."""
    if isinstance(obj, str):
        return "serdes.STRING", "string"
    if isinstance(obj, bytes | bytearray | memoryview):
        return "serdes.BYTES", "bytes"
    if isinstance(obj, int) and not isinstance(obj, bool):
        return "serdes.INT64", "int64"
    try:
        _serdes.JSON.serialize(obj)
    except (TypeError, ValueError):
        return None
    return "serdes.JSON", "json"
