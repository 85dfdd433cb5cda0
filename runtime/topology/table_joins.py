"""Table-table joins: `KTable.join`, `left_join`, `outer_join` of two KTables.

Kafka Streams' `KTableKTableJoin` shape and semantics (caching off: one result
per update):

    this table  -> KTABLE-JOINTHIS-<n>  (look the key up in the other table) -\
                                                                               KTABLE-MERGE-<n>
    other table -> KTABLE-JOINOTHER-<n> (look the key up in this table)  ------/

An update on either side looks its key up in the other side's table (its
store, through `TableValueGetter`) and forwards the joined row, or a
tombstone when this side's row went away:

- inner: nothing when the other side has no row; else `joiner(left, right)`,
  or a tombstone when this side's new value is None.
- left, on the left side: nothing only when the right row, the new and the old
  left value are all None; else `joiner(left, right or None)` (tombstone if
  the new left value is None). On the right side: nothing when there is no
  left row; else `joiner(left, right)` with the new right value, None included.
- outer: as the left side of a left join, on both sides.

Left and outer joins need their outer sides' old values (`table_changes`): a
left row deleted while no right row exists becomes a tombstone only if the
row existed. When a table downstream needs the join's old values
(`group_by`, another left join), the join nodes compute them with the same
rules from the old value of their side.

The result is a KTable: with `store=` it is materialized in a change-logged
key-value store written by the merge node (`TableJoinStoreNode`), readable by
later joins; without, the merge node passes the rows on and the result
cannot be joined again (it has no store to read).

Result timestamps are the updating record's (Kafka Streams': the larger of
both rows' timestamps; this runtime's stores keep no timestamps yet).

Both tables must be co-partitioned (a co-partition group of their source
topics); a join node needs only its key, so the join runs key-parallel.

Threads: `table_join` on the thread defining the topology; nodes on the
processing thread holding the task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from runtime.topology.context import TaskContext
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import Node, PassThroughNode, _not_initialized
from runtime.topology.record import Record
from runtime.topology.stateful_nodes import TableValueGetter, _StoreWriterNode
from runtime.topology.table_changes import Change, old_value_of

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.topology.builder import GraphBuilder

# The role of one join node (Kafka Streams' processor classes).
INNER, LEFT, RIGHT, OUTER = "inner", "left", "right", "outer"


class TableJoinNode(Node):
    """One side of a table-table join (see the module docstring for the rules).

    `role`: INNER, LEFT (left side of a left join), RIGHT (right side of a left
    join) or OUTER. `this_is_left`: whether this node's table is the join's
    left one (argument order of `joiner`). `send_old`: forward `Change`
    records with the old result (set by `table_changes.enable_old_values`).
    """

    __slots__ = ("getter", "joiner", "role", "this_is_left", "send_old", "_get", "_dropped")

    def __init__(
        self,
        name: str,
        getter: TableValueGetter,
        joiner: Callable[[Any, Any], Any],
        role: str,
        this_is_left: bool,
        send_old: bool,
    ) -> None:
        super().__init__(name)
        self.getter = getter
        self.joiner = joiner
        self.role = role
        self.this_is_left = this_is_left
        self.send_old = send_old
        self._get: Callable[[Any], Any] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._get = self.getter.bind(ctx, self.name)
        self._dropped = ctx.record_dropped

    def _join(self, mine: Any, theirs: Any) -> Any:
        return self.joiner(mine, theirs) if self.this_is_left else self.joiner(theirs, mine)

    def process(self, record: Record) -> None:
        key = record.key
        if key is None:
            self._dropped("null_key")
            return
        theirs = self._get(key)
        new, old = record.value, old_value_of(record)
        role = self.role
        if role in (INNER, RIGHT):
            if theirs is None:
                return
        elif theirs is None and new is None and old is None:
            return
        if role == RIGHT:
            # The right side of a left join: the left row exists, so the
            # result is joiner(left, right) even when the right row is gone.
            new_result = self._join(new, theirs)
            old_result = self._join(old, theirs) if self.send_old else None
        elif role == OUTER:
            new_result = self._join(new, theirs) if new is not None or theirs is not None else None
            old_result = (
                self._join(old, theirs)
                if self.send_old and (old is not None or theirs is not None)
                else None
            )
        else:
            new_result = None if new is None else self._join(new, theirs)
            old_result = self._join(old, theirs) if self.send_old and old is not None else None
        if self.send_old:
            self._emit(
                Change(
                    key,
                    new_result,
                    record.timestamp,
                    old_result,
                    record.headers,
                    record.topic,
                    record.partition,
                    record.offset,
                )
            )
        else:
            self._emit(record.with_value(new_result))


class TableJoinStoreNode(_StoreWriterNode):
    """The merge node of a materialized join: writes each result row (None
    deletes); the store's flush listener forwards it."""

    __slots__ = ()

    def process(self, record: Record) -> None:
        key_bytes = self._key_ser(record.key)
        self._writing(key_bytes, record.headers)
        if record.value is None:
            self._store.delete(key_bytes)
        else:
            self._store.put(key_bytes, self._value_ser(record.value))


