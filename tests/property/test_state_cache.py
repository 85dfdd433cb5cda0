"""The caching layer changes how often updates are emitted, never what they add up to.

Random put/delete sequences over a small key space on two stores sharing one
cache budget (from "off" to "a few entries" to "everything fits"), with random
commit points. Checked against an uncached store receiving the same writes:
- reads through the cache always equal the uncached store's values;
- at each commit, replaying the changelog records in order, and replaying the
  downstream updates in order, gives exactly the uncached store's state, and the
  latest changelog value of every key equals the store's value;
- after a commit the budget holds nothing.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from runtime.state.cache import CachingKeyValueStore, entry_size
from runtime.state.cache_budget import CacheBudget
from runtime.state.changelog import ChangeLoggingKeyValueStore
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.topology.record import Headers

KEYS = [b"a", b"b", b"bb", b"c", b"\x00"]
STORES = 2


class Side:
    """One store stack and the replay of what it emitted."""

    def __init__(self, name: str, budget: CacheBudget) -> None:
        self.changelog_replay: dict[bytes, bytes] = {}
        self.latest_logged: dict[bytes, bytes | None] = {}
        self.downstream_replay: dict[bytes, bytes] = {}
        logged = ChangeLoggingKeyValueStore(
            InMemoryKeyValueStore(name), self.send, f"app-{name}-changelog", 0, lambda: 0
        )
        self.store = CachingKeyValueStore(logged, budget, self.on_flush, lambda: 0)

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        assert key is not None
        self.latest_logged[key] = value
        apply(self.changelog_replay, key, value)

    def on_flush(self, key: bytes, value: bytes | None, old: bytes | None, timestamp: int) -> None:
        apply(self.downstream_replay, key, value)


def apply(state: dict[bytes, bytes], key: bytes, value: bytes | None) -> None:
    if value is None:
        state.pop(key, None)
    else:
        state[key] = value


operation = st.one_of(
    st.tuples(
        st.just("put"),
        st.integers(0, STORES - 1),
        st.sampled_from(KEYS),
        st.binary(min_size=0, max_size=40),
    ),
    st.tuples(st.just("delete"), st.integers(0, STORES - 1), st.sampled_from(KEYS), st.just(b"")),
    st.tuples(st.just("commit"), st.just(0), st.just(b""), st.just(b"")),
)

ENTRY = entry_size(b"bb", b"x" * 20)
budgets = st.sampled_from([0, ENTRY // 2, ENTRY, 2 * ENTRY, 3 * ENTRY, 100 * ENTRY])


@settings(deadline=None, max_examples=200)
@given(st.lists(operation, max_size=60), budgets)
def test_cached_output_replays_to_the_uncached_state(
    ops: list[tuple[str, int, bytes, bytes]], max_bytes: int
) -> None:
    budget = CacheBudget(max_bytes)
    cached = [Side(f"s{i}", budget) for i in range(STORES)]
    uncached = [Side(f"u{i}", CacheBudget(0)) for i in range(STORES)]

    def commit() -> None:
        for side, reference in zip(cached, uncached, strict=True):
            side.store.flush()
            reference.store.flush()
            expected = dict(reference.store.all())
            assert side.changelog_replay == expected
            assert side.downstream_replay == expected
            for key in KEYS:
                assert side.latest_logged.get(key) == side.store.get(key)
        for side in cached:  # the reads above may have cached clean entries
            side.store.flush()
            assert side.store.dirty_count == 0
            assert side.store.cached_bytes <= budget.keep_share
        assert budget.used == sum(side.store.cached_bytes for side in cached)

    for op, index, key, value in ops:
        side, reference = cached[index], uncached[index]
        if op == "put":
            side.store.put(key, value)
            reference.store.put(key, value)
        elif op == "delete":
            side.store.delete(key)
            reference.store.delete(key)
        else:
            commit()
            continue
        assert side.store.get(key) == reference.store.get(key)
        assert list(side.store.all()) == list(reference.store.all())
        assert budget.used <= max_bytes
    commit()
