"""Remote state through crashes of the daemon (issue 18): a kill in the middle of
an upload leaves a partial snapshot that restoration ignores; under
exactly_once_v2, SIGKILLs with the local state wiped before every restart give
exactly-once output and exact counts, restored from snapshots plus tails.

Real Kafka, a real S3-compatible server (S3Proxy), the daemon as operators run it.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from runtime.brokers.s3proxy import S3Proxy
from tests.harness import Daemon, Feeder, TopicReader
from tests.integration.test_eos import Topics, eos_config, exactly_once_checks
from tests.kafka_helpers import unique_name, wait_until
from tests.remote_helpers import SlowRelay, remote_bucket

pytestmark = pytest.mark.integration

REMOTE_APP = "tests.apps.remote_app:topology"


def restored_events(daemon: Daemon) -> list[dict[str, Any]]:
    """The daemon's `task_restored` log events."""
    events = []
    for line in daemon.tail(10_000_000).splitlines():
        if '"task_restored"' in line:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue
    return events


def started_uploads(daemon: Daemon) -> list[dict[str, Any]]:
    return [
        json.loads(line)
        for line in daemon.tail(10_000_000).splitlines()
        if '"remote_snapshot_upload_started"' in line
    ]


def test_kill_during_upload_leaves_a_partial_snapshot_that_is_ignored(
    bootstrap: str,
    tmp_path: Path,
    s3proxy: S3Proxy,
    monkeypatch: pytest.MonkeyPatch,
    aborts_filtered: bool,
) -> None:
    if not aborts_filtered:
        pytest.skip("exact counts after a kill need a broker that aborts a crashed transaction")
    topics = Topics(bootstrap, partitions=1)
    app_id = unique_name("rkill")
    keys = 10_000
    # Fast until the first snapshot is complete, then about 20 kB/s towards the
    # server: an upload takes seconds instead of milliseconds.
    relay = SlowRelay(s3proxy.port, rate=10_000_000)
    feeder = Feeder(bootstrap, topics.input, rate=1000, keys=keys)
    state = tmp_path / "state"
    with remote_bucket(s3proxy, monkeypatch) as bucket:
        sets = eos_config(bootstrap, app_id, state)
        sets.update(bucket.config(interval_ms=2000))
        sets["state.remote.endpoint"] = relay.endpoint
        env = {**topics.env(), **bucket.env()}
        first = Daemon(tmp_path / "first.log", REMOTE_APP, sets, env).start()
        second: Daemon | None = None
        try:
            feeder.start()
            task_prefix = f"snapshots/{app_id}/0_0/"

            def manifests() -> list[str]:
                return bucket.keys(task_prefix + "manifests/")

            # One complete snapshot first: the restart must fall back to it.
            wait_until(
                lambda: first.assert_alive() is None and len(manifests()) >= 1,
                120,
                message="no complete snapshot",
            )

            def orphans() -> set[str]:
                """Files in the bucket that no manifest names: a snapshot being
                uploaded, or one whose upload was cut short. (Listed before the
                manifests are read: a manifest only ever names files already there.)"""
                prefix = task_prefix + "objects/"
                files = {key[len(prefix) :] for key in bucket.keys(prefix)}
                named = {
                    entry[2]
                    for manifest in bucket.manifests(app_id, "0_0")
                    for store in manifest["stores"].values()
                    for entry in store["files"]
                }
                return files - named

            def mid_upload() -> bool:
                """Files unnamed twice, 0.3 s apart: an upload under way (a
                retention pass also leaves unnamed files, for milliseconds)."""
                first.assert_alive()
                seen = orphans()
                if not seen:
                    return False
                time.sleep(0.3)
                return bool(seen & orphans())

            def held_midway() -> bool:
                """An upload under way, frozen there: with the relay held nothing
                more reaches the server, so the kill cannot race the upload's end
                (a CI run once killed the daemon just after the manifest landed)."""
                if not mid_upload():
                    return False
                relay.hold()
                if mid_upload():
                    return True
                relay.release()
                return False

            relay.rate = 20_000
            wait_until(held_midway, 120, interval=0.05, message="never caught an upload midway")
            first.send(signal.SIGKILL)
            assert first.wait(10) is not None
            relay.stop()  # nothing the relay still holds reaches the server
            feeder.stop()
            total = feeder.sent
            # The partial snapshot: files in the bucket that no manifest names.
            complete = manifests()
            assert complete
            assert orphans(), "no file of a partial snapshot is in the bucket"

            shutil.rmtree(state)  # a new machine: only the bucket and Kafka remain
            sets["state.remote.endpoint"] = s3proxy.endpoint
            second = Daemon(tmp_path / "second.log", REMOTE_APP, sets, env).start()
            wait_until(
                lambda: second.assert_alive() is None and len(restored_events(second)) >= 1,
                120,
                message="the second daemon never restored",
            )
            restored = restored_events(second)[0]
            assert restored["source"] == "snapshot+tail", restored
            assert restored["snapshot"] in complete[-1], (restored, complete)
            exactly_once_checks(bootstrap, topics, total, keys)
            second.send(signal.SIGTERM)
            assert second.wait(30) == 0
        finally:
            feeder._halt.set()
            relay.stop()
            for daemon in (first, second):
                if daemon is not None:
                    daemon.kill()
                    print(f"--- {daemon.log_path.name} ---\n{daemon.tail(3000)}")


