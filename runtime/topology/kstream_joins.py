"""The join operators of `KStream` (`join`, `left_join`, `outer_join`):
argument checking, and dispatch on what is joined.

`KStream`'s methods are thin: they hand their arguments here and wrap the
`Joined` answer in a new `KStream`. What the other side is decides the
graph:

- a `GlobalKTable`: `runtime.topology.global_table.global_join` (Kafka
  Streams' positional `(table, key_mapper, joiner, name)`);
- a `KStream` with `windows=JoinWindows...`: the windowed stream-stream join
  of `runtime.topology.stream_join_dsl`, each side repartitioned first if
  its key may have changed;
- a `KTable`: one stream-table join node (`StreamTableJoinNode`) reading the
  table through its value getter, the stream repartitioned first if its key
  may have changed, both sides' source topics one co-partition group.

Kept apart from `runtime.topology.kstream` so that the fluent class stays a
list of short operators. This module imports neither `kstream` nor `ktable`
nor `builder` at run time (types only; the checks come from
`runtime.topology.arguments`), so it adds no import cycle.

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from runtime.topology.arguments import check_callable, check_serde, check_store_name, store_spec
from runtime.topology.errors import TopologyError
from runtime.topology.global_table import GlobalKTable, global_join
from runtime.topology.graph import NodeDef
from runtime.topology.nodes import Node
from runtime.topology.stateful_nodes import StreamTableJoinNode
from runtime.topology.stream_join_dsl import stream_join
from runtime.topology.windows import JoinWindows

if TYPE_CHECKING:
    from runtime.topology.kstream import KStream
    from runtime.topology.ktable import KTable


class Joined(NamedTuple):
    """The joined stream, for `KStream` to wrap: the node producing it, its
    key serde, and whether its key may differ from its partitioning."""

    node: str
    key_serde: Any
    repartition_required: bool


def _make_join(d: NodeDef) -> Node:
    p = d.params
    return StreamTableJoinNode(d.name, p["getter"], p["joiner"], p["left"])


def _serde(given: Any, inherited: Any, what: str) -> Any:
    given = check_serde(given, what)
    return inherited if given is None else given


def join(
    stream: KStream,
    other: Any,
    joiner: Any,
    name: Any,
    key_serde: Any,
    value_serde: Any,
    windows: JoinWindows | None,
    other_value_serde: Any,
    store: str | None,
    left: bool,
) -> Joined:
    """`stream.join(...)` (`left=False`) or `stream.left_join(...)`: dispatch on
    `other` (a `GlobalKTable`, a `KStream`, else a `KTable`)."""
    what = "left_join()" if left else "join()"
    if isinstance(other, GlobalKTable):  # (table, key_mapper, joiner, name) as Kafka Streams
        extra = (value_serde, windows, other_value_serde, store)
        graph = stream.graph_builder()
        node = global_join(graph, stream.name, other, joiner, name, left, key_serde, extra)
        return Joined(node, stream.key_serde, stream.repartition_required)
    if name is not None and not isinstance(name, str):
        raise TopologyError(f"a join's name must be a str, got {name!r}")
    if isinstance(other, type(stream)):  # another KStream
        return join_streams(
            stream,
            other,
            joiner,
            windows,
            left,
            False,
            name,
            (key_serde, value_serde, other_value_serde),
            store,
            what,
        )
    if windows is not None or other_value_serde is not None or store is not None:
        raise TopologyError(
            f"{what}: windows, other_value_serde and store are for joining two streams; "
            "a stream-table join takes none"
        )
    return join_table(stream, other, joiner, left, name, key_serde, value_serde)


def join_streams(
    stream: KStream,
    other: KStream,
    joiner: Callable[[Any, Any], Any],
    windows: JoinWindows | None,
    left_outer: bool,
    right_outer: bool,
    name: str | None,
    serdes: tuple[Any, Any, Any],
    store: str | None,
    what: str,
) -> Joined:
    """The windowed join of two streams (`join`, `left_join`, `outer_join`);
    `serdes` are the user's `(key_serde, value_serde, other_value_serde)`,
    each defaulting to the streams' own."""
    if not isinstance(windows, JoinWindows):
        raise TopologyError(
            f"{what} of two streams needs windows=JoinWindows...(...), got {windows!r}"
        )
    graph = stream.graph_builder()
    if other.graph_builder() is not graph:
        raise TopologyError(f"{what}: both streams must come from one StreamsBuilder")
    fn = check_callable(joiner, what)
    key_serde = _serde(serdes[0], stream.key_serde, "key_serde")
    this_serde = _serde(serdes[1], stream.value_serde, "value_serde")
    other_serde = _serde(serdes[2], other.value_serde, "other_value_serde")
    this = stream
    if stream.repartition_required:
        this = stream.repartition(
            name=f"{name}-left" if name else None, key_serde=key_serde, value_serde=this_serde
        )
    that = other
    if other.repartition_required:
        that = other.repartition(
            name=f"{name}-right" if name else None, key_serde=key_serde, value_serde=other_serde
        )
    merge = stream_join(
        graph,
        this.name,
        that.name,
        fn,
        windows,
        left_outer,
        right_outer,
        name,
        (key_serde, this_serde, other_serde),
        None if store is None else check_store_name(store),
        store_spec,
    )
    return Joined(merge, key_serde, False)


def join_table(
    stream: KStream,
    table: KTable,
    joiner: Callable[[Any, Any], Any],
    left: bool,
    name: str | None,
    key_serde: Any,
    value_serde: Any,
) -> Joined:
    """The stream-table join: each record looks its key up in `table`."""
    what = "left_join()" if left else "join()"
    # A KTable is what has a value getter (the class is not imported here:
    # that would close an import cycle through the fluent classes).
    if isinstance(table, type(stream)) or not callable(getattr(table, "value_getter", None)):
        raise TopologyError(f"{what} expects a KTable, got {table!r}")
    graph = stream.graph_builder()
    if table.graph_builder() is not graph:
        raise TopologyError(f"{what}: the stream and the table must come from one StreamsBuilder")
    getter = table.value_getter(what)
    fn = check_callable(joiner, what)
    if stream.repartition_required:
        stream = stream.repartition(name=name, key_serde=key_serde, value_serde=value_serde)
    node = graph.node_name(name, "KSTREAM-LEFTJOIN-" if left else "KSTREAM-JOIN-")
    graph.add_processor(
        node,
        _make_join,
        (stream.name,),
        {"getter": getter, "joiner": fn, "left": left},
        (getter.store,),
    )
    graph.add_copartition_group(
        graph.source_topics_of(stream.name) | graph.source_topics_of(table.name)
    )
    return Joined(node, stream.key_serde, False)
