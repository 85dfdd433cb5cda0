"""The cleanup thread: deletes state directories this instance no longer uses.

A task's directory stays after the task moves away, in case it comes back
(its checkpoint makes the return cheap). Once a directory has been neither
owned here (active, restoring or standby) nor written for
`state.cleanup.delay.ms`, this thread deletes it, if it can take the
directory's lock (runtime.state.task_lock: another processing process of
the daemon may own it). It only reads the owned set the polling thread
publishes; it never touches a store.

With `state.store.layout=consolidated` a task's state is also its keys (under
its prefix) and positions in the process's database: those of a task not owned
here for the delay are dropped too (`ConsolidatedStores.drop_task`, which
refuses while a store of the task is open).
"""

from __future__ import annotations

import re
import shutil
import threading
import time
from collections.abc import Callable
from pathlib import Path

from runtime.logging import get_logger
from runtime.state.consolidated import ConsolidatedStores
from runtime.state.task_lock import TaskDirectoryLock

log = get_logger("runtime.cleanup")

_TASK_DIR = re.compile(r"^\d+_\d+$")


class CleanupThread(threading.Thread):
    def __init__(
        self,
        name: str,
        app_dir: Path,
        delay_ms: int,
        owned: Callable[[], frozenset[str]],
        interval_s: float | None = None,
        consolidated: ConsolidatedStores | None = None,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self._app_dir = app_dir
        self._delay_s = delay_ms / 1000.0
        self._owned = owned
        self._interval_s = interval_s or min(60.0, max(0.5, self._delay_s / 2))
        self._unowned_since: dict[str, float] = {}
        self._consolidated = consolidated
        self._families_unowned_since: dict[str, float] = {}
        self._stop_event = threading.Event()
        self.deleted: list[str] = []

    def request_stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        while not self._stop_event.wait(self._interval_s):
            try:
                self.clean_once()
            except Exception as exc:  # never fatal: retry next round
                log.warning("state_cleanup_failed", error=str(exc))

    def clean_once(self, now: float | None = None) -> list[str]:
        """Delete directories (and, consolidated, a task's keys and positions) unused for
        the delay; returns their task ids."""
        now = time.time() if now is None else now
        if not self._app_dir.is_dir():
            return []
        owned = self._owned()
        dropped = self._drop_families(owned, now)
        deleted: list[str] = []
        for entry in self._app_dir.iterdir():
            task_id = entry.name
            if not entry.is_dir() or not _TASK_DIR.match(task_id):
                continue
            if task_id in owned:
                self._unowned_since.pop(task_id, None)
                continue
            since = self._unowned_since.setdefault(task_id, now)
            last_used = max(since, _last_write(entry))
            if now - last_used < self._delay_s:
                continue
            # Another process of this daemon (processes > 1) may own it: only
            # a directory nobody holds is deleted, under its lock.
            lock = TaskDirectoryLock(entry)
            if not lock.try_acquire():
                self._unowned_since.pop(task_id, None)
                continue
            try:
                shutil.rmtree(entry, ignore_errors=True)
            finally:
                lock.release()
            self._unowned_since.pop(task_id, None)
            deleted.append(task_id)
            log.info("state_directory_deleted", task_id=task_id, path=str(entry))
        deleted += [task_id for task_id in dropped if task_id not in deleted]
        self.deleted.extend(deleted)
        return deleted

    def _drop_families(self, owned: frozenset[str], now: float) -> list[str]:
        """Consolidated layout: drop the keys and positions of the
        tasks not owned here for the delay; returns their task ids."""
        stores = self._consolidated
        if stores is None:
            return []
        dropped = []
        present = stores.task_ids()
        since_map = self._families_unowned_since
        for task_id in list(since_map):
            if task_id not in present:
                del since_map[task_id]
        for task_id in sorted(present):
            if task_id in owned:
                since_map.pop(task_id, None)
                continue
            since = since_map.setdefault(task_id, now)
            if now - since < self._delay_s:
                continue
            if stores.drop_task(task_id):
                since_map.pop(task_id, None)
                dropped.append(task_id)
            else:  # a store of it is open again: owned since the owned set was read
                since_map.pop(task_id, None)
        return dropped


def _last_write(directory: Path) -> float:
    latest = directory.stat().st_mtime
    checkpoint = directory / ".checkpoint"
    if checkpoint.exists():
        latest = max(latest, checkpoint.stat().st_mtime)
    return latest
