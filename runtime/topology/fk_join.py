"""The foreign-key table join (KIP-213): `KTable.join(other, foreign_key_extractor, joiner)`.

A row of this (left) table joins the row of `other` whose key is
`foreign_key_extractor(value)`. The tables need not be co-partitioned: the
left rows subscribe to their foreign keys through an internal topic, and the
foreign side answers through another (Kafka Streams' shape and names):

    left table -> SUBSCRIPTION-REGISTRATION (instructions per change)
        -> <prefix>-SUBSCRIPTION-REGISTRATION-<n>-topic (keyed by foreign key)
        -> SUBSCRIPTION-PROCESSOR (receive: keep (fk, pk) in the subscription store)
        -> SUBSCRIPTION-PROCESSOR (join: look the foreign row up)  --\\
    other table -> SUBSCRIPTION-PROCESSOR (every subscriber of the   -> response
                   updated foreign key, by a prefix scan)          --/   topic
        -> <prefix>-SUBSCRIPTION-RESPONSE-<n>-topic (keyed by primary key,
           to the partition the subscription came from)
        -> SUBSCRIPTION-RESPONSE-RESOLVER-PROCESSOR -> KTABLE-FK-JOIN-OUTPUT-<n>

Instructions (Kafka Streams' `SubscriptionWrapper.Instruction`): a left row
whose foreign key changed unsubscribes from the old one (inner join: without
a response; left join: with one) and subscribes to the new one asking for an
answer even when the foreign row is missing (so a previous result is
retracted); a new row asks only if the foreign row exists (inner) or always
(left); a deleted row unsubscribes with an answer (a tombstone). A left row
with a None foreign key: dropped by the inner join, joined with None by the
left join (its subscription has no key and no stored state).

Staleness: a subscription carries a 128-bit hash of the left value it was
made for; the resolver drops a response whose hash is not the current left
value's (the row changed again meanwhile; its newer subscription answers).
The hash is BLAKE2b of the value serialized with the left table's value
serde (Kafka Streams': Murmur3; the topics are internal to each
implementation, so only self-consistency matters).

State: the subscription store (`KTABLE-FK-JOIN-SUBSCRIPTION-STATE-STORE-<n>`,
key `len(fk) (4 bytes) + fk + pk`, value hash and partition; change-logged,
not cached, so the prefix scan reads it directly) and the result table's
store. Both internal topics are co-partitioned with their readers' tables.

Result timestamps are the updating record's (Kafka Streams': the larger of
both rows'). Both key serdes must be known (the subscription carries the
primary key and the store key the foreign key).

Key-parallel: the foreign side's prefix scan answers many primary keys from
one foreign key's update, but each node only reads and writes keys of the
record it holds (the subscription store by foreign key), so both sides run
key-parallel.

The graph is added by `runtime.topology.fk_join_dsl`.

Threads: the processing thread holding the task, like every node.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from typing import Any, NamedTuple

from runtime.topology.context import TaskContext
from runtime.topology.nodes import Node, _not_initialized, resolve_serde
from runtime.topology.record import Record
from runtime.topology.stateful_nodes import TableValueGetter
from runtime.topology.table_changes import old_value_of

# Kafka Streams' SubscriptionWrapper.Instruction.
DELETE_KEY_AND_PROPAGATE = 0
DELETE_KEY_NO_PROPAGATE = 1
PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE = 2
PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE = 3
_VERSION = 0


def value_hash(data: bytes | None) -> bytes | None:
    return None if data is None else hashlib.blake2b(data, digest_size=16).digest()


class Subscription(NamedTuple):
    hash: bytes | None
    instruction: int
    primary_key: Any
    primary_partition: int


class Response(NamedTuple):
    hash: bytes | None
    foreign_value: Any
    primary_partition: int


def _hash_bytes(h: bytes | None) -> bytes:
    return b"\x00" if h is None else bytes((len(h),)) + h


def _read_hash(data: bytes, i: int) -> tuple[bytes | None, int]:
    n = data[i]
    return (None if n == 0 else data[i + 1 : i + 1 + n]), i + 1 + n


class SubscriptionSerde:
    """Subscriptions: version, instruction, hash, primary partition, primary key.
    `inner` serializes the primary key."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    name = "fk-subscription"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        pk = self.inner.serialize(obj.primary_key) or b""
        return (
            bytes((_VERSION, obj.instruction))
            + _hash_bytes(obj.hash)
            + obj.primary_partition.to_bytes(4, "big")
            + pk
        )

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if data[0] != _VERSION:
            raise ValueError(f"unknown foreign-key subscription version {data[0]}")
        h, i = _read_hash(data, 2)
        partition = int.from_bytes(data[i : i + 4], "big")
        return Subscription(h, data[1], self.inner.deserialize(data[i + 4 :]), partition)


