"""Store specs and the one call that builds a task's layered stores.

The layers, outermost first (Kafka Streams' order):

    [WindowStore]  composite keys, expiry             (window stores only)
    Metered        counts (latency totals if asked)
    Caching        folds writes per key until commit; on_flush forwards
    ChangeLogging  one changelog record per emitted write
    inner          RocksDB or in-memory

Caching sits above change-logging so that folded writes produce one changelog
record per key per commit. With caching off (`cache.max.bytes=0`, or
`StoreSpec.caching=False`) but an `on_flush` listener, the caching layer stays
as a pass-through that forwards every write at once.

Layout on disk (`state.store.layout=per-task`, the default):
`<state.dir>/<application.id>/<task id>/rocksdb/<store>`, and the task's
checkpoint file `<task dir>/.checkpoint`. With `consolidated`, a RocksDB
store's keys sit under the task's prefix in its store name's column
family of the process's one database and the positions
live there too (runtime.state.consolidated); `build_task_stores` first moves
a per-task directory left by the other layout into it
(runtime.state.layout_upgrade). A store's positions are reached through its
`positions` (`TaskPositions`) whatever the layout.

Threads: `build_store` runs on whichever thread creates the task (the polling
thread); the returned store then follows the package docstring.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from runtime.logging import get_logger
from runtime.state.cache import CachingKeyValueStore, FlushListener
from runtime.state.cache_budget import CacheBudget
from runtime.state.changelog import (
    ChangeLoggingKeyValueStore,
    ChangelogSink,
    changelog_topic_name,
    wall_clock_ms,
)
from runtime.state.checkpoint import FileCheckpoint, Offsets, TaskPositions
from runtime.state.column_family_store import ColumnFamilyStore
from runtime.state.consolidated import ConsolidatedPositions, ConsolidatedStores
from runtime.state.layout_upgrade import adopt_per_task_directory
from runtime.state.memory_store import InMemoryKeyValueStore
from runtime.state.metered import MeteredKeyValueStore, metered
from runtime.state.rocksdb_memory import RocksDBMemory
from runtime.state.rocksdb_store import RocksDBKeyValueStore
from runtime.state.store import KeyValueStore, ReadOnlyKeyValueStore
from runtime.state.windowed_store import ReadOnlyWindowStore, WindowStore

log = get_logger("runtime.state")

StoreKind = Literal["rocksdb", "memory", "window"]
_KINDS = ("rocksdb", "memory", "window")


@dataclass(frozen=True)
class StoreSpec:
    """What a topology declares about one store; the same for every task."""

    name: str
    kind: StoreKind = "rocksdb"
    changelog: bool = True
    caching: bool = True
    window_size_ms: int | None = None  # window stores only
    retention_ms: int | None = None  # window stores only (default: window size)
    send_old_values: bool = False  # on_flush also gets the previous value
    timed_metrics: bool = False

    def __post_init__(self) -> None:
        if not self.name or "/" in self.name or self.name in (".", ".."):
            raise ValueError(f"invalid store name {self.name!r}")
        if self.kind not in _KINDS:
            raise ValueError(f"store {self.name!r}: kind must be one of {_KINDS}")
        if self.kind == "window":
            if self.window_size_ms is None or self.window_size_ms <= 0:
                raise ValueError(f"window store {self.name!r} needs window_size_ms > 0")
            if self.retention_ms is not None and self.retention_ms < self.window_size_ms:
                raise ValueError(f"window store {self.name!r}: retention below window size")
        elif self.window_size_ms is not None or self.retention_ms is not None:
            raise ValueError(f"store {self.name!r}: window settings on a {self.kind} store")


def task_directory(state_dir: str | os.PathLike[str], application_id: str, task_id: str) -> Path:
    """`<state.dir>/<application.id>/<task id>`."""
    return Path(state_dir) / application_id / task_id


def rocksdb_path(task_dir: str | os.PathLike[str], store_name: str) -> Path:
    return Path(task_dir) / "rocksdb" / store_name


class LayeredStore:
    """One built store: `store` for processors, the rest for the task runtime.

    `store` is what `TaskContext.state_store(name)` returns: the metered top
    of the key-value stack, or the `WindowStore` over it. `base` is the inner
    RocksDB or in-memory store (restoration target), `changelog` the
    change-logging layer (None when not logged), `cache` the caching layer
    (None when absent).
    `task_dir` is the task's directory, None when the store was built without
    one; `positions` where the task's changelog positions live (its
    checkpoint file, or the consolidated database's offsets).
    """

    def __init__(
        self,
        spec: StoreSpec,
        store: MeteredKeyValueStore | WindowStore,
        metered_layer: MeteredKeyValueStore,
        cache: CachingKeyValueStore | None,
        changelog: ChangeLoggingKeyValueStore | None,
        base: RocksDBKeyValueStore | InMemoryKeyValueStore,
        task_dir: Path | None = None,
        positions: TaskPositions | None = None,
    ) -> None:
        self.spec = spec
        self.store = store
        self.metered = metered_layer
        self.cache = cache
        self.changelog = changelog
        self.base = base
        self.task_dir = task_dir
        if positions is None and task_dir is not None:
            positions = FileCheckpoint(task_dir)
        self.positions = positions

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def persistent(self) -> bool:
        return self.base.persistent

    @property
    def changelog_topic(self) -> str | None:
        return self.changelog.topic if self.changelog is not None else None

    # --- commit (polling thread, task locked) --------------------------------

    def flush(self) -> None:
        """Emit the cache (changelog records, downstream updates), then write the
        pending batch to RocksDB atomically."""
        self.store.flush()

    def emit_cached(self) -> None:
        """First half of `flush`: emit the cache, leave the disk alone.

        The commit protocol emits first and writes the store batch only once
        the changelog records are acknowledged (or their transaction
        committed), so an aborted transaction never reaches the disk."""
        if self.cache is not None:
            self.cache.flush_cache()

    def update_changelog_offset(self, next_offset: int) -> None:
        """After the producer acknowledged this commit's changelog records."""
        if self.changelog is not None:
            self.changelog.update_changelog_offset(next_offset)

    def checkpoint_offsets(self) -> Offsets:
        """This store's entries of the task checkpoint (persistent, logged stores)."""
        if self.changelog is None or not self.persistent:
            return {}
        return self.changelog.checkpoint_offsets()

    # --- restoration (restoration thread, before processing) -----------------

    def apply_checkpoint(self, offsets: Offsets | None) -> int | None:
        """Take this store's position from the task's checkpoint.

        Returns the changelog offset to restore from, or None for "from the
        beginning" (no checkpoint, not persistent, or not in the file).

        A RocksDB store whose files were gone when it opened (`created`: its
        directory missing or emptied while the checkpoint stayed) holds
        nothing, whatever the checkpoint says: its position there means "no
        checkpoint", with a warning naming the store and its directory, and
        the entry is dropped from the file (a crash during the restore then
        cannot leave a half-restored store trusted). A store that is empty
        because its changelog is (position 0) still has its files, so it is
        not `created` and nothing is said or replayed. Called by the thread
        that builds the task or standby (the polling thread), before
        restoration.
        """
        if self.changelog is None or not self.persistent or not offsets:
            return None
        partition = (self.changelog.topic, self.changelog.partition)
        position = offsets.get(partition)
        if position is None:
            return None
        base = self.rocksdb
        if base is not None and base.created:
            if position > 0:  # at 0 the checkpoint claims nothing the store lacks
                log.warning(
                    "state_store_files_missing",
                    task_id=self.task_dir.name if self.task_dir is not None else None,
                    store=self.name,
                    directory=str(base.path),
                    changelog=f"{partition[0]}-{partition[1]}",
                    checkpoint_position=position,
                    action="ignoring the checkpoint: restoring from the changelog's start",
                )
            self._forget_checkpoint()
            return None
        self.changelog.update_changelog_offset(position)
        return position

    def wipe(self) -> None:
        """Empty the store and forget its position, to restore it from its
        changelog's start: the changelog does not have the position the store
        was at (out of range: a recreated or truncated changelog), so what it
        holds cannot be placed in the changelog. Its checkpoint entry is
        dropped first. Restoration thread, before processing (the cache holds
        nothing yet). Raises `StoreUnopenableError` when the new, empty
        database cannot be opened."""
        if self.changelog is not None:
            self.changelog.changelog_offset = None
        self._forget_checkpoint()
        self.base.wipe()
        if isinstance(self.store, WindowStore):
            self.store.restored()

    def _forget_checkpoint(self) -> None:
        if self.changelog is None or self.positions is None:
            return
        self.positions.drop([(self.changelog.topic, self.changelog.partition)])

    @property
    def directory(self) -> Path | None:
        """The inner RocksDB store's directory (None for an in-memory store)."""
        base = self.rocksdb
        return base.path if base is not None else None

    def restore_batch(
        self, records: Iterable[tuple[bytes, bytes | None]], next_offset: int | None = None
    ) -> int:
        """Apply changelog records straight to the inner store (no changelog, no
        cache, no downstream); `next_offset` is the position after them.

        Call `sync()` before writing a checkpoint that names restored offsets."""
        if isinstance(self.base, ColumnFamilyStore):
            # Consolidated: the position goes into the records' batch.
            count = self.base.restore_batch(records, next_offset)
        else:
            count = self.base.restore_batch(records)
        if isinstance(self.store, WindowStore):
            self.store.restored()
        if next_offset is not None and self.changelog is not None:
            self.changelog.update_changelog_offset(next_offset)
        return count

    @property
    def rocksdb(self) -> RocksDBKeyValueStore | None:
        """The inner RocksDB store, or None for an in-memory one."""
        return self.base if isinstance(self.base, RocksDBKeyValueStore) else None

    def install_snapshot(self, directory: str | os.PathLike[str], position: int) -> None:
        """Replace the inner RocksDB by a downloaded snapshot (a RocksDB
        database of the store's keys, taken by either layout) that reflects
        the changelog up to `position`; restoration then replays the changelog
        from there. Raises if it does not open (the store's position is then
        unknown: per-task, the store is empty; consolidated, nothing was
        written and the store is as restoration found it)."""
        base = self.rocksdb
        if base is None or self.changelog is None:
            raise TypeError(f"store {self.name!r} is not a change-logged RocksDB store")
        self.changelog.changelog_offset = None
        base.install_snapshot_db(directory, position)
        if isinstance(self.store, WindowStore):
            self.store.restored()
        self.changelog.update_changelog_offset(position)

    def sync(self) -> None:
        """Make what commits and restoration wrote durable (before a checkpoint names it)."""
        if isinstance(self.base, RocksDBKeyValueStore):
            self.base.sync()

    # --- queries, metrics, lifecycle ------------------------------------------

    def read_only(self) -> ReadOnlyKeyValueStore | ReadOnlyWindowStore:
        if isinstance(self.store, WindowStore):
            return ReadOnlyWindowStore(self.store)
        return ReadOnlyKeyValueStore(self.store)

    def metrics(self) -> dict[str, float]:
        snapshot = self.metered.metrics()
        if self.cache is not None:
            snapshot.update(
                cache_hits=self.cache.hits,
                cache_misses=self.cache.misses,
                cache_evictions=self.cache.evictions,
                cache_bytes=self.cache.cached_bytes,
            )
        if self.changelog is not None:
            snapshot["changelog_records"] = self.changelog.records_logged
        return snapshot

    def close(self) -> None:
        """Close without flushing: call `flush` first for a clean close."""
        self.store.close()


