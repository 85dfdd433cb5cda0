"""The column families of the consolidated database (runtime.state.consolidated):
their names, the figures the RocksDB metrics thread reads per family, and the
one-time conversion of a database the layout's first version left.

Keys: a task's keys start with `task_prefix(task_id)`, in every family.
Names: `offsets` (changelog positions), `store.<store>` (every task's copy of
store `<store>`, keys under the task's prefix), RocksDB's own `default`
(unused). The first version of the layout kept a family per task-store,
`<task id>/<store>` (a store name holds no `/`); such a family is "legacy".

Figures: the metrics thread reads RocksDB's properties per column family,
so in this layout per store name (every task of the process together):
`FamilyFigures` is registered with the app's `RocksDBMemory` for each family
(task label `*`), which also lets the write-buffer relief flush a family's
memtable. Per task, RocksDB has no figure: the prefix is not a unit RocksDB
counts.

Threads: `FamilyFigures` methods from the metrics thread or a writer
relieving the write-buffer budget (they take the database's lock);
`upgrade_family_per_task_store` from the thread opening the database, before
it is shared.
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import islice
from typing import TYPE_CHECKING, cast

from rocksdict import Rdict, WriteBatch

from runtime.logging import get_logger

if TYPE_CHECKING:
    from runtime.state.consolidated import ConsolidatedStores

log = get_logger("runtime.state.consolidated")

OFFSETS_CF = "offsets"
STORE_CF_PREFIX = "store."
ALL_TASKS = "*"
"""The task label of a column family's figures: every task of the process."""
_COPY_CHUNK = 10_000


def task_prefix(task_id: str) -> bytes:
    """What every key of the task starts with, in its stores' column families
    and in `offsets`: the task id and 0x00 (a task id holds no 0x00, so no
    task's keys fall inside another's range)."""
    if "\x00" in task_id:
        raise ValueError(f"task id {task_id!r} holds a NUL byte")
    return task_id.encode("utf-8") + b"\x00"


def prefix_end(prefix: bytes) -> bytes:
    """The smallest key after every key starting with `prefix` (which ends
    with 0x00)."""
    return prefix[:-1] + b"\x01"


def store_family_name(store: str) -> str:
    return STORE_CF_PREFIX + store


def store_of_family(name: str) -> str | None:
    """The store name of a `store.<store>` family; None for any other."""
    return name[len(STORE_CF_PREFIX) :] if name.startswith(STORE_CF_PREFIX) else None


def is_legacy_family(name: str) -> bool:
    """A `<task id>/<store>` family of the layout's first version."""
    return "/" in name and not name.startswith(STORE_CF_PREFIX)


class FamilyFigures:
    """One column family as the metrics thread and the write-buffer relief see
    it (runtime.state.rocksdb_memory.MeteredDatabase): labelled task `*`,
    store = the store name (or `offsets`, `default`)."""

    def __init__(self, stores: ConsolidatedStores, family: str) -> None:
        self._stores = stores
        self._family = family
        self._name = store_of_family(family) or family

    @property
    def task_id(self) -> str:
        return ALL_TASKS

    @property
    def name(self) -> str:
        return self._name

    def rocksdb_properties(self, names: tuple[str, ...]) -> dict[str, int] | None:
        return self._stores.family_properties(self._family, names)

    def rocksdb_statistics(self) -> str | None:
        """None: RocksDB's statistics belong to the database, not a family."""
        return None

    def flushable_memtable_bytes(self) -> int:
        return self._stores.family_flushable_bytes(self._family)

    def request_flush(self) -> None:
        self._stores.flush_family(self._family)


def upgrade_family_per_task_store(stores: ConsolidatedStores, db: Rdict, legacy: list[str]) -> None:
    """Move each legacy `<task>/<store>` family's keys under the task's prefix
    in `store.<store>`, then drop the family. The positions in `offsets` are
    the same in both versions and stay.

    Crash safety: a family is dropped only after its keys are copied and
    synced; the copy's first batch clears the task's range first, so a copy
    interrupted by a crash is done again from scratch at the next open (the
    legacy family, still there, is what counts until it is dropped).
    Dropping costs RocksDB an OPTIONS file rewrite per family (O(N^2) for N
    families: the reason the layout changed), paid once."""
    copied = 0
    for name in legacy:
        task_id, _slash, store = name.rpartition("/")
        _family, handle, _created = stores.store_family(store)
        prefix = task_prefix(task_id)
        old = db.get_column_family(name)
        items = cast("Iterable[tuple[bytes, bytes]]", old.items())
        batch = WriteBatch(raw_mode=True)
        batch.delete_range(prefix, prefix_end(prefix), handle)
        while True:
            chunk = list(islice(items, _COPY_CHUNK))
            for key, value in chunk:
                batch.put(prefix + key, value, handle)
            copied += len(chunk)
            stores.write_adopted(task_id, batch, {})
            if len(chunk) < _COPY_CHUNK:
                break
            batch = WriteBatch(raw_mode=True)
        del items, old
        db.drop_column_family(name)
    log.info(
        "consolidated_layout_upgraded",
        path=str(stores.path),
        column_families=len(legacy),
        records=copied,
        action="a column family per task-store moved into one per store name (key prefixes)",
    )
