"""Runtime-owned placement (`task.assignment=runtime`) on a real broker.

Learners: a joining instance first restores a stateful task's store from its
changelog (through its restore consumer, outside the group), and the task moves
only when that copy is caught up; the old owner commits and releases it first.
Measured from the output: a task's output never stops for much longer than
two commit intervals, and the final counts are exact (no record lost or counted
twice). Planned departure: `admin prepare-leave` hands an instance's tasks over,
then the daemon exits 0.

The sink topic uses LogAppendTime, so output timestamps say when each record
was written, and per-partition gaps are processing gaps (keys land on the same
partition number in the source and the sink: both use murmur2).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest

from benchmarks.harness import load_records
from benchmarks.scale import Instance, stop_all
from runtime import App, StreamsBuilder, serdes
from tests.configs import app_config
from tests.harness import REPO, Daemon, Feeder, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
KEYS = 3000
COMMIT_MS = 1000
ALL_TASKS = {f"0_{p}" for p in range(PARTITIONS)}


# More records make the restore-length gap of `group` placement visible (the
# issue's benchmark wants 1,000,000); the CI default keeps the test short.
PREFILL = int(os.environ.get("STREAMS_TEST_LEARNERS_RECORDS", "40000"))


def settings(
    bootstrap: str, app_id: str, state_dir: Path, assignment: str = "runtime"
) -> dict[str, object]:
    return app_config(
        bootstrap,
        app_id,
        state_dir,
        threads=1,
        commit_ms=COMMIT_MS,
        **{
            "task.assignment": assignment,
            # Every update reaches the changelog: a long history to learn.
            "cache.max.bytes": 0,
            "acceptable.recovery.lag": 1000,
            "max.warmup.replicas": 2,
        },
    )


def counting_app(
    bootstrap: str,
    app_id: str,
    source: str,
    sink: str,
    state_dir: Path,
    assignment: str = "runtime",
    extra: dict[str, object] | None = None,
) -> App:
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.STRING)
        .group_by_key()
        .count(store="counts")
        .to_stream()
        .to(sink, value_serde=serdes.INT64)
    )
    return App(
        builder.build(), {**settings(bootstrap, app_id, state_dir, assignment), **(extra or {})}
    )


def running(app: App) -> set[str]:
    return {t["id"] for t in app.status()["tasks"] if t["state"] == "RUNNING"}


def prefill(bootstrap: str, source: str, n: int) -> Counter[str]:
    """Records k0..k{KEYS-1} round robin, as the Feeder sends them."""
    records = [(f"k{i % KEYS}", str(i)) for i in range(n)]
    produce(bootstrap, source, records)
    return Counter(k for k, _ in records)


def fed(feeder: Feeder) -> Counter[str]:
    return feeder.written_keys()


def assert_counts(bootstrap: str, sink: str, expected: Counter[str]) -> None:
    def latest() -> dict[str, int]:
        out: dict[str, int] = {}
        for m in consume_all(bootstrap, sink, idle=0.5, timeout=60):
            assert m.key is not None and m.value is not None
            out[m.key.decode()] = serdes.INT64.deserialize(m.value)
        return out

    last: dict[str, int] = {}

    def done() -> bool:
        nonlocal last
        last = latest()
        return last == dict(expected)

    try:
        wait_until(done, 60, interval=1.0)
    except AssertionError:
        wrong = {k: (last.get(k), v) for k, v in expected.items() if last.get(k) != v}
        raise AssertionError(f"{len(wrong)} counts wrong, e.g. {list(wrong.items())[:5]}") from None


def sink_positions(bootstrap: str, sink: str) -> str:
    """Per sink partition: the last offset a read_committed reader reaches, the
    last a read_uncommitted one reaches, and the end offset. A read_committed
    reader stopping far below the others means a transaction still open on
    that partition (its last stable offset is held back): what a failure of
    the counts should say about where the missing output is."""
    ends = end_offsets(bootstrap, sink)
    lines = []
    last: dict[str, dict[int, int]] = {}
    for isolation in ("read_committed", "read_uncommitted"):
        seen: dict[int, int] = {}
        for m in consume_all(bootstrap, sink, idle=0.5, timeout=30, isolation=isolation):
            seen[m.partition] = max(seen.get(m.partition, -1), m.offset)
        last[isolation] = seen
    for partition in sorted(ends):
        lines.append(
            f"partition {partition}: read_committed to {last['read_committed'].get(partition)}, "
            f"read_uncommitted to {last['read_uncommitted'].get(partition)}, end {ends[partition]}"
        )
    return "; ".join(lines)


def longest_gaps(
    bootstrap: str, sink: str, since_ms: int, until_ms: int, partitions: int = PARTITIONS
) -> dict[int, float]:
    """Per sink partition, the longest time (s) without output in [since, until]."""
    stamps: dict[int, list[int]] = {p: [since_ms, until_ms] for p in range(partitions)}
    for m in consume_all(bootstrap, sink, idle=0.5, timeout=60):
        if since_ms <= m.timestamp <= until_ms:
            stamps[m.partition].append(m.timestamp)
    gaps = {}
    for p, ts in stamps.items():
        ts.sort()
        gap, start = max((b - a, a) for a, b in zip(ts, ts[1:], strict=False))
        gaps[p] = gap / 1000
        print(f"partition {p}: longest gap {gap} ms from +{(start - since_ms) / 1000:.2f} s")
    return gaps


def wait_committed_past(
    bootstrap: str, group: str, topic: str, ends: dict[int, int], timeout: float = 30
) -> None:
    """Until the group's committed offset of every partition reaches `ends`."""
    committed: dict[int, int] = {}

    def reached() -> bool:
        nonlocal committed
        committed = committed_offsets(bootstrap, group, topic)
        return all(committed.get(p, -1) >= end for p, end in ends.items())

    try:
        wait_until(reached, timeout, interval=0.5)
    except AssertionError:
        behind = {
            p: (committed.get(p), end) for p, end in ends.items() if committed.get(p, -1) < end
        }
        raise AssertionError(f"partitions not committed past the feed: {behind}") from None


