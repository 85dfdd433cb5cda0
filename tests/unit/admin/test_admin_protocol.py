"""The admin protocol without Kafka: request parsing, dispatch on a fake app, the socket
server in-process (mode, stale files, several clients, over-long lines), the client's
rendering and the `streams-runtime admin` command's exit codes, and the config keys.
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import cli
from runtime.admin import client as admin_client
from runtime.admin import paths
from runtime.admin.handler import AdminHandler
from runtime.admin.protocol import (
    COMMANDS,
    MAX_LINE_BYTES,
    ProtocolError,
    Request,
    encode_reply,
    parse_request,
)
from runtime.admin.server import AdminServer, AdminSocketError, read_lines
from runtime.config import ConfigError, StreamsConfig, load_config
from runtime.status import AppStatus
from tests.kafka_helpers import wait_until

STATUS: dict[str, Any] = {
    "application_id": "app",
    "client_id": "app",
    "state": "RUNNING",
    "processing_guarantee": "at_least_once",
    "threads": [
        {"name": "app-ProcessingThread-1", "alive": True, "task": "0_0", "batches": 7,
         "busy_seconds": 0.5},
    ],
    "tasks": [
        {"id": "0_0", "state": "RUNNING", "owner": "app-ProcessingThread-1",
         "partitions": ["in-0", "side-0"], "buffered": 3, "processed": 10, "skipped": 1,
         "dead_lettered": 0},
        {"id": "0_1", "state": "PAUSED", "owner": None, "partitions": ["in-1"], "buffered": 0,
         "processed": 0, "skipped": 0, "dead_lettered": 0},
    ],
    "consumed": 13, "processed": 10, "produced": 9, "skipped": 1, "dead_lettered": 0,
    "commits": 2, "commit_failures": 0, "last_commit": 1_700_000_000.0,
    "last_commit_duration_s": 0.004, "failed_threads": 0,
    "lag": {"in-0": 5, "side-0": 2, "in-1": 1}, "total_lag": 8,
    "broker_down_since": None, "failure": None,
}  # fmt: skip


class FakeApp:
    """Records calls; answers like `App` does."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.state = "RUNNING"
        self.names = ["app-ProcessingThread-1"]
        self.remove_error: BaseException | None = None
        self.status_error: BaseException | None = None

    def status(self) -> AppStatus:
        if self.status_error is not None:
            raise self.status_error
        return AppStatus.from_dict(json.loads(json.dumps(STATUS)))

    @property
    def processing_threads(self) -> list[str]:
        return list(self.names)

    def add_processing_thread(self) -> str | None:
        self.calls.append(("add",))
        if self.state != "RUNNING":
            return None
        name = f"app-ProcessingThread-{len(self.names) + 1}"
        self.names.append(name)
        return name

    def remove_processing_thread(self, timeout: float | None = None) -> str | None:
        self.calls.append(("remove", timeout))
        if self.remove_error is not None:
            raise self.remove_error
        return self.names.pop() if self.names else None

    def set_processing_threads(self, count: int, timeout: float | None = None) -> list[str]:
        self.calls.append(("set", count, timeout))
        if self.state != "RUNNING":
            raise RuntimeError(f"cannot resize threads in state {self.state}")
        self.names = [f"app-ProcessingThread-{i}" for i in range(1, count + 1)]
        return list(self.names)

    def pause(self, task_id: str | None = None) -> None:
        self.calls.append(("pause", task_id))

    def resume(self, task_id: str | None = None) -> None:
        self.calls.append(("resume", task_id))

    def prepare_leave(self) -> None:
        self.calls.append(("prepare-leave",))

    def add_query(self, name: str, topology: Any, **settings: Any) -> None:
        self.calls.append(("add_query", name, settings))

    def remove_query(self, name: str, reset: bool = False, timeout: float = 60.0) -> None:
        self.calls.append(("remove_query", name, reset))

    def pause_query(self, name: str) -> None:
        self.calls.append(("pause_query", name))

    def resume_query(self, name: str) -> None:
        self.calls.append(("resume_query", name))


class FakePool(FakeApp):
    """A daemon with processes > 1 (runtime.isolation.workers.WorkerPool's calls)."""

    processes = 2

    def set_processes(self, count: int, timeout: float | None = None) -> list[Any]:
        self.calls.append(("set_processes", count, timeout))
        self.processes = count
        return []

    def add_process(self, timeout: float | None = None) -> list[Any]:
        return self.set_processes(self.processes + 1, timeout)

    def remove_process(self, timeout: float | None = None) -> list[Any]:
        return self.set_processes(self.processes - 1, timeout)

    def process_rows(self) -> list[Any]:
        return []


