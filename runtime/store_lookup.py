"""`App.store(name)`: which store a name means, with which serdes, and
whether the app can answer at all.

The reads themselves are interactive queries (runtime.processing.store_queries:
`StoreQuery` locks one task at a time through the task manager). This module
is the app's side of them: it resolves a store name (a named query's
`<query>.<store>`, or a plain name only one query uses), picks the serdes (the
topology's, else the config's defaults), and turns the app's state into the
`StoreUnavailableError` every read asks for first. It reads the app's state
(runtime.lifecycle), which the processing layer must not import; so it lives
up here beside the app rather than in runtime.processing.

Any thread but a processing thread (the reads lock tasks).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

from runtime.config import StreamsConfig
from runtime.lifecycle import ACTIVE, AppState, Lifecycle
from runtime.processing.store_queries import StoreQuery, StoreUnavailableError
from runtime.processing.task_manager import TaskManager
from runtime.topology.serdes import serde_from_name
from runtime.topology.topology import Topology


def _serde(given: Any) -> Any:
    """A serde object from what a topology may hold: None, a name, or a serde."""
    return serde_from_name(given) if isinstance(given, str) else given


def open_store(
    name: str,
    topology: Topology,
    config: StreamsConfig,
    task_manager: TaskManager,
    lifecycle: Lifecycle,
    timeout: float,
) -> StoreQuery:
    """A `StoreQuery` over store `name` of `topology` (see `App.store`).

    Raises KeyError for an unknown store or a plain name two queries use.
    """
    definition = topology.store_def(name)
    # Named queries: `<query>.<store>` names one query's store; a plain
    # name used by two queries is ambiguous.
    query, _, plain = name.partition(".")
    if not plain or query not in topology.queries:
        query, plain = "", name
        owners = {s.query for s in topology.subtopologies if name in s.state_stores and s.query}
        if len(owners) > 1:
            raise KeyError(
                f"store {name!r} is used by queries {sorted(owners)}: name one, "
                f"e.g. {sorted(owners)[0]}.{name}"
            )
    key_serde = _serde(definition.key_serde) or config.default_key_serde
    value_serde = _serde(definition.value_serde) or config.default_value_serde
    return StoreQuery(
        plain,
        task_manager,
        key_serde,
        value_serde,
        definition.windowed,
        timeout,
        available=lambda: check_queryable(name, config.application_id, lifecycle),
        key_serde_source="given in the topology"
        if definition.key_serde is not None
        else "default.key.serde",
        query=query or None,
    )


class GlobalStoreQuery:
    """`App.store(name)` of a global table: reads this process's copy
    directly, without a task lock (the global thread writes whole batches;
    a read sees the table as of one of them)."""

    def __init__(
        self,
        name: str,
        stores: Mapping[str, Any],
        key_serde: Any,
        value_serde: Any,
        available: Callable[[], None],
    ) -> None:
        self.name = name
        self.windowed = False
        self._stores = stores
        self._key_serde = key_serde
        self._value_serde = value_serde
        self._available = available

    def _store(self) -> Any:
        self._available()
        store = self._stores.get(self.name)
        if store is None:
            raise StoreUnavailableError(f"global store {self.name!r} is not open")
        return store

    def get(self, key: Any) -> Any:
        data = self._store().get(self._key_serde.serialize(key))
        return None if data is None else self._value_serde.deserialize(data)

    def range(self, lo: Any, hi: Any) -> Iterator[tuple[Any, Any]]:
        ser = self._key_serde.serialize
        rows = self._store().range(None if lo is None else ser(lo), None if hi is None else ser(hi))
        for key, value in rows:
            yield self._key_serde.deserialize(key), self._value_serde.deserialize(value)

    def all(self) -> Iterator[tuple[Any, Any]]:
        return self.range(None, None)

    def approximate_num_entries(self) -> int:
        return int(self._store().approximate_num_entries())


def open_global_store(
    name: str,
    topology: Topology,
    config: StreamsConfig,
    stores: Mapping[str, Any],
    lifecycle: Lifecycle,
) -> GlobalStoreQuery | None:
    """A query over global store `name`, or None when no global table has it."""
    definition = next((g for g in topology.global_stores if g.store == name), None)
    if definition is None:
        return None
    return GlobalStoreQuery(
        name,
        stores,
        _serde(definition.key_serde) or config.default_key_serde,
        _serde(definition.value_serde) or config.default_value_serde,
        lambda: check_queryable(name, config.application_id, lifecycle),
    )


def check_queryable(store: str, app: str, lifecycle: Lifecycle) -> None:
    """Raise StoreUnavailableError unless the app runs (or rebalances).
    `app`: the application.id, for the message. Racy read of the state."""
    state = lifecycle.state
    if state in ACTIVE:
        return
    if state in (AppState.ERROR, AppState.PENDING_ERROR):
        failure = lifecycle.failure
        reason = f": {type(failure).__name__}: {failure}" if failure is not None else ""
        raise StoreUnavailableError(
            f"store {store!r} cannot be queried: application {app!r} failed "
            f"(state {state}){reason}; fix the cause and start it again"
        )
    if state is AppState.CREATED:
        raise StoreUnavailableError(
            f"store {store!r} cannot be queried: application {app!r} is not started "
            "(call start() first)"
        )
    raise StoreUnavailableError(
        f"store {store!r} cannot be queried: application {app!r} is stopped (state {state})"
    )