def make_topics(bootstrap: str, partitions: int = PARTITIONS) -> tuple[str, str]:
    source, sink = unique_name("learn-in"), unique_name("learn-out")
    create_topic(bootstrap, source, partitions)
    create_topic(bootstrap, sink, partitions, {"message.timestamp.type": "LogAppendTime"})
    return source, sink


@pytest.mark.parametrize("assignment", ["runtime", "group"])
def test_scale_out_moves_stateful_tasks_only_to_caught_up_learners(
    bootstrap: str, tmp_path: Path, assignment: str
) -> None:
    """`group` is today's placement, for comparison: same exact counts, but a
    moved task waits for its restore (the gap is printed, not bounded)."""
    app_id = unique_name("learners")
    source, sink = make_topics(bootstrap)
    expected = prefill(bootstrap, source, PREFILL)
    a = counting_app(bootstrap, app_id, source, sink, tmp_path / "a", assignment)
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b", assignment)
    feeder = Feeder(bootstrap, source, rate=400, keys=KEYS)
    try:
        a.start()
        wait_until(lambda: running(a) == ALL_TASKS, 60, message="a never ran all tasks")
        feeder.start()
        # Steady state under load (the prefill processed) before the second instance.
        wait_until(lambda: a.status()["total_lag"] < 2000, 120, interval=0.5, message="a lags")
        time.sleep(2)
        since_ms = int(time.time() * 1000)
        b.start()

        def split() -> bool:
            ra, rb = running(a), running(b)
            return len(ra) == 2 and len(rb) == 2 and ra | rb == ALL_TASKS

        wait_until(split, 75, interval=0.2, message="the tasks never split 2/2")
        split_s = time.time() - since_ms / 1000
        placement = b.status()["placement"]
        restored = b.status()["restored"]
        if assignment == "runtime":
            assert placement is not None and placement["handovers"] == 2, placement
            # The moved tasks were learned first: only a tail was restored.
            assert restored < PREFILL / 8, f"b restored {restored} records as an active task"
        time.sleep(3)  # processing goes on after the hand-over
        until_ms = int(time.time() * 1000)
        feeder.stop()
        expected += fed(feeder)
        assert_counts(bootstrap, sink, expected)
        gaps = longest_gaps(bootstrap, sink, since_ms, until_ms)
        print(
            f"task.assignment={assignment}, {PREFILL} records before the join: longest output "
            f"gap per partition (s) {gaps}; split after {split_s:.1f} s; b restored {restored} "
            f"records as an active task; placement {placement}"
        )
        # The gap itself (about two commit intervals under runtime placement,
        # 1.1-2.8 s here) is a speed figure: printed, not asserted (issue 32);
        # what must hold is asserted above (counts, a tail-only restore).
    finally:
        if feeder.is_alive():
            feeder.stop()
        b.close(30)
        a.close(30)


