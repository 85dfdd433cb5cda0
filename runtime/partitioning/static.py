"""Static partitioners: a key's partition never changes when a topic grows.

Why: a stateful task owns the keys of its partition. With Kafka's default
partitioner (`murmur2(key) % partitions`) most keys move when a topic gains
partitions, and their state stays behind in the old task: counts restart,
joins miss. A static partitioner promises that a key keeps its partition for
good (KIP-878's `StaticStreamPartitioner`), which lets the runtime follow a
partition expansion of its input topics without a restart (see
`runtime.polling.expansion`).

The contract (config `static.partitioner`, a `module:attr` naming an object
or a class made with no arguments): `static_partition(topic, key,
num_partitions) -> int` returns a partition in `[0, num_partitions)` for a
non-null key (the deserialized key, as a `to()` partitioner gets it) and must
return the same partition for the same key forever; and optionally
`on_partition_expansion(old_count, new_count)`, run once per expansion on one
instance of the application (on its polling thread: keep it short; see
`runtime.partitioning.expansion_marker` for what "once" guarantees). Records
with a null key are spread round-robin and never reach the partitioner.

A partitioner that needs the cluster (`FirstSeenPartitioner`) also has
`open(application_id, client_config, replication_factor)` and `close()`:
`App.start` calls `open` after its topic checks and before any thread
starts (a failure stops start-up), and `close` once every thread has
stopped (`open_static_partitioner`).

`static_partition` is called by processing threads (sink nodes), several at
once: it must be thread-safe and should be fast (it runs once per record).
"""

from __future__ import annotations

import importlib
import re
import threading
from collections.abc import Callable, Mapping
from typing import Any, Protocol, runtime_checkable

from runtime.partitioning.default import default_partition

__all__ = [
    "StaticPartitioner",
    "VirtualPartitioner",
    "check_static_partitioner",
    "key_bytes",
    "open_static_partitioner",
    "static_partitioner_from_name",
]

_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)


@runtime_checkable
class StaticPartitioner(Protocol):
    """What `static.partitioner` names (see the module docstring)."""

    def static_partition(self, topic: str, key: Any, num_partitions: int) -> int: ...


def check_static_partitioner(obj: Any, shown: str) -> Any:
    """`obj` if it is a usable static partitioner, else ValueError naming `shown`."""
    method = getattr(obj, "static_partition", None)
    if not callable(method):
        kind = f"the class {obj.__name__}" if isinstance(obj, type) else type(obj).__name__
        raise ValueError(
            f"static partitioner {shown} ({kind}) has no static_partition(topic, key, "
            "num_partitions) method"
        )
    for name in ("on_partition_expansion", "open", "close"):
        hook = getattr(obj, name, None)
        if hook is not None and not callable(hook):
            raise ValueError(f"static partitioner {shown}: {name} is not callable")
    return obj


def open_static_partitioner(
    partitioner: Any,
    application_id: str,
    client_config: Mapping[str, Any],
    replication_factor: int,
) -> Callable[[], None]:
    """Call the partitioner's `open` if it has one; returns what undoes it
    (its `close`, or nothing). The caller of `App.start`; exceptions pass."""
    opener = getattr(partitioner, "open", None)
    if partitioner is None or isinstance(partitioner, type) or opener is None:
        return lambda: None
    opener(application_id, dict(client_config), replication_factor)
    closer = getattr(partitioner, "close", None)
    return closer if callable(closer) else (lambda: None)


def static_partitioner_from_name(name: str) -> Any:
    """Resolve `module:attr` to a static partitioner object.

    A class is instantiated with no arguments; an object is used as it is.
    Nothing else is called (a name is configuration). Raises ValueError.
    """
    shown = repr(name if len(name) <= 80 else name[:77] + "...")
    module_name, sep, attr = name.strip().partition(":")
    if not sep or not _DOTTED.fullmatch(module_name) or not _DOTTED.fullmatch(attr):
        raise ValueError(f"static partitioner {shown}: expected 'module:attr' (dotted names)")
    try:
        target: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"static partitioner {shown}: cannot import {module_name!r}: {exc}"
        ) from exc
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ValueError(
                f"static partitioner {shown}: module {module_name!r} has no {attr!r}"
            ) from None
    if isinstance(target, type):
        check_static_partitioner(target, shown)
        target = target()
    return check_static_partitioner(target, shown)


def key_bytes(key: Any) -> bytes:
    """A key's bytes as the built-in serdes write them (so a plain producer
    hashing the serialized key agrees): bytes as they are, str UTF-8, int
    INT64 (8 bytes big-endian)."""
    if isinstance(key, bytes):
        return key
    if isinstance(key, str):
        return key.encode("utf-8")
    if isinstance(key, int) and not isinstance(key, bool):
        return key.to_bytes(8, "big", signed=True)
    raise TypeError(
        f"the static partitioner cannot hash a {type(key).__name__} key: give key_bytes= a "
        "function turning it into bytes"
    )


_key_bytes = key_bytes


class VirtualPartitioner:
    """A ready-made static partitioner over a fixed number of virtual partitions.

    A key's partition is `place(key)` when the placement rule names one, else
    `murmur2(key bytes) % virtual_partitions` (Kafka's default partitioner
    over `virtual_partitions` partitions). Neither depends on the topic's
    current partition count, so no key ever moves.

    The trade-off, plainly: with `virtual_partitions` = the topics' partition
    count before the first expansion, it places every key exactly where
    Kafka's default partitioner did (an existing application can switch to
    it without moving a key). After an expansion the hashed keys stay on
    partitions `0..virtual_partitions-1` for good: the new partitions receive
    only the keys `place` sends there (new tenants, regions, devices: whatever
    your keys say). An expansion adds parallelism for those keys, not for the
    existing hashed key space; spreading existing keys means moving their
    state, which only an offline repartition does.

    `place(key) -> int | None` must be stable per key and may only name
    partitions that exist on every topic the key is written to (expand the
    output topics first: `streams-runtime expand` does). `key_bytes` turns a
    key into the bytes hashed (default: bytes as they are, str UTF-8, int as
    INT64). Thread-safe; `expansions` lists the `(old, new)` counts
    `on_partition_expansion` received on this instance.
    """

    def __init__(
        self,
        virtual_partitions: int,
        place: Callable[[Any], int | None] | None = None,
        key_bytes: Callable[[Any], bytes] = _key_bytes,
    ) -> None:
        if isinstance(virtual_partitions, bool) or not isinstance(virtual_partitions, int):
            raise TypeError(f"virtual_partitions must be an int, got {virtual_partitions!r}")
        if virtual_partitions < 1:
            raise ValueError(f"virtual_partitions must be at least 1, got {virtual_partitions}")
        self.virtual_partitions = virtual_partitions
        self._place = place
        self._key_bytes = key_bytes
        self._lock = threading.Lock()
        self.expansions: list[tuple[int, int]] = []

    def static_partition(self, topic: str, key: Any, num_partitions: int) -> int:
        if self._place is not None:
            placed = self._place(key)
            if placed is not None:
                return placed
        if num_partitions < self.virtual_partitions:
            raise ValueError(
                f"topic {topic!r} has {num_partitions} partitions, fewer than the "
                f"{self.virtual_partitions} virtual partitions of the static partitioner: "
                "create it with at least as many"
            )
        return default_partition(self._key_bytes(key), self.virtual_partitions)

    def on_partition_expansion(self, old_count: int, new_count: int) -> None:
        with self._lock:
            self.expansions.append((old_count, new_count))

    def __repr__(self) -> str:
        return f"VirtualPartitioner({self.virtual_partitions})"
