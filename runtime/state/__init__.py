"""State stores: key-value and windowed stores, with their layers.

Owns the stores (RocksDB via rocksdict, in-memory, windowed), the layers a
store is wrapped in (metered -> cached -> change-logged -> inner), the
process-wide cache budget, the app's shared RocksDB memory (one block cache
and write-buffer budget for every RocksDB store, `rocksdb_memory`) and the
RocksDB metrics thread reading the stores' properties (`rocksdb_metrics`),
per-task checkpoint files, the consolidated layout (`consolidated`: one
database per process, a column family per store name with the tasks' keys
under their prefixes, the positions in it,
one synced batch per commit; `layout_upgrade` moves per-task directories
in), and `build_store`, which
turns a `StoreSpec` into a layered store. Local state is trusted only as far
as it goes: a store whose files are gone restores from its changelog's start
whatever its checkpoint says, one RocksDB cannot open stops the app with
`StoreUnopenableError` (directory and fix named), and a checkpointed position
the changelog does not have wipes the store and restores it from scratch.

Threads: a store of a task is called only by the processing thread holding
that task; `flush` (commit) and `close` by the polling thread while every task
is locked (or the task is closed); `restore_batch` by the restoration thread
before the task is handed to processing. Only `CacheBudget` and
`RocksDBMemory` are shared between threads, and they lock; the RocksDB
metrics thread reads stores' properties under each store's own lock. Nothing here touches a Kafka client: changelog records
go to an injected sink (in the runtime, `TaskContext.send`).
"""

from runtime.state.builders import (
    LayeredStore,
    StoreSpec,
    build_store,
    build_task_stores,
    task_checkpoint_offsets,
    task_directory,
)
from runtime.state.cache_budget import CacheBudget
from runtime.state.checkpoint import checkpoint_path, read_checkpoint, write_checkpoint
from runtime.state.rocksdb_store import StoreUnopenableError
from runtime.state.store import KeyValueStore, ReadOnlyKeyValueStore
from runtime.state.windowed_store import ReadOnlyWindowStore, WindowStore

__all__ = [
    "CacheBudget",
    "KeyValueStore",
    "LayeredStore",
    "ReadOnlyKeyValueStore",
    "ReadOnlyWindowStore",
    "StoreSpec",
    "StoreUnopenableError",
    "WindowStore",
    "build_store",
    "build_task_stores",
    "checkpoint_path",
    "read_checkpoint",
    "task_checkpoint_offsets",
    "task_directory",
    "write_checkpoint",
]