class ResponseSerde:
    """Responses: version, hash, primary partition, then the foreign value
    (a presence byte and its bytes). `inner` serializes the foreign value
    (None: the configured default value serde)."""

    __slots__ = ("inner",)

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    name = "fk-response"

    def with_inner(self, inner: Any) -> ResponseSerde:
        return ResponseSerde(inner)

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        head = bytes((_VERSION,)) + _hash_bytes(obj.hash) + obj.primary_partition.to_bytes(4, "big")
        if obj.foreign_value is None:
            return head + b"\x00"
        return head + b"\x01" + (self.inner.serialize(obj.foreign_value) or b"")

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        if data[0] != _VERSION:
            raise ValueError(f"unknown foreign-key response version {data[0]}")
        h, i = _read_hash(data, 1)
        partition = int.from_bytes(data[i : i + 4], "big")
        value = self.inner.deserialize(data[i + 5 :]) if data[i + 4] else None
        return Response(h, value, partition)


def combined_prefix(fk: bytes) -> bytes:
    return len(fk).to_bytes(4, "big") + fk


def _prefix_end(prefix: bytes) -> bytes | None:
    """The largest key starting with `prefix` is below this (inclusive range end)."""
    trimmed = prefix.rstrip(b"\xff")
    if not trimmed:
        return None
    return trimmed[:-1] + bytes((trimmed[-1] + 1,))


