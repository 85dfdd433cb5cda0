"""`cogroup` (KIP-150): several grouped streams aggregated into one table.

    clicks.group_by_key().cogroup(lambda key, click, agg: agg + 1) \\
        .cogroup(views.group_by_key(), lambda key, view, agg: agg + 10) \\
        .aggregate(lambda: 0, value_serde=serdes.INT64)

`KGroupedStream.cogroup(aggregator)` starts a `CogroupedKStream`; `.cogroup(other,
aggregator)` adds inputs; `.aggregate(initializer)` or `.windowed_by(windows)
.aggregate(initializer[, merger])` (time, session (with a merger) and sliding
windows) ends it in one table. As Kafka Streams' `CogroupedStreamAggregateBuilder`:

- one aggregation node per input (`COGROUPKSTREAM-AGGREGATE-<n>`, with `name`:
  `<name>-cogroup-agg-<i>`), each with its input's aggregator, all writing one
  store (`COGROUPKSTREAM-AGGREGATE-STATE-STORE-<n>` or `store=`), and one
  `COGROUPKSTREAM-MERGE-<n>` (`<name>-cogroup-merge`) below them all, the node
  of the resulting table;
- an input whose key changed upstream is repartitioned first, each through
  its own topic: `<grouping name>-repartition` if it was named, else
  `<store>-repartition` for the first such input (Kafka Streams' name) and
  `<store>-<i>-repartition` for the i-th input after it (Kafka Streams would
  name them all `<store>-repartition` and fail);
- all inputs' source topics must be co-partitioned (checked at start-up).

The aggregation nodes are this package's own (`AggregateNode`,
`WindowAggregateNode`, `SessionWindowAggregateNode`,
`SlidingWindowAggregateNode`), so stores, change-logging, restoration, caching
and null handling are theirs. Each node keeps its own stream time, as each of
Kafka Streams' per-input processors does. How updates reach the table:

- key-value and time windows: the store's flush listener is the merge node's
  (one listener per store), so with caching on a key updated by several
  inputs goes out once per commit, as in Kafka Streams; a record's headers
  go with the update (the nodes share the merge node's `LastWrite`);
- session windows: the store is cached; its flush listener is the first
  input node's to initialize (one listener per store; each node forwards to
  the merge node, so any one will do);
- sliding windows: each node forwards its updates itself (the store is not
  cached);
- both: through the merge node, which also holds the
  store's shared time (the newest session end / window start), so windows
  one input wrote are as visible to the other inputs' nodes as Kafka Streams'
  segmented store makes them.

Key-parallel: a key-value cogroup stays key-parallel (its nodes touch only
their record's key; `LastWrite` is one tuple, so a racing thread can lose a
record's headers but never attach another's); windowed cogroups opt out (the
store's time is shared across keys and inputs).

Threads: the DSL classes run on the thread that defines the application; the
nodes on the processing thread holding their task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology.builder import check_callable, check_serde, check_store_name, store_spec
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.ktable import KTable
from runtime.topology.nodes import Node, StoreNode
from runtime.topology.record import Record
from runtime.topology.session_store import SessionWindowAggregateNode
from runtime.topology.sliding_aggregate import SlidingWindowAggregateNode
from runtime.topology.stateful_nodes import (
    AggregateNode,
    WindowAggregateNode,
    _StoreWriterNode,
    aggregate_fold,
)
from runtime.topology.windows import TimeWindows, Windowed

if TYPE_CHECKING:
    from runtime.topology.context import TaskContext
    from runtime.topology.grouped import KGroupedStream

Aggregator = Callable[[Any, Any, Any], Any]

AGGREGATE = "COGROUPKSTREAM-AGGREGATE-"
MERGE = "COGROUPKSTREAM-MERGE-"


# -- nodes ------------------------------------------------------------------------


class CogroupMergeNode(_StoreWriterNode):
    """The node of a key-value cogroup's table: forwards the shared store's updates.

    It registers the store's flush listener (the aggregation nodes do not)
    and receives no records itself.
    """

    __slots__ = ()

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self._bind_values(ctx)


class CogroupWindowMergeNode(CogroupMergeNode):
    """`CogroupMergeNode` of a time-windowed store (keys: key bytes + window start).

    `store_time` is the largest window start any input wrote (-1: none yet),
    the time Kafka Streams' segmented window store expires windows by.
    """

    __slots__ = ("size_ms", "store_time")

    def __init__(self, name: str, store: str, key_serde: Any, value_serde: Any, size: int) -> None:
        super().__init__(name, store, key_serde, value_serde)
        self.size_ms = size
        self.store_time = -1

    def init(self, ctx: TaskContext) -> None:
        super().init(ctx)
        self.store_time = -1  # not restored (nor is a stream time here or in Kafka Streams)

    def on_flush(self, key: bytes, new: bytes | None, old: bytes | None, timestamp: int) -> None:
        start = int.from_bytes(key[-8:], "big")
        key_bytes = key[:-8]
        windowed = Windowed(self._key_de(key_bytes), start, start + self.size_ms)
        value = self._emitted_value(new)
        self._emit(Record(windowed, value, timestamp, self._last_write.headers_of(key_bytes)))


def _bind_to_merge(node: _StoreWriterNode, ctx: TaskContext) -> None:
    """Init of an input's aggregation node: the store and serdes, no flush
    listener (the merge node below has it), and the merge node's `LastWrite`."""
    StoreNode.init(node, ctx)
    node._bind_values(ctx)
    merge = node.children[0] if node.children else None
    if not isinstance(merge, CogroupMergeNode):
        raise RuntimeError(f"cogroup node {node.name!r} is not wired to its merge node")
    node._last_write = merge._last_write


