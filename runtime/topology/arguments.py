"""Argument checks of the DSL: topic and store names, serdes, callables,
partition counts, and `store_spec` (a `StoreSpec`, errors as TopologyError).

A leaf module (it imports no DSL class) so that the modules which build
parts of the graph for the fluent classes (`kstream_joins`, ...) can check
their arguments without an import cycle through `builder`, which
re-exports these names.

Pure functions, for the thread that defines the application.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from runtime.topology import serdes as _serdes
from runtime.topology.errors import TopologyError

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec

_LEGAL_TOPIC = re.compile(r"[A-Za-z0-9._-]+")
_MAX_TOPIC_LENGTH = 249


def check_topic(topic: Any, what: str = "topic") -> str:
    """A legal Kafka topic name, or TopologyError."""
    if not isinstance(topic, str):
        raise TopologyError(f"{what} must be a str, got {topic!r}")
    if not _LEGAL_TOPIC.fullmatch(topic) or topic in (".", "..") or len(topic) > _MAX_TOPIC_LENGTH:
        raise TopologyError(
            f"illegal {what} {topic!r}: use 1-{_MAX_TOPIC_LENGTH} of [A-Za-z0-9._-], not '.' or '..'"
        )
    return topic


def check_serde(serde: Any, what: str) -> Any:
    """None (use the stream's or the configured default), a serde object, or a name."""
    if serde is None:
        return None
    if isinstance(serde, str):
        try:
            return _serdes.serde_from_name(serde)
        except ValueError as exc:
            raise TopologyError(f"{what}: {exc}") from None
    if isinstance(serde, type):
        raise TopologyError(f"{what}: pass a serde instance, not the class {serde.__name__}")
    if not isinstance(serde, _serdes.Serde):
        raise TopologyError(f"{what}: {serde!r} has no serialize()/deserialize() methods")
    return serde


def check_store_name(name: Any) -> str:
    """A legal state store name: its changelog topic `<app>-<name>-changelog` must be legal."""
    if not isinstance(name, str) or not name:
        raise TopologyError(f"a state store name must be a non-empty str, got {name!r}")
    if not _LEGAL_TOPIC.fullmatch(name) or name in (".", ".."):
        raise TopologyError(
            f"illegal state store name {name!r}: use [A-Za-z0-9._-] (it names a changelog topic)"
        )
    return name


def store_spec(name: str, **options: Any) -> StoreSpec:
    """A `StoreSpec` (imported here, not at module level: runtime.state imports
    this package, so the import must wait until both are loaded)."""
    from runtime.state.builders import StoreSpec

    try:
        return StoreSpec(name, **options)
    except ValueError as exc:
        raise TopologyError(str(exc)) from None


def check_callable(fn: Any, what: str) -> Any:
    if not callable(fn):
        raise TopologyError(f"{what} expects a callable, got {fn!r}")
    return fn


def check_partitions(partitions: Any) -> int | None:
    if partitions is None:
        return None
    if isinstance(partitions, bool) or not isinstance(partitions, int) or partitions < 1:
        raise TopologyError(f"partitions must be a positive int, got {partitions!r}")
    return partitions
