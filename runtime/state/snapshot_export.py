"""Per-task snapshots of the consolidated layout: a task's key range of one
store, exported into (and read back from) a standalone RocksDB database.

Why: a remote-state snapshot (runtime.state.remote) is, per store, a RocksDB
database directory holding exactly that store's keys, as a RocksDB checkpoint
of a per-task store is. In the consolidated layout a task's store is a key
range (`<task id>\\x00` prefix) of a column family shared by every task.
So at the commit the whole process database is checkpointed (hard links:
cheap, see runtime.state.remote.capture for the memtable flush it needs),
and later, on the upload's thread, each of the task's ranges is read from
that checkpoint (opened read-only, only the store's column family) and
written, prefix stripped, into a new database; the checkpoint is then
deleted. The result has the per-task format, so a snapshot is portable
between layouts: a per-task app installs it as it installs a checkpoint, and
a consolidated app reads a per-task checkpoint the same way (`read_database`).

Why not a RocksDB snapshot (`Rdict.snapshot()`, a sequence number, free to
take): rocksdict 0.3.29's `Snapshot.items()`/`iter()` read the latest data,
not the snapshot's (only `Snapshot.get` honours it; checked here with a key
changed and one added after the snapshot), so an export read from it would
mix commits.

Threads: `export_range` and `read_database` run on the restoration thread
(the upload's first step; an install). They open their own read-only or new
databases; nothing here touches the live one.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from itertools import islice
from pathlib import Path
from typing import cast

from rocksdict import AccessType, Options, Rdict, ReadOptions, WriteBatch

_CHUNK = 4096  # entries per rocksdict iterator and per write batch


def _raw_options(create: bool) -> Options:
    options = Options(raw_mode=True)
    options.create_if_missing(create)
    options.set_error_if_exists(create)
    return options


def export_range(
    checkpoint: str | os.PathLike[str],
    family: str,
    prefix: bytes,
    end: bytes,
    directory: str | os.PathLike[str],
) -> int:
    """Write the keys in [prefix, end) of column family `family` of the
    database checkpoint at `checkpoint`, without `prefix`, into a new RocksDB
    database at `directory` (which must not exist), flushed to SST files and
    closed. Returns the keys written."""
    source = Rdict(
        str(checkpoint),
        Options(raw_mode=True),
        column_families={family: Options(raw_mode=True)},
        access_type=AccessType.read_only(),
    )
    path = Path(directory)
    count = 0
    try:
        column = source.get_column_family(family)
        target = Rdict(str(path), _raw_options(create=True))
        try:
            cut = len(prefix)
            start = prefix
            while True:
                read_options = ReadOptions()
                read_options.set_iterate_upper_bound(end)
                items = cast(
                    "Iterable[tuple[bytes, bytes]]",
                    column.items(from_key=start, read_opt=read_options),
                )
                chunk = list(islice(items, _CHUNK))
                del items  # no rocksdict iterator outlives a chunk
                if chunk:
                    batch = WriteBatch(raw_mode=True)
                    for key, value in chunk:
                        batch.put(key[cut:], value)
                    target.write(batch)
                    count += len(chunk)
                if len(chunk) < _CHUNK:
                    break
                start = chunk[-1][0] + b"\x00"
            target.flush(True)  # the data in SST files, the write-ahead log empty
        finally:
            target.close()
        del column
    finally:
        source.close()
    # RocksDB's info logs are not data; a checkpoint has none either.
    for entry in path.iterdir():
        if entry.name.startswith("LOG"):
            entry.unlink()
    return count


def read_database(directory: str | os.PathLike[str]) -> Iterator[list[tuple[bytes, bytes]]]:
    """The entries of the RocksDB database at `directory` (a snapshot, either
    layout's), in chunks of sorted entries. Raises if it is no database
    (never creates one). Closes the database when exhausted or closed."""
    db = Rdict(str(directory), _raw_options(create=False))
    try:
        start = b""
        while True:
            items = cast("Iterable[tuple[bytes, bytes]]", db.items(from_key=start))
            chunk = list(islice(items, _CHUNK))
            del items
            if chunk:
                yield chunk
            if len(chunk) < _CHUNK:
                return
            start = chunk[-1][0] + b"\x00"
    finally:
        db.close()
