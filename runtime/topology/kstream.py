"""`KStream`: the stateless DSL, and `BranchedKStream` for `split()`.

Each operation adds one node (or a few) to the builder's graph and returns a new
`KStream` for the result. Function arities follow Kafka Streams: the `*_values`
functions take the value; the others take `(key, value)`.

A stream remembers the serdes of its records when they are known (from
`stream()`, `through()`, `repartition()`; kept by operations that do not change
key or value), and `to()`/`through()`/`repartition()` use them when given none.
Otherwise the configured defaults apply. A stream also remembers whether its
key may have changed since it was read (`map`, `flat_map`, `process`): key-based
operations (`group_by_key`, stream-table `join`) then insert a repartition topic.

Stateful operations: `group_by_key`/`group_by` lead to aggregations
(`runtime.topology.grouped`); `join`/`left_join`/`outer_join` are thin here
and checked and dispatched in `runtime.topology.kstream_joins` (a `KTable`,
a `GlobalKTable`, or another stream with `JoinWindows`).

Over 500 lines as one thing: `KStream` is the DSL's fluent API, one method
per operator as Kafka Streams' `KStream` has, each a few lines that add a
node; `BranchedKStream` is its `split()`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from runtime.topology import kstream_joins
from runtime.topology.builder import (
    GraphBuilder,
    check_callable,
    check_partitions,
    check_serde,
    check_store_name,
    store_spec,
)
from runtime.topology.errors import TopologyError
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import (
    BranchNode,
    FilterNode,
    FilterNotNode,
    FlatMapNode,
    FlatMapValuesNode,
    ForeachNode,
    MapNode,
    MapValuesNode,
    Node,
    Partitioner,
    PassThroughNode,
    PeekNode,
    ProcessorNode,
)
from runtime.topology.processor import Processor
from runtime.topology.stateful_nodes import KeySelectNode
from runtime.topology.windows import JoinWindows

if TYPE_CHECKING:
    from runtime.topology.global_table import GlobalKTable
    from runtime.topology.grouped import KGroupedStream
    from runtime.topology.ktable import KTable

KeyValuePredicate = Callable[[Any, Any], Any]


def _make_filter(d: NodeDef) -> Node:
    return FilterNode(d.name, d.params["fn"])


def _make_filter_not(d: NodeDef) -> Node:
    return FilterNotNode(d.name, d.params["fn"])


def _make_map(d: NodeDef) -> Node:
    return MapNode(d.name, d.params["fn"])


def _make_map_values(d: NodeDef) -> Node:
    return MapValuesNode(d.name, d.params["fn"])


def _make_flat_map(d: NodeDef) -> Node:
    return FlatMapNode(d.name, d.params["fn"])


def _make_flat_map_values(d: NodeDef) -> Node:
    return FlatMapValuesNode(d.name, d.params["fn"])


def _make_peek(d: NodeDef) -> Node:
    return PeekNode(d.name, d.params["fn"])


def _make_foreach(d: NodeDef) -> Node:
    return ForeachNode(d.name, d.params["fn"])


def _make_pass_through(d: NodeDef) -> Node:
    return PassThroughNode(d.name)


def _make_branch(d: NodeDef) -> Node:
    return BranchNode(d.name, d.params["routes"], d.params["default"])


def _make_processor(d: NodeDef) -> Node:
    return ProcessorNode(d.name, d.params["supplier"](), d.stores)


def _make_key_select(d: NodeDef) -> Node:
    return KeySelectNode(d.name, d.params["fn"])


_KEEP: Any = object()


class KStream:
    """An unbounded stream of key/value records (create with `StreamsBuilder.stream`)."""

    __slots__ = ("_graph", "_node", "key_serde", "value_serde", "repartition_required")

    def __init__(
        self,
        graph: GraphBuilder,
        node: str,
        key_serde: Any = None,
        value_serde: Any = None,
        repartition_required: bool = False,
    ) -> None:
        self._graph = graph
        self._node = node
        self.key_serde = key_serde
        self.value_serde = value_serde
        self.repartition_required = repartition_required

    @property
    def name(self) -> str:
        """The name of the node that produces this stream."""
        return self._node

    def __repr__(self) -> str:
        return f"KStream({self._node!r})"

    def graph_builder(self) -> GraphBuilder:
        """The builder's graph this stream belongs to (for the DSL's modules)."""
        return self._graph

    # -- helpers -------------------------------------------------------------

    def _then(
        self,
        prefix: str,
        name: str | None,
        factory: Callable[[NodeDef], Node],
        params: dict[str, Any] | None = None,
        *,
        key_serde: Any = _KEEP,
        value_serde: Any = _KEEP,
        repartition_required: bool | None = None,
    ) -> KStream:
        node = self._graph.node_name(name, prefix)
        self._graph.add_processor(node, factory, (self._node,), params)
        return KStream(
            self._graph,
            node,
            self.key_serde if key_serde is _KEEP else key_serde,
            self.value_serde if value_serde is _KEEP else value_serde,
            self.repartition_required if repartition_required is None else repartition_required,
        )

    # -- stateless operations ------------------------------------------------

    def filter(self, predicate: KeyValuePredicate, name: str | None = None) -> KStream:
        """Keep the records for which `predicate(key, value)` is true."""
        fn = check_callable(predicate, "filter()")
        return self._then("KSTREAM-FILTER-", name, _make_filter, {"fn": fn})

    def filter_not(self, predicate: KeyValuePredicate, name: str | None = None) -> KStream:
        """Drop the records for which `predicate(key, value)` is true."""
        fn = check_callable(predicate, "filter_not()")
        return self._then("KSTREAM-FILTER-", name, _make_filter_not, {"fn": fn})

    def map(
        self, mapper: Callable[[Any, Any], tuple[Any, Any]], name: str | None = None
    ) -> KStream:
        """Replace each record by `mapper(key, value) -> (new_key, new_value)`."""
        fn = check_callable(mapper, "map()")
        return self._then(
            "KSTREAM-MAP-",
            name,
            _make_map,
            {"fn": fn},
            key_serde=None,
            value_serde=None,
            repartition_required=True,
        )

    def select_key(self, mapper: Callable[[Any, Any], Any], name: str | None = None) -> KStream:
        """Set each record's key to `mapper(key, value)`; the value and its serde
        stay (Kafka Streams' `selectKey`). The key may have changed, so a later
        key-based operation (`group_by_key`, a join) repartitions first; the new
        key's serde is the configured default unless the next operation names one."""
        fn = check_callable(mapper, "select_key()")
        return self._then(
            "KSTREAM-KEY-SELECT-",
            name,
            _make_key_select,
            {"fn": fn},
            key_serde=None,
            repartition_required=True,
        )

    def map_values(self, mapper: Callable[[Any], Any], name: str | None = None) -> KStream:
        """Replace each value by `mapper(value)`; the key stays."""
        fn = check_callable(mapper, "map_values()")
        return self._then(
            "KSTREAM-MAPVALUES-", name, _make_map_values, {"fn": fn}, value_serde=None
        )

    def flat_map(
        self, mapper: Callable[[Any, Any], Iterable[tuple[Any, Any]]], name: str | None = None
    ) -> KStream:
        """Replace each record by the `(key, value)` pairs of `mapper(key, value)`."""
        fn = check_callable(mapper, "flat_map()")
        return self._then(
            "KSTREAM-FLATMAP-",
            name,
            _make_flat_map,
            {"fn": fn},
            key_serde=None,
            value_serde=None,
            repartition_required=True,
        )

    def flat_map_values(
        self, mapper: Callable[[Any], Iterable[Any]], name: str | None = None
    ) -> KStream:
        """Replace each record by one record per value of `mapper(value)`, same key."""
        fn = check_callable(mapper, "flat_map_values()")
        return self._then(
            "KSTREAM-FLATMAPVALUES-", name, _make_flat_map_values, {"fn": fn}, value_serde=None
        )

    def peek(self, action: Callable[[Any, Any], Any], name: str | None = None) -> KStream:
        """Call `action(key, value)` for each record and pass the record on."""
        fn = check_callable(action, "peek()")
        return self._then("KSTREAM-PEEK-", name, _make_peek, {"fn": fn})

    def foreach(self, action: Callable[[Any, Any], Any], name: str | None = None) -> None:
        """Call `action(key, value)` for each record (terminal)."""
        fn = check_callable(action, "foreach()")
        self._then("KSTREAM-FOREACH-", name, _make_foreach, {"fn": fn})

    # -- branching and merging -------------------------------------------------

    def split(self, name: str | None = None) -> BranchedKStream:
        """Route records into branches; see `BranchedKStream`.

        Branch names are `name` (or a generated `KSTREAM-BRANCH-...`) followed
        by the branch's own name, or by its index (1, 2, ...; 0 for the default
        branch) when it has none.
        """
        node = self._graph.node_name(name, "KSTREAM-BRANCH-")
        spec = self._graph.add_processor(
            node, _make_branch, (self._node,), {"routes": [], "default": None}
        )
        return BranchedKStream(self, node, spec.params)

    def branch(self, *predicates: KeyValuePredicate, name: str | None = None) -> list[KStream]:
        """One stream per predicate; a record goes to the first that matches.

        Records no predicate matches are dropped. (Kafka Streams' older API;
        prefer `split()`.)
        """
        if not predicates:
            raise TopologyError("branch() needs at least one predicate")
        for predicate in predicates:
            check_callable(predicate, "branch()")
        node = self._graph.node_name(name, "KSTREAM-BRANCH-")
        routes: list[tuple[KeyValuePredicate, str]] = []
        self._graph.add_processor(
            node, _make_branch, (self._node,), {"routes": routes, "default": None}
        )
        streams = []
        for i, predicate in enumerate(predicates):
            child = (
                f"{name}-predicate-{i}"
                if name is not None
                else self._graph.new_name("KSTREAM-BRANCHCHILD-")
            )
            self._graph.add_processor(child, _make_pass_through, (node,))
            routes.append((predicate, child))
            streams.append(
                KStream(
                    self._graph, child, self.key_serde, self.value_serde, self.repartition_required
                )
            )
        return streams

    def merge(self, other: KStream, name: str | None = None) -> KStream:
        """A stream of the records of both streams (no order between the two)."""
        if not isinstance(other, KStream):
            raise TopologyError(f"merge() expects a KStream, got {other!r}")
        if other._graph is not self._graph:
            raise TopologyError("merge(): both streams must come from the same StreamsBuilder")
        node = self._graph.node_name(name, "KSTREAM-MERGE-")
        self._graph.add_processor(node, _make_pass_through, (self._node, other._node))
        return KStream(
            self._graph,
            node,
            self.key_serde if self.key_serde is other.key_serde else None,
            self.value_serde if self.value_serde is other.value_serde else None,
            self.repartition_required or other.repartition_required,
        )

    # -- topics ----------------------------------------------------------------

    def to(
        self,
        topic: str,
        key_serde: Any = None,
        value_serde: Any = None,
        partitioner: Partitioner | None = None,
        name: str | None = None,
    ) -> None:
        """Write the stream to `topic` (terminal).

        Serdes default to the stream's own, then to the configured defaults.
        `partitioner(key, value, num_partitions) -> int | None` picks the
        partition (None: partition by the serialized key).
        """
        key_serde = self._serde(key_serde, self.key_serde, "key_serde")
        value_serde = self._serde(value_serde, self.value_serde, "value_serde")
        node = self._graph.node_name(name, "KSTREAM-SINK-")
        self._graph.add_sink(
            node, self._node, topic, False, key_serde, value_serde, partitioner, origin="to"
        )

    def through(
        self,
        topic: str,
        key_serde: Any = None,
        value_serde: Any = None,
        partitioner: Partitioner | None = None,
        name: str | None = None,
    ) -> KStream:
        """Write to the user topic `topic` and continue with a stream reading it back.

        The new stream belongs to a new subtopology; `topic` must exist (it is a
        user topic, not created by the runtime). `name` names the sink; the
        source is then `<name>-source`.
        """
        key_serde = self._serde(key_serde, self.key_serde, "key_serde")
        value_serde = self._serde(value_serde, self.value_serde, "value_serde")
        sink = self._graph.node_name(name, "KSTREAM-SINK-")
        source = f"{name}-source" if name is not None else None
        self._graph.add_sink(
            sink, self._node, topic, False, key_serde, value_serde, partitioner, origin="through"
        )
        source = self._graph.node_name(source, "KSTREAM-SOURCE-")
        self._graph.add_source(source, [topic], False, key_serde, value_serde)
        return KStream(self._graph, source, key_serde, value_serde)

    def repartition(
        self,
        name: str | None = None,
        partitions: int | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
        partitioner: Partitioner | None = None,
    ) -> KStream:
        """Write to an internal topic and continue with a stream reading it back.

        The topic's relative name is `<name>-repartition` (the runtime prefixes
        `<application.id>-` and creates it, with `partitions` partitions if
        given). Without a name, a generated `KSTREAM-REPARTITION-...` is used.
        The new stream belongs to a new subtopology.
        """
        partitions = check_partitions(partitions)
        key_serde = self._serde(key_serde, self.key_serde, "key_serde")
        value_serde = self._serde(value_serde, self.value_serde, "value_serde")
        base = self._graph.node_name(name, "KSTREAM-REPARTITION-")
        topic = self._graph.reserve_internal_topic(f"{base}-repartition")
        self._graph.add_sink(
            f"{topic}-sink",
            self._node,
            topic,
            True,
            key_serde,
            value_serde,
            partitioner,
            partitions,
            origin="repartition",
        )
        source = f"{topic}-source"
        self._graph.add_source(source, [topic], True, key_serde, value_serde, partitions)
        return KStream(self._graph, source, key_serde, value_serde)

    def to_table(
        self,
        store: str | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KTable:
        """The stream read as a table (Kafka Streams' `toTable`): each record
        upserts its key, a null value deletes it (and goes downstream as a
        tombstone), a null key is dropped (counted as `null_key`).

        A stream whose key may have changed (`map`, `select_key`, ...) is
        repartitioned first, through `<name>-repartition` (`name`, else a
        generated one), so that each key's updates meet in one task. With
        `store` the table is materialized in a store of that name: cached (one
        update per key per commit downstream) and queryable, as
        `StreamsBuilder.table`'s. Without, as Kafka Streams' unmaterialized
        table, every update goes downstream at once; the table still keeps an
        internal, change-logged store (`KSTREAM-TOTABLE-STATE-STORE-...`) so
        that it can be joined. `name` names the table's node.
        """
        from runtime.topology.ktable import KTable, make_table_source

        key_serde = self._serde(key_serde, self.key_serde, "key_serde")
        value_serde = self._serde(value_serde, self.value_serde, "value_serde")
        source: KStream = self
        if self.repartition_required:
            source = self.repartition(name=name, key_serde=key_serde, value_serde=value_serde)
        graph = self._graph
        node = graph.node_name(name, "KSTREAM-TOTABLE-")
        if store is not None:
            store_name = check_store_name(store)
            spec = store_spec(store_name)
        else:
            store_name = graph.new_name("KSTREAM-TOTABLE-STATE-STORE-")
            spec = store_spec(store_name, caching=False)
        graph.add_store(StateStoreDef(spec, key_serde, value_serde))
        graph.add_processor(
            node,
            make_table_source,
            (source._node,),
            {
                "store": store_name,
                "key_serde": key_serde,
                "value_serde": value_serde,
                "queryable": store is not None,  # (table_changes.sends_old_values_unforced)
            },
            (store_name,),
        )
        return KTable.materialized(graph, node, store_name, key_serde, value_serde)

    @staticmethod
    def _serde(given: Any, inherited: Any, what: str) -> Any:
        given = check_serde(given, what)
        return inherited if given is None else given

    # -- grouping --------------------------------------------------------------

    def group_by_key(
        self, key_serde: Any = None, value_serde: Any = None, name: str | None = None
    ) -> KGroupedStream:
        """Group by the current key, for `count`/`reduce`/`aggregate`/`windowed_by`.

        If the key may have changed upstream (`map`, `flat_map`, `process`),
        the aggregation reads through the internal topic `<name>-repartition`
        (`name`, else the store's name). Serdes default to the stream's own.
        """
        from runtime.topology.grouped import KGroupedStream

        return KGroupedStream(
            self._graph,
            self._node,
            self._serde(key_serde, self.key_serde, "key_serde"),
            self._serde(value_serde, self.value_serde, "value_serde"),
            self.repartition_required,
            self._repartition_name(name),
        )

    def group_by(
        self,
        selector: Callable[[Any, Any], Any],
        key_serde: Any = None,
        value_serde: Any = None,
        name: str | None = None,
    ) -> KGroupedStream:
        """Group by the key `selector(key, value)`; always repartitions.

        The aggregation reads through the internal topic `<name>-repartition`
        (`name`, else the store's name), keyed by the new key: `key_serde`
        serializes it (None: the configured default), `value_serde` the values
        (None: the stream's, else the default).
        """
        from runtime.topology.grouped import KGroupedStream

        fn = check_callable(selector, "group_by()")
        node = self._graph.new_name("KSTREAM-KEY-SELECT-")
        self._graph.add_processor(node, _make_key_select, (self._node,), {"fn": fn})
        return KGroupedStream(
            self._graph,
            node,
            check_serde(key_serde, "key_serde"),
            self._serde(value_serde, self.value_serde, "value_serde"),
            True,
            self._repartition_name(name),
        )

    @staticmethod
    def _repartition_name(name: str | None) -> str | None:
        if name is not None and (not isinstance(name, str) or not name):
            raise TopologyError(f"a grouping name must be a non-empty str, got {name!r}")
        return name

    # -- stream-table joins ----------------------------------------------------

    def join(
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: Callable[[Any, Any], Any],
        name: str | Callable[[Any, Any], Any] | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
        *,
        windows: JoinWindows | None = None,
        other_value_serde: Any = None,
        store: str | None = None,
    ) -> KStream:
        """Join with a table (each record with the table's current value for its
        key) or, given `windows`, with another stream (records of equal keys
        at most the windows' time difference apart). A `GlobalKTable` takes
        `(table, key_mapper, joiner, name)`: `runtime.topology.global_table`.

        Table: emits `joiner(stream_value, table_value)` with the record's key
        and timestamp; records whose key the table lacks produce nothing (null
        keys and values are dropped and counted). See `left_join` for how the
        stream and the table must be partitioned.

        Stream (`windows=JoinWindows...`): emits `joiner(this_value,
        other_value)` for each pair, stamped with the later timestamp; see
        `runtime.topology.stream_joins` and docs/dsl.md. `value_serde` and
        `other_value_serde` serialize each side's values in its window store
        (default: the streams' own, else the configured default); `store`
        names the stores (`<store>-this-join-store`, `<store>-other-join-store`).
        """
        return self._joined(
            kstream_joins.join(
                self,
                other,
                joiner,
                name,
                key_serde,
                value_serde,
                windows,
                other_value_serde,
                store,
                left=False,
            )
        )

    def left_join(
        self,
        other: KTable | KStream | GlobalKTable,
        joiner: Callable[[Any, Any], Any],
        name: str | Callable[[Any, Any], Any] | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
        *,
        windows: JoinWindows | None = None,
        other_value_serde: Any = None,
        store: str | None = None,
    ) -> KStream:
        """Left join with a table, or (given `windows`) with another stream.

        Table: each record joined with the table's value for its key, or with
        None; emits `joiner(stream_value, table_value_or_None)` for every
        record with a value (null keys included). The lookup is local, so the
        stream's and the table's source topics form a co-partition group: the
        runtime checks at start-up that they have the same partition count
        (TopicError otherwise). A stream whose key may have changed (`map`,
        `flat_map`, `process`) is repartitioned first, automatically, through
        `<name>-repartition` (`name`, else a generated
        `KSTREAM-REPARTITION-<n>`), with `key_serde`/`value_serde` (default:
        the stream's); that topic joins the co-partition group.

        Stream: as `join`, and a record of this stream that found no partner
        by the time its window closed (stream time past its timestamp +
        after + grace) is emitted once as `joiner(this_value, None)`.
        """
        return self._joined(
            kstream_joins.join(
                self,
                other,
                joiner,
                name,
                key_serde,
                value_serde,
                windows,
                other_value_serde,
                store,
                left=True,
            )
        )

    def outer_join(
        self,
        other: KStream,
        joiner: Callable[[Any, Any], Any],
        windows: JoinWindows,
        name: str | None = None,
        key_serde: Any = None,
        value_serde: Any = None,
        other_value_serde: Any = None,
        store: str | None = None,
    ) -> KStream:
        """Windowed outer join with another stream: as `left_join`, and a
        record of either side without partner is emitted once its window has
        closed, as `joiner(this_value, None)` or `joiner(None, other_value)`."""
        if not isinstance(other, KStream):
            raise TopologyError(f"outer_join() expects a KStream, got {other!r}")
        serdes = (key_serde, value_serde, other_value_serde)
        return self._joined(
            kstream_joins.join_streams(
                self, other, joiner, windows, True, True, name, serdes, store, "outer_join()"
            )
        )

    def _joined(self, joined: kstream_joins.Joined) -> KStream:
        return KStream(
            self._graph, joined.node, joined.key_serde, None, joined.repartition_required
        )

    # -- Processor API ---------------------------------------------------------

    def process(
        self,
        processor_supplier: Callable[[], Processor],
        *store_names: str,
        name: str | None = None,
        key_parallel: bool = True,
    ) -> KStream:
        """Run a `Processor` on each record; returns the stream of what it forwards.

        `processor_supplier` is called once per task for a fresh processor: pass
        the class, or a zero-argument factory, not an instance. `store_names`
        connect state stores the processor may reach via `context.state_store`.
        With `num.threads.per.task` > 1 several threads may call one
        processor's `process` at once, for different keys; `key_parallel=False`
        keeps this subtopology's tasks on one thread at a time (a processor
        whose attributes or stores are shared across keys).
        """
        if isinstance(processor_supplier, Processor) or not callable(processor_supplier):
            raise TopologyError(
                f"process() expects a processor supplier (the Processor class or a "
                f"zero-argument factory), got {processor_supplier!r}: each task needs its "
                "own instance"
            )
        node = self._graph.node_name(name, "KSTREAM-PROCESSOR-")
        params: dict[str, Any] = {"supplier": processor_supplier}
        if not key_parallel:
            params["key_parallel"] = False
        self._graph.add_processor(node, _make_processor, (self._node,), params, store_names)
        return KStream(self._graph, node, None, None, True)


class BranchedKStream:
    """The branches of `KStream.split()`: add with `branch`, finish with
    `default_branch` or `no_default_branch`, which return the branches by name.

    A record goes to the first branch whose predicate matches; unmatched
    records go to the default branch, or are dropped without one.
    """

    __slots__ = ("_stream", "_splitter", "_params", "_branches", "_done")

    def __init__(self, stream: KStream, splitter: str, params: dict[str, Any]) -> None:
        self._stream = stream
        self._splitter = splitter
        self._params = params
        self._branches: dict[str, KStream] = {}
        self._done = False

    def branch(self, predicate: KeyValuePredicate, name: str | None = None) -> BranchedKStream:
        """Add a branch for the records `predicate(key, value)` matches first."""
        check_callable(predicate, "branch()")
        routes: list[tuple[KeyValuePredicate, str]] = self._params["routes"]
        child = self._add_branch(name, len(routes) + 1)
        routes.append((predicate, child))
        return self

    def default_branch(self, name: str | None = None) -> dict[str, KStream]:
        """Add the branch for unmatched records and return all branches by name."""
        self._params["default"] = self._add_branch(name, 0)
        self._done = True
        return dict(self._branches)

    def no_default_branch(self) -> dict[str, KStream]:
        """Drop unmatched records and return all branches by name."""
        self._check_open()
        self._done = True
        return dict(self._branches)

    def _check_open(self) -> None:
        if self._done:
            raise TopologyError(f"split {self._splitter!r} is already finished")

    def _add_branch(self, name: str | None, index: int) -> str:
        self._check_open()
        if name is not None and (not isinstance(name, str) or not name):
            raise TopologyError(f"a branch name must be a non-empty str, got {name!r}")
        child = self._splitter + (name if name is not None else str(index))
        stream = self._stream
        graph = stream._graph
        graph.add_processor(child, _make_pass_through, (self._splitter,))
        graph.new_name(child)  # Kafka Streams advances the name counter per branch
        self._branches[child] = KStream(
            graph, child, stream.key_serde, stream.value_serde, stream.repartition_required
        )
        return child
