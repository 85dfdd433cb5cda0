"""State stores: key-value and windowed stores, with their layers.

Owns the stores (RocksDB via rocksdict, in-memory, windowed), the layers a
store is wrapped in (metered -> cached -> change-logged -> inner), the
process-wide cache budget, per-task checkpoint files, and `build_store`, which
turns a `StoreSpec` into a layered store.

Threads: a store of a task is called only by the processing thread holding
that task; `flush` (commit) and `close` by the polling thread while every task
is locked (or the task is closed); `restore_batch` by the restoration thread
before the task is handed to processing. Only `CacheBudget` is shared between
threads, and it locks. Nothing here touches a Kafka client: changelog records
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
from runtime.state.cache import CacheBudget
from runtime.state.checkpoint import checkpoint_path, read_checkpoint, write_checkpoint
from runtime.state.store import KeyValueStore, ReadOnlyKeyValueStore
from runtime.state.windowed_store import ReadOnlyWindowStore, WindowStore

__all__ = [
    "CacheBudget",
    "KeyValueStore",
    "LayeredStore",
    "ReadOnlyKeyValueStore",
    "ReadOnlyWindowStore",
    "StoreSpec",
    "WindowStore",
    "build_store",
    "build_task_stores",
    "checkpoint_path",
    "read_checkpoint",
    "task_checkpoint_offsets",
    "task_directory",
    "write_checkpoint",
]
