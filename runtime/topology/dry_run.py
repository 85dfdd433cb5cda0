"""A dry run of a subtopology's serdes on sample input, before the app starts.

A sink whose serde cannot take what the topology hands it (`map_values(lambda
v: {"x": v}).to("out")` with the default BYTES serde, `group_by` returning a
str without `key_serde`) fails on every record. `dry_run` finds that on a
real input record before any task exists, so start-up can stop with the
sink's message (exit 2) instead of the app dying on its first record.

Only side-effect-free DSL steps run: filter, filter_not, map, map_values,
flat_map, flat_map_values, split/branch, merge, the group_by key selector and
the null-key filter before a repartition topic, and sinks (which serialize and
send nothing). A record that reaches any other node (peek, foreach, process,
aggregations, joins) stops there, so no user side effect and no store is
touched. Errors other than a sink's `SerializationError` (bad input, a
mapper raising on this record) end the sample's run silently: they are the
error handlers' business at runtime.

Called once by `App.start` on the starting thread; builds its own nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from runtime.topology.context import PunctuationType
from runtime.topology.errors import SerializationError
from runtime.topology.nodes import (
    BranchNode,
    FilterNode,
    FilterNotNode,
    FlatMapNode,
    FlatMapValuesNode,
    MapNode,
    MapValuesNode,
    Node,
    PassThroughNode,
    SourceNode,
)
from runtime.topology.record import Headers
from runtime.topology.sink_node import SinkNode
from runtime.topology.stateful_nodes import KeySelectNode, NullKeyFilterNode
from runtime.topology.topology import Subtopology

__all__ = ["Sample", "dry_run"]

# Nodes that only compute from the record (the user's functions are assumed
# pure, as Kafka Streams assumes of these steps).
_PURE = (
    FilterNode,
    FilterNotNode,
    MapNode,
    MapValuesNode,
    FlatMapNode,
    FlatMapValuesNode,
    BranchNode,
    PassThroughNode,
    KeySelectNode,
    NullKeyFilterNode,
    SinkNode,
)


@dataclass(frozen=True)
class Sample:
    """One consumed input record, as bytes."""

    topic: str  # the full topic name
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers | None = None


class _Cancelled:
    def cancel(self) -> None:
        pass


class _DryRunContext:
    """A `TaskContext` that sends nothing anywhere and holds no stores."""

    def __init__(
        self,
        application_id: str,
        default_key_serde: Any,
        default_value_serde: Any,
        partitions: dict[str, int],
    ) -> None:
        self.task_id = "dry-run"
        self.application_id = application_id
        self.default_key_serde = default_key_serde
        self.default_value_serde = default_value_serde
        # Sinks partition nothing in a dry run: the serdes are what is tried.
        self.static_partitioner = None
        self._partitions = partitions
        self.record_timestamp = 0
        self.stream_time = -1

    def send(self, *args: Any) -> None:
        """Serialized output is dropped: only serializing it was the point."""

    def partition_count(self, topic: str) -> int:
        return self._partitions.get(topic, 1)

    def resolve_topic(self, name: str, internal: bool) -> str:
        return f"{self.application_id}-{name}" if internal else name

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, callback: Callable[[int], None]
    ) -> _Cancelled:
        return _Cancelled()

    def request_commit(self) -> None:
        pass

    def state_store(self, name: str) -> Any:
        raise KeyError(f"no state store {name!r} in a dry run")

    def register_flush_listener(self, store: str, listener: Any) -> None:
        pass

    def record_dropped(self, reason: str) -> None:
        pass


def dry_run(
    subtopology: Subtopology,
    samples: Iterable[Sample],
    application_id: str,
    default_key_serde: Any,
    default_value_serde: Any,
    partitions: dict[str, int],
    relative: Callable[[str], str] = lambda topic: topic,
) -> SerializationError | None:
    """The first sink serialization error the samples cause, or None.

    `samples` are records of this subtopology's source topics; `relative`
    maps a full topic name to the name as written in the topology (internal
    topics drop the `<application.id>-` prefix).
    """
    graph = subtopology.instantiate()
    ctx = _DryRunContext(application_id, default_key_serde, default_value_serde, partitions)
    reachable = _prune(graph.sources.values())
    try:
        for node in reachable:
            node.init(ctx)
    except Exception:  # a node that cannot start without its task: no dry run
        return None
    for sample in samples:
        source = graph.sources.get(relative(sample.topic))
        if source is None:
            continue
        try:
            record = source.deserialize(
                sample.key,
                sample.value,
                sample.timestamp,
                sample.headers,
                sample.topic,
                sample.partition,
                sample.offset,
            )
        except Exception:
            continue  # bad input: the deserialization handler's business
        ctx.record_timestamp = sample.timestamp
        try:
            source.process(record)
        except SerializationError as exc:
            return exc
        except Exception:
            continue
    return None


def _prune(sources: Iterable[SourceNode]) -> list[Node]:
    """Rewire the graph so records stop at the first node that is not pure.

    Each impure child of a reachable node is replaced by a stand-in with the
    same name that drops the record (so a branch still routes by name, and
    the record goes where it would have, then stops). Returns the reachable
    nodes, parents first.
    """
    seen: set[int] = set()
    order: list[Node] = []
    stack: list[Node] = list(dict.fromkeys(sources))
    while stack:
        node = stack.pop(0)
        if id(node) in seen:
            continue
        seen.add(id(node))
        order.append(node)
        children = list(node.children)
        node.children.clear()
        node._children_by_name.clear()
        for child in children:
            kept = child if isinstance(child, _PURE) else Node(child.name)
            node.children.append(kept)
            node._children_by_name[kept.name] = kept
            if kept is child:
                stack.append(child)
        node._children_changed()
    return order
