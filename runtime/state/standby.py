"""Standby tasks: a task's stores kept current from its changelog, no processing.

A standby is built by the polling thread (it opens the stores) and then lives
in the restoration thread, which applies changelog records to it and writes
its checkpoint from time to time and when it is removed. When the task
becomes active on this instance, the standby is removed first (stores closed,
checkpoint written) and the active task opens the same directory and restores
only what the standby had not seen yet.
"""

from __future__ import annotations

from runtime.state.builders import LayeredStore, StoreSpec, build_task_stores, task_directory
from runtime.state.checkpoint import FileCheckpoint, TaskPositions
from runtime.state.consolidated import ConsolidatedPositions, ConsolidatedStores
from runtime.state.rocksdb_memory import RocksDBMemory
from runtime.state.task_lock import TaskDirectoryLock, TaskDirectoryLocked


def _no_writes(
    topic: str,
    key: bytes | None,
    value: bytes | None,
    timestamp: int,
    headers: object,
    partition: int | None,
) -> None:
    raise RuntimeError("a standby task never writes to its changelog")


class StandbyTask:
    """The stores of one task, kept warm. Restoration thread after creation."""

    def __init__(
        self,
        task_id: str,
        partition: int,
        specs: list[StoreSpec],
        state_dir: str,
        application_id: str,
        changelog_prefix: str | None = None,
        rocksdb_memory: RocksDBMemory | None = None,
        consolidated: ConsolidatedStores | None = None,
        wait_for_lock: bool = True,
    ) -> None:
        """`changelog_prefix`: what its changelog topics start with
        (`Subtopology.topic_prefix`; default `application_id`);
        `rocksdb_memory`: the app's shared RocksDB memory; `consolidated`:
        the process's one database (`state.store.layout=consolidated`);
        `wait_for_lock`: False raises TaskDirectoryLocked at once when another
        process holds the task's directory (a standby of placement tries
        again later), True waits like an active task but claims nothing."""
        self.id = task_id
        self.partition = partition
        self.directory = task_directory(state_dir, application_id, task_id)
        logged = [s for s in specs if s.changelog]
        self._directory_lock = TaskDirectoryLock(self.directory)
        if wait_for_lock:
            self._directory_lock.acquire(claim=False)
        elif not self._directory_lock.try_acquire():
            raise TaskDirectoryLocked(f"{self.directory} is held by another process")
        # Only persistent stores are worth keeping warm; in-memory ones are
        # rebuilt by the active task anyway.
        self.stores: dict[str, LayeredStore] = build_task_stores(
            [s for s in logged if s.kind != "memory"],
            self.directory,
            changelog_prefix or application_id,
            partition,
            None,
            _no_writes,
            rocksdb_memory=rocksdb_memory,
            consolidated=consolidated,
        )
        self._positions: TaskPositions = (
            ConsolidatedPositions(consolidated, task_id)
            if consolidated is not None
            else FileCheckpoint(self.directory)
        )
        checkpoint = self._positions.read()
        self.restore_from: dict[tuple[str, int], int | None] = {}
        for store in self.stores.values():
            start = store.apply_checkpoint(checkpoint)
            if store.changelog_topic is not None:
                self.restore_from[(store.changelog_topic, partition)] = start
        self.applied = 0

    def checkpoint(self) -> None:
        offsets: dict[tuple[str, int], int] = {}
        for store in self.stores.values():
            store.sync()
            offsets.update(store.checkpoint_offsets())
        if offsets:
            self._positions.write(offsets)

    def close(self) -> None:
        """Write the checkpoint and close the stores."""
        try:
            self.checkpoint()
        finally:
            try:
                for store in self.stores.values():
                    store.close()
            finally:
                self._directory_lock.release()