# --- parsing --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b'{"command": "status"}', Request("status")),
        ('{"command": "threads"}\n', Request("threads")),
        (b'{"command": "threads.remove", "timeout": 10}\r\n',
         Request("threads.remove", {"timeout": 10.0})),
        (b'{"command": "threads.set", "count": 3}', Request("threads.set", {"count": 3})),
        (b'{"command": "pause", "task": "0_1"}', Request("pause", {"task": "0_1"})),
        (b'{"command": "resume", "task": null}', Request("resume", {"task": None})),
        (b'{"command": "shutdown"}', Request("shutdown")),
    ],
)  # fmt: skip
def test_parse_valid(line: bytes | str, expected: Request) -> None:
    assert parse_request(line) == expected


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (b"", "empty request"),
        (b"status", "not valid JSON"),
        (b"\xff\xfe", "not UTF-8"),
        (b"[1, 2]", "must be a JSON object, got list"),
        (b"null", "must be a JSON object"),
        (b'"status"', "must be a JSON object, got str"),
        (b"{}", 'needs a "command"'),
        (b'{"command": 7}', 'needs a "command"'),
        (b'{"command": "reboot"}', "unknown command \"reboot\""),
        (b'{"command": "status", "verbose": true}', "unexpected argument \"verbose\""),
        (b'{"command": "threads.set"}', "needs the argument 'count'"),
        (b'{"command": "threads.set", "count": "3"}', "'count' must be an integer"),
        (b'{"command": "threads.set", "count": true}', "'count' must be an integer"),
        (b'{"command": "threads.set", "count": -1}', "between 0 and"),
        (b'{"command": "threads.set", "count": 100000}', "between 0 and"),
        (b'{"command": "threads.remove", "timeout": "10"}', "'timeout' must be a number"),
        (b'{"command": "threads.remove", "timeout": NaN}', "'timeout' must be between"),
        (b'{"command": "threads.remove", "timeout": -1}', "'timeout' must be between"),
        (b'{"command": "pause", "task": 1}', "'task' must be a task id"),
        (b'{"command": "pause", "task": "../0_1"}', "'task' must be a task id"),
        (b"[" * 100_000, "not valid JSON"),
        (b'{"command": "' + b"x" * (MAX_LINE_BYTES + 1) + b'"}', "longer than"),
    ],
)  # fmt: skip
def test_parse_errors(line: bytes, message: str) -> None:
    with pytest.raises(ProtocolError, match=None) as info:
        parse_request(line)
    assert message in str(info.value)
    assert len(str(info.value)) < 500, "error messages must not echo huge input"


def test_every_command_is_dispatched() -> None:
    app = FakePool()
    handler = AdminHandler(app, shutdown=lambda: None)
    for command, spec in COMMANDS.items():
        request = {"command": command}
        if "count" in spec:
            request["count"] = 1
        if "name" in spec:
            request["name"] = "q"
        if "target" in spec:
            request["target"] = "tests.apps.query_app:topology"
        reply = handler.handle_line(json.dumps(request))
        assert reply["ok"], (command, reply)


def test_processes_commands_resize_a_pool_and_explain_a_one_process_daemon() -> None:
    pool = FakePool()
    handler = AdminHandler(pool)
    reply = handler.handle_line(b'{"command": "processes.set", "count": 3, "timeout": 5}')
    assert reply == {"ok": True, "result": {"processes": 3, "rows": []}}
    assert pool.calls[-1] == ("set_processes", 3, 5.0)
    assert handler.handle_line(b'{"command": "processes.add"}')["result"]["processes"] == 4
    pool.processes = 1
    reply = handler.handle_line(b'{"command": "processes.remove"}')
    assert not reply["ok"] and "fewest" in reply["error"]
    single = AdminHandler(FakeApp())
    assert single.handle_line(b'{"command": "processes"}') == {
        "ok": True,
        "result": {"processes": 1, "rows": []},
    }
    reply = single.handle_line(b'{"command": "processes.add"}')
    assert not reply["ok"] and "processes.resizable=true" in reply["error"]


# --- dispatch -------------------------------------------------------------------------


def test_status_adds_task_lag_and_daemon_facts() -> None:
    handler = AdminHandler(FakeApp(), extra_status=lambda: {"pid": 42})
    reply = handler.handle_line(b'{"command": "status"}')
    assert reply["ok"]
    result = reply["result"]
    assert result["daemon"] == {"pid": 42}
    assert [t["lag"] for t in result["tasks"]] == [7, 1]
    assert result["state"] == "RUNNING"
    tasks = handler.handle_line(b'{"command": "tasks"}')["result"]["tasks"]
    assert [t["id"] for t in tasks] == ["0_0", "0_1"]


