"""`state.store.layout=consolidated` on Kafka: kill -9 during commits (both
guarantees), the upgrade from per-task directories, a task moving to another
instance and its state dropped where it left, standby promotion (and the
RocksDB figures per column family).

The kill test runs the daemon (`tests/apps/count_app.py`) while a feeder
produces, kills it mid-stream, then reads the dead process's database: what
its data column families hold must be the changelog replayed up to some
offset at or after the position in its `offsets` column family (a position
may lag a little: the broker's end offset is looked up after the commit;
it never names a record the data lacks), and the next start may restore at
most the changelog records after the positions. The other
tests run `App`s in-process (their log lines and status are at hand).
"""

from __future__ import annotations

import io
import json
import signal
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime import App, StreamsBuilder, serdes
from runtime.state.column_family_store import ColumnFamilyStore
from runtime.state.consolidated import ConsolidatedStores, consolidated_directory
from tests.configs import app_config
from tests.harness import Daemon, Feeder, TopicReader, clean_env
from tests.kafka_helpers import (
    Msg,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)
from tests.logs import capture_logs, logged_events

pytestmark = pytest.mark.integration

STORE = "counts"
KEYS = 20


def _latest_counts(msgs: list) -> dict[str, int]:  # type: ignore[type-arg]
    latest: dict[str, int] = {}
    for m in msgs:
        latest[m.key.decode()] = serdes.INT64.deserialize(m.value)
    return latest


def _events(log_path: Path, name: str) -> list[dict[str, object]]:
    found = []
    for line in log_path.read_text(errors="replace").splitlines():
        if line.startswith("{") and f'"{name}"' in line:
            event = json.loads(line)
            if event.get("event") == name:
                found.append(event)
    return found


def _prefix_states(
    msgs: list[Msg], partition: int, upto: int
) -> Iterator[tuple[int, dict[bytes, bytes]]]:
    """A changelog partition's store as of each offset from `upto` on: (the
    position, the changelog replayed below it), the first at `upto`."""
    state: dict[bytes, bytes] = {}
    records = [m for m in msgs if m.partition == partition]
    yielded = False
    for m in records:
        if m.offset >= upto and not yielded:
            yielded = True
            yield upto, dict(state)
        if m.value is None:
            state.pop(m.key or b"", None)
        else:
            state[m.key or b""] = m.value
        if m.offset >= upto:
            yield m.offset + 1, dict(state)
    if not yielded:
        yield upto, dict(state)