@pytest.fixture(scope="module")
def aborts_filtered(on_kafka: bool) -> bool:
    return on_kafka


KILLS = 6


def test_exactly_once_through_sigkills_with_local_state_wiped_each_time(
    bootstrap: str,
    tmp_path: Path,
    s3proxy: S3Proxy,
    monkeypatch: pytest.MonkeyPatch,
    aborts_filtered: bool,
) -> None:
    if not aborts_filtered:
        pytest.skip("exactly-once after a kill needs a broker that aborts a crashed transaction")
    topics = Topics(bootstrap)
    app_id = unique_name("rchaos")
    keys = 400
    feeder = Feeder(bootstrap, topics.input, rate=400, keys=keys)
    reader = TopicReader(bootstrap, topics.output, 4)  # read_committed
    rng = random.Random(20261124)
    state = tmp_path / "state"
    daemons: list[Daemon] = []
    with remote_bucket(s3proxy, monkeypatch) as bucket:
        sets = eos_config(bootstrap, app_id, state)
        sets.update(bucket.config(interval_ms=1000))
        sets["consumer.session.timeout.ms"] = 3000
        sets["commit.interval.ms"] = 200
        env = {**topics.env(), **bucket.env()}

        def committed_beyond(first_new: int, daemon: Daemon) -> bool:
            daemon.assert_alive()
            reader.poll()
            return any(int(m.value) >= first_new for m in reader.msgs[-2000:] if m.value)

        try:
            feeder.start()
            for n in range(KILLS + 1):
                first_new = feeder.sent
                daemon = Daemon(tmp_path / f"daemon-{n}.log", REMOTE_APP, sets, env).start()
                daemons.append(daemon)
                wait_until(
                    lambda d=daemon, f=first_new: committed_beyond(f, d),
                    90,
                    message=f"daemon {n} committed no transaction",
                )
                if n == KILLS:
                    break
                # Long enough, sometimes, for a snapshot to be taken and uploaded.
                time.sleep(rng.uniform(0.0, 2.5))
                daemon.assert_alive()
                daemon.send(signal.SIGKILL)
                assert daemon.wait(10) is not None
                shutil.rmtree(state, ignore_errors=True)  # restart from the bucket + Kafka
            final = daemons[-1]
            first_new = feeder.sent
            wait_until(lambda: committed_beyond(first_new, final), 90, message="final idle")
            feeder.stop()
            exactly_once_checks(bootstrap, topics, feeder.sent, keys)
            sources = [e["source"] for d in daemons[1:] for e in restored_events(d)]
            print(f"restore sources after wiped restarts: {sources}")
            assert "snapshot+tail" in sources, sources
            final.send(signal.SIGTERM)
            assert final.wait(30) == 0
        finally:
            feeder._halt.set()
            reader.close()
            for daemon in daemons:
                daemon.kill()
            for daemon in daemons[-2:]:
                print(f"--- {daemon.log_path.name} ---\n{daemon.tail(3000)}")