def test_thread_commands() -> None:
    app = FakeApp()
    handler = AdminHandler(app)
    added = handler.handle_line(b'{"command": "threads.add"}')
    assert added == {
        "ok": True,
        "result": {
            "added": "app-ProcessingThread-2",
            "names": ["app-ProcessingThread-1", "app-ProcessingThread-2"],
        },
    }
    removed = handler.handle_line(b'{"command": "threads.remove", "timeout": 2.5}')
    assert removed["result"]["removed"] == "app-ProcessingThread-2"
    assert app.calls[-1] == ("remove", 2.5)
    handler.handle_line(b'{"command": "threads.remove"}')
    assert app.calls[-1] == ("remove", 30.0)  # the default timeout
    none_left = handler.handle_line(b'{"command": "threads.remove"}')
    assert none_left == {"ok": False, "error": "no processing thread to remove"}
    set3 = handler.handle_line(b'{"command": "threads.set", "count": 3, "timeout": 1}')
    assert set3["result"]["names"][-1] == "app-ProcessingThread-3"
    assert app.calls[-1] == ("set", 3, 1.0)
    listing = handler.handle_line(b'{"command": "threads"}')["result"]
    assert listing["names"] == app.names
    assert listing["threads"][0]["batches"] == 7


def test_thread_commands_fail_cleanly() -> None:
    app = FakeApp()
    handler = AdminHandler(app)
    app.remove_error = TimeoutError("app-ProcessingThread-1 did not finish its batch within 1 s")
    reply = handler.handle_line(b'{"command": "threads.remove", "timeout": 1}')
    assert reply == {"ok": False, "error": str(app.remove_error)}
    app.state = "PENDING_SHUTDOWN"
    reply = handler.handle_line(b'{"command": "threads.add"}')
    assert reply == {
        "ok": False,
        "error": "cannot add a processing thread: the app is PENDING_SHUTDOWN",
    }
    reply = handler.handle_line(b'{"command": "threads.set", "count": 2}')
    assert not reply["ok"] and "PENDING_SHUTDOWN" in reply["error"]
    app.status_error = KeyError("boom")
    reply = handler.handle_line(b'{"command": "status"}')
    assert reply == {"ok": False, "error": "status failed: KeyError: 'boom'"}


def test_pause_resume_and_shutdown() -> None:
    app = FakeApp()
    shutdowns: list[int] = []
    handler = AdminHandler(app, shutdown=lambda: shutdowns.append(1))
    assert handler.handle_line(b'{"command": "pause", "task": "0_1"}')["result"] == {
        "paused": "0_1",
        "assigned": True,
    }
    assert handler.handle_line(b'{"command": "pause", "task": "9_9"}')["result"] == {
        "paused": "9_9",
        "assigned": False,
    }
    assert handler.handle_line(b'{"command": "resume"}')["result"] == {
        "resumed": "all",
        "assigned": None,
    }
    assert app.calls == [("pause", "0_1"), ("pause", "9_9"), ("resume", None)]
    assert handler.handle_line(b'{"command": "shutdown"}')["ok"]
    assert shutdowns == [1]
    no_shutdown = AdminHandler(app).handle_line(b'{"command": "shutdown"}')
    assert not no_shutdown["ok"]


@given(st.one_of(st.binary(max_size=300), st.text(max_size=300).map(str.encode)))
def test_any_bytes_get_one_json_reply(data: bytes) -> None:
    reply = AdminHandler(FakeApp()).handle_line(data)
    encoded = encode_reply(reply)
    assert encoded.endswith(b"\n") and encoded.count(b"\n") == 1
    decoded = json.loads(encoded)
    assert isinstance(decoded, dict) and isinstance(decoded["ok"], bool)
    assert decoded["ok"] or isinstance(decoded["error"], str)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=20,
)


@given(
    st.dictionaries(
        st.sampled_from(["command", "count", "timeout", "task", "x"]), json_values, max_size=4
    ),
    st.sampled_from([*COMMANDS, "nope"]),
)
def test_any_object_gets_one_reply(message: dict[str, Any], command: str) -> None:
    message.setdefault("command", command)
    app = FakeApp()
    reply = AdminHandler(app, shutdown=lambda: None).handle_line(json.dumps(message))
    assert set(reply) in ({"ok", "result"}, {"ok", "error"})
    json.loads(encode_reply(reply))


def test_encode_reply_is_one_ascii_line() -> None:
    line = encode_reply({"ok": False, "error": "two\nlines \u2603"})
    assert line.count(b"\n") == 1 and line.isascii()
    assert json.loads(line)["error"] == "two\nlines \u2603"
    assert json.loads(encode_reply({"ok": True, "result": float("nan")}))["ok"] is False


# --- line reading -----------------------------------------------------------------------


def _lines(chunks: list[bytes], limit: int) -> list[Any]:
    async def go() -> list[Any]:
        reader = asyncio.StreamReader()
        for chunk in chunks:
            reader.feed_data(chunk)
        reader.feed_eof()
        return [line async for line in read_lines(reader, limit)]

    return asyncio.run(go())


def test_read_lines_splits_and_drops_overlong_lines() -> None:
    got = _lines([b"ab", b"c\nde", b"f\n" + b"x" * 25, b"x" * 10 + b"\n", b"ok\n", b"tail"], 16)
    assert got[:2] == [b"abc", b"def"]
    assert type(got[2]).__name__ == "_TooLong"
    assert got[3:] == [b"ok", b"tail"]
    # An over-long line ending inside the chunk that completes it: still one marker.
    got = _lines([b"y" * 20 + b"\nz\n"], 16)
    assert type(got[0]).__name__ == "_TooLong" and got[1:] == [b"z"]