class CogroupAggregateNode(AggregateNode):
    """One input of a key-value cogroup: `aggregator(key, value, agg)` into the shared store."""

    __slots__ = ()

    def init(self, ctx: TaskContext) -> None:
        _bind_to_merge(self, ctx)


class CogroupWindowAggregateNode(WindowAggregateNode):
    """One input of a time-windowed cogroup (its own stream time, as Kafka Streams').

    Late records are judged by this input's stream time, but windows expire
    by the store's: the largest window start any input wrote, minus the
    retention (Kafka Streams' segmented store: a window that starts at or
    before that reads as absent, so an input whose stream time lags starts
    such a window over). The base class's expiry by this node's stream time
    is turned off (`_retention` beyond any time).
    """

    __slots__ = ("_merge",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self._retention = 1 << 62
        self._merge: CogroupWindowMergeNode | None = None

    def init(self, ctx: TaskContext) -> None:
        _bind_to_merge(self, ctx)
        self._observed = -1
        merge = self.children[0]
        assert isinstance(merge, CogroupWindowMergeNode)
        self._merge = merge

    def process(self, record: Record) -> None:
        super().process(record)
        ts = record.timestamp
        if record.key is None or ts < 0 or (record.value is None and not self._count):
            return  # dropped: nothing written
        close = self._observed - self._grace
        written = [s for s in self.windows.window_starts(ts) if s + self._size > close]
        merge = self._merge
        assert merge is not None
        if written and written[-1] > merge.store_time:
            merge.store_time = max(written)
        if merge.store_time >= 0:
            self._store.expire(merge.store_time - self.windows.retention_ms + 1)


class CogroupPassThroughNode(Node):
    """The merge node of a session or sliding cogroup: forwards what its
    parents forward, and holds the time of their shared store."""

    __slots__ = ("store_time", "flush_ctx")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.store_time: int | None = None
        # The context whose flush listener one session input registered (not
        # reset by init: the inputs may initialize before this node).
        self.flush_ctx: TaskContext | None = None

    def init(self, ctx: TaskContext) -> None:
        self.store_time = None


def _merge_of(node: Node) -> CogroupPassThroughNode:
    merge = node.children[0] if node.children else None
    if not isinstance(merge, CogroupPassThroughNode):
        raise RuntimeError(f"cogroup node {node.name!r} is not wired to its merge node")
    return merge


def _get_store_time(node: Node) -> int | None:
    return _merge_of(node).store_time


def _set_store_time(node: Node, value: int | None) -> None:
    if node.children:  # the constructor sets it before wiring; init sets it again
        _merge_of(node).store_time = value


class CogroupSessionAggregateNode(SessionWindowAggregateNode):
    """One input of a session cogroup; the store's time is the merge node's."""

    __slots__ = ()

    _store_time = property(_get_store_time, _set_store_time)

    def _register_flush(self, ctx: TaskContext) -> None:
        merge = _merge_of(self)
        if merge.flush_ctx is not ctx:
            merge.flush_ctx = ctx
            super()._register_flush(ctx)


class CogroupSlidingAggregateNode(SlidingWindowAggregateNode):
    """One input of a sliding-window cogroup; the store's time is the merge node's."""

    __slots__ = ()

    _store_time = property(_get_store_time, _set_store_time)


def _make_aggregate(d: NodeDef) -> Node:
    p = d.params
    return CogroupAggregateNode(d.name, p["store"], p["key_serde"], p["value_serde"], p["fold"])


def _make_window_aggregate(d: NodeDef) -> Node:
    p = d.params
    return CogroupWindowAggregateNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["fold"], p["windows"]
    )


