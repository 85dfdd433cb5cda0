"""The metrics endpoint's limits against hostile clients (issue 31, item 6), no Kafka.

A real `MetricsServer` on its own loop thread (`start_metrics_server`) in front
of a fake app: idle connections beyond the cap are cut off (the oldest first)
while scrapes keep answering, a slowloris request head is timed out however
it trickles, a new connection is refused with 503 only while every slot is
answering, and a client that does not read its response is cut off too. The
daemon under 1,100 connections is tests/integration/test_metrics_hostile.py.
"""

from __future__ import annotations

import dataclasses
import socket
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from runtime.metrics import (
    BackgroundMetricsServer,
    MetricsLimits,
    MetricsServer,
    start_metrics_server,
)
from runtime.status import AppStatus
from tests.kafka_helpers import wait_until

STATUS = AppStatus.from_dict({"application_id": "app", "state": "RUNNING"})


class FakeApp:
    def __init__(self) -> None:
        self.state = "RUNNING"
        self.gate = threading.Event()
        self.gate.set()

    def status(self) -> AppStatus:
        self.gate.wait(30)  # a test holds scrapes here to fill the slots
        return dataclasses.replace(STATUS, state=self.state)


def get(url: str) -> int:
    with urllib.request.urlopen(url, timeout=5) as resp:
        resp.read()
        return int(resp.status)


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed `sock` (EOF or reset), without blocking.

    A peek, not select(): this process holds descriptors above select()'s 1024.
    """
    sock.settimeout(0)  # a socket with a timeout would wait that long for the peek
    try:
        return sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
    except BlockingIOError:
        return False
    except ConnectionResetError:
        return True


def on_loop(server: BackgroundMetricsServer, fn: Any) -> Any:
    """`fn()` on the server's loop thread (its state belongs to that thread)."""
    import asyncio

    async def run() -> Any:
        return fn()

    loop = server._loop
    assert loop is not None
    return asyncio.run_coroutine_threadsafe(run(), loop).result(5)


@pytest.fixture
def sockets() -> Iterator[list[socket.socket]]:
    opened: list[socket.socket] = []
    try:
        yield opened
    finally:
        for sock in opened:
            sock.close()


def connect(port: int, opened: list[socket.socket]) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=5)
    opened.append(sock)
    return sock


def test_idle_connections_beyond_the_cap_are_cut_off_and_scrapes_still_answer(
    sockets: list[socket.socket],
) -> None:
    server = start_metrics_server(
        FakeApp(), limits=MetricsLimits(max_connections=8, idle_timeout_s=30.0)
    )
    try:
        idle = [connect(server.port, sockets) for _ in range(200)]
        # Held at the cap: the newest 8 stay, every older one was cut off.
        wait_until(lambda: all(closed_by_server(s) for s in idle[:-8]), 10, interval=0.05)
        assert on_loop(server, lambda: server.server.connections) <= 8
        for path in ("/metrics", "/healthz", "/readyz"):
            for _ in range(3):
                assert get(server.url + path) == 200
        assert on_loop(server, lambda: server.server.evicted_total) >= 192
        assert on_loop(server, lambda: server.server.refused_total) == 0
    finally:
        server.close()


def test_a_slowloris_request_head_is_timed_out_however_it_trickles(
    sockets: list[socket.socket],
) -> None:
    server = start_metrics_server(
        FakeApp(), limits=MetricsLimits(max_connections=8, idle_timeout_s=1.0)
    )
    try:
        slow = connect(server.port, sockets)
        started = time.monotonic()
        slow.sendall(b"GET /metr")
        cut = False
        while time.monotonic() - started < 10 and not cut:
            try:
                slow.sendall(b"i")  # one byte every 0.1 s: never a whole line
            except (BrokenPipeError, ConnectionResetError):
                cut = True
                break
            cut = closed_by_server(slow)
            time.sleep(0.1)
        took = time.monotonic() - started
        assert cut, "a trickling request head was never cut off"
        assert 0.9 <= took < 5, took
        assert get(server.url + "/metrics") == 200
        assert on_loop(server, lambda: server.server.timed_out_total) == 1
    finally:
        server.close()


def test_only_when_every_slot_is_answering_a_new_connection_gets_503(
    sockets: list[socket.socket],
) -> None:
    app = FakeApp()
    server = start_metrics_server(app, limits=MetricsLimits(max_connections=4, idle_timeout_s=30))
    try:
        app.gate.clear()  # scrapes wait inside status(): their slots stay busy
        busy = [connect(server.port, sockets) for _ in range(4)]
        for sock in busy:
            sock.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        wait_until(lambda: on_loop(server, lambda: len(server.server._answering)) == 4, 10)
        extra = connect(server.port, sockets)
        reply = extra.recv(4096)
        assert reply.startswith(b"HTTP/1.1 503"), reply
        assert on_loop(server, lambda: server.server.refused_total) == 1
        app.gate.set()
        for sock in busy:  # one shared scrape answers all four
            data = b""
            while chunk := sock.recv(65536):
                data += chunk
            assert data.startswith(b"HTTP/1.1 200") and b"streams_app_state" in data
        wait_until(lambda: on_loop(server, lambda: server.server.connections) == 0, 10)
    finally:
        app.gate.set()
        server.close()


class BigCollector(Collector):
    """A /metrics body far larger than the kernel's socket buffers (about 20 MB)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        family = GaugeMetricFamily("big", "a large body", labels=["i"])
        for i in range(200_000):
            family.add_metric([f"{i:0>64}"], float(i))
        yield family


def test_a_client_that_leaves_its_response_unread_is_cut_off(
    sockets: list[socket.socket],
) -> None:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(BigCollector())
    limits = MetricsLimits(max_connections=4, idle_timeout_s=1.0)
    server = BackgroundMetricsServer(MetricsServer(FakeApp(), registry=registry, limits=limits))
    server.start()
    try:
        reader = socket.socket()
        sockets.append(reader)
        reader.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
        reader.connect(("127.0.0.1", server.port))
        reader.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")  # and never reads
        wait_until(lambda: on_loop(server, lambda: server.server.timed_out_total) == 1, 30)
        assert on_loop(server, lambda: server.server.connections) == 0
    finally:
        server.close()