# --- the socket server in-process -----------------------------------------------------------


class ServerThread:
    """An AdminServer on its own loop in a thread, for blocking-socket tests."""

    def __init__(self, path: Path, app: FakeApp) -> None:
        self.server = AdminServer(str(path), AdminHandler(app, shutdown=lambda: None))
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)

    def __enter__(self) -> ServerThread:
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self.server.start(), self.loop).result(5)
        return self

    def __exit__(self, *_exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.server.stop(), self.loop).result(5)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)
        self.loop.close()


@pytest.fixture
def sock_path() -> Iterator[Path]:
    # Short, so AF_UNIX's 107-byte limit is never near (pytest's tmp_path can be long).
    import tempfile

    with tempfile.TemporaryDirectory(prefix="adm") as d:
        yield Path(d) / "admin.sock"


def test_server_socket_mode_clients_and_cleanup(sock_path: Path) -> None:
    with ServerThread(sock_path, FakeApp()):
        assert stat.S_IMODE(os.stat(sock_path).st_mode) == 0o600
        assert [p.name for p in sock_path.parent.iterdir()] == ["admin.sock"]
        conns = [admin_client.AdminConnection(str(sock_path)) for _ in range(3)]
        try:
            for i, conn in enumerate(conns):
                assert conn.call("threads")["names"][0] == "app-ProcessingThread-1", i
            # Several requests in one write: replies in order, one line each.
            conns[0]._sock.sendall(b'{"command": "threads"}\nnot json\n{"command": "tasks"}\n')
            replies = [conns[0].read_reply() for _ in range(3)]
            assert [r["ok"] for r in replies] == [True, False, True]
            # An over-long line: one error, then the connection still works.
            big = b'{"command": "status", "pad": "' + b"p" * (MAX_LINE_BYTES + 10) + b'"}'
            reply = conns[1].send_line(big)
            assert reply == {"ok": False, "error": f"request longer than {MAX_LINE_BYTES} bytes"}
            assert conns[1].call("status")["state"] == "RUNNING"
            with pytest.raises(admin_client.AdminCommandFailed, match="unknown command"):
                conns[2].call("reboot")
        finally:
            for conn in conns:
                conn.close()
    assert not sock_path.exists()


def test_server_replaces_stale_socket_and_refuses_live_one(sock_path: Path) -> None:
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(sock_path))
    stale.close()  # the file stays, nobody listens: a crashed daemon's leftover
    with ServerThread(sock_path, FakeApp()):
        assert admin_client.request(str(sock_path), "status")["state"] == "RUNNING"
        second = AdminServer(str(sock_path), AdminHandler(FakeApp()))
        with pytest.raises(AdminSocketError, match="another process is listening"):
            asyncio.run(second.start())
        assert admin_client.request(str(sock_path), "status")["state"] == "RUNNING"


def test_server_refuses_non_socket_and_long_paths(sock_path: Path) -> None:
    sock_path.write_text("not a socket")
    with pytest.raises(AdminSocketError, match="not a socket"):
        asyncio.run(AdminServer(str(sock_path), AdminHandler(FakeApp())).start())
    assert sock_path.read_text() == "not a socket"
    long_path = sock_path.parent / ("s" * 120)
    with pytest.raises(AdminSocketError, match="too long"):
        asyncio.run(AdminServer(str(long_path), AdminHandler(FakeApp())).start())


# --- client rendering and the command ------------------------------------------------------


def test_format_status_and_tasks() -> None:
    status = AdminHandler(FakeApp(), extra_status=lambda: {"pid": 7}).handle(Request("status"))
    text = admin_client.format_status(status, now=1_700_000_002.5)
    assert "state        RUNNING" in text
    assert "2.5 s ago (2 commits, last took 4 ms)" in text
    assert "consumed 13  processed 10  produced 9" in text
    assert "pid 7" in text
    lines = text.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("TASK"))
    assert lines[header].split() == [
        "TASK", "STATE", "OWNER", "BUFFERED", "LAG", "PROCESSED", "PARTITIONS",
    ]  # fmt: skip
    assert lines[header + 1].split() == [
        "0_0", "RUNNING", "app-ProcessingThread-1", "3", "7", "10", "in-0,side-0",
    ]  # fmt: skip
    assert lines[header + 2].split()[:3] == ["0_1", "PAUSED", "-"]
    assert "retrying" not in text


