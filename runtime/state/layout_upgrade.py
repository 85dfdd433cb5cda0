"""The switch from `state.store.layout=per-task` to `consolidated`: a task's
old directory moved into the process's database, once.

A task opening its stores in the consolidated layout may find the per-task
layout's `<task dir>/.checkpoint` and `<task dir>/rocksdb/<store>` (the app
ran with `per-task` before). Its state is worth keeping (restoring it from
the changelogs costs the whole changelog), so `adopt_per_task_directory`
copies each old store's keys into the store's column family (under the
task's prefix) and the checkpoint's positions into the `offsets` column
family in ONE synced batch, then deletes the old store directories and checkpoint (a log line says so).

Crash safety: everything goes in ONE synced batch: the deletion of the
task's range in its stores' column families and in `offsets` (what an older
consolidated run left there is superseded by the per-task state), the old
stores' keys and the checkpoint's positions; the old files go after it. A
crash before the batch leaves the database as it was and the old directory
still there (the next start does it again); a crash after it leaves the old
directory naming the same state, copied again. A store whose old directory
is missing takes no position (it restores from its changelog's start, as in
the per-task layout). A directory without a checkpoint names no position:
its stores are deleted, not copied.

Threads: the thread opening the task's stores (polling thread for an active
task, the one creating a standby), holding the task directory's lock.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, cast

from rocksdict import Rdict, WriteBatch

from runtime.logging import get_logger
from runtime.state.changelog import changelog_topic_name
from runtime.state.checkpoint import Offsets, checkpoint_path, delete_checkpoint, read_checkpoint
from runtime.state.consolidated_families import prefix_end, task_prefix

if TYPE_CHECKING:
    from runtime.state.builders import StoreSpec
    from runtime.state.consolidated import ConsolidatedStores

log = get_logger("runtime.state.layout_upgrade")


def adopt_per_task_directory(
    stores: ConsolidatedStores,
    task_dir: str | os.PathLike[str],
    specs: Sequence[StoreSpec],
    changelog_prefix: str,
    partition: int,
) -> bool:
    """Move the per-task layout's state of this task into `stores` (see the
    module docstring); True when there was any to move."""
    task_dir = Path(task_dir)
    rocksdb_dir = task_dir / "rocksdb"
    checkpoint_file = checkpoint_path(task_dir)
    if not rocksdb_dir.exists() and not checkpoint_file.exists():
        return False
    task_id = task_dir.name
    checkpoint = read_checkpoint(checkpoint_file) or {}
    persistent = [s for s in specs if s.kind != "memory"]
    adopted: Offsets = {}
    copied = 0
    if checkpoint:
        prefix = task_prefix(task_id)
        batch = WriteBatch(raw_mode=True)
        # Whatever an older consolidated run left for the task the per-task
        # state supersedes: its positions and keys go in the same batch.
        batch.delete_range(prefix, prefix_end(prefix), stores.offsets_handle())
        for spec in persistent:
            old = rocksdb_dir / spec.name
            changelog = (changelog_topic_name(changelog_prefix, spec.name), partition)
            _family, handle, _created = stores.store_family(spec.name)
            batch.delete_range(prefix, prefix_end(prefix), handle)
            if not (old / "CURRENT").exists():
                continue  # no database: it restores from its changelog's start
            db = Rdict(str(old), stores.memory.options(spec.name, create=False))
            try:
                items = cast("Iterable[tuple[bytes, bytes]]", db.items())  # raw mode
                for key, value in items:
                    batch.put(prefix + key, value, handle)
                    copied += 1
            finally:
                db.close()
            if changelog in checkpoint:
                adopted[changelog] = checkpoint[changelog]
        stores.write_adopted(task_id, batch, adopted)
    shutil.rmtree(rocksdb_dir, ignore_errors=True)
    delete_checkpoint(checkpoint_file)
    log.info(
        "state_layout_upgraded",
        task_id=task_id,
        directory=str(task_dir),
        records=copied,
        positions={f"{t}-{p}": o for (t, p), o in adopted.items()},
        action=(
            "per-task stores copied into the consolidated database; old directory removed"
            if checkpoint
            else "per-task stores without a checkpoint removed (they restore from their changelogs)"
        ),
    )
    return True
