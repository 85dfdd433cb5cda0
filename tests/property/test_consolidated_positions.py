"""Hypothesis: in the consolidated layout, the positions in the `offsets`
column family never name a changelog record that the data column families
do not hold.

Model: two tasks with one change-logged store each over one real RocksDB
database. A write goes to the store and (cache off, as the runtime sends it)
to a model changelog at once. A commit stages every store and position and
writes the one batch. A crash closes everything without the commit's batch
(a staged but unwritten commit is lost, as with kill -9) and reopens the
database; a restore then applies the changelog after each position in
batches (each carrying its position), and may itself be cut short by a
crash. A task may also leave and have its state dropped (`drop_task`), then
come back and restore from the start. After every step, what is on disk for
each task is exactly the changelog replayed up to the position the `offsets`
column family gives (the two task ids share a prefix: "0_1", "0_12").
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import example, given
from hypothesis import strategies as st

from runtime.state.builders import LayeredStore, StoreSpec, build_task_stores
from runtime.state.column_family_store import ColumnFamilyStore
from runtime.state.consolidated import ConsolidatedStores

# One task id a prefix of the other: their keys share a column family, each
# under its own prefix, and nothing done to one may touch the other's.
TASKS = ("0_1", "0_12")
STORE = "s"

Changelog = list[tuple[bytes, bytes | None]]

write = st.tuples(
    st.just("write"),
    st.sampled_from(TASKS),
    st.sampled_from([b"a", b"b", b"c"]),
    st.one_of(st.none(), st.binary(min_size=1, max_size=3)),
)
commit = st.tuples(st.just("commit"), st.sampled_from([True, False]))  # False: crash mid-commit
crash = st.tuples(
    st.just("crash"), st.integers(min_value=0, max_value=5)
)  # restored before a crash
# A task closed and opened again in the same process (a rebalance, a rewind):
# its overlay is gone; it restores from its position before it writes again.
# Its restore may still run (`budget` batches done) when the other task commits.
reopen = st.tuples(st.just("reopen"), st.sampled_from(TASKS), st.integers(min_value=0, max_value=3))
# A task that left and whose state the cleanup thread dropped (one batch:
# its keys and positions), then came back: it restores from the start.
drop = st.tuples(st.just("drop"), st.sampled_from(TASKS), st.integers(min_value=0, max_value=3))
ops = st.lists(st.one_of(write, write, commit, crash, reopen, drop), max_size=40)


def _sink(*_args: object, **_kwargs: object) -> None:
    return None


class Process:
    """The stores of both tasks on one open database."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.db = ConsolidatedStores(root / "consolidated")
        self.stores: dict[str, LayeredStore] = {}
        for task in TASKS:
            self.open(task)

    def open(self, task: str) -> None:
        built = build_task_stores(
            [StoreSpec(STORE, caching=False)],
            self.root / task,
            "app",
            int(task[-1]),
            None,
            _sink,
            consolidated=self.db,
        )
        self.stores[task] = built[STORE]

    def position(self, task: str) -> int:
        store = self.stores[task]
        assert store.changelog is not None
        found = self.db.read_positions(task) or {}
        return found.get((store.changelog.topic, store.changelog.partition), 0)

    def on_disk(self, task: str) -> dict[bytes, bytes]:
        view = ColumnFamilyStore(STORE, self.db, task)
        try:
            return dict(view.all())
        finally:
            view.close()

    def close(self) -> None:
        for store in self.stores.values():
            store.close()
        self.db.close()


def _replay(changelog: Changelog, upto: int) -> dict[bytes, bytes]:
    state: dict[bytes, bytes] = {}
    for key, value in changelog[:upto]:
        if value is None:
            state.pop(key, None)
        else:
            state[key] = value
    return state


def _check(process: Process, changelogs: dict[str, Changelog]) -> None:
    for task in TASKS:
        position = process.position(task)
        assert position <= len(changelogs[task])
        assert process.on_disk(task) == _replay(changelogs[task], position), task


def _restore(
    process: Process,
    changelogs: dict[str, Changelog],
    budget: int | None,
    tasks: tuple[str, ...] = TASKS,
) -> None:
    """Apply each changelog after its position, two records a batch; stop
    after `budget` batches (None: to the end)."""
    for task in tasks:
        store = process.stores[task]
        position = process.position(task)
        log = changelogs[task]
        while position < len(log):
            if budget is not None:
                if budget == 0:
                    return
                budget -= 1
            batch = log[position : position + 2]
            position += len(batch)
            store.restore_batch(batch, position)


@given(ops)
# A commit whose batch was never written, its task reopened (overlay gone),
# the other task's commit while it restores: the staged position must not go.
@example([("write", "0_1", b"a", b"1"), ("commit", False), ("reopen", "0_1", 0), ("commit", True)])
@example([("write", "0_12", b"a", b"1"), ("commit", True), ("drop", "0_1", 0), ("crash", 0)])
def test_positions_never_name_records_the_data_lacks(steps: list[tuple[object, ...]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        changelogs: dict[str, Changelog] = {task: [] for task in TASKS}
        restoring: set[str] = set()
        process = Process(root)
        try:
            for step in steps:
                if step[0] == "write":
                    _op, task, key, value = step
                    assert isinstance(task, str) and isinstance(key, bytes)
                    if task in restoring:
                        continue  # not processed before its restore is done
                    store = process.stores[task].store
                    if value is None:
                        store.delete(key)
                    else:
                        assert isinstance(value, bytes)
                        store.put(key, value)
                    changelogs[task].append((key, value))  # sent at once (cache off)
                elif step[0] == "commit":
                    for task in TASKS:
                        if task in restoring:
                            continue  # not committed while it restores
                        layered = process.stores[task]
                        layered.flush()
                        assert layered.positions is not None and layered.changelog is not None
                        partition = (layered.changelog.topic, layered.changelog.partition)
                        layered.positions.commit({partition: len(changelogs[task])})
                    if step[1]:
                        process.db.write_commit()
                    _check(process, changelogs)
                    for task in sorted(restoring):  # done after the commit
                        _restore(process, changelogs, None, (task,))
                    restoring.clear()
                elif step[0] in ("reopen", "drop"):
                    _op, task, budget = step
                    assert isinstance(task, str) and isinstance(budget, int)
                    if task in restoring:
                        continue
                    process.stores[task].close()
                    if step[0] == "drop":
                        assert process.db.drop_task(task)
                        assert process.position(task) == 0
                    process.open(task)
                    _check(process, changelogs)
                    _restore(process, changelogs, budget, (task,))
                    restoring.add(task)
                else:
                    # kill -9: the staged batch and the overlays are gone.
                    process.close()
                    process = Process(root)
                    _check(process, changelogs)
                    restoring.clear()
                    budget = step[1]
                    assert isinstance(budget, int)
                    _restore(process, changelogs, budget)
                    # A crash in the middle of restoring, then the whole restore.
                    process.close()
                    process = Process(root)
                    _check(process, changelogs)
                    _restore(process, changelogs, None)
                _check(process, changelogs)
        finally:
            process.close()
