"""Rebalances while a large store restores (issue 31, item 10): the failure
quixstreams users report most (every rebalance restarts every restore, or a
partition never comes back).

Instance A starts on an empty state directory, so it restores the whole
changelog of a count (300,000 records, written straight into the changelog,
and slowed down by small restore fetches, so restoration is still going on
when the chaos starts). While it restores and input keeps
arriving, other instances join, leave and (under exactly_once_v2) die by
SIGKILL, one event every few seconds. Then A alone remains. What must hold:

- no partition is stuck: the group commits past everything fed, and A's stall
  watchdog never had to step in;
- the counts are exact (read_committed under exactly_once_v2; at_least_once
  sees only graceful joins and leaves, so exact there too);
- restore work is not repeated from the start on an instance that kept its
  state: after A's first restore of a task, any later restore of it on A
  starts from a checkpoint, not from offset 0.

Each case runs both `task.assignment` modes and both guarantees; instances
are daemons (`python -m runtime run`), each with its own log to check.
"""

from __future__ import annotations

import json
import signal
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Producer

from runtime import serdes
from tests.configs import app_config
from tests.harness import Daemon, Feeder, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    consume_all,
    create_topic,
    end_offsets,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

PARTITIONS = 4
KEYS = 2000
UPDATES = 150  # changelog records per key: 300,000 to restore
APP = "tests.apps.count_app:topology"


def _sets(bootstrap: str, app_id: str, state_dir: Path, assignment: str, guarantee: str) -> dict:
    return app_config(
        bootstrap,
        app_id,
        state_dir,
        threads=1,
        commit_ms=500,
        guarantee=guarantee,
        **{
            "task.assignment": assignment,
            "cache.max.bytes": 0,  # every update reaches the changelog: a long one to restore
            "acceptable.recovery.lag": 2000,
            # Small restore fetches stretch A's restore over the chaos.
            "restore.consumer.max.partition.fetch.bytes": 4096,
        },
    )


def _write_small_batches(bootstrap: str, topic: str, records: list[tuple[str, bytes]]) -> None:
    """Produce in batches of 50 records: a fetch returns whole batches, so
    only small ones let the restore consumer's small fetches slow it down."""
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",  # as the runtime's sink: same partition per key
            "batch.num.messages": 50,
            "linger.ms": 2,
        }
    )
    failed: list[str] = []
    for key, value in records:
        while True:
            try:
                producer.produce(
                    topic,
                    value,
                    key.encode(),
                    on_delivery=lambda err, _m: failed.append(str(err)) if err else None,
                )
                break
            except BufferError:
                producer.poll(0.05)
    assert producer.flush(120) == 0 and not failed, failed[:3]


