"""The graph of a foreign-key table join, as `KTable.join/left_join(other,
foreign_key_extractor, joiner)` add it (the nodes, wire formats and rules are
in `runtime.topology.fk_join`).

Kafka Streams' names: `KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-<n>-topic` and
`KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-<n>-topic` (internal, prefixed with the
application id), `KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE-<n>`, processors
`KTABLE-FK-JOIN-SUBSCRIPTION-REGISTRATION-<n>`,
`KTABLE-FK-JOIN-SUBSCRIPTION-PROCESSOR-<n>` (three),
`KTABLE-FK-JOIN-SUBSCRIPTION-RESPONSE-RESOLVER-PROCESSOR-<n>`,
`KTABLE-FK-JOIN-OUTPUT-<n>`, sinks and sources `KTABLE-SINK-<n>` /
`KTABLE-SOURCE-<n>`; with `name`, `<name>-subscription-registration-topic`,
`<name>-subscription-receive`, ... as Kafka Streams' `TableJoined.as(name)`.

The subscription topic is co-partitioned with the foreign table's topics, the
response topic with this table's.

Used by the thread that defines the application, like the rest of the DSL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

from runtime.topology.fk_join import (
    ForeignTableJoinNode,
    ResponseResolverNode,
    ResponseSerde,
    SubscriptionJoinNode,
    SubscriptionReceiveNode,
    SubscriptionSendNode,
    SubscriptionSerde,
)
from runtime.topology.graph import NodeDef, StateStoreDef
from runtime.topology.nodes import Node
from runtime.topology.stateful_nodes import TableValueGetter

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.topology.builder import GraphBuilder


def _make_send(d: NodeDef) -> Node:
    p = d.params
    return SubscriptionSendNode(
        d.name, p["extractor"], p["fk_serde"], p["value_serde"], p["left_join"]
    )


def _make_receive(d: NodeDef) -> Node:
    p = d.params
    return SubscriptionReceiveNode(d.name, p["store"], p["fk_serde"], p["pk_serde"])


def _make_subscription_join(d: NodeDef) -> Node:
    return SubscriptionJoinNode(d.name, d.params["getter"])


def _make_foreign_join(d: NodeDef) -> Node:
    p = d.params
    return ForeignTableJoinNode(d.name, p["store"], p["fk_serde"], p["pk_serde"])


def _make_resolver(d: NodeDef) -> Node:
    p = d.params
    return ResponseResolverNode(d.name, p["getter"], p["value_serde"], p["joiner"], p["left_join"])


def _subscription_partition(key: Any, value: Any, num_partitions: int) -> int | None:
    """A subscription without a foreign key goes to partition 0 (it is answered
    at once, without state); the others by their foreign key."""
    return 0 if key is None else None


def _response_partition(key: Any, value: Any, num_partitions: int) -> int | None:
    """A response goes back to the partition its subscription came from."""
    return value.primary_partition if value is not None else None


class FkTables(NamedTuple):
    """One side of a foreign-key join: the table's node, getter and serdes."""

    node: str
    getter: TableValueGetter
    key_serde: Any
    value_serde: Any