def test_format_status_of_several_processes_has_a_row_each_and_tasks_name_theirs() -> None:
    status = {
        "state": "RUNNING",
        "processes": [
            {"name": "p0", "pid": 11, "state": "RUNNING", "up": True, "tasks": 1, "restarts": 0},
            {"name": "p1", "pid": None, "state": "DEAD", "up": False, "restarts": 3,
             "last_exit": "killed by SIGKILL"},
        ],
        "tasks": [{"id": "0_0", "state": "RUNNING", "process": "p0", "partitions": ["in-0"]}],
    }  # fmt: skip
    text = admin_client.format_status(status, now=0.0)
    lines = text.splitlines()
    assert any(line.split() == ["processes", "1", "up", "of", "2"] for line in lines)
    header = next(i for i, line in enumerate(lines) if line.startswith("PROCESS  PID"))
    assert lines[header + 1].split()[:3] == ["p0", "11", "RUNNING"]
    assert lines[header + 2].split()[-4:] == ["3", "killed", "by", "SIGKILL"]
    task_header = next(i for i, line in enumerate(lines) if line.startswith("PROCESS  TASK"))
    assert lines[task_header + 1].split()[:2] == ["p0", "0_0"]
    assert admin_client._format("processes", {"rows": []}) == "one process (processes=1)"


def test_format_status_says_which_coordinator_call_the_polling_thread_retries() -> None:
    status = {
        **AdminHandler(FakeApp()).handle(Request("status")),
        "retrying_call": "commit_transaction",
        "retrying_since": 1_700_000_000.0,
    }
    text = admin_client.format_status(status, now=1_700_000_012.5)
    assert "retrying     commit_transaction since 12.5 s ago" in text