class SubscriptionSendNode(Node):
    """Left side: a left row's change becomes subscription instructions (module docstring)."""

    __slots__ = (
        "extractor",
        "fk_serde",
        "value_serde",
        "left_join",
        "_fk_ser",
        "_value_ser",
        "_partition",
        "_dropped",
    )

    def __init__(
        self,
        name: str,
        extractor: Callable[[Any], Any],
        fk_serde: Any,
        value_serde: Any,
        left_join: bool,
    ) -> None:
        super().__init__(name)
        self.extractor = extractor
        self.fk_serde = fk_serde
        self.value_serde = value_serde
        self.left_join = left_join
        self._fk_ser: Callable[[Any], bytes | None] = _not_initialized
        self._value_ser: Callable[[Any], bytes | None] = _not_initialized
        self._partition = 0
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._fk_ser = resolve_serde(
            self.fk_serde, ctx.default_key_serde, self.name, "key"
        ).serialize
        self._value_ser = resolve_serde(
            self.value_serde, ctx.default_value_serde, self.name, "value"
        ).serialize
        self._partition = int(ctx.task_id.rsplit("_", 1)[1])
        self._dropped = ctx.record_dropped

    def _fk(self, value: Any) -> Any:
        return None if value is None else self.extractor(value)

    def _same(self, a: Any, b: Any) -> bool:
        return self._fk_ser(a) == self._fk_ser(b)

    def process(self, record: Record) -> None:
        new, old = record.value, old_value_of(record)
        out: list[tuple[Any, int]] = []
        if self.left_join:
            # Kafka Streams 3.x answered from the old foreign key too
            # (DELETE_KEY_AND_PROPAGATE: joiner(row, None) for the current
            # row), racing the new key's answer, and a deleted row twice;
            # as the later fixes (KAFKA-16394), the old key is unsubscribed
            # silently and only the new key (or the deletion) answers.
            if old is not None:
                old_fk = self._fk(old)
                if new is None:
                    if old_fk is not None:
                        out.append((old_fk, DELETE_KEY_AND_PROPAGATE))
                    else:  # no subscription to remove: answer the deletion at once
                        out.append((None, PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
                else:
                    new_fk = self._fk(new)
                    if old_fk is not None and not self._same(new_fk, old_fk):
                        out.append((old_fk, DELETE_KEY_NO_PROPAGATE))
                    out.append((new_fk, PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
            elif new is not None:
                out.append((self._fk(new), PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
        elif old is not None:
            old_fk = self._fk(old)
            if old_fk is None:
                self._dropped("null_foreign_key")
                return
            if new is not None:
                new_fk = self._fk(new)
                if new_fk is None:
                    self._dropped("null_foreign_key")
                    return
                if not self._same(new_fk, old_fk):
                    out.append((old_fk, DELETE_KEY_NO_PROPAGATE))
                out.append((new_fk, PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE))
            else:
                out.append((old_fk, DELETE_KEY_AND_PROPAGATE))
        elif new is not None:
            new_fk = self._fk(new)
            if new_fk is None:
                self._dropped("null_foreign_key")
                return
            out.append((new_fk, PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE))
        if not out:
            return
        h = value_hash(None if new is None else self._value_ser(new))
        for fk, instruction in out:
            subscription = Subscription(h, instruction, record.key, self._partition)
            self._emit(Record(fk, subscription, record.timestamp, record.headers))


class SubscriptionReceiveNode(Node):
    """Foreign side: keep (fk, pk) subscriptions in the store, pass them on."""

    __slots__ = (
        "store_name",
        "fk_serde",
        "pk_serde",
        "_store",
        "_fk_ser",
        "_pk_ser",
        "_sub_ser",
        "_dropped",
    )

    def __init__(self, name: str, store: str, fk_serde: Any, pk_serde: Any) -> None:
        super().__init__(name)
        self.store_name = store
        self.fk_serde = fk_serde
        self.pk_serde = pk_serde
        self._store: Any = None
        self._fk_ser: Callable[[Any], bytes | None] = _not_initialized
        self._pk_ser: Callable[[Any], bytes | None] = _not_initialized
        self._sub_ser: Callable[[Any], bytes | None] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._store = ctx.state_store(self.store_name)
        self._fk_ser = resolve_serde(
            self.fk_serde, ctx.default_key_serde, self.name, "key"
        ).serialize
        pk = resolve_serde(self.pk_serde, ctx.default_key_serde, self.name, "key")
        self._pk_ser = pk.serialize
        self._sub_ser = SubscriptionSerde(pk).serialize
        self._dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        fk, sub = record.key, record.value
        if sub is None:
            self._dropped("null_value")
            return
        if fk is None:
            if sub.instruction != PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
                self._dropped("null_key")
                return
        else:
            # The store key: the foreign key, length-prefixed (for the prefix
            # scan of ForeignTableJoinNode), then the primary key.
            key = combined_prefix(self._fk_ser(fk) or b"") + (self._pk_ser(sub.primary_key) or b"")
            if sub.instruction in (DELETE_KEY_AND_PROPAGATE, DELETE_KEY_NO_PROPAGATE):
                self._store.delete(key)
            else:
                self._store.put(key, self._sub_ser(sub) or b"")
        self._emit(record.with_key((fk, sub.primary_key)))

    def close(self) -> None:
        self._store = None


class SubscriptionJoinNode(Node):
    """Foreign side: answer a subscription with the foreign row (per instruction)."""

    __slots__ = ("getter", "_get")

    def __init__(self, name: str, getter: TableValueGetter) -> None:
        super().__init__(name)
        self.getter = getter
        self._get: Callable[[Any], Any] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._get = self.getter.bind(ctx, self.name)

    def process(self, record: Record) -> None:
        fk, pk = record.key
        sub: Subscription = record.value
        instruction = sub.instruction
        if instruction == DELETE_KEY_NO_PROPAGATE:
            return
        foreign = None
        if instruction != DELETE_KEY_AND_PROPAGATE and fk is not None:
            foreign = self._get(fk)
        if instruction == PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE and foreign is None:
            return
        response = Response(sub.hash, foreign, sub.primary_partition)
        self._emit(Record(pk, response, record.timestamp, record.headers))


class ForeignTableJoinNode(Node):
    """Foreign side: an update of a foreign row answers every subscriber of its key."""

    __slots__ = ("store_name", "fk_serde", "pk_serde", "_store", "_fk_ser", "_sub_de", "_dropped")

    def __init__(self, name: str, store: str, fk_serde: Any, pk_serde: Any) -> None:
        super().__init__(name)
        self.store_name = store
        self.fk_serde = fk_serde
        self.pk_serde = pk_serde
        self._store: Any = None
        self._fk_ser: Callable[[Any], bytes | None] = _not_initialized
        self._sub_de: Callable[[bytes | None], Any] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._store = ctx.state_store(self.store_name)
        self._fk_ser = resolve_serde(
            self.fk_serde, ctx.default_key_serde, self.name, "key"
        ).serialize
        pk = resolve_serde(self.pk_serde, ctx.default_key_serde, self.name, "key")
        self._sub_de = SubscriptionSerde(pk).deserialize
        self._dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        if record.key is None:
            self._dropped("null_key")
            return
        prefix = combined_prefix(self._fk_ser(record.key) or b"")
        for key, data in self._store.range(prefix, _prefix_end(prefix)):
            if not key.startswith(prefix):
                continue
            sub = self._sub_de(data)
            response = Response(sub.hash, record.value, sub.primary_partition)
            self._emit(Record(sub.primary_key, response, record.timestamp, record.headers))

    def close(self) -> None:
        self._store = None


class ResponseResolverNode(Node):
    """Left side: a fresh response becomes the joined row (or a tombstone)."""

    __slots__ = ("getter", "value_serde", "joiner", "left_join", "_get", "_value_ser", "_dropped")

    def __init__(
        self,
        name: str,
        getter: TableValueGetter,
        value_serde: Any,
        joiner: Callable[[Any, Any], Any],
        left_join: bool,
    ) -> None:
        super().__init__(name)
        self.getter = getter
        self.value_serde = value_serde
        self.joiner = joiner
        self.left_join = left_join
        self._get: Callable[[Any], Any] = _not_initialized
        self._value_ser: Callable[[Any], bytes | None] = _not_initialized
        self._dropped: Callable[[str], None] = _not_initialized

    def init(self, ctx: TaskContext) -> None:
        self._get = self.getter.bind(ctx, self.name)
        self._value_ser = resolve_serde(
            self.value_serde, ctx.default_value_serde, self.name, "value"
        ).serialize
        self._dropped = ctx.record_dropped

    def process(self, record: Record) -> None:
        response: Response = record.value
        current = self._get(record.key)
        current_hash = None if current is None else value_hash(self._value_ser(current))
        if response.hash != current_hash:
            self._dropped("stale_response")  # the row changed since; a newer answer follows
            return
        foreign = response.foreign_value
        if foreign is None and (not self.left_join or current is None):
            result = None
        else:
            result = self.joiner(current, foreign)
        self._emit(record.with_value(result))