def make_join(d: NodeDef) -> Node:
    p = d.params
    return TableJoinNode(
        d.name, p["getter"], p["joiner"], p["role"], p["this_is_left"], p.get("send_old", False)
    )


def make_merge(d: NodeDef) -> Node:
    return PassThroughNode(d.name)


def make_join_store(d: NodeDef) -> Node:
    p = d.params
    return TableJoinStoreNode(d.name, p["store"], p["key_serde"], p["value_serde"])


def _roles(left_outer: bool, right_outer: bool) -> tuple[str, str]:
    if left_outer and right_outer:
        return OUTER, OUTER
    if left_outer:
        return LEFT, RIGHT
    return INNER, INNER


def table_join(
    graph: GraphBuilder,
    this: tuple[str, TableValueGetter],
    other: tuple[str, TableValueGetter],
    joiner: Callable[[Any, Any], Any],
    left_outer: bool,
    right_outer: bool,
    name: str | None,
    store: tuple[str, Any, Any] | None,
    store_spec: Callable[..., StoreSpec],
) -> tuple[str, TableValueGetter | None]:
    """Add the join of the tables made by the nodes `this` and `other` (each with
    its getter); returns the result's node and getter (None: not materialized).

    `store`: (checked store name, key serde, value serde) to materialize the
    result, or None. Names as Kafka Streams': `KTABLE-MERGE-<n>`,
    `KTABLE-JOINTHIS-<n>`, `KTABLE-JOINOTHER-<n>`, or with `name`
    `<name>`, `<name>-join-this`, `<name>-join-other`.
    """
    (this_node, this_getter), (other_node, other_getter) = this, other
    merge = graph.node_name(name, "KTABLE-MERGE-")
    join_this = f"{name}-join-this" if name else graph.new_name("KTABLE-JOINTHIS-")
    join_other = f"{name}-join-other" if name else graph.new_name("KTABLE-JOINOTHER-")
    this_role, other_role = _roles(left_outer, right_outer)
    for node, parent, lookup, role, is_left in (
        (join_this, this_node, other_getter, this_role, True),
        (join_other, other_node, this_getter, other_role, False),
    ):
        graph.add_processor(
            node,
            make_join,
            (parent,),
            {"getter": lookup, "joiner": joiner, "role": role, "this_is_left": is_left},
            (lookup.store,),
        )
    getter: TableValueGetter | None = None
    if store is None:
        graph.add_processor(merge, make_merge, (join_this, join_other))
    else:
        store_name, key_serde, value_serde = store
        graph.add_store(StateStoreDef(store_spec(store_name), key_serde, value_serde))
        graph.add_processor(
            merge,
            make_join_store,
            (join_this, join_other),
            {"store": store_name, "key_serde": key_serde, "value_serde": value_serde},
            (store_name,),
        )
        getter = TableValueGetter(store_name, key_serde, value_serde)
    graph.add_copartition_group(
        graph.source_topics_of(this_node) | graph.source_topics_of(other_node)
    )
    return merge, getter
