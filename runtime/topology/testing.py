"""Test helpers: a recording `TaskContext` for running a `TaskGraph` without Kafka.

Stateless graphs:

    graph = topology.subtopologies[0].instantiate()
    ctx = RecordingTaskContext(partitions={"out": 4})
    graph.init(ctx)
    graph.sources["in"].process(Record("k", "v", 5))
    ctx.sent   # [Sent(topic="out", key=b"k", ...)]

Stateful graphs run on real stores (`runtime.state.builders.build_store`)
under `state_dir`, with one `CacheBudget` of `cache_max_bytes` (0: caching
off), changelog records going to `sent` like every output, as in the runtime:

    ctx = RecordingTaskContext(state_dir=tmp_path, store_kind="memory")
    graph = ctx.instantiate(topology.subtopologies[1])   # stores built, graph init'ed
    ctx.process(graph, "in", "k", "v", timestamp=5)
    ctx.commit()            # flush every store: cached updates go downstream
    ctx.output("out")       # what the sinks sent
    ctx.close()

`pipe(graph, sent)` feeds serialized records another context sent (e.g. to a
repartition topic) into the source that reads their topic.

Not used by the runtime itself; everything runs on the calling thread.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

from runtime.state.builders import LayeredStore, StoreKind, StoreSpec, build_store
from runtime.state.cache import FlushListener
from runtime.state.cache_budget import CacheBudget
from runtime.topology import serdes
from runtime.topology.context import PunctuationType
from runtime.topology.record import Headers, Record
from runtime.topology.topology import Subtopology, TaskGraph, Topology


@dataclass
class Sent:
    """One record handed to `TaskContext.send`."""

    topic: str
    key: bytes | None
    value: bytes | None
    timestamp: int
    headers: Headers | None
    partition: int | None


@dataclass
class Scheduled:
    """One `TaskContext.schedule` call; `cancel()` marks it cancelled."""

    interval_ms: int
    punctuation_type: PunctuationType
    callback: Callable[[int], None]
    cancelled: bool = False

    def cancel(self) -> None:
        self.cancelled = True


@dataclass
class RecordingTaskContext:
    """A `TaskContext` that records what the graph asks of it.

    `partitions` gives partition counts per full topic name (default 1);
    `stores` the objects `state_store(name)` returns (fakes may be put there
    directly; `build_stores`/`instantiate` put real stores there).

    Real stores: `state_dir` is the state directory (required for RocksDB and
    window stores; the task directory is `<state_dir>/<application_id>/<task_id>`);
    `store_kind="memory"` builds key-value stores specified as RocksDB in
    memory instead; `cache_max_bytes` is the process-wide cache budget (0:
    caching off, every write goes downstream at once). `dropped` counts
    `record_dropped` reasons. `record_timestamp`/`stream_time` follow the
    records given to `process`/`pipe`, as the task runtime's do.
    """

    task_id: str = "0_0"
    application_id: str = "app"
    default_key_serde: Any = serdes.BYTES
    default_value_serde: Any = serdes.BYTES
    static_partitioner: Any = None
    partitions: dict[str, int] = field(default_factory=dict)
    stores: dict[str, Any] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    scheduled: list[Scheduled] = field(default_factory=list)
    commits_requested: int = 0
    state_dir: str | os.PathLike[str] | None = None
    partition: int = 0
    store_kind: StoreKind | None = None
    cache_max_bytes: int = 10 * 1024 * 1024
    record_timestamp: int = 0
    stream_time: int = -1
    dropped: Counter[str] = field(default_factory=Counter)
    layered: dict[str, LayeredStore] = field(default_factory=dict)
    flush_listeners: dict[str, list[FlushListener]] = field(default_factory=dict)
    # Global stores by name (`global_store`); `load_global` fills them.
    global_stores: dict[str, Any] = field(default_factory=dict)
    _budget: CacheBudget | None = field(default=None, init=False, repr=False)

    # -- TaskContext -------------------------------------------------------------

    def send(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        timestamp: int,
        headers: Headers | None,
        partition: int | None,
    ) -> None:
        self.sent.append(Sent(topic, key, value, timestamp, headers, partition))

    def partition_count(self, topic: str) -> int:
        return self.partitions.get(topic, 1)

    def resolve_topic(self, name: str, internal: bool) -> str:
        return f"{self.application_id}-{name}" if internal else name

    def schedule(
        self, interval_ms: int, punctuation_type: PunctuationType, callback: Callable[[int], None]
    ) -> Scheduled:
        scheduled = Scheduled(interval_ms, punctuation_type, callback)
        self.scheduled.append(scheduled)
        return scheduled

    def request_commit(self) -> None:
        self.commits_requested += 1

    def state_store(self, name: str) -> Any:
        try:
            return self.stores[name]
        except KeyError:
            raise KeyError(f"no state store {name!r} in this task") from None

    def register_flush_listener(self, store: str, listener: FlushListener) -> None:
        self.flush_listeners.setdefault(store, []).append(listener)

    def global_store(self, name: str) -> Any:
        try:
            return self.global_stores[name]
        except KeyError:
            raise KeyError(f"no global store {name!r}") from None

    def load_global(self, topology: Topology, topic: str, key: Any, value: Any) -> None:
        """Apply one record of a global table's topic to its in-memory store
        (created on first use), as the global thread would: serialized with
        the table's serdes (or the defaults), None deleting the key."""
        from runtime.state.global_store import memory_global_store

        definition = next((g for g in topology.global_stores if g.topic == topic), None)
        if definition is None:
            raise KeyError(f"no global table reads {topic!r}")
        store = self.global_stores.get(definition.store)
        if store is None:
            store = self.global_stores[definition.store] = memory_global_store(
                definition.store, topic
            )
        key_serde = definition.key_serde or self.default_key_serde
        value_serde = definition.value_serde or self.default_value_serde
        store.apply([(key_serde.serialize(key), value_serde.serialize(value))])

    def record_dropped(self, reason: str) -> None:
        self.dropped[reason] += 1

    # -- stores ------------------------------------------------------------------

    def build_stores(self, specs: Iterable[StoreSpec]) -> None:
        """Build real layered stores (skipping names already present), as the
        runtime does for a task, with `send` as the changelog sink and the
        listeners nodes register as `on_flush`."""
        if self._budget is None:
            self._budget = CacheBudget(self.cache_max_bytes)
        task_dir = os.path.join(
            self.state_dir if self.state_dir is not None else os.devnull,
            self.application_id,
            self.task_id,
        )
        for spec in specs:
            if spec.name in self.stores:
                continue
            if self.store_kind is not None and spec.kind != "window":
                spec = replace(spec, kind=self.store_kind)
            if self.state_dir is None and spec.kind != "memory":
                raise ValueError(f"store {spec.name!r} ({spec.kind}) needs a state_dir")
            built = build_store(
                spec,
                task_dir,
                self.application_id,
                self.partition,
                self._budget,
                self.send,
                self._dispatcher(spec.name),
                self._clock,
            )
            self.layered[spec.name] = built
            self.stores[spec.name] = built.store

    def _dispatcher(self, store: str) -> FlushListener:
        listeners = self.flush_listeners.setdefault(store, [])

        def dispatch(key: bytes, new: bytes | None, old: bytes | None, timestamp: int) -> None:
            # While an update flows down, "the record being processed" is that update.
            saved, self.record_timestamp = self.record_timestamp, timestamp
            try:
                for listener in listeners:
                    listener(key, new, old, timestamp)
            finally:
                self.record_timestamp = saved

        return dispatch

    def _clock(self) -> int:
        return self.record_timestamp

    def instantiate(self, subtopology: Subtopology) -> TaskGraph:
        """Build the subtopology's stores, then a fresh graph initialized with this context."""
        self.build_stores(subtopology.store_specs)
        graph = subtopology.instantiate()
        graph.init(self)
        return graph

    def commit(self) -> None:
        """Flush every built store in order, as the runtime's commit does."""
        for store in self.layered.values():
            store.flush()

    def close(self) -> None:
        """Close every built store (unflushed writes are dropped, like a crash)."""
        for store in self.layered.values():
            store.close()
        for name in self.layered:
            self.stores.pop(name, None)
        self.layered.clear()

    # -- driving a graph ---------------------------------------------------------

    def process(
        self,
        graph: TaskGraph,
        topic: str,
        key: Any,
        value: Any,
        timestamp: int | None = None,
        headers: Headers | None = None,
        offset: int | None = None,
    ) -> None:
        """Feed one deserialized record to the source reading `topic` (as written).

        `timestamp` defaults to the current stream time (0 at the start);
        stream time advances to it before the graph sees the record.
        """
        if timestamp is None:
            timestamp = max(self.stream_time, 0)
        self._advance(timestamp)
        graph.sources[topic].process(
            Record(key, value, timestamp, headers, topic, self.partition, offset)
        )

    def pipe(self, graph: TaskGraph, records: Iterable[Sent]) -> int:
        """Feed serialized records to the sources reading their (full) topics.

        Records for topics the graph does not read are skipped; returns how
        many were fed. Use it to carry a repartition sink's output into the
        subtopology that reads the repartition topic.
        """
        sources = {
            self.resolve_topic(name, source.internal): source
            for name, source in graph.sources.items()
        }
        fed = 0
        for offset, sent in enumerate(list(records)):
            source = sources.get(sent.topic)
            if source is None:
                continue
            record = source.deserialize(
                sent.key,
                sent.value,
                sent.timestamp,
                sent.headers,
                sent.topic,
                self.partition,
                offset,
            )
            self._advance(sent.timestamp)
            source.process(record)
            fed += 1
        return fed

    def _advance(self, timestamp: int) -> None:
        self.record_timestamp = timestamp
        if timestamp > self.stream_time:
            self.stream_time = timestamp

    # -- reading the output ------------------------------------------------------

    def output(self, topic: str) -> list[Sent]:
        """What was sent to `topic` (full name)."""
        return [s for s in self.sent if s.topic == topic]

    def changelog(self, store: str) -> list[Sent]:
        """The changelog records of `store` (`<application.id>-<store>-changelog`)."""
        return self.output(f"{self.application_id}-{store}-changelog")

    def clear(self) -> None:
        """Forget what was sent so far."""
        self.sent.clear()