def _make_session_aggregate(d: NodeDef) -> Node:
    p = d.params
    return CogroupSessionAggregateNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["windows"], p["functions"], True
    )


def _make_sliding_aggregate(d: NodeDef) -> Node:
    p = d.params
    return CogroupSlidingAggregateNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["windows"], p["functions"]
    )


def make_merge(d: NodeDef) -> Node:
    """The merge node of a key-value cogroup (a table store writer, for old values)."""
    p = d.params
    return CogroupMergeNode(d.name, p["store"], p["key_serde"], p["value_serde"])


def _make_window_merge(d: NodeDef) -> Node:
    p = d.params
    return CogroupWindowMergeNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["windows"].size_ms
    )


def _make_pass_through_merge(d: NodeDef) -> Node:
    return CogroupPassThroughNode(d.name)


# -- the DSL ------------------------------------------------------------------------

PLAIN, TIME, SESSION, SLIDING = "plain", "time", "session", "sliding"


def _kind(windows: Any) -> str | None:
    """Which aggregation `windows` asks for. Session and sliding windows are
    told apart by their fields, not their classes: their modules import the
    DSL, and this module is part of it (no import cycle)."""
    if windows is None:
        return PLAIN
    if isinstance(windows, TimeWindows):
        return TIME
    if hasattr(windows, "gap_ms") and hasattr(windows, "table_type"):
        return SESSION
    if hasattr(windows, "difference_ms"):
        return SLIDING
    return None


