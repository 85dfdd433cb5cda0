"""The graph of a windowed stream-stream join, as `KStream.join`/`left_join`/
`outer_join` add it (the nodes themselves are in `runtime.topology.stream_joins`).

Kafka Streams' node and store names: per side a `KSTREAM-WINDOWED-<n>` node
that remembers records in its window store, a join node
(`KSTREAM-JOINTHIS-<n>`/`KSTREAM-JOINOTHER-<n>`, `OUTERTHIS`/`OUTEROTHER` for
the outer sides) and one `KSTREAM-MERGE-<n>` below both. Stores:
`<join node>-store` per side (or `<store>-this-join-store` /
`<store>-other-join-store` when the user names them), and for left and outer
joins the shared `KSTREAM-OUTERSHARED-<n>-store` of pending unmatched records.
With `name`, nodes are `<name>-this-windowed`, `<name>-this-join`, ...,
`<name>-merge`.

Both sides' source topics form a co-partition group. The join nodes opt out
of key-parallel processing (their stream time is shared across keys).

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import Node, PassThroughNode
from runtime.topology.stream_joins import JoinTimeTrackers, JoinWindowNode, StreamJoinNode
from runtime.topology.windows import JoinWindows

if TYPE_CHECKING:
    # Types only: the builder imports the DSL, which imports this module.
    from runtime.state.builders import StoreSpec
    from runtime.topology.builder import GraphBuilder


def _make_window(d: NodeDef) -> Node:
    p = d.params
    return JoinWindowNode(
        d.name, p["store"], p["key_serde"], p["value_serde"], p["windows"].retention_ms
    )


def _make_join(d: NodeDef) -> Node:
    p = d.params
    return StreamJoinNode(
        d.name,
        p["joiner"],
        p["windows"],
        p["left"],
        p["outer"],
        p["other_store"],
        p["outer_store"],
        p["trackers"],
        p["serdes"],
    )


def _make_merge(d: NodeDef) -> Node:
    return PassThroughNode(d.name)


def stream_join(
    graph: GraphBuilder,
    this: str,
    other: str,
    joiner: Callable[[Any, Any], Any],
    windows: JoinWindows,
    left_outer: bool,
    right_outer: bool,
    name: str | None,
    serdes: tuple[Any, Any, Any],
    store: str | None,
    store_spec: Callable[..., StoreSpec],
) -> str:
    """Add the join below the nodes `this` (left) and `other` (right); returns
    the merge node, whose output is the joined stream. `store` is a checked
    store name or None; `store_spec` makes a `StoreSpec` (the builder's)."""
    key_serde, this_serde, other_serde = serdes

    def named(suffix: str, prefix: str) -> str:
        return graph.node_name(f"{name}-{suffix}" if name else None, prefix)

    this_windowed = named("this-windowed", "KSTREAM-WINDOWED-")
    other_windowed = named("other-windowed", "KSTREAM-WINDOWED-")
    join_this = named(
        "outer-this-join" if right_outer else "this-join",
        "KSTREAM-OUTERTHIS-" if right_outer else "KSTREAM-JOINTHIS-",
    )
    join_other = named(
        "outer-other-join" if left_outer else "other-join",
        "KSTREAM-OUTEROTHER-" if left_outer else "KSTREAM-JOINOTHER-",
    )
    merge = named("merge", "KSTREAM-MERGE-")
    if store is not None:
        base = store
        this_store, other_store = f"{base}-this-join-store", f"{base}-other-join-store"
        outer_store = f"{base}-outer-shared-join-store"
    else:
        this_store, other_store = f"{join_this}-store", f"{join_other}-store"
        outer_store = "KSTREAM-OUTERSHARED-" + join_this.rsplit("-", 1)[-1] + "-store"
    size = max(windows.size_ms, 1)  # a window store needs a size; 0 joins equal timestamps
    for store_name, value_serde in ((this_store, this_serde), (other_store, other_serde)):
        spec = store_spec(
            store_name,
            kind="window",
            window_size_ms=size,
            retention_ms=max(windows.retention_ms, size),
            caching=False,
        )
        graph.add_store(StateStoreDef(spec, key_serde, value_serde))
    if left_outer:
        graph.add_store(StateStoreDef(store_spec(outer_store, caching=False), key_serde, None))
    shared = outer_store if left_outer else None
    trackers = JoinTimeTrackers()
    for node, parent, store_name, value_serde in (
        (this_windowed, this, this_store, this_serde),
        (other_windowed, other, other_store, other_serde),
    ):
        graph.add_processor(
            node,
            _make_window,
            (parent,),
            {
                "store": store_name,
                "key_serde": key_serde,
                "value_serde": value_serde,
                "windows": windows,
            },
            (store_name,),
        )
    for node, parent, left, outer, other_side, side_serdes in (
        (join_this, this_windowed, True, left_outer, other_store, serdes),
        (
            join_other,
            other_windowed,
            False,
            right_outer,
            this_store,
            (key_serde, other_serde, this_serde),
        ),
    ):
        stores = (other_side, shared) if shared else (other_side,)
        graph.add_processor(
            node,
            _make_join,
            (parent,),
            {
                "joiner": joiner,
                "windows": windows,
                "left": left,
                "outer": outer,
                "other_store": other_side,
                "outer_store": shared,
                "trackers": trackers,
                "serdes": side_serdes,
                "key_parallel": False,
            },
            stores,
        )
    graph.add_processor(merge, _make_merge, (join_this, join_other))
    graph.add_copartition_group(graph.source_topics_of(this) | graph.source_topics_of(other))
    return merge
