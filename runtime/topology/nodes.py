"""The runtime processor graph: one `Node` object per node per task.

A task's graph (`TaskGraph`) is created by `Subtopology.instantiate()`, wired
once, initialized with the task's `TaskContext` and then driven by the task:
the task hands each input record to a `SourceNode` and the record flows down the
graph as plain method calls (`child.process(record)`), ending in `SinkNode`s
that hand serialized records to `TaskContext.send` (`runtime.topology.sink_node`).

Threads: a graph belongs to one task and is only called by the processing
thread that currently holds that task's lock (init and close included), so no
node needs locking.

Hot path rules: `process` does the node's work and calls `self._emit(record)`;
`_emit` is bound at wiring time to the single child's `process` (the common
case), to a loop over all children, or to a no-op for a leaf. Nodes allocate
nothing per record beyond the new `Record` a transformation has to produce.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

from runtime.topology import serdes as _serdes
from runtime.topology.context import TaskContext
from runtime.topology.processor import Processor, ProcessorContext
from runtime.topology.record import Headers, Record

Emit = Callable[[Record], None]
Predicate = Callable[[Any, Any], Any]
Partitioner = Callable[[Any, Any, int], int | None]


def _drop(record: Record) -> None:
    """The `_emit` of a node without children: the record goes nowhere."""


def _not_initialized(*args: Any) -> Any:
    raise RuntimeError("node used before init()")


def _emit_to_all(processes: tuple[Emit, ...]) -> Emit:
    def emit_all(record: Record) -> None:
        for process in processes:
            process(record)

    return emit_all


def resolve_serde(given: Any, default: Any, node: str, what: str) -> _serdes.Serde:
    """The serde a node uses: its own, else the task's configured default.

    `default` may also be a serde name (`"string"`, `"module:attr"`), as a raw
    config value would be. A `serdes.windowed(None, size)` gets the default as
    its inner key serde. Called at `init`, never per record.
    """
    serde = given if given is not None else default
    if serde is None:
        raise ValueError(
            f"node {node!r} has no {what} serde and no default.{what}.serde is configured"
        )
    if isinstance(serde, str):
        serde = _serdes.serde_from_name(serde)
    if not isinstance(serde, _serdes.Serde):
        raise ValueError(f"node {node!r}: {what} serde {serde!r} has no serialize/deserialize")
    if getattr(serde, "inner", False) is None and hasattr(serde, "with_inner"):
        # A wrapping serde over "the default" (windowed keys, a table
        # re-grouping's value pairs): the inner serde is the default.
        serde = serde.with_inner(resolve_serde(None, default, node, what))
    return serde


class Node:
    """One node of a task's processor graph.

    `children` is in wiring order; `forward` sends a record to every child in
    that order, or to the one child named `to`. Subclasses override `process`
    (and `init`/`close` if they hold resources) and call `self._emit(record)`
    to pass a record on; the base `process` is a pass-through.
    """

    __slots__ = ("name", "children", "_children_by_name", "_emit")

    def __init__(self, name: str) -> None:
        self.name = name
        self.children: list[Node] = []
        self._children_by_name: dict[str, Node] = {}
        self._emit: Emit = _drop

    def add_child(self, child: Node) -> None:
        """Wire `child` below this node (by `Subtopology.instantiate`, before `init`)."""
        self.children.append(child)
        self._children_by_name[child.name] = child
        self._children_changed()

    def _children_changed(self) -> None:
        if not self.children:
            self._emit = _drop
        elif len(self.children) == 1:
            self._emit = self.children[0].process
        else:
            self._emit = _emit_to_all(tuple(child.process for child in self.children))

    def init(self, ctx: TaskContext) -> None:
        """Prepare for processing; called once per task, parents before children."""

    def process(self, record: Record) -> None:
        self._emit(record)

    def close(self) -> None:
        """Release what `init` acquired; called once when the task closes."""

    def forward(self, record: Record, to: str | None = None) -> None:
        """Pass `record` to every child, or only to the child named `to`."""
        if to is None:
            self._emit(record)
            return
        child = self._children_by_name.get(to)
        if child is None:
            known = ", ".join(self._children_by_name) or "none"
            raise ValueError(f"node {self.name!r} has no child named {to!r} (children: {known})")
        child.process(record)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class StoreNode(Node):
    """A node that owns one store of its task, with the key and value serdes it
    reads and writes that store with.

    `init` binds the store, the serdes (the app's defaults where none was
    given) and the drop counter; `close` lets the store go. The aggregations,
    session and sliding windows and suppression build on it. Called by the
    thread holding the task.
    """

    __slots__ = (
        "store_name",
        "key_serde",
        "value_serde",
        "_store",
        "_key_ser",
        "_key_de",
        "_value_ser",
        "_value_de",
        "_dropped",
    )

    def __init__(self, name: str, store: str, key_serde: Any, value_serde: Any) -> None:
        super().__init__(name)
        self.store_name = store
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._store: Any = None
        self._key_ser: Callable[[Any], bytes | None] = _not_initialized
        self._key_de: Callable[[bytes | None], Any] = _not_initialized
        self._value_ser: Callable[[Any], bytes | None] = _not_initialized
        self._value_de: Callable[[bytes | None], Any] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._store = ctx.state_store(self.store_name)
        key = resolve_serde(self.key_serde, ctx.default_key_serde, self.name, "key")
        value = resolve_serde(self.value_serde, ctx.default_value_serde, self.name, "value")
        self._key_ser, self._key_de = key.serialize, key.deserialize
        self._value_ser, self._value_de = value.serialize, value.deserialize
        self._dropped = ctx.record_dropped

    def close(self) -> None:
        self._store = None


class SourceNode(Node):
    """Turns one consumed Kafka record into a `Record` and forwards it.

    `topics` are the topic names as written in the topology (relative names
    for internal topics); `topic` is the first of them (the only one unless the
    stream was built from a list of topics). Serdes given as None resolve to the
    task's defaults at `init`.
    """

    __slots__ = ("topics", "internal", "key_serde", "value_serde", "_key_de", "_value_de")

    def __init__(
        self,
        name: str,
        topics: Sequence[str],
        internal: bool = False,
        key_serde: Any = None,
        value_serde: Any = None,
    ) -> None:
        super().__init__(name)
        if not topics:
            raise ValueError(f"source {name!r} reads no topic")
        self.topics = tuple(topics)
        self.internal = internal
        self.key_serde = key_serde
        self.value_serde = value_serde
        self._key_de: Callable[[bytes | None], Any] = _not_initialized
        self._value_de: Callable[[bytes | None], Any] = _not_initialized

    @property
    def topic(self) -> str:
        return self.topics[0]

    def init(self, ctx: TaskContext) -> None:
        self._key_de = resolve_serde(
            self.key_serde, ctx.default_key_serde, self.name, "key"
        ).deserialize
        self._value_de = resolve_serde(
            self.value_serde, ctx.default_value_serde, self.name, "value"
        ).deserialize

    def deserialize(
        self,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        topic: str,
        partition: int,
        offset: int,
    ) -> Record:
        """Build the `Record` for one consumed message; raises on bad data.

        `topic` is the full topic name the message was consumed from. The
        caller (the task) catches the error and applies the deserialization
        exception handler.
        """
        return Record(
            self._key_de(key), self._value_de(value), timestamp, headers, topic, partition, offset
        )


class PassThroughNode(Node):
    """Forwards every record unchanged (merge, branch children)."""

    __slots__ = ()


class FilterNode(Node):
    __slots__ = ("predicate",)

    def __init__(self, name: str, predicate: Predicate) -> None:
        super().__init__(name)
        self.predicate = predicate

    def process(self, record: Record) -> None:
        if self.predicate(record.key, record.value):
            self._emit(record)


class FilterNotNode(Node):
    __slots__ = ("predicate",)

    def __init__(self, name: str, predicate: Predicate) -> None:
        super().__init__(name)
        self.predicate = predicate

    def process(self, record: Record) -> None:
        if not self.predicate(record.key, record.value):
            self._emit(record)


class MapNode(Node):
    """`fn(key, value) -> (new_key, new_value)`."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any, Any], tuple[Any, Any]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        key, value = self.fn(record.key, record.value)
        self._emit(record.with_key_value(key, value))