def fk_join(
    graph: GraphBuilder,
    this: FkTables,
    other: FkTables,
    extractor: Callable[[Any], Any],
    joiner: Callable[[Any, Any], Any],
    left_join: bool,
    name: str | None,
    store: str | None,
    value_serde: Any,
    store_spec: Callable[..., StoreSpec],
    table_source_factory: Callable[[NodeDef], Node],
) -> tuple[str, str]:
    """Add the join (module docstring); returns the result table's node and store.

    The result node is a table source (`table_source_factory`) writing a
    change-logged store: `store` (cached, like `to_table(store=...)`), else
    `KTABLE-FK-JOIN-OUTPUT-STATE-STORE-<n>` (not cached: every result goes
    downstream, as Kafka Streams' unmaterialized result), so the result can be
    joined or regrouped like any table. `value_serde` serializes results.
    """

    def named(suffix: str, prefix: str) -> str:
        return f"{name}-{suffix}" if name else graph.new_name(prefix)

    fk = "KTABLE-FK-JOIN-"
    sub_topic = graph.reserve_internal_topic(
        named("subscription-registration", fk + "SUBSCRIPTION-REGISTRATION-") + "-topic"
    )
    send = named("subscription-registration-processor", fk + "SUBSCRIPTION-REGISTRATION-")
    sub_sink = named("subscription-registration-sink", "KTABLE-SINK-")
    sub_source = named("subscription-registration-source", "KTABLE-SOURCE-")
    sub_store = named("subscription-store", fk + "SUBSCRIPTION-STATE-STORE-")
    receive = named("subscription-receive", fk + "SUBSCRIPTION-PROCESSOR-")
    sub_join = named("subscription-join-foreign", fk + "SUBSCRIPTION-PROCESSOR-")
    foreign_join = named("foreign-join-subscription", fk + "SUBSCRIPTION-PROCESSOR-")
    resp_topic = graph.reserve_internal_topic(
        named("subscription-response", fk + "SUBSCRIPTION-RESPONSE-") + "-topic"
    )
    resp_sink = named("subscription-response-sink", "KTABLE-SINK-")
    resp_source = named("subscription-response-source", "KTABLE-SOURCE-")
    resolver = named(
        "subscription-response-resolver", fk + "SUBSCRIPTION-RESPONSE-RESOLVER-PROCESSOR-"
    )
    result = named("result", fk + "OUTPUT-")

    subscriptions = SubscriptionSerde(this.key_serde)
    responses = ResponseSerde(other.value_serde)
    graph.add_processor(
        send,
        _make_send,
        (this.node,),
        {
            "extractor": extractor,
            "fk_serde": other.key_serde,
            "value_serde": this.value_serde,
            "left_join": left_join,
        },
    )
    graph.add_sink(
        sub_sink, send, sub_topic, True, other.key_serde, subscriptions, _subscription_partition
    )
    graph.add_source(sub_source, [sub_topic], True, other.key_serde, subscriptions)
    graph.add_store(StateStoreDef(store_spec(sub_store, caching=False), None, None))
    stores = {"store": sub_store, "fk_serde": other.key_serde, "pk_serde": this.key_serde}
    graph.add_processor(receive, _make_receive, (sub_source,), stores, (sub_store,))
    graph.add_processor(
        sub_join,
        _make_subscription_join,
        (receive,),
        {"getter": other.getter},
        (other.getter.store,),
    )
    graph.add_processor(foreign_join, _make_foreign_join, (other.node,), stores, (sub_store,))
    graph.add_sink(
        resp_sink, sub_join, resp_topic, True, this.key_serde, responses, _response_partition
    )
    graph.add_parent(resp_sink, foreign_join)
    graph.add_source(resp_source, [resp_topic], True, this.key_serde, responses)
    graph.add_processor(
        resolver,
        _make_resolver,
        (resp_source,),
        {
            "getter": this.getter,
            "value_serde": this.value_serde,
            "joiner": joiner,
            "left_join": left_join,
        },
        (this.getter.store,),
    )
    graph.add_copartition_group(graph.source_topics_of(other.node) | {sub_topic})
    graph.add_copartition_group(graph.source_topics_of(this.node) | {resp_topic})
    if store is None:
        store_name = graph.new_name(fk + "OUTPUT-STATE-STORE-")
        spec = store_spec(store_name, caching=False)
    else:
        store_name = store
        spec = store_spec(store_name)
    graph.add_store(StateStoreDef(spec, this.key_serde, value_serde))
    graph.add_processor(
        result,
        table_source_factory,
        (resolver,),
        {
            "store": store_name,
            "key_serde": this.key_serde,
            "value_serde": value_serde,
            "queryable": store is not None,  # (table_changes.sends_old_values_unforced)
        },
        (store_name,),
    )
    return result, store_name
