"""A cache holding values as objects behaves as a plain dict of values.

Random sequences of object writes (`put_value`, None deleting), byte writes
(`put`/`delete`), reads of both kinds, ranges and commits, on a cache whose
budget goes from "off" to "a few entries" to "everything fits". Checked
against a dict: every read, every range, and after each commit the changelog
replay and the downstream replay; the budget's charge always equals the
cache's bytes, and never exceeds the budget after a write returns unless the
cache holds nothing.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.state.cache import UNSET, CachingKeyValueStore, entry_size
from runtime.state.cache_budget import CacheBudget
from runtime.state.changelog import ChangeLoggingKeyValueStore
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.topology import serdes
from runtime.topology.record import Headers

KEYS = [b"a", b"b", b"bb", b"c"]
ENTRY = entry_size(b"bb", b"12345678")

ops = st.lists(
    st.tuples(
        st.sampled_from(["put_value", "put", "delete", "get", "get_value", "range", "commit"]),
        st.sampled_from(KEYS),
        st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    ),
    max_size=60,
)


def dec(data: bytes) -> int:
    return int.from_bytes(data, "big", signed=True)


@settings(max_examples=300, deadline=None)
@given(ops=ops, budget=st.sampled_from([0, ENTRY, 2 * ENTRY, 3 * ENTRY, 10**6]))
def test_value_cache_matches_a_dict(ops: list[tuple[str, bytes, int | None]], budget: int) -> None:
    changelog: dict[bytes, int] = {}
    downstream: dict[bytes, int] = {}

    def apply(state: dict[bytes, int], key: bytes, value: bytes | None) -> None:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = dec(value)

    def send(
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        assert key is not None
        apply(changelog, key, value)

    def on_flush(key: bytes, value: bytes | None, old: bytes | None, ts: int) -> None:
        obj = store.emitting  # the object handed down instead of the bytes
        if obj is not UNSET:
            assert obj == (None if value is None else dec(value))
        apply(downstream, key, value)

    shared = CacheBudget(budget)
    logged = ChangeLoggingKeyValueStore(
        InMemoryKeyValueStore("s"), send, "app-s-changelog", 0, lambda: 0
    )
    store = CachingKeyValueStore(logged, shared, on_flush, lambda: 0)
    store.use_values(serdes.INT64)
    model: dict[bytes, int] = {}
    for op, key, value in ops:
        if op == "put_value":
            store.put_value(key, value)
            if value is None:
                model.pop(key, None)
            else:
                model[key] = value
        elif op == "put":
            v = 0 if value is None else value
            store.put(key, v.to_bytes(8, "big", signed=True))
            model[key] = v
        elif op == "delete":
            store.delete(key)
            model.pop(key, None)
        elif op == "get":
            got = store.get(key)
            assert (None if got is None else dec(got)) == model.get(key)
        elif op == "get_value":
            assert store.get_value(key) == model.get(key)
        elif op == "range":
            assert [(k, dec(v)) for k, v in store.range(None, None)] == sorted(model.items())
        else:
            store.flush()
            assert changelog == model
            assert downstream == model
            assert store.dirty_count == 0 and store.cached_bytes <= shared.keep_share
        assert shared.used == store.cached_bytes
        assert shared.used <= max(budget, 0) or store.cached_bytes == 0 or budget == 0
    store.flush()
    assert changelog == model == downstream
