"""The admin socket under hostile clients (issue 21, point 5), on the real server over a
real Unix socket with a fake app: a reply to every line (deep nesting included), the
connection cap with a logged refusal, the buffered-bytes budget across clients, the idle
timeout, and `threads set` capped by `processing.threads.limit`.
"""

from __future__ import annotations

import io
import json
import socket
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from runtime.admin.handler import AdminHandler
from runtime.admin.protocol import _show, encode_reply
from runtime.admin.server import AdminLimits
from runtime.config import StreamsConfig
from runtime.logging import configure_logging
from tests.fakes.admin import FakeAdminApp, ServerThread, connect, read_replies
from tests.kafka_helpers import wait_until


@pytest.fixture
def sock_path() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="adm") as d:  # short: AF_UNIX path limit
        yield Path(d) / "admin.sock"


def nested(depth: int, command: str = "threads.set", argument: str = "count") -> bytes:
    return (f'{{"command":"{command}","{argument}":' + "[" * depth + "]" * depth + "}").encode()


def test_show_survives_values_too_deep_to_encode_again() -> None:
    """The issue's failure: json.loads took ~988 levels, the error message's
    json.dumps (a few frames deeper) raised RecursionError, the connection died."""
    value: list[object] = []
    for _ in range(5000):
        value = [value]
    assert _show(value) == "a deeply nested list"
    assert json.loads(encode_reply({"ok": True, "result": value}))["ok"] is False


def test_every_nesting_depth_gets_one_reply(sock_path: Path) -> None:
    with ServerThread(sock_path, FakeAdminApp()), connect(sock_path) as sock:
        lines = [nested(d) for d in range(900, 1100, 3)]
        lines += [nested(d, "pause", "task") for d in (985, 988, 990, 100_000)]
        lines += [nested(d, "status", "x") for d in (988, 5000)]
        sock.sendall(b"\n".join(lines) + b"\n")
        replies = [json.loads(r) for r in read_replies(sock, len(lines))]
        assert all(r["ok"] is False and isinstance(r["error"], str) for r in replies)
        sock.sendall(b'{"command": "status"}\n')
        assert json.loads(read_replies(sock, 1)[0])["ok"] is True


def test_connection_cap_refuses_logs_and_recovers(sock_path: Path) -> None:
    log = io.StringIO()
    configure_logging("info", json=True, stream=log)
    limits = AdminLimits(max_connections=4, idle_timeout_s=60)
    try:
        with ServerThread(sock_path, FakeAdminApp(), limits) as st:
            held = [connect(sock_path) for _ in range(4)]
            for sock in held:  # all four served
                sock.sendall(b'{"command": "threads"}\n')
                assert json.loads(read_replies(sock, 1)[0])["ok"]
            # A flood, in bursts (within the listen backlog): fds stay bounded.
            for _ in range(5):
                burst = [connect(sock_path) for _ in range(40)]
                for sock in burst:
                    reply = json.loads(read_replies(sock, 1)[0])
                    assert not reply["ok"] and "admin.socket.max.connections" in reply["error"]
                    assert sock.recv(10) == b"", "a refused client is closed"
                    sock.close()
            assert st.on_loop(lambda: st.server.connections) == 4
            assert st.on_loop(lambda: st.server.refused_total) == 200
            for sock in held[:2]:
                sock.close()
            wait_until(lambda: st.on_loop(lambda: st.server.connections) == 2, 10)
            with connect(sock_path) as again:  # usable again once others left
                again.sendall(b'{"command": "status"}\n')
                assert json.loads(read_replies(again, 1)[0])["ok"]
            for sock in held[2:]:
                sock.close()
    finally:
        configure_logging()
    events = [json.loads(line) for line in log.getvalue().splitlines()]
    refusals = [e for e in events if e["event"] == "admin_connection_refused"]
    assert refusals and refusals[0]["max_connections"] == 4
    assert len(refusals) < 10, "a flood is logged once per interval, not per client"