def build_store(
    spec: StoreSpec,
    task_dir: str | os.PathLike[str],
    application_id: str,
    partition: int,
    cache_budget: CacheBudget | None,
    changelog_sink: ChangelogSink | None,
    on_flush: FlushListener | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    rocksdb_memory: RocksDBMemory | None = None,
    consolidated: ConsolidatedStores | None = None,
) -> LayeredStore:
    """Open (creating if needed) one store of a task and wrap it in its layers.

    `changelog_sink` is the task's `send` (required when `spec.changelog`);
    `on_flush(key, value, old_value, timestamp)` receives the folded
    downstream updates; `clock` gives the current record's timestamp;
    `rocksdb_memory` the app's shared RocksDB memory (default: the process's);
    `consolidated`: the process's one database (`state.store.layout=
    consolidated`), None for a database per store.
    """
    base: RocksDBKeyValueStore | InMemoryKeyValueStore
    task_id = Path(task_dir).name
    positions: TaskPositions = (
        ConsolidatedPositions(consolidated, task_id)
        if consolidated is not None
        else FileCheckpoint(task_dir)
    )
    if spec.kind == "memory":
        base = InMemoryKeyValueStore(spec.name)
    elif consolidated is not None:
        base = ColumnFamilyStore(spec.name, consolidated, task_id)
    else:
        base = RocksDBKeyValueStore(
            spec.name,
            rocksdb_path(task_dir, spec.name),
            rocksdb_memory,
            task_id=Path(task_dir).name,
        )
    stack: KeyValueStore = base
    changelog = None
    if spec.changelog:
        if changelog_sink is None:
            base.close()
            raise ValueError(f"store {spec.name!r} is change-logged but no changelog sink given")
        changelog = ChangeLoggingKeyValueStore(
            base, changelog_sink, changelog_topic_name(application_id, spec.name), partition, clock
        )
        stack = changelog
        if isinstance(base, ColumnFamilyStore):
            base.changelog_partition = (changelog.topic, partition)
    cache = None
    caching = spec.caching and cache_budget is not None and cache_budget.enabled
    if caching or on_flush is not None:
        budget = cache_budget if caching and cache_budget is not None else CacheBudget(0)
        cache = CachingKeyValueStore(stack, budget, on_flush, clock, spec.send_old_values)
        stack = cache
    metered_layer = metered(stack, timed=spec.timed_metrics)
    store: MeteredKeyValueStore | WindowStore = metered_layer
    if spec.kind == "window":
        assert spec.window_size_ms is not None
        retention = spec.retention_ms if spec.retention_ms is not None else spec.window_size_ms
        # Kafka Streams' segment interval: max(retention / 2, 60 s).
        slack = max(retention // 2, 60_000)
        store = WindowStore(
            metered_layer, spec.window_size_ms, retention, base=base, gc_slack_ms=slack
        )
    return LayeredStore(
        spec, store, metered_layer, cache, changelog, base, Path(task_dir), positions
    )


def build_task_stores(
    specs: Iterable[StoreSpec],
    task_dir: str | os.PathLike[str],
    application_id: str,
    partition: int,
    cache_budget: CacheBudget | None,
    changelog_sink: ChangelogSink | None,
    on_flush: Callable[[str], FlushListener | None] | None = None,
    clock: Callable[[], int] = wall_clock_ms,
    rocksdb_memory: RocksDBMemory | None = None,
    consolidated: ConsolidatedStores | None = None,
) -> dict[str, LayeredStore]:
    """All stores of one task, by name; `on_flush(store name)` picks each listener.

    With `consolidated`, a per-task directory the other layout left is moved
    into the process's database first (once; the caller holds the task
    directory's lock). On failure, the stores already opened are closed again.
    """
    specs = list(specs)
    if consolidated is not None and specs:
        adopt_per_task_directory(consolidated, task_dir, specs, application_id, partition)
    stores: dict[str, LayeredStore] = {}
    try:
        for spec in specs:
            if spec.name in stores:
                raise ValueError(f"duplicate store name {spec.name!r}")
            listener = on_flush(spec.name) if on_flush is not None else None
            stores[spec.name] = build_store(
                spec,
                task_dir,
                application_id,
                partition,
                cache_budget,
                changelog_sink,
                listener,
                clock,
                rocksdb_memory,
                consolidated,
            )
    except BaseException:
        for built in stores.values():
            built.close()
        raise
    return stores


def task_checkpoint_offsets(stores: Iterable[LayeredStore]) -> Offsets:
    """The offsets of a task's checkpoint file: all its persistent logged stores."""
    offsets: Offsets = {}
    for store in stores:
        offsets.update(store.checkpoint_offsets())
    return offsets