class MapValuesNode(Node):
    """`fn(value) -> new_value`."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        self._emit(record.with_value(self.fn(record.value)))


class FlatMapNode(Node):
    """`fn(key, value) -> iterable of (key, value)`; each pair is forwarded."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any, Any], Iterable[tuple[Any, Any]]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        emit = self._emit
        for key, value in self.fn(record.key, record.value):
            emit(record.with_key_value(key, value))


class FlatMapValuesNode(Node):
    """`fn(value) -> iterable of values`; each value is forwarded with the input key."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any], Iterable[Any]]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        emit = self._emit
        for value in self.fn(record.value):
            emit(record.with_value(value))


class PeekNode(Node):
    """Calls `fn(key, value)` for its side effect, then forwards the record."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        self.fn(record.key, record.value)
        self._emit(record)


class ForeachNode(Node):
    """Calls `fn(key, value)`; a terminal node."""

    __slots__ = ("fn",)

    def __init__(self, name: str, fn: Callable[[Any, Any], Any]) -> None:
        super().__init__(name)
        self.fn = fn

    def process(self, record: Record) -> None:
        self.fn(record.key, record.value)


class BranchNode(Node):
    """Routes each record to the child of the first predicate that matches.

    `routes` pairs each predicate with the name of its child; `default` names
    the child that gets records no predicate matches (None: they are dropped).
    """

    __slots__ = ("routes", "default", "_routes", "_default")

    def __init__(
        self, name: str, routes: Sequence[tuple[Predicate, str]], default: str | None = None
    ) -> None:
        super().__init__(name)
        self.routes = tuple(routes)
        self.default = default
        self._routes: tuple[tuple[Predicate, Emit], ...] = ()
        self._default: Emit = _drop

    def _children_changed(self) -> None:
        super()._children_changed()
        by_name = self._children_by_name
        self._routes = tuple(
            (predicate, by_name[child].process)
            for predicate, child in self.routes
            if child in by_name
        )
        default = by_name.get(self.default) if self.default is not None else None
        self._default = default.process if default is not None else _drop

    def init(self, ctx: TaskContext) -> None:
        missing = [child for _, child in self.routes if child not in self._children_by_name]
        if missing:
            raise RuntimeError(f"branch node {self.name!r} is missing children {missing}")

    def process(self, record: Record) -> None:
        key = record.key
        value = record.value
        for predicate, emit in self._routes:
            if predicate(key, value):
                emit(record)
                return
        self._default(record)


class ProcessorNode(Node):
    """Runs a user `Processor` (Processor API).

    `store_names` are the state stores the processor was connected to; only
    those are reachable through `ProcessorContext.state_store`.
    """

    __slots__ = ("processor", "store_names", "context")

    def __init__(self, name: str, processor: Processor, store_names: Sequence[str] = ()) -> None:
        super().__init__(name)
        if not callable(getattr(processor, "process", None)):
            raise TypeError(
                f"processor node {name!r}: the supplier returned {processor!r}, which has no process()"
            )
        self.processor = processor
        self.store_names = frozenset(store_names)
        self.context: ProcessorContext | None = None

    def init(self, ctx: TaskContext) -> None:
        self.context = ProcessorContext(ctx, self)
        self.processor.init(self.context)

    def process(self, record: Record) -> None:
        self.processor.process(record)

    def close(self) -> None:
        self.processor.close()