def test_buffered_bytes_are_bounded_across_clients(sock_path: Path) -> None:
    limits = AdminLimits(max_connections=16, max_buffered_bytes=100_000, idle_timeout_s=60)
    with ServerThread(sock_path, FakeAdminApp(), limits) as st:
        clients = [connect(sock_path) for _ in range(6)]
        partial = b'{"command": "status", "pad": "' + b"p" * 30_000
        for sock in clients[:3]:  # 3 x 30 KB of unfinished lines: within the budget
            sock.sendall(partial)
        wait_until(lambda: st.on_loop(lambda: st.server.buffered_bytes) >= 90_000, 10)
        for sock in clients[3:]:  # each would take it over 100 KB: dropped with a reply
            sock.sendall(partial)
            reply = json.loads(read_replies(sock, 1)[0])
            assert reply["ok"] is False and "admin.socket.max.buffered.bytes" in reply["error"]
        assert st.on_loop(lambda: st.server.buffered_bytes) <= 100_000
        for sock in clients:  # every line ends: the first three are answered normally
            sock.sendall(b'"}\n')
        for sock in clients[:3]:
            assert json.loads(read_replies(sock, 1)[0]) == {
                "ok": False,
                "error": "unexpected argument \"pad\" for 'status' (arguments: none)",
            }
        wait_until(lambda: st.on_loop(lambda: st.server.buffered_bytes) == 0, 10)
        for sock in clients[3:]:  # the budget is free again; the dropped line left no trace
            sock.sendall(b'{"command": "threads"}\n')
            assert json.loads(read_replies(sock, 1)[0])["ok"] is True
        for sock in clients:
            sock.close()
        wait_until(lambda: st.on_loop(lambda: st.server.connections) == 0, 10)
        assert st.on_loop(lambda: st.server.buffered_bytes) == 0


def test_idle_clients_are_disconnected(sock_path: Path) -> None:
    limits = AdminLimits(max_connections=8, idle_timeout_s=0.5)
    with ServerThread(sock_path, FakeAdminApp(), limits) as st:
        silent = connect(sock_path)
        trickler = connect(sock_path)
        talker = connect(sock_path)
        started = time.monotonic()
        closed: dict[str, float] = {}

        def trickle() -> None:  # bytes, but never a whole line: idle all the same
            try:
                while True:
                    trickler.sendall(b" ")
                    time.sleep(0.05)
            except OSError:
                closed["trickler"] = time.monotonic() - started

        threading.Thread(target=trickle, daemon=True).start()
        while time.monotonic() - started < 1.5:  # a line every 0.2 s keeps one alive
            talker.sendall(b'{"command": "status"}\n')
            assert json.loads(read_replies(talker, 1)[0])["ok"]
            time.sleep(0.2)
        assert silent.recv(10) == b""
        wait_until(lambda: "trickler" in closed, 10)
        assert closed["trickler"] < 3.0
        wait_until(lambda: st.on_loop(lambda: st.server.connections) == 1, 10)
        for sock in (silent, trickler, talker):
            sock.close()


def test_a_client_that_never_reads_its_replies_is_disconnected(sock_path: Path) -> None:
    limits = AdminLimits(max_connections=8, idle_timeout_s=0.5)
    with ServerThread(sock_path, FakeAdminApp(), limits) as st:
        hog = connect(sock_path, timeout=5)
        hog.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        request = b'{"command": "status"}\n' * 1000
        ended: list[BaseException] = []

        def flood() -> None:  # replies pile up unread until the server gives up
            try:
                for _ in range(500):
                    hog.sendall(request)
            except OSError as exc:
                ended.append(exc)

        sender = threading.Thread(target=flood, daemon=True)
        sender.start()
        wait_until(lambda: st.on_loop(lambda: st.server.connections) == 0, 20)
        sender.join(10)
        assert ended and not isinstance(ended[0], TimeoutError), ended  # reset, not stuck
        hog.close()
        with connect(sock_path) as fresh:
            fresh.sendall(b'{"command": "status"}\n')
            assert json.loads(read_replies(fresh, 1)[0])["ok"]


def test_threads_set_and_add_are_capped_by_processing_threads_limit() -> None:
    app = FakeAdminApp()
    handler = AdminHandler(app, max_threads=3)
    reply = handler.handle_line(b'{"command": "threads.set", "count": 4}')
    assert reply["ok"] is False and "processing.threads.limit (3)" in reply["error"]
    assert handler.handle_line(b'{"command": "threads.set", "count": 3}')["ok"]
    reply = handler.handle_line(b'{"command": "threads.add"}')
    assert reply["ok"] is False and "processing.threads.limit (3)" in reply["error"]
    assert len(app.processing_threads) == 3
    reply = handler.handle_line(b'{"command": "threads.set", "count": 1025}')
    assert reply["ok"] is False and "between 0 and 1024" in reply["error"]


def test_limits_come_from_the_config() -> None:
    config = StreamsConfig.from_dict(
        {
            "application.id": "a",
            "bootstrap.servers": "127.0.0.1:9092",
            "admin.socket.max.connections": "5",
            "admin.socket.max.buffered.bytes": "65536",
            "admin.socket.idle.timeout.ms": "9223372036854775807",
        }
    )
    limits = AdminLimits.from_config(config)
    assert limits == AdminLimits(5, 65536, (2**31 - 1) / 1000.0)
    assert limits.idle_timeout_s <= threading.TIMEOUT_MAX
