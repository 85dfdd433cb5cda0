"""Fuzz of the admin protocol: at least 10,000 generated request lines against the real
`AdminServer` over a real Unix socket, with a fake app behind it (issue 21).

Each example is one connection sending 100-160 lines (junk bytes, JSON of every shape,
requests for every command with hostile arguments, nesting up to past the JSON decoder's
recursion limit), in random write sizes, so line splitting across reads is exercised
too. Asserted: exactly one reply per line, in one well-formed JSON object each (`ok`
a bool; `result` with ok, an `error` string without), and the server still serves a
fresh client afterwards. Runs in a few seconds: the lines of one example share one
connection and one write loop.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from runtime.admin.protocol import COMMANDS
from runtime.admin.server import AdminLimits
from tests.fakes.admin import FakeAdminApp, ServerThread, connect, read_replies

EXAMPLES = 90
LINES_PER_EXAMPLE = (100, 160)
TOTAL_AT_LEAST = 10_000

scalars = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.sampled_from([0, -1, 1024, 1025, 2**31, 2**63, -(2**63), 10**300])
    | st.floats()  # NaN and infinities are written as NaN/Infinity: valid for json.loads
    | st.text(max_size=24)
    | st.sampled_from(["0_1", "99_99", "0_", "_1", "\u0000", "\ud7ff", "１_２", "a" * 300])
)
json_values = st.recursive(
    scalars,
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=6,
)
argument_names = st.sampled_from(["count", "timeout", "task", "command", "x", "", "\u00e9"])
commands = st.sampled_from([*COMMANDS, "", "STATUS", "reboot", "threads.", "status\n"]) | st.text(
    max_size=12
)


def request_object(command: Any, args: dict[str, Any]) -> bytes:
    return json.dumps({"command": command, **args}).encode()


requests = st.builds(
    request_object, commands, st.dictionaries(argument_names, json_values, max_size=3)
)


@st.composite
def deep(draw: st.DrawFn) -> bytes:
    depth = draw(st.integers(900, 1100) | st.integers(1, 50) | st.just(20_000))
    opener, closer = draw(st.sampled_from([("[", "]"), ('{"a":', "}")]))
    command = draw(st.sampled_from(["threads.set", "pause", "threads.remove", "status"]))
    argument = draw(st.sampled_from(["count", "task", "timeout", "x"]))
    nest = opener * depth + "0" + closer * depth
    return f'{{"command":"{command}","{argument}":{nest}}}'.encode()


junk = (
    st.binary(max_size=300)
    | st.text(max_size=200).map(lambda t: t.encode("utf-8", "surrogatepass"))
    | json_values.map(lambda v: json.dumps(v).encode())
    | st.sampled_from([b"", b"\r", b"{", b"}", b"null", b"[]", b'{"command": null}', b"\xff\xfe"])
)
lines_strategy = st.lists(
    requests | junk | deep(),
    min_size=LINES_PER_EXAMPLE[0],
    max_size=LINES_PER_EXAMPLE[1],
).map(lambda lines: [line.replace(b"\n", b" ") for line in lines])
chunk_sizes = st.lists(
    st.integers(1, 16) | st.integers(512, 70_000), min_size=1, max_size=8
).filter(lambda sizes: sum(sizes) >= 512)


@pytest.fixture(scope="module")
def server() -> Iterator[ServerThread]:
    with tempfile.TemporaryDirectory(prefix="fuzz") as d:
        path = Path(d) / "admin.sock"
        # Generous limits: this fuzz is about replies; test_admin_limits tests the limits.
        limits = AdminLimits(max_connections=8, idle_timeout_s=60)
        with ServerThread(path, FakeAdminApp(), limits, max_threads=8) as st_:
            yield st_


def check_reply(raw: bytes) -> None:
    assert raw.isascii(), raw[:200]
    reply = json.loads(raw)
    assert isinstance(reply, dict), raw[:200]
    assert isinstance(reply["ok"], bool)
    if reply["ok"]:
        assert set(reply) == {"ok", "result"}, raw[:200]
    else:
        assert set(reply) == {"ok", "error"} and isinstance(reply["error"], str), raw[:200]


def test_every_line_gets_one_well_formed_reply(server: ServerThread) -> None:
    path = Path(server.server.path)
    sent = [0]

    @settings(
        max_examples=EXAMPLES,
        deadline=None,
        derandomize=False,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(lines=lines_strategy, chunks=chunk_sizes)
    def one_connection(lines: list[bytes], chunks: list[int]) -> None:
        payload = b"\n".join(lines) + b"\n"
        with connect(path, timeout=30) as sock:
            position, i, done = 0, 0, 0
            buffer = bytearray()
            replies: list[bytes] = []
            while position < len(payload):  # write in random sizes, read as we go
                chunk = payload[position : position + chunks[i % len(chunks)]]
                sock.sendall(chunk)
                position += len(chunk)
                i += 1
                done += chunk.count(b"\n")
                replies += read_replies(sock, done - len(replies), buffer)
            assert len(replies) == len(lines)
            assert not buffer, "no reply beyond one per line"
            for raw in replies:
                check_reply(raw)
        sent[0] += len(lines)

    one_connection()
    assert sent[0] >= TOTAL_AT_LEAST, sent[0]
    with connect(path) as sock:  # the server is alive and well for a fresh client
        sock.sendall(b'{"command": "status"}\n')
        assert json.loads(read_replies(sock, 1)[0])["result"]["state"] == "RUNNING"
    assert server.on_loop(lambda: server.server.buffered_bytes) == 0
    print(f"admin fuzz: {sent[0]} request lines, one reply each")