def test_format_status_has_a_state_memory_line() -> None:
    mib = 1 << 20
    store = {"task": "0_1", "store": "counts", "estimated_keys": 1500, "live_sst_bytes": 3 * mib,
             "table_readers_bytes": mib // 2, "delayed_write_rate": 0, "write_stopped": 0}  # fmt: skip
    memory = {
        "memory_bytes": 256 * mib, "write_buffer_limit_bytes": 64 * mib,
        "block_cache_usage_bytes": 12 * mib, "block_cache_pinned_bytes": 4 * mib,
        "write_buffer_usage_bytes": 3 * mib, "stall_seconds": 0.0,
        "stores": [store, {**store, "task": "1_1", "write_stopped": 1}],
    }  # fmt: skip
    status = {**AdminHandler(FakeApp()).handle(Request("status")), "state_memory": memory}
    text = admin_client.format_status(status, now=1_700_000_012.5)
    (line,) = [line for line in text.splitlines() if line.startswith("state memory")]
    assert "RocksDB 12.0 MiB of 256.0 MiB (memtables 3.0 MiB of 64.0 MiB, pinned 4.0 MiB" in line
    assert "SST readers 1.0 MiB), 2 stores, 3000 keys, SST 6.0 MiB" in line
    assert line.endswith("write stalls: 1 (1_1/counts stopped)")
    # The consolidated layout's figures are per column family (task "*").
    families = [{**store, "task": "*"}, {**store, "task": "*", "store": "offsets"}]
    status["state_memory"] = {**memory, "stores": families}
    text = admin_client.format_status(status, now=1_700_000_012.5)
    (line,) = [line for line in text.splitlines() if line.startswith("state memory")]
    assert "2 column families, 3000 keys" in line
    status["state_memory"] = {**memory, "stall_seconds": 2.5, "stalls_without_progress": 1}
    text = admin_client.format_status(status, now=1_700_000_012.5)
    (line,) = [line for line in text.splitlines() if line.startswith("state memory")]
    assert line.endswith(
        "waited 2.5 s for memtable flushes, 1 waits gave up (memtables over their budget: "
        "see the log's rocksdb_memtables_over_budget)"
    )
    no_memory = admin_client.format_status(AdminHandler(FakeApp()).handle(Request("status")))
    assert "state memory" not in no_memory  # a stateless app, or before the first read


def test_admin_command_exit_codes(
    sock_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(admin_client.SOCKET_ENV, raising=False)
    monkeypatch.delenv(admin_client.APPLICATION_ID_ENV, raising=False)
    # No default socket either (issue 32): not the ones of daemons running here.
    monkeypatch.setattr(paths, "socket_dirs", lambda env=None: [str(sock_path.parent / "d")])
    assert cli.main(["admin", "status"]) == 2
    assert "no socket" in capsys.readouterr().err
    assert cli.main(["admin", "--socket", str(sock_path), "status"]) == 1
    assert f"no admin socket at {sock_path}" in capsys.readouterr().err
    with pytest.raises(SystemExit) as info:
        cli.main(["admin", "--socket", str(sock_path), "threads", "set"])
    assert info.value.code == 2
    capsys.readouterr()
    with ServerThread(sock_path, FakeApp()):
        monkeypatch.setenv(admin_client.SOCKET_ENV, str(sock_path))
        assert cli.main(["admin", "--json", "threads", "set", "2"]) == 0
        assert json.loads(capsys.readouterr().out)["names"][-1] == "app-ProcessingThread-2"
        assert cli.main(["admin", "pause", "0_1"]) == 0
        assert capsys.readouterr().out.strip() == "paused task 0_1"
        assert cli.main(["admin", "pause", "bogus"]) == 1
        assert "'task' must be a task id" in capsys.readouterr().err


def test_admin_options_are_accepted_after_the_command(
    sock_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(admin_client.SOCKET_ENV, raising=False)
    with ServerThread(sock_path, FakeApp()):
        for argv in (
            ["admin", "threads", "--json", "--socket", str(sock_path)],
            ["admin", "--socket", str(sock_path), "threads", "--json"],
            ["admin", "--json", "--socket", str(sock_path), "threads"],
        ):
            assert cli.main(argv) == 0, argv
            assert json.loads(capsys.readouterr().out)["names"] == ["app-ProcessingThread-1"]
        # Not repeated after the command: the value before it stands.
        assert cli.main(["admin", "--json", "--socket", str(sock_path), "status"]) == 0
        assert json.loads(capsys.readouterr().out)["state"] == "RUNNING"
        assert cli.main(["admin", "status", "--socket", str(sock_path)]) == 0
        assert capsys.readouterr().out.startswith("state")


def test_admin_output_into_a_closed_pipe_ends_quietly(sock_path: Path) -> None:
    """`admin --json threads | head`: the reader is gone before the output is
    written; the command must end without a traceback."""
    import subprocess
    import sys

    from tests.harness import REPO

    with ServerThread(sock_path, FakeApp()):
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "runtime",
                "admin",
                "--json",
                "status",
                "--socket",
                str(sock_path),
            ],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
        )
        assert proc.stdout is not None and proc.stderr is not None
        proc.stdout.close()  # long before the interpreter has started
        err = proc.stderr.read().decode()
        code = proc.wait(30)
    assert "Traceback" not in err and "BrokenPipe" not in err, err
    assert err == "", err
    assert code == 0


def test_admin_command_reads_socket_from_config(tmp_path: Path) -> None:
    toml = tmp_path / "app.toml"
    toml.write_text('application.id = "a"\n[admin]\nsocket = "/run/x.sock"\n')
    assert admin_client.resolve_socket(None, str(toml)) == "/run/x.sock"
    assert admin_client.resolve_socket("/explicit", str(toml)) == "/explicit"


# --- config keys -------------------------------------------------------------------------


REQUIRED = {"application.id": "app", "bootstrap.servers": "127.0.0.1:9092"}


def test_admin_socket_is_a_known_key_not_a_client_property() -> None:
    c = StreamsConfig.from_dict(
        {**REQUIRED, "admin.socket": "/run/s.sock", "admin.request.timeout.ms": 500}
    )
    assert c.admin_socket == "/run/s.sock"
    assert c.admin_overrides == {"request.timeout.ms": 500}  # the socket is not passed on
    c = load_config(env={"STREAMS_RUNTIME_ADMIN_SOCKET": "/run/e.sock"}, base=REQUIRED)
    assert c.admin_socket == "/run/e.sock" and c.admin_overrides == {}
    default = StreamsConfig.from_dict(REQUIRED)
    assert (default.admin_socket, default.metrics_port, default.metrics_host) == (
        None,
        None,
        "127.0.0.1",
    )


@pytest.mark.parametrize("value", ["-1", "65536", "http", True])
def test_metrics_port_is_validated(value: Any) -> None:
    with pytest.raises(ConfigError, match="metrics.port"):
        StreamsConfig.from_dict({**REQUIRED, "metrics.port": value})


def test_metrics_port_zero_and_env() -> None:
    c = load_config(
        env={"STREAMS_RUNTIME_METRICS_PORT": "0", "STREAMS_RUNTIME_METRICS_HOST": "0.0.0.0"},
        base=REQUIRED,
    )
    assert (c.metrics_port, c.metrics_host) == (0, "0.0.0.0")


# --- the autoscaler's decisions ----------------------------------------------------------------


class Load:
    """Builds successive status snapshots, 10 s apart, for the autoscaler."""

    def __init__(self, threads: int) -> None:
        self.busy = {f"t-{i}": 0.0 for i in range(1, threads + 1)}
        self.processed = 0
        self.lag = 0
        self.now = 0.0

    def step(self, busy: float | dict[str, float], rate: float, lag_delta: int) -> dict[str, Any]:
        for name in self.busy:
            share = busy if isinstance(busy, float) else busy.get(name, 0.0)
            self.busy[name] += share * 10
        self.processed += int(rate * 10)
        self.lag = max(0, self.lag + lag_delta)
        self.now += 10
        return self.snapshot()

    def snapshot(self, state: str = "RUNNING") -> AppStatus:
        return AppStatus.from_dict(
            {
                "state": state,
                "threads": [
                    {"name": n, "alive": True, "busy_seconds": b} for n, b in self.busy.items()
                ],
                "processed": self.processed,
                "total_lag": self.lag,
            }
        )

    def add_thread(self) -> None:
        self.busy[f"t-{len(self.busy) + 1}"] = 0.0

    def remove_thread(self) -> None:
        self.busy.pop(max(self.busy))


def test_autoscaler_adds_while_lag_grows_and_all_busy_then_checks_the_gain() -> None:
    from runtime.admin.autoscaler import AutoscalePolicy, Autoscaler

    scaler = Autoscaler(AutoscalePolicy(min_threads=1, max_threads=4))
    load = Load(2)
    assert scaler.observe(load.snapshot(), load.now) is None
    decisions = [scaler.observe(load.step(0.95, 1000, +500), load.now) for _ in range(3)]
    assert decisions[:2] == [None, None]
    added = decisions[2]
    assert added is not None and added.action == "add"
    assert "total lag grew 3 intervals" in added.reason and "least 95%" in added.reason
    assert added.facts["threads"] == 2 and added.facts["total_lag"] == 1500

    # The new thread does not raise throughput (the GIL): it is taken back, adding pauses.
    load.add_thread()
    outcomes = [scaler.observe(load.step(0.95, 1000, +500), load.now) for _ in range(4)]
    assert outcomes[:3] == [None, None, None]
    revert = outcomes[3]
    assert revert is not None and revert.action == "remove"
    assert "did not raise throughput (1000 -> 1000 records/s)" in revert.reason
    load.remove_thread()
    later = [scaler.observe(load.step(0.95, 1000, +500), load.now) for _ in range(10)]
    assert later == [None] * 10, "adding must back off after a thread that did not help"


def test_autoscaler_keeps_a_thread_that_helped() -> None:
    from runtime.admin.autoscaler import AutoscalePolicy, Autoscaler

    scaler = Autoscaler(AutoscalePolicy(min_threads=1, max_threads=3))
    load = Load(1)
    scaler.observe(load.snapshot(), load.now)
    decisions = [scaler.observe(load.step(1.0, 500, +100), load.now) for _ in range(3)]
    assert decisions[-1] is not None and decisions[-1].action == "add"
    load.add_thread()
    scaler.observe(load.step(1.0, 500, +100), load.now)  # the set changed: observe afresh
    outcomes = [scaler.observe(load.step(1.0, 900, +50), load.now) for _ in range(3)]
    # Throughput rose: no take-back; lag still grows with all busy: one more (up to max 3).
    assert outcomes[:2] == [None, None]
    assert outcomes[2] is not None and outcomes[2].action == "add"


def test_autoscaler_removes_an_idle_thread_down_to_min_and_respects_bounds() -> None:
    from runtime.admin.autoscaler import AutoscalePolicy, Autoscaler

    scaler = Autoscaler(AutoscalePolicy(min_threads=2, max_threads=4))
    load = Load(3)
    scaler.observe(load.snapshot(), load.now)
    busy = {"t-1": 0.5, "t-2": 0.5, "t-3": 0.0}
    decisions = [scaler.observe(load.step(busy, 100, 0), load.now) for _ in range(6)]
    assert decisions[:5] == [None] * 5
    removed = decisions[5]
    assert removed is not None and removed.action == "remove"
    assert removed.reason == "t-3 idle for 6 intervals (busy 0% of the last)"
    load.remove_thread()
    idle_at_min = [scaler.observe(load.step(0.0, 0, 0), load.now) for _ in range(10)]
    assert idle_at_min == [None] * 10, "never below processing.threads.min"

    below = Autoscaler(AutoscalePolicy(min_threads=2, max_threads=4))
    decision = below.observe(Load(1).snapshot(), 0.0)
    assert decision is not None and decision.action == "add" and "below" in decision.reason
    above = Autoscaler(AutoscalePolicy(min_threads=1, max_threads=2))
    decision = above.observe(Load(3).snapshot(), 0.0)
    assert decision is not None and decision.action == "remove" and "above" in decision.reason
    rebalancing = Autoscaler(AutoscalePolicy(min_threads=2, max_threads=4))
    assert rebalancing.observe(Load(1).snapshot(state="REBALANCING"), 0.0) is None


def test_autoscale_keys() -> None:
    c = StreamsConfig.from_dict(REQUIRED)
    assert (c.processing_threads_autoscale, c.processing_threads_min) == (False, 1)
    assert c.processing_threads_max == 8
    c = load_config(
        sets=["processing.threads.autoscale=true", "processing.threads.max=3"], base=REQUIRED
    )
    assert c.processing_threads_autoscale and c.processing_threads_max == 3
    from runtime.admin.preflight import DaemonSetupError, preflight

    with pytest.raises(DaemonSetupError, match="processing.threads.min"):
        preflight(c.with_overrides(processing_threads_min=5))


# --- the daemon loop with a fake app (no signals: they belong to the integration tests) ----


class DaemonApp(FakeApp):
    """A started app for `run_daemon`: `wait()` blocks until `finish()` or `close()`."""

    def __init__(self, socket_path: Path, close_ok: bool = True) -> None:
        super().__init__()
        self.config = StreamsConfig.from_dict(
            {**REQUIRED, "admin.socket": str(socket_path), "metrics.port": 0}
        )
        self._done = threading.Event()
        self._close_ok = close_ok
        self.closed = 0

    def wait(self, timeout: float | None = None) -> bool:
        return self._done.wait(timeout)

    def close(self, timeout: float | None = None) -> bool:
        self.closed += 1
        if not self._close_ok:
            return False
        self.finish("NOT_RUNNING")
        return True

    def finish(self, state: str) -> None:
        self.state = state
        self._done.set()


class _Helper(threading.Thread):
    """Runs `action` once; keeps what it raised (`error`) and then calls
    `give_up`, so a daemon waiting for the helper's command ends instead of
    hanging the test."""

    def __init__(self, action: Any, give_up: Any = None) -> None:
        super().__init__(daemon=True)
        self._action, self._give_up = action, give_up
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            self._action()
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            self.error = exc
            if self._give_up is not None:
                self._give_up()


def _in_background(action: Any, give_up: Any = None) -> _Helper:
    helper = _Helper(action, give_up)
    helper.start()
    return helper


def _when_listening(path: Path, action: Any) -> Any:
    """`action` once the daemon accepts connections on `path` (the file alone
    is not enough: a socket bound but not yet listening refuses). The daemon
    starts in the test's thread; on a loaded machine that can take seconds."""

    def accepting() -> bool:
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.connect(str(path))
        except OSError:
            return False
        finally:
            probe.close()
        return True

    def run() -> None:
        wait_until(accepting, 60, interval=0.025, message=f"nothing listened on {path}")
        action()

    return run


def test_daemon_shutdown_command_exits_0_and_cleans_up(sock_path: Path) -> None:
    from runtime.admin.daemon import run_daemon

    app = DaemonApp(sock_path)
    seen: dict[str, Any] = {}

    def operate() -> None:
        status = admin_client.request(str(sock_path), "status")
        seen["metrics"] = status["daemon"]["metrics"]
        admin_client.request(str(sock_path), "shutdown")

    helper = _in_background(_when_listening(sock_path, operate), lambda: app.finish("ERROR"))
    code = run_daemon(app, install_signals=False)
    helper.join(30)
    assert helper.error is None, helper.error
    assert code == 0
    assert app.closed == 1 and not sock_path.exists()
    assert seen["metrics"]["port"] > 0


def test_daemon_exit_codes_for_error_timeout_and_bad_setup(sock_path: Path) -> None:
    from runtime.admin.daemon import run_daemon

    failing = DaemonApp(sock_path)
    helper = _in_background(
        _when_listening(sock_path, lambda: failing.finish("ERROR")), lambda: failing.finish("ERROR")
    )
    assert run_daemon(failing, install_signals=False) == 1
    helper.join(30)
    assert helper.error is None, helper.error
    assert failing.closed == 0

    stuck = DaemonApp(sock_path, close_ok=False)
    helper = _in_background(
        _when_listening(sock_path, lambda: admin_client.request(str(sock_path), "shutdown")),
        lambda: stuck.finish("ERROR"),
    )
    assert run_daemon(stuck, install_signals=False) == 1  # close() timed out
    helper.join(30)
    assert helper.error is None, helper.error

    sock_path.write_text("in the way")
    blocked = DaemonApp(sock_path)
    assert run_daemon(blocked, install_signals=False) == 2
    assert blocked.closed == 1, "a daemon that cannot set up closes its app"


def test_query_commands_reach_the_app() -> None:
    app = FakeApp()
    handler = AdminHandler(app)
    line = {"command": "query.add", "target": "tests.apps.query_app:topology", "name": "q"}
    assert handler.handle_line(json.dumps({**line, "priority": 3}))["ok"]
    assert handler.handle_line(json.dumps({**line, "name": "p", "isolation": "process"}))["ok"]
    bad = handler.handle_line(json.dumps({**line, "isolation": "fork"}))
    assert not bad["ok"] and "'isolation' must be 'thread' or 'process'" in bad["error"]
    assert handler.handle_line(b'{"command": "query.remove", "name": "q", "reset": true}')["ok"]
    assert handler.handle_line(b'{"command": "query.pause", "name": "q"}')["ok"]
    reply = handler.handle_line(json.dumps({**line, "target": "tests.apps.nothing_here:x"}))
    assert not reply["ok"] and "nothing_here" in reply["error"]
    added = {
        "priority": None,
        "weight": None,
        "max_threads": None,
        "timeout": 60.0,
        "source": "tests.apps.query_app:topology",
        "isolation": None,
    }
    assert app.calls == [
        ("add_query", "q", {**added, "priority": 3}),
        ("add_query", "p", {**added, "isolation": "process"}),
        ("remove_query", "q", True),
        ("pause_query", "q"),
    ]
