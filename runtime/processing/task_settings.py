"""What every task of one app shares, and how a task is named.

`TaskSettings` is resolved once at start-up by the assembly and read-only
after that, by every thread that creates or runs a task.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from runtime.processing.errors import ErrorPolicy
from runtime.processing.key_lanes import KeyParallelSettings
from runtime.state.cache_budget import CacheBudget
from runtime.state.consolidated import ConsolidatedStores
from runtime.state.rocksdb_memory import RocksDBMemory


def task_id_of(subtopology_id: int | str, partition: int) -> str:
    """Kafka Streams' task id: `<subtopology>_<partition>` (a named query's
    subtopology is `<query>__<n>`, `Subtopology.task_name`)."""
    return f"{subtopology_id}_{partition}"


class TaskSettings:
    """What every task of one app shares (resolved once at start-up, read-only)."""

    def __init__(
        self,
        application_id: str,
        default_key_serde: Any,
        default_value_serde: Any,
        error_policy: ErrorPolicy,
        partition_counts: dict[str, int],
        state_dir: str,
        cache_budget: CacheBudget | None,
        static_partitioner: Any = None,
        key_parallel: KeyParallelSettings | None = None,
        rocksdb_memory: RocksDBMemory | None = None,
        consolidated: ConsolidatedStores | None = None,
        max_task_idle_ms: int = -1,
    ) -> None:
        self.application_id = application_id
        self.default_key_serde = default_key_serde
        self.default_value_serde = default_value_serde
        self.error_policy = error_policy
        self.partition_counts = partition_counts
        self.state_dir = state_dir
        self.cache_budget = cache_budget
        # `static.partitioner` (partition expansion): sinks use it when set.
        self.static_partitioner = static_partitioner
        # None: every task is a plain StreamTask (today's path, exactly).
        self.key_parallel = key_parallel
        # The block cache and write-buffer budget every RocksDB store of the
        # app shares (None: the process's default, runtime.state.rocksdb_memory).
        self.rocksdb_memory = rocksdb_memory
        # `state.store.layout=consolidated`: the process's one database (None:
        # a database per store and a checkpoint file per task).
        self.consolidated = consolidated
        # The process's global stores by name (runtime.state.global_store),
        # read by global table joins; filled by the assembly when it has any.
        self.global_stores: dict[str, Any] = {}
        # `max.task.idle.ms` (runtime.processing.partition_sync); -1: no waiting.
        self.max_task_idle_ms = max_task_idle_ms
        # Called now and then while a new task waits for its directory
        # (runtime.state.task_lock): standby placement's
        # `release_claimed_standbys`, set by the polling thread when it is
        # built (before any task). Two processes of a daemon may each wait
        # for a directory the other's standby holds; this breaks the tie.
        self.while_directory_waits: Callable[[], None] | None = None