def _held_position(
    msgs: list[Msg], partition: int, position: int, held: dict[bytes, bytes]
) -> int | None:
    """The changelog position whose replay the store holds, at or after the
    position its `offsets` entry names (None: no such position). The entry
    may lag (the broker's end offset is looked up after the commit; a failed
    or stale lookup keeps a lower one: restoration replays a few records the
    store already has), never lead: it must not name a record the data lacks."""
    for at, state in _prefix_states(msgs, partition, position):
        if state == held:
            return at
    return None


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
def test_kill_9_during_commits_keeps_data_and_positions_together(
    bootstrap: str, tmp_path: Path, guarantee: str
) -> None:
    app_id = unique_name("consol-kill")
    source, sink = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    changelog = f"{app_id}-{STORE}-changelog"
    sets: dict[str, object] = dict(
        app_config(bootstrap, app_id, tmp_path / "state", guarantee=guarantee, commit_ms=100),
        **{
            "state.store.layout": "consolidated",
            # Every update reaches the changelog at once: at the kill, the
            # changelog runs ahead of the last batch, which restoration replays.
            "cache.max.bytes": 0,
            # A killed member leaves the group when its session expires.
            "consumer.session.timeout.ms": 3000,
        },
    )
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    feeder = Feeder(bootstrap, source, rate=800, keys=KEYS)
    reader = TopicReader(bootstrap, sink, 2)
    first = Daemon(tmp_path / "first.log", "tests.apps.count_app:topology", sets, env)
    second = Daemon(tmp_path / "second.log", "tests.apps.count_app:topology", sets, env)
    feeder.start()
    try:
        first.start()

        def counted(at_least: int, daemon: Daemon) -> bool:
            daemon.assert_alive()
            reader.poll()
            return sum(_latest_counts(reader.msgs).values()) >= at_least

        wait_until(lambda: counted(1, first), 120, message="the first daemon counted nothing")
        # Then a few seconds of steady commits (the backlog of its start is done).
        started_at = sum(_latest_counts(reader.msgs).values())
        wait_until(
            lambda: counted(started_at + 2000, first), 60, message="the first daemon stalled"
        )
        first.send(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL
        assert feeder.is_alive(), "the feeder had finished: the kill was not mid-stream"

        # The dead process's database: the data is the changelog up to (or a
        # little past) the positions.
        ends = end_offsets(bootstrap, changelog)
        db = ConsolidatedStores(consolidated_directory(str(tmp_path / "state"), app_id))
        try:
            positions: dict[int, int] = {}
            held: dict[int, dict[bytes, bytes]] = {}
            for partition in (0, 1):
                task_id = f"0_{partition}"
                found = db.read_positions(task_id) or {}
                positions[partition] = found.get((changelog, partition), 0)
                store = ColumnFamilyStore(STORE, db, task_id)
                held[partition] = dict(store.all())
                store.close()
        finally:
            db.close()
        assert sum(positions.values()) > 0, "no commit reached the database before the kill"
        records = consume_all(bootstrap, changelog, idle=0.5)
        for partition in (0, 1):
            at = _held_position(records, partition, positions[partition], held[partition])
            assert at is not None, (partition, positions, held[partition])
            assert at <= ends[partition]
        assert not list((tmp_path / "state").rglob(".checkpoint"))

        second.start()
        wait_until(
            lambda: len(_events(second.log_path, "task_restored")) >= 2 or not second.alive(),
            120,
            message="the second daemon restored nothing",
        )
        second.assert_alive()
        for event in _events(second.log_path, "task_restored"):
            partition = int(str(event["task_id"]).split("_")[1])
            # No replay beyond the last batch: only what follows its positions
            # (all of it without transactions; markers take offsets under EOS).
            restored = int(str(event["records"]))
            tail = ends[partition] - positions[partition]
            assert restored <= tail, (event, ends, positions)
            if guarantee == "at_least_once":
                assert restored == tail, (event, ends, positions)
        feeder.stop()
        expected = dict(feeder.written_keys())

        def complete() -> bool:
            second.assert_alive()
            reader.poll()
            latest = _latest_counts(reader.msgs)
            return all(latest.get(k, 0) >= n for k, n in expected.items())

        wait_until(complete, 120, interval=0.5, message="counts never complete after the restart")
        if guarantee == "exactly_once_v2":
            assert _latest_counts(reader.msgs) == expected
        second.send(signal.SIGTERM)
        assert second.wait(60) == 0, second.tail()
    finally:
        if feeder.is_alive():
            feeder.stop()
        first.kill()
        second.kill()
        reader.close()


def counting_app(
    bootstrap: str, app_id: str, source: str, sink: str, state_dir: Path, **extra: object
) -> App:
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .count(store=STORE)
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    return App(
        builder.build(),
        app_config(bootstrap, app_id, state_dir, threads=1, **{"cache.max.bytes": 0, **extra}),
    )


def running_tasks(app: App) -> set[str]:
    return {t["id"] for t in app.status()["tasks"] if t["state"] == "RUNNING"}


@pytest.fixture
def log_lines() -> Iterator[io.StringIO]:
    with capture_logs("info") as stream:
        yield stream


def _wait_counts(bootstrap: str, sink: str, expected: Counter[str]) -> None:
    wait_until(
        lambda: _latest_counts(consume_all(bootstrap, sink, idle=0.3)) == dict(expected),
        60,
        interval=0.5,
        message="counts never exact",
    )


def test_upgrade_from_per_task_then_a_task_leaves_and_its_state_is_dropped(
    bootstrap: str, tmp_path: Path, log_lines: io.StringIO
) -> None:
    app_id = unique_name("consol-up")
    source, sink = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    expected: Counter[str] = Counter()

    def feed(n: int) -> None:
        batch = [(f"k{i % KEYS}", "x") for i in range(n)]
        produce(bootstrap, source, batch)
        expected.update(k for k, _ in batch)

    feed(600)
    a_dir = tmp_path / "a"
    per_task = counting_app(bootstrap, app_id, source, sink, a_dir)
    per_task.start()
    try:
        _wait_counts(bootstrap, sink, expected)
    finally:
        assert per_task.close(30)
    assert (a_dir / app_id / "0_0" / ".checkpoint").exists()

    consolidated = {"state.store.layout": "consolidated", "state.cleanup.delay.ms": 500}
    a = counting_app(bootstrap, app_id, source, sink, a_dir, **consolidated)
    a.start()
    b = None
    try:
        wait_until(lambda: running_tasks(a) == {"0_0", "0_1"}, 60, message="a never ran")
        upgraded = logged_events(log_lines, "state_layout_upgraded")
        assert sorted(e["task_id"] for e in upgraded) == ["0_0", "0_1"]
        assert a.status()["restored"] == 0  # the old state was copied, not restored
        assert not (a_dir / app_id / "0_0" / "rocksdb").exists()
        assert not (a_dir / app_id / "0_0" / ".checkpoint").exists()
        feed(400)
        _wait_counts(bootstrap, sink, expected)

        # A second instance: one task moves there (a full restore: new state).
        b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b", **consolidated)
        b.start()
        wait_until(
            lambda: len(running_tasks(a)) == 1 and len(running_tasks(b)) == 1,  # type: ignore[union-attr]
            90,
            message="the tasks never spread over the two instances",
        )
        moved = running_tasks(b).pop()
        assert b.status()["restored"] > 0
        # Where it left, its column families and positions are dropped.
        wait_until(
            lambda: any(
                e["task_id"] == moved for e in logged_events(log_lines, "consolidated_task_dropped")
            ),
            30,
            message=f"{moved}'s state was never dropped from a",
        )
        feed(400)
        _wait_counts(bootstrap, sink, expected)
    finally:
        if b is not None:
            assert b.close(30)
        assert a.close(30)


def test_standby_promotion_restores_only_the_tail(bootstrap: str, tmp_path: Path) -> None:
    app_id = unique_name("consol-sb")
    source, sink = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    records = [(f"k{i % KEYS}", "x") for i in range(2000)]
    produce(bootstrap, source, records)
    expected = Counter(k for k, _ in records)
    extra = {
        "state.store.layout": "consolidated",
        "num.standby.replicas": 1,
        "state.rocksdb.metrics.interval.ms": 200,
    }
    a = counting_app(bootstrap, app_id, source, sink, tmp_path / "a", **extra)
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b", **extra)
    changelog = f"{app_id}-{STORE}-changelog"
    a.start()
    b.start()
    try:
        wait_until(
            lambda: len(running_tasks(a)) == 1 and len(running_tasks(b)) == 1,
            90,
            message="the two instances never shared the tasks",
        )
        _wait_counts(bootstrap, sink, expected)

        def standbys_current() -> bool:
            ends = end_offsets(bootstrap, changelog)
            standbys = a.status()["standbys"]
            if set(standbys) != running_tasks(b):
                return False
            return all(
                positions.get(f"{changelog}-{task_id[-1]}") == ends[int(task_id[-1])]
                for task_id, positions in standbys.items()
            )

        wait_until(standbys_current, 60, interval=0.5, message="a's standby never caught up")

        # The RocksDB figures are per column family: one for the store name
        # (every task's copy, active and standby, labelled task "*").
        def counts_family() -> dict[str, object] | None:
            memory = a.status().get("state_memory") or {}
            found = [s for s in memory.get("stores", []) if s["store"] == STORE]
            return found[0] if found and found[0]["estimated_keys"] > 0 else None

        wait_until(counts_family, 30, interval=0.2, message="no figures for the counts family")
        figures = counts_family()
        assert figures is not None and figures["task"] == "*"
        assert {s["store"] for s in a.status()["state_memory"]["stores"]} == {STORE, "offsets"}
        restored_before = a.status()["restored"]
        assert b.close(30)
        wait_until(lambda: running_tasks(a) == {"0_0", "0_1"}, 90, message="a never took b's task")
        # Only b's final commit, after the standby's last update, may need restoring.
        assert a.status()["restored"] - restored_before <= KEYS
        more = [(f"k{i % KEYS}", "x") for i in range(200)]
        produce(bootstrap, source, more)
        expected.update(k for k, _ in more)
        _wait_counts(bootstrap, sink, expected)
    finally:
        b.close(30)
        assert a.close(30)


def test_two_processes_each_keep_their_own_database(bootstrap: str, tmp_path: Path) -> None:
    """`processes` > 1: one consolidated database per processing process."""
    from tests.integration.test_processes import Run, final_counts

    run = Run(
        bootstrap,
        tmp_path,
        "tests.apps.count_app:topology",
        **{"state.store.layout": "consolidated"},
    )
    keys = [f"k{i}" for i in range(KEYS)]
    produce(bootstrap, run.input, ((k, "x") for _ in range(30) for k in keys))
    try:
        run.start()
        run.wait_running(2)
        expected = {k.encode(): 30 for k in keys}
        assert final_counts(bootstrap, run.output, expected) == expected
        app_dir = tmp_path / str(run.sets["application.id"])
        assert (app_dir / "consolidated-p0" / "CURRENT").exists()
        assert (app_dir / "consolidated-p1" / "CURRENT").exists()
        assert not (app_dir / "consolidated").exists()
        assert not list(app_dir.rglob(".checkpoint"))
        run.stop()
    finally:
        if run.daemon is not None:
            run.daemon.kill()