class CogroupedKStream:
    """Grouped streams with one aggregator each, to aggregate into one table."""

    __slots__ = ("_inputs",)

    def __init__(self, inputs: tuple[tuple[KGroupedStream, Aggregator], ...]) -> None:
        self._inputs = inputs

    @classmethod
    def start(cls, grouped: KGroupedStream, aggregator: Aggregator) -> CogroupedKStream:
        """`grouped.cogroup(aggregator)` (called by `KGroupedStream.cogroup`)."""
        return cls(((grouped, check_callable(aggregator, "cogroup() aggregator")),))

    def __repr__(self) -> str:
        return f"CogroupedKStream({[g for g, _ in self._inputs]!r})"

    def cogroup(self, grouped: KGroupedStream, aggregator: Aggregator) -> CogroupedKStream:
        """Add `grouped`, aggregated with `aggregator(key, value, agg)`."""
        from runtime.topology.grouped import KGroupedStream

        if not isinstance(grouped, KGroupedStream):
            raise TopologyError(
                f"cogroup() expects a KGroupedStream (from group_by_key()/group_by()), "
                f"got {grouped!r}"
            )
        if grouped._graph is not self._inputs[0][0]._graph:
            raise TopologyError("cogroup(): the grouped streams come from different builders")
        if any(g is grouped for g, _ in self._inputs):
            raise TopologyError(f"cogroup(): {grouped!r} is already part of this cogroup")
        fn = check_callable(aggregator, "cogroup() aggregator")
        return CogroupedKStream((*self._inputs, (grouped, fn)))

    def aggregate(
        self,
        initializer: Callable[[], Any],
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per key: each input's `aggregator(key, value, agg)`, from `initializer()`.

        One key-value store (cached, change-logged); `value_serde` serializes
        the aggregate (None: `default.value.serde`). Null keys and values are
        dropped (`null_key`, `null_value`).
        """
        init = check_callable(initializer, "aggregate() initializer")
        return _build(self, init, None, None, store, check_serde(value_serde, "value_serde"), name)

    def windowed_by(self, windows: Any) -> WindowedCogroupedKStream:
        """Aggregate per key and window: `TimeWindows`, `SessionWindows` or `SlidingWindows`."""
        if _kind(windows) is None:
            raise TopologyError(
                "windowed_by() expects TimeWindows, SessionWindows or SlidingWindows, "
                f"got {windows!r}"
            )
        return WindowedCogroupedKStream(self, windows)


class WindowedCogroupedKStream:
    """A cogroup aggregated per window (from `CogroupedKStream.windowed_by`)."""

    __slots__ = ("_cogrouped", "windows")

    def __init__(self, cogrouped: CogroupedKStream, windows: Any) -> None:
        self._cogrouped = cogrouped
        self.windows = windows

    def __repr__(self) -> str:
        return f"WindowedCogroupedKStream({self._cogrouped!r}, {self.windows!r})"

    def aggregate(
        self,
        initializer: Callable[[], Any],
        merger: Callable[[Any, Any, Any], Any] | None = None,
        store: str | None = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """Per key and window: each input's aggregator from `initializer()`.

        Session windows need `merger(key, agg1, agg2)` to combine the sessions a
        record joins; time and sliding windows take none.
        """
        init = check_callable(initializer, "aggregate() initializer")
        sessions = _kind(self.windows) == SESSION
        if sessions and merger is None:
            raise TopologyError(
                "aggregate() over SessionWindows needs a merger(key, agg1, agg2) "
                "to combine merged sessions"
            )
        if not sessions and merger is not None:
            raise TopologyError("aggregate(): a merger is only used with SessionWindows")
        if merger is not None:
            check_callable(merger, "aggregate() merger")
        return _build(
            self._cogrouped,
            init,
            self.windows,
            merger,
            store,
            check_serde(value_serde, "value_serde"),
            name,
        )


def _build(
    cogrouped: CogroupedKStream,
    initializer: Callable[[], Any],
    windows: Any,
    merger: Callable[[Any, Any, Any], Any] | None,
    store: str | None,
    value_serde: Any,
    name: str | None,
) -> KTable:
    """Add the repartitions, the per-input nodes, the store and the merge node."""
    kind = _kind(windows)
    inputs = cogrouped._inputs
    first = inputs[0][0]
    graph = first._graph
    key_serde = first.key_serde
    if store is None:
        store_name = graph.new_name(f"{AGGREGATE}STATE-STORE-")
    else:
        store_name = check_store_name(store)
        if graph.store(store_name) is not None:
            raise TopologyError(f"the topology already has a state store named {store_name!r}")
    # Each repartitioned input through its own topic (see the module docstring).
    parents = []
    repartitioned = 0
    for i, (grouped, _fn) in enumerate(inputs):
        prefix = store_name if repartitioned == 0 else f"{store_name}-{i}"
        if grouped.repartition_required:
            repartitioned += grouped._repartition_name is None
        parents.append(grouped._input(prefix, True))
    if len(parents) > 1:
        graph.add_copartition_group(set().union(*(graph.source_topics_of(p) for p in parents)))

    params: dict[str, Any] = {
        "store": store_name,
        "key_serde": key_serde,
        "value_serde": value_serde,
        "windows": windows,
    }
    if kind == PLAIN:
        spec = store_spec(store_name)
        make_node, merge_factory = _make_aggregate, make_merge
    elif kind == TIME:
        spec = store_spec(
            store_name,
            kind="window",
            window_size_ms=windows.size_ms,
            retention_ms=windows.retention_ms,
        )
        make_node, merge_factory = _make_window_aggregate, _make_window_merge
        params["key_parallel"] = False  # the store's time is shared across keys and inputs
    else:
        spec = store_spec(store_name, caching=kind == SESSION)
        make_node = _make_session_aggregate if kind == SESSION else _make_sliding_aggregate
        merge_factory = _make_pass_through_merge
        params["key_parallel"] = False
    graph.add_store(StateStoreDef(spec, key_serde, value_serde))

    nodes = []
    for i, (parent, (_grouped, aggregator)) in enumerate(zip(parents, inputs, strict=True)):
        node = graph.node_name(None if name is None else f"{name}-cogroup-agg-{i}", AGGREGATE)
        node_params = dict(params)
        if kind in (PLAIN, TIME):
            node_params["fold"] = aggregate_fold(initializer, aggregator)
        elif kind == SESSION:
            assert merger is not None
            node_params["functions"] = (initializer, aggregator, merger)
        else:
            node_params["functions"] = (initializer, aggregator)
        graph.add_processor(node, make_node, (parent,), node_params, (store_name,))
        nodes.append(node)
    merge = graph.node_name(None if name is None else f"{name}-cogroup-merge", MERGE)
    # Not connected to the store, as Kafka Streams describes it: the merge node
    # reaches the store of its task (the aggregation nodes connect it).
    graph.add_processor(merge, merge_factory, tuple(nodes), dict(params))

    if kind == PLAIN:
        return KTable.materialized(graph, merge, store_name, key_serde, value_serde)
    if kind == TIME:
        return KTable.materialized(
            graph, merge, store_name, key_serde, value_serde, windows.size_ms
        )
    if kind == SESSION:
        table_type: type[KTable] = windows.table_type()
        return table_type(graph, merge, key_serde, value_serde, store_name, None, windows.gap_ms)
    return KTable(graph, merge, key_serde, value_serde, store_name, None, windows.difference_ms)