# The scale-out: three instances (daemons: each its own GIL, so a
# gap measures the runtime, not two apps sharing one interpreter) over a
# store loaded straight into the changelog, as `benchmarks/scale.py` does
# with 1,000,000 records. 600,000 keeps both modes within about two minutes
# on a loaded 2-core machine (instance 1 restores the whole store first, in
# each mode), and still gives each newcomer 200,000 records to restore under
# `group`: a gap of seconds, not of one commit.
SCALE_PARTITIONS = 6
SCALE_RECORDS = int(os.environ.get("STREAMS_TEST_SCALE_RECORDS", "600000"))
SCALE_RATE = 600  # input records/s, 100 per task


def running_now(instance: Instance) -> set[str]:
    """The tasks a daemon runs, from a fresh status (none while it does not answer)."""
    instance.status()
    return instance.running()


@pytest.mark.parametrize("assignment", ["runtime", "group"])
def test_three_instances_join_a_large_store_under_load(
    bootstrap: str, tmp_path: Path, short_dir: Path, assignment: str
) -> None:
    """One daemon counts over a store of SCALE_RECORDS changelog records under
    a steady input rate; a second daemon joins, and a third while the second
    is still learning (`runtime`) or restoring (`group`).

    `runtime`: moved tasks are learned first, so every task keeps being
    processed: no task's output stops for longer than about two commit
    intervals (bounded at four), and the newcomers restore only tails while
    a task waits. `group` (the old assignment): a moved task waits for its
    new owner to restore its share of the store, so its longest output gap
    is at least that restore's length; printed beside `runtime`'s, not
    bounded. Counts exact in both: a fed key's count is its store count (1)
    plus the records fed.
    """
    app_id = unique_name(f"scale3-{assignment}")
    source, sink = make_topics(bootstrap, SCALE_PARTITIONS)
    changelog = f"{app_id}-counts-changelog"
    create_topic(bootstrap, changelog, SCALE_PARTITIONS, {"cleanup.policy": "compact"})
    one = serdes.INT64.serialize(1)
    load_s = load_records(bootstrap, changelog, SCALE_RECORDS, lambda i: (f"k{i}".encode(), one))
    sets = settings(bootstrap, app_id, tmp_path, assignment)  # Instance: a state.dir each
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    instances = [Instance(f"i{n}", tmp_path, short_dir, sets, env) for n in (1, 2, 3)]
    i1, i2, i3 = instances
    everything = {f"0_{p}" for p in range(SCALE_PARTITIONS)}
    feeder = Feeder(bootstrap, source, rate=SCALE_RATE, keys=SCALE_RECORDS)
    try:
        started = time.monotonic()
        i1.start()

        def i1_runs_all() -> bool:
            i1.daemon.assert_alive()
            return running_now(i1) == everything

        wait_until(i1_runs_all, 240, interval=0.25, message="i1 never ran every task")
        first_restore_s = time.monotonic() - started
        feeder.start()

        def caught_up() -> bool:
            i1.daemon.assert_alive()
            status = i1.status()
            return status is not None and status["total_lag"] < SCALE_RATE

        wait_until(caught_up, 120, interval=0.25, message="i1 never caught up with the feed")
        since_ms = int(time.time() * 1000)
        i2.start()

        def i2_joined() -> bool:
            i2.daemon.assert_alive()
            status = i2.status()
            return status is not None and bool(status["tasks"] or status["standbys"])

        wait_until(i2_joined, 90, interval=0.1, message=f"i2 never joined:\n{i2.daemon.tail()}")
        i3.start()

        def balanced() -> bool:
            for instance in instances:
                instance.daemon.assert_alive()
            held = [running_now(instance) for instance in instances]
            return all(len(h) == 2 for h in held) and set().union(*held) == everything

        wait_until(balanced, 180, interval=0.25, message="the tasks never split 2/2/2")
        balance_s = time.time() - since_ms / 1000
        time.sleep(3)  # processing goes on after the last hand-over
        until_ms = int(time.time() * 1000)
        statuses = {instance.name: instance.status() or {} for instance in instances}
        feeder.stop()
        assert_counts(bootstrap, sink, Counter({k: n + 1 for k, n in fed(feeder).items()}))
    finally:
        if feeder.is_alive():
            feeder.stop()
        stop_all(instances)
    gaps = longest_gaps(bootstrap, sink, since_ms, until_ms, SCALE_PARTITIONS)
    newcomers = [statuses["i2"], statuses["i3"]]
    restored = sum(int(s.get("restored", 0)) for s in newcomers)
    # Per task, the longest restore as an active task on a newcomer.
    restore_s: dict[str, float] = {}
    for status in newcomers:
        for task, restore in (status.get("restores") or {}).items():
            restore_s[task] = max(restore_s.get(task, 0.0), float(restore["seconds"]))
    handovers = sum(int((s.get("placement") or {}).get("handovers", 0)) for s in newcomers)
    print(
        f"task.assignment={assignment}, {SCALE_RECORDS:,} records ({load_s:.1f} s to load, "
        f"{first_restore_s:.1f} s until i1 ran them): longest output gap per task (s) {gaps}; "
        f"balanced {balance_s:.1f} s after i2 started; newcomers restored {restored:,} records "
        f"while their tasks waited, per task (s) {restore_s}; hand-overs {handovers}; "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    if assignment == "runtime":
        assert handovers >= 4, statuses["i2"].get("placement")
        # Learned first: no moved task restores its whole share while it waits
        # (under `group` placement the newcomers restore over half the store,
        # below). A learner is at most acceptable.recovery.lag behind when the
        # plan moves its task, plus what arrives until the hand-over: how much
        # depends on the machine's speed, so the bound is the invariant, not a
        # figure (issue 32: 12,000 was exceeded on a loaded machine).
        assert restored < SCALE_RECORDS / 6, restored
        # The output gaps (about two commit intervals, 1.9-2.5 s here) are
        # printed above: a speed figure, not asserted.
    else:
        # Four tasks at least moved to the newcomers with their whole share of
        # the store (4/6 of it), and each waited for its restore.
        assert restored > SCALE_RECORDS / 2, restored
        assert len(restore_s) >= 4, restore_s
        for task, seconds in restore_s.items():
            gap = gaps[int(task.split("_", 1)[1])]
            assert gap >= seconds - 0.05, f"{task}: gap {gap} s, restored in {seconds} s"


def admin(socket: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "runtime", "admin", "--socket", socket, *args],
        cwd=REPO,
        env=clean_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for admin sockets (AF_UNIX paths are <= 107 bytes),
    removed with what else was put there."""
    path = Path(tempfile.mkdtemp(prefix="lrn"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("processes", [1, 2])
def test_prepare_leave_hands_every_task_over_then_exits_0(
    bootstrap: str, tmp_path: Path, short_dir: Path, processes: int
) -> None:
    """With `processes` = 2 every processing process leaves (none takes a
    task of the other) and none is restarted: the daemon exits 0."""
    app_id = unique_name("leave")
    source, sink = make_topics(bootstrap)
    expected = prefill(bootstrap, source, 20_000)
    sock = str(short_dir / "admin.sock")
    sets = {
        **settings(bootstrap, app_id, tmp_path / "daemon"),
        "admin.socket": sock,
        "processes": processes,
    }
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    daemon = Daemon(tmp_path / "daemon.log", "tests.apps.count_app:topology", sets, env)
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b")
    feeder = Feeder(bootstrap, source, rate=400, keys=KEYS)
    try:
        daemon.start()
        wait_until(lambda: os.path.exists(sock), 60, message=f"no socket:\n{daemon.tail()}")
        feeder.start()
        b.start()

        def shared() -> bool:
            daemon.assert_alive()
            # Two members share 4 tasks 2:2; three (2 processes and b) 1:1:2.
            return len(running(b)) == 2 if processes == 1 else bool(running(b))

        # Three members (two processes and b) take longer to settle on a loaded machine.
        wait_until(
            shared,
            75 if processes == 1 else 150,
            interval=0.2,
            message=f"b never took its share of the tasks (b runs {sorted(running(b))}); "
            f"daemon log tail:\n{daemon.tail()}",
        )
        tasks = admin(sock, "tasks")
        assert tasks.returncode == 0, tasks
        if processes == 1:
            assert "placement plan" in tasks.stdout, tasks
        since_ms = int(time.time() * 1000)
        leave = admin(sock, "prepare-leave")
        assert leave.returncode == 0, leave.stderr
        code = daemon.wait(75)
        assert code == 0, f"exit code {code}; log tail:\n{daemon.tail()}"
        wait_until(lambda: running(b) == ALL_TASKS, 30, message="b never ran all tasks")
        time.sleep(2)
        until_ms = int(time.time() * 1000)
        feeder.stop()
        expected += fed(feeder)
        assert_counts(bootstrap, sink, expected)
        gaps = longest_gaps(bootstrap, sink, since_ms, until_ms)
        # A speed figure (about two commit intervals here): printed, not asserted.
        print(f"longest output gap per partition during the leave (s): {gaps}")
    finally:
        if feeder.is_alive():
            feeder.stop()
        daemon.kill()
        b.close(30)


@pytest.mark.parametrize("fault", ["kill", "stop"])
def test_placer_killed_or_stalled_under_exactly_once_counts_stay_exact(
    bootstrap: str, tmp_path: Path, fault: str
) -> None:
    """The placing instance (a daemon) dies (`kill`: SIGKILL) or stalls past its
    session timeout (`stop`: SIGSTOP, then SIGCONT once its tasks moved: a
    zombie). Once the group's new generation no longer holds it (rule (b) of
    the hand-over), the survivor becomes the placer and takes its tasks. The
    dead one's open transaction is aborted; the zombie's late commit is fenced
    by the broker (old generation), it drops its tasks and comes back under a
    new identity. read_committed counts stay exact either way."""
    app_id = unique_name(f"placer-{fault}")
    source, sink = make_topics(bootstrap)
    expected = prefill(bootstrap, source, 10_000)
    eos = {"processing.guarantee": "exactly_once_v2"}
    sets = {**settings(bootstrap, app_id, tmp_path / "daemon"), **eos}
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    daemon = Daemon(tmp_path / "daemon.log", "tests.apps.count_app:topology", sets, env)
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b", extra=eos)
    feeder = Feeder(bootstrap, source, rate=300, keys=KEYS)
    try:
        daemon.start()

        def placer_runs_all() -> bool:
            daemon.assert_alive()
            return "tasks_taken" in daemon.tail(200_000)

        wait_until(placer_runs_all, 60, interval=0.2, message="the daemon never took its tasks")
        feeder.start()
        b.start()

        def shared() -> bool:
            daemon.assert_alive()
            return len(running(b)) == 2

        wait_until(shared, 75, interval=0.2, message=f"b never took half:\n{daemon.tail()}")
        if fault == "kill":
            daemon.kill()
        else:
            daemon.send(signal.SIGSTOP)
        wait_until(lambda: running(b) == ALL_TASKS, 75, message="b never took the lost tasks")
        assert b.status()["placement"]["placer"]
        if fault == "stop":
            daemon.send(signal.SIGCONT)

            def zombie_dropped_its_tasks() -> bool:
                daemon.assert_alive()
                return "instance_id_renewed" in daemon.tail(400_000)

            wait_until(zombie_dropped_its_tasks, 30, message=daemon.tail())
            # Back under a new identity, it gets tasks again (learned first):
            # half the tasks are the new identity's in b's plan, b runs the
            # others, and the daemon took its share (two RUNNING tasks on b
            # alone would also be b rewinding after an aborted transaction).

            def handed_back() -> bool:
                daemon.assert_alive()
                owners = b.status()["placement"]["owners"]
                renewed = {t for t, o in owners.items() if "~" in o}
                log = daemon.tail(400_000)
                taken_again = log.rfind('"tasks_taken"') > log.find("instance_id_renewed")
                return len(renewed) == 2 and running(b) == ALL_TASKS - renewed and taken_again

            wait_until(handed_back, 75, interval=0.2, message=daemon.tail())
        # Every partition processed and committed past what was fed until now,
        # under the final placement (the output after a hand-over counts).
        wait_committed_past(bootstrap, app_id, source, end_offsets(bootstrap, source))
        feeder.stop()
        expected += fed(feeder)
        try:
            assert_counts(bootstrap, sink, expected)
        except AssertionError as exc:
            # Seen once in a CI run (the last records of b's partitions missing for
            # 60 s): say whether a transaction held the sink back, and what the
            # daemon (the zombie) last did with its transactions and tasks.
            events = [
                line
                for line in daemon.tail(400_000).splitlines()
                if "transaction" in line or "tasks_" in line or "rewound" in line
            ]
            raise AssertionError(
                f"{exc}\nsink: {sink_positions(bootstrap, sink)}\n"
                f"b: {b.status()['transactions_committed']} transactions committed, "
                f"{b.status()['transactions_aborted']} aborted\n"
                "daemon:\n" + "\n".join(events[-40:])
            ) from None
    finally:
        if feeder.is_alive():
            feeder.stop()
        if daemon.alive():
            daemon.send(signal.SIGCONT)
        daemon.kill()
        b.close(30)


def test_an_instance_joining_while_another_restores_neither_crashes_nor_loops(
    bootstrap: str, tmp_path: Path
) -> None:
    """The crash loop quixstreams users report: a second instance joins while
    the first still restores its stores. The restore goes on, the newcomer
    learns, the tasks split, nothing restarts, the counts are exact."""
    app_id = unique_name("join-restoring")
    source, sink = make_topics(bootstrap)
    expected = prefill(bootstrap, source, 40_000)
    first = counting_app(bootstrap, app_id, source, sink, tmp_path / "first")
    first.start()
    try:
        assert_counts(bootstrap, sink, expected)
    finally:
        first.close(30)
    # A fresh state directory: the whole changelog is restored first.
    a = counting_app(bootstrap, app_id, source, sink, tmp_path / "a")
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b")
    try:
        a.start()

        def restoring() -> bool:
            return any(t["state"] == "RESTORING" for t in a.status()["tasks"])

        wait_until(restoring, 60, interval=0.02, message="a never restored")
        b.start()

        def split() -> bool:
            for app in (a, b):
                assert app.state.name in ("RUNNING", "REBALANCING"), app.state
            ra, rb = running(a), running(b)
            return len(ra) == 2 and len(rb) == 2 and ra | rb == ALL_TASKS

        wait_until(split, 75, interval=0.2, message="the tasks never split 2/2")
        assert a.status()["failed_threads"] == 0 and b.status()["failed_threads"] == 0
        more = [(f"k{i % KEYS}", "x") for i in range(4000)]
        produce(bootstrap, source, more)
        expected.update(k for k, _ in more)
        assert_counts(bootstrap, sink, expected)
    finally:
        b.close(30)
        a.close(30)


def test_scale_down_asks_a_fraction_of_the_instances_to_leave(
    bootstrap: str, tmp_path: Path
) -> None:
    """`streams-runtime scale-down --fraction 0.5` with two instances: the
    placer names one, it hands its tasks over and stops cleanly; the other
    runs everything."""
    app_id = unique_name("scale-down")
    source, sink = make_topics(bootstrap)
    expected = prefill(bootstrap, source, 10_000)
    a = counting_app(bootstrap, app_id, source, sink, tmp_path / "a")
    b = counting_app(bootstrap, app_id, source, sink, tmp_path / "b")
    try:
        a.start()
        b.start()
        wait_until(lambda: len(running(a)) == 2 and len(running(b)) == 2, 75, interval=0.2)
        request = subprocess.run(
            [sys.executable, "-m", "runtime", "scale-down", "--fraction", "0.5",
             "--set", f"application.id={app_id}", "--set", f"bootstrap.servers={bootstrap}",
             "--set", "task.assignment=runtime"],
            cwd=REPO, env=clean_env(), capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert request.returncode == 0, request.stderr
        wait_until(lambda: a.wait(0) or b.wait(0), 75, message="no instance left")
        gone, stayed = (a, b) if a.wait(0) else (b, a)
        assert gone.state.name == "NOT_RUNNING" and gone.failure is None
        wait_until(lambda: running(stayed) == ALL_TASKS, 30, message="tasks not all taken")
        assert not stayed.wait(0)
        more = [(f"k{i % KEYS}", "x") for i in range(2000)]
        produce(bootstrap, source, more)
        expected.update(k for k, _ in more)
        assert_counts(bootstrap, sink, expected)
    finally:
        a.close(30)
        b.close(30)


def test_new_owner_killed_right_after_taking_over_under_exactly_once(
    bootstrap: str, tmp_path: Path
) -> None:
    """A crash during a hand-over: the joining instance (a daemon) is killed
    the moment it takes its first tasks over (restoring their tail, maybe
    processing a first batch). The placer gives them back once the group's
    generation no longer holds the dead member; read_committed counts exact."""
    app_id = unique_name("taker-crash")
    source, sink = make_topics(bootstrap)
    expected = prefill(bootstrap, source, 10_000)
    eos = {"processing.guarantee": "exactly_once_v2"}
    a = counting_app(bootstrap, app_id, source, sink, tmp_path / "a", extra=eos)
    sets = {**settings(bootstrap, app_id, tmp_path / "daemon"), **eos}
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    daemon = Daemon(tmp_path / "daemon.log", "tests.apps.count_app:topology", sets, env)
    feeder = Feeder(bootstrap, source, rate=300, keys=KEYS)
    try:
        a.start()
        wait_until(lambda: running(a) == ALL_TASKS, 60, message="a never ran all tasks")
        feeder.start()
        daemon.start()

        def taking_over() -> bool:
            daemon.assert_alive()
            return '"tasks_taken"' in daemon.tail(400_000)

        wait_until(taking_over, 75, interval=0.01, message="the daemon never took tasks")
        daemon.kill()
        wait_until(lambda: running(a) == ALL_TASKS, 75, message="a never took the tasks back")
        time.sleep(2)
        feeder.stop()
        expected += fed(feeder)
        assert_counts(bootstrap, sink, expected)
    finally:
        if feeder.is_alive():
            feeder.stop()
        daemon.kill()
        a.close(30)
