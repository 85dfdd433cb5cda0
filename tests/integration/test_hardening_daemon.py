"""Issue 21 on a real daemon (`python -m runtime run`, session broker): Kafka's
"infinite" timeouts, and the admin socket under a hostile client.

With `shutdown.timeout.ms=9223372036854775807` a SIGTTOU (which waits up to that
timeout for a thread's batch) and a SIGTERM must both work: before the fix the
join raised OverflowError inside an asyncio task, logged only as "Task exception was
never retrieved", and the daemon stayed PENDING_SHUTDOWN forever. On the same daemon:
a request nested about as deep as the JSON decoder allows gets a reply, connections
beyond `admin.socket.max.connections` are refused (and logged) while the socket keeps
serving, and `threads set` and SIGTTIN stop at `processing.threads.limit`.
"""

from __future__ import annotations

import json
import signal
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.admin.client import AdminCommandFailed, AdminConnection, request
from tests.configs import app_config
from tests.harness import Daemon, TopicReader, clean_env
from tests.kafka_helpers import (
    committed_offsets,
    create_topic,
    end_offsets,
    produce,
    unique_name,
    wait_until,
)

pytestmark = pytest.mark.integration

INFINITE = 9223372036854775807


@pytest.fixture
def short_dir() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="hd") as d:  # AF_UNIX paths are <= 107 bytes
        yield Path(d)


def test_infinite_timeouts_and_a_hostile_admin_client(bootstrap: str, short_dir: Path) -> None:
    source, sink, app_id = unique_name("h-in"), unique_name("h-out"), unique_name("h-inf")
    create_topic(bootstrap, source, 4)
    create_topic(bootstrap, sink, 4)
    n = 2000
    produce(bootstrap, source, ((f"k{i % 64}", str(i)) for i in range(n)))
    ends = end_offsets(bootstrap, source)
    sock = str(short_dir / "admin.sock")
    sets = app_config(
        bootstrap,
        app_id,
        short_dir / "state",
        commit_ms=500,
        **{
            "processing.threads.limit": 4,
            "admin.socket": sock,
            "admin.socket.max.connections": 3,
            "admin.socket.idle.timeout.ms": INFINITE,
            "shutdown.timeout.ms": INFINITE,
        },
    )
    env = clean_env(STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    daemon = Daemon(short_dir / "daemon.log", "tests.apps.passthrough:topology", sets, env)
    daemon.start()
    reader = TopicReader(bootstrap, sink, 4)
    try:
        wait_until(lambda: Path(sock).exists() or not daemon.alive(), 60)
        daemon.assert_alive()

        def running() -> bool:
            daemon.assert_alive()
            return bool(request(sock, "status")["state"] == "RUNNING")

        wait_until(running, 60, interval=0.2, message="daemon not RUNNING")

        def complete() -> bool:
            daemon.assert_alive()
            reader.poll()
            return len(reader.values()) >= n

        wait_until(complete, 90, interval=0.0, message="passthrough output incomplete")
        assert reader.values() == set(range(n))

        # A request nested as deep as the decoder allows: a reply, and the
        # connection stays usable.
        with AdminConnection(sock, timeout=20) as conn:
            for depth in (985, 988, 990, 5000):
                line = b'{"command":"threads.set","count":' + b"[" * depth + b"]" * depth + b"}"
                reply = conn.send_line(line)
                assert reply["ok"] is False and isinstance(reply["error"], str)
            with pytest.raises(AdminCommandFailed, match=r"processing.threads.limit \(4\)"):
                conn.call("threads.set", count=5)
            assert len(conn.call("threads")["names"]) == 2

            # Two more clients fill the cap of 3; further ones are refused.
            held = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2)]
            for client in held:
                client.settimeout(10)
                client.connect(sock)
            for _ in range(20):
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as extra:
                    extra.settimeout(10)
                    extra.connect(sock)
                    busy = json.loads(extra.makefile("rb").readline())
                    assert busy["ok"] is False and "admin.socket.max.connections" in busy["error"]
            assert conn.call("status")["state"] == "RUNNING"  # the held ones still serve
            for client in held:
                client.close()

        # SIGTTOU removes a thread, waiting up to shutdown.timeout.ms ("infinite").
        daemon.send(signal.SIGTTOU)

        def threads_are(count: int) -> bool:
            daemon.assert_alive()
            try:
                return len(request(sock, "threads")["names"]) == count
            except AdminCommandFailed as exc:  # the closes above not yet seen by the loop
                assert "busy" in str(exc)
                return False

        wait_until(lambda: threads_are(1), 30, interval=0.2, message="SIGTTOU removed none")

        # SIGTTIN adds threads up to processing.threads.limit (4), then no more.
        for expected in (2, 3, 4):
            daemon.send(signal.SIGTTIN)
            wait_until(lambda: threads_are(expected), 30, interval=0.1)  # noqa: B023
        daemon.send(signal.SIGTTIN)
        wait_until(lambda: "processing_thread_limit_reached" in daemon.tail(), 30)
        assert threads_are(4)
    finally:
        reader.close()

    sent_at = time.monotonic()
    daemon.send(signal.SIGTERM)
    code = daemon.wait(60)
    took = time.monotonic() - sent_at
    log = daemon.tail(2_000_000)
    daemon.kill()
    assert code == 0, f"exit code {code} after SIGTERM ({took:.1f}s)\n{daemon.tail()}"
    assert "OverflowError" not in log and "never retrieved" not in log, daemon.tail()
    assert "admin_connection_refused" in log
    assert committed_offsets(bootstrap, app_id, source) == ends
    assert not Path(sock).exists()
    print(f"SIGTERM with shutdown.timeout.ms={INFINITE}: exit 0 after {took:.2f}s")
