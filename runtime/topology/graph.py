"""Build-time description of the processor graph (internal to this package).

The builder records one `NodeSpec` per node while the user chains DSL calls;
`StreamsBuilder.build()` freezes them into `NodeDef`s, which the `Topology`
keeps. A `NodeDef` knows how to make its runtime `Node` (`factory`), so a
subtopology can create fresh nodes for every task.

Stateful DSL operations (aggregations, tables, joins) attach state store
names to their nodes (`stores`); nodes sharing a store end up in the same
subtopology. Each store the topology creates is described once by a
`StateStoreDef`: its `StoreSpec` plus the serdes that read it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from runtime.topology.nodes import Node

if TYPE_CHECKING:
    # Only for types: runtime.state imports runtime.topology.record, so a
    # module-level import here would be circular when runtime.state loads first.
    from runtime.state.builders import StoreSpec


@dataclass(frozen=True)
class StateStoreDef:
    """A state store of a topology: how to build it and how to read it.

    `spec` is what the runtime builds for every task of the subtopology that
    uses the store. `key_serde`/`value_serde` turn the store's bytes back into
    objects (None: the configured `default.key.serde`/`default.value.serde`).
    For a window store (`spec.kind == "window"`) `key_serde` is the serde of
    the record key inside the composite store key `key bytes + 8-byte start`.
    """

    spec: StoreSpec
    key_serde: Any = None
    value_serde: Any = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def windowed(self) -> bool:
        return self.spec.kind == "window"


class NodeKind(Enum):
    SOURCE = "Source"
    PROCESSOR = "Processor"
    SINK = "Sink"


@dataclass(frozen=True, eq=False)
class NodeDef:
    """An immutable node description, part of a built `Topology`.

    `topics`: for a source, the topics it reads; for a sink, its one topic
    (names as written; relative when `internal`). `partitions`: the partition
    count requested for an internal topic, or None. `params`: what `factory`
    needs to build the runtime node (functions, serdes, routes).
    """

    name: str
    kind: NodeKind
    order: int
    factory: Callable[[NodeDef], Node]
    parents: tuple[str, ...]
    children: tuple[str, ...]
    stores: tuple[str, ...]
    topics: tuple[str, ...]
    internal: bool
    partitions: int | None
    params: Mapping[str, Any]

    def make(self) -> Node:
        return self.factory(self)


@dataclass(eq=False)
class NodeSpec:
    """A node while the topology is being built; mutable until `freeze`."""

    name: str
    kind: NodeKind
    order: int
    factory: Callable[[NodeDef], Node]
    parents: list[str] = field(default_factory=list)
    children: list[str] = field(default_factory=list)
    stores: list[str] = field(default_factory=list)
    topics: list[str] = field(default_factory=list)
    internal: bool = False
    partitions: int | None = None
    params: dict[str, Any] = field(default_factory=dict)

    def freeze(self) -> NodeDef:
        params = {k: tuple(v) if isinstance(v, list) else v for k, v in self.params.items()}
        return NodeDef(
            name=self.name,
            kind=self.kind,
            order=self.order,
            factory=self.factory,
            parents=tuple(self.parents),
            children=tuple(self.children),
            stores=tuple(self.stores),
            topics=tuple(self.topics),
            internal=self.internal,
            partitions=self.partitions,
            params=MappingProxyType(params),
        )