def _pace(seconds: float, alive: Callable[[], None]) -> None:
    """Chaos comes at a rhythm: the point is time passing between events
    (rebalances overlapping), not a condition; A must stay up meanwhile."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        alive()
        time.sleep(0.1)


def _events(log: Path) -> list[dict]:
    out = []
    for line in log.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except ValueError:
                continue
    return out


def _history(bootstrap: str, source: str, sink: str, keys: list[str]) -> str:
    """For a wrong count: each key's input records (partition, offset) and its
    committed counts in output order (partition, offset, count), so that a
    reader can tell an input counted twice (one count too many between two
    inputs) from a store that went back (a count repeated or lower)."""
    wanted = {k.encode() for k in keys}
    inputs = [m for m in consume_all(bootstrap, source, idle=0.5, timeout=60) if m.key in wanted]
    counts = [m for m in consume_all(bootstrap, sink, idle=0.5, timeout=60) if m.key in wanted]
    parts = []
    for key in sorted(wanted):
        fed = [(m.partition, m.offset) for m in inputs if m.key == key]
        seen = [
            (m.partition, m.offset, serdes.INT64.deserialize(m.value))
            for m in counts
            if m.key == key and m.value is not None
        ]
        parts.append(f"{key.decode()}: input at {fed}; counts {seen[-12:]}")
    return "; ".join(parts)


def _latest_counts(bootstrap: str, sink: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for m in consume_all(bootstrap, sink, idle=0.5, timeout=60):
        assert m.key is not None and m.value is not None
        out[m.key.decode()] = serdes.INT64.deserialize(m.value)
    return out


@pytest.mark.parametrize(
    "assignment,guarantee",
    [
        ("group", "exactly_once_v2"),
        ("runtime", "exactly_once_v2"),
        ("group", "at_least_once"),
        ("runtime", "at_least_once"),
    ],
)
def test_rebalances_while_a_large_store_restores(
    bootstrap: str, tmp_path: Path, assignment: str, guarantee: str
) -> None:
    app_id = unique_name(f"chaos-{assignment}-{guarantee[:3]}")
    source, sink = unique_name("chaos-in"), unique_name("chaos-out")
    create_topic(bootstrap, source, PARTITIONS)
    create_topic(bootstrap, sink, PARTITIONS)
    # 1. The store's history, written straight into its changelog (a count
    # of UPDATES per key, one update a record): cheaper than counting it.
    changelog = f"{app_id}-counts-changelog"
    create_topic(bootstrap, changelog, PARTITIONS, {"cleanup.policy": "compact"})
    _write_small_batches(
        bootstrap,
        changelog,
        [(f"k{i % KEYS}", serdes.INT64.serialize(i // KEYS + 1)) for i in range(KEYS * UPDATES)],
    )
    expected = Counter({f"k{k}": UPDATES for k in range(KEYS)})
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    eos = guarantee == "exactly_once_v2"

    def daemon(name: str) -> Daemon:
        sets = _sets(bootstrap, app_id, tmp_path / name, assignment, guarantee)
        return Daemon(tmp_path / f"{name}.log", APP, sets, env)

    def committed_past(ends: dict[int, int], alive: Callable[[], None]) -> Callable[[], bool]:
        def check() -> bool:
            alive()
            committed = committed_offsets(bootstrap, app_id, source)
            return all(committed.get(p, -1) >= end for p, end in ends.items())

        return check

    # 2. A restores it all into an empty directory while others come and go.
    a = daemon("a").start()
    others: list[Daemon] = []
    feeder = Feeder(bootstrap, source, rate=200, keys=KEYS)
    try:
        wait_until(
            lambda: a.assert_alive() or '"task_restoring"' in a.tail(400_000),
            60,
            message="A never started restoring",
        )
        feeder.start()
        steps: list[tuple[str, str]] = [
            ("join", "b"),
            ("join", "c"),
            ("kill" if eos else "leave", "c"),
            ("join", "d"),
            ("leave", "b"),
            ("kill" if eos else "leave", "d"),
        ]
        by_name: dict[str, Daemon] = {}
        for step, (action, name) in enumerate(steps):
            # The first events come while A still restores.
            _pace(1.5 if step < 2 else 3.0, a.assert_alive)
            if action == "join":
                by_name[name] = daemon(name).start()
                others.append(by_name[name])
            elif action == "kill":
                by_name[name].kill()
            else:
                # A leave is a graceful close, of an app that started.
                by_name[name].wait_ready()
                by_name[name].send(signal.SIGTERM)
                assert by_name[name].wait(90) == 0, by_name[name].tail()
        feeder.stop()
        expected.update(feeder.written_keys())  # what the input holds (see there)

        # 3. A alone processes and commits everything: nothing stuck.
        wait_until(
            committed_past(end_offsets(bootstrap, source), a.assert_alive),
            180,
            interval=1.0,
            message=f"partitions not committed past the input; A's log:\n{a.tail()}",
        )
        last: dict[str, int] = {}

        def exact() -> bool:
            nonlocal last
            last = _latest_counts(bootstrap, sink)
            return last == dict(expected)

        try:
            wait_until(exact, 60, interval=1.0)
        except AssertionError:
            wrong = {k: (last.get(k), v) for k, v in expected.items() if last.get(k) != v}
            raise AssertionError(
                f"{len(wrong)} counts wrong, e.g. {list(wrong.items())[:5]}; "
                + _history(bootstrap, source, sink, sorted(wrong)[:2])
            ) from None
    finally:
        if feeder.is_alive():
            feeder.stop()
        for other in others:
            other.kill()
        a.send(signal.SIGTERM)
        if a.wait(60) is None:
            a.kill()

    events = _events(tmp_path / "a.log")
    assert not [e for e in events if e.get("event") == "partitions_stalled"]
    # Restores of A: the first of each task from the start, any later one
    # from a checkpoint (A's directory kept its state all along).
    starts: dict[str, list[int]] = defaultdict(list)
    for e in events:
        if e.get("event") == "task_restoring":
            offsets = [int(c.rsplit("@", 1)[1]) for c in e["changelogs"]]
            starts[e["task_id"]].append(min(offsets))
    restored_at = [e.get("timestamp") for e in events if e.get("event") == "task_restored"]
    print(f"A's restores (task -> start offsets): {dict(starts)}; finished at {restored_at}")
    assert starts, "A restored nothing"
    repeated = {t: s for t, s in starts.items() if any(o <= 0 for o in s[1:])}
    assert not repeated, f"restores repeated from the start on A: {repeated}"
