"""Issue 32, a user's first day, without a broker: failure messages that name
the record, the serde or processor and the ways out; MODULE:ATTR errors that
say what was meant (and file paths that work); unprefixed client properties
that say which prefix they need; no processing threads said out loud; the
default admin socket's path, and finding it.

The same on a real broker: tests/integration/test_first_day.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import stat
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Message

from runtime import Processor, PunctuationType, Record, StreamsBuilder, cli, serdes
from runtime.admin import client as admin_client
from runtime.admin import paths
from runtime.admin.handler import AdminHandler
from runtime.admin.preflight import preflight
from runtime.admin.protocol import Request
from runtime.admin.server import AdminServer
from runtime.app_status import with_thread_warning
from runtime.config import ConfigError, StreamsConfig, load_config
from runtime.kafka.startup_checks import check_client_properties, check_startup
from runtime.librdkafka_properties import librdkafka_role
from runtime.processing.errors import ErrorPolicy, TaskFailedError, preview
from runtime.processing.task import StreamTask
from runtime.processing.task_settings import TaskSettings
from runtime.status import NO_PROCESSING_THREADS, AppStatus
from runtime.topology.loading import load_topology
from runtime.topology.topology import Topology

# This file as the failure line names it (relative to the working directory).
HERE = os.path.relpath(__file__)

REQUIRED = {"application.id": "first-day", "bootstrap.servers": "127.0.0.1:1"}
FAIL = ErrorPolicy("log_and_fail", "log_and_fail", None)


# --- failure messages -----------------------------------------------------------------------


def _task(topology: Topology, tmp_path: Path, policy: ErrorPolicy = FAIL) -> StreamTask:
    settings = TaskSettings(
        "app", serdes.BYTES, serdes.BYTES, policy, {"in": 1, "out": 1}, str(tmp_path), None
    )
    return StreamTask(topology.subtopologies[0], 0, ["in"], settings)


def _fail(task: StreamTask, *records: tuple[bytes | None, bytes | None]) -> TaskFailedError:
    for offset, (key, value) in enumerate(records):
        message = Message(
            topic="in", partition=0, offset=offset, key=key, value=value, timestamp=(1, 5)
        )
        task.queues["in"].records.append(message)
    with pytest.raises(TaskFailedError) as info:
        task.process(float("inf"))
    return info.value


def _json_values() -> Topology:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.JSON).to(
        "out", key_serde=serdes.STRING, value_serde=serdes.JSON
    )
    return builder.build()


def test_a_bad_record_names_itself_the_serde_and_the_ways_out(tmp_path: Path) -> None:
    """Before: `task 0_0 failed in deserialization: JSONDecodeError: Expecting
    value: line 1 column 1 (char 0)`, no record, no fix."""
    failure = _fail(_task(_json_values(), tmp_path), (b"k", b'{"a": 1}'), (b"k", b"not json\n"))
    failure.explain(FAIL)
    text = str(failure)
    assert text.startswith(
        "task 0_0 failed in deserialization: record in[0]@1 (key b'k', value b'not json\\n'): "
        "value serde serdes.JSON (given in the topology): JSONDecodeError: Expecting value"
    ), text
    assert "deserialization.exception.handler=log_and_continue" in text
    assert "dead_letter_queue" in text and "errors.dead.letter.queue.topic.name" in text
    assert "fix what produces 'in'" in text
    assert "\n" not in text
    assert failure.record is not None and failure.record.origin == "in[0]@1"


def test_the_key_serde_is_named_when_the_key_is_bad(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=serdes.INT64, value_serde=serdes.STRING).to("out")
    failure = _fail(_task(builder.build(), tmp_path), (b"abc", b"fine"))
    assert "key serde serdes.INT64 (given in the topology)" in str(failure), failure


def test_a_default_serde_says_where_it_comes_from_and_a_dead_letter_topic_is_named(
    tmp_path: Path,
) -> None:
    builder = StreamsBuilder()
    builder.stream("in").to("out")
    policy = ErrorPolicy("log_and_fail", "log_and_fail", "app-dlq")
    settings = TaskSettings(
        "app", serdes.BYTES, serdes.JSON, policy, {"in": 1, "out": 1, "app-dlq": 1}, str(tmp_path),
        None,
    )  # fmt: skip
    task = StreamTask(builder.build().subtopologies[0], 0, ["in"], settings)
    failure = _fail(task, (None, b"\x00\xff" * 40))
    failure.explain(policy)
    text = str(failure)
    assert "key null" in text
    assert "value b'\\x00\\xff" in text and "... (80 bytes)" in text
    assert "value serde serdes.JSON (default.value.serde)" in text
    assert "written to dead-letter topic 'app-dlq'" in text


def test_a_processing_failure_names_the_processor_the_record_and_the_users_line(
    tmp_path: Path,
) -> None:
    builder = StreamsBuilder()
    builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.JSON).map_values(
        lambda v: 1 / v["n"]
    ).to("out", key_serde=serdes.STRING, value_serde=serdes.JSON)
    failure = _fail(_task(builder.build(), tmp_path), (b"k", b'{"n": 0}'))
    text = str(failure)
    assert text.startswith(
        "task 0_0 failed in processing: record in[0]@0 (key b'k', value b'{\"n\": 0}'): "
        f"processor 'KSTREAM-MAPVALUES-0000000001' ({HERE}:"
    ), text
    assert "in <lambda>): ZeroDivisionError: division by zero" in text
    assert "processing.exception.handler=log_and_continue" in text
    assert text.endswith("or fix the processor")


class Beats(Processor):
    def init(self, context: Any) -> None:
        context.schedule(1, PunctuationType.WALL_CLOCK_TIME, self.beat)

    def process(self, record: Record) -> None:
        raise ValueError("not this one")

    def beat(self, timestamp: int) -> None:
        raise ValueError("no beat")


def test_a_punctuation_failure_names_the_punctuation(tmp_path: Path) -> None:
    builder = StreamsBuilder()
    builder.stream("in").process(Beats)
    task = _task(builder.build(), tmp_path)
    import time

    time.sleep(0.01)
    failure = _fail(task)
    text = str(failure)
    assert f"punctuation Beats.beat ({HERE}:" in text, text
    assert "ValueError: no beat" in text
    assert "a punctuation that raises stops the app" in text


def test_a_topology_serde_mistake_keeps_its_own_message(tmp_path: Path) -> None:
    """A sink serde refusing a Python type is the topology's mistake (issue
    20's message names the sink and the fix): no record, no handler advice."""
    builder = StreamsBuilder()
    builder.stream("in").map_values(lambda v: {"v": 1}).to("out")
    failure = _fail(_task(builder.build(), tmp_path), (b"k", b"v"))
    text = str(failure)
    assert text.startswith("task 0_0 failed in processing: SerializationError: sink"), text
    assert text.endswith("or --set default.value.serde=json"), text


def test_an_error_outside_the_handlers_keeps_the_plain_message() -> None:
    failure = TaskFailedError("0_0", "processing", ValueError("boom"))
    assert str(failure) == "task 0_0 failed in processing: ValueError: boom"
    assert failure.record is None


def test_a_bug_caught_outside_the_record_loop_names_no_record() -> None:
    """A processing thread wraps a bug outside the handlers: the frames below
    it may hold the last record, which did not fail."""

    def record_loop() -> None:
        message = Message(topic="in", partition=0, offset=3, key=b"k", value=b"v")
        assert message.offset() == 3
        raise ValueError("a bug after the record")

    try:
        record_loop()
    except ValueError as exc:
        failure = TaskFailedError("0_0", "processing", exc)
    assert failure.record is None
    assert str(failure) == "task 0_0 failed in processing: ValueError: a bug after the record"


def test_preview_is_short_and_escaped() -> None:
    assert preview(None) == "null"
    assert preview(b"a\nb") == "b'a\\nb'"
    long = preview(b"x" * 1000)
    assert long.endswith("... (1000 bytes)") and len(long) < 80


# --- MODULE:ATTR ----------------------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """A user's directory with wordsplit.py (importing a module beside it),
    the working directory of the test."""
    app = tmp_path / "proj"
    (app / "sub").mkdir(parents=True)
    source = textwrap.dedent(
        """
        import helper_first_day
        from runtime import StreamsBuilder

        builder = StreamsBuilder()
        builder.stream("in").to("out")
        topology = builder.build()
        """
    )
    (app / "wordsplit_fd.py").write_text(source)
    (app / "helper_first_day.py").write_text("X = 1\n")
    (app / "sub" / "other_fd.py").write_text(source)
    (app / "sub" / "helper_first_day.py").write_text("X = 2\n")
    monkeypatch.chdir(app)
    monkeypatch.setattr(sys, "path", list(sys.path))
    for name in ("wordsplit_fd", "other_fd", "helper_first_day"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    yield app
    for name in ("wordsplit_fd", "other_fd", "helper_first_day"):
        sys.modules.pop(name, None)


def test_a_misspelt_attribute_gets_a_did_you_mean(project: Path) -> None:
    with pytest.raises(ValueError) as info:
        load_topology("wordsplit_fd:topolgy")
    assert str(info.value) == (
        "module 'wordsplit_fd' has no attribute 'topolgy' (did you mean 'topology'?)"
    )
    with pytest.raises(ValueError, match=r"no attribute 'zzz' \(it has: topology\)"):
        load_topology("wordsplit_fd:zzz")


def test_a_misspelt_module_names_the_working_directory_and_a_close_file(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    with pytest.raises(ValueError) as info:
        load_topology("wordsplt_fd:topology")
    text = str(info.value)
    assert text.startswith("cannot import 'wordsplt_fd': No module named 'wordsplt_fd'")
    assert f"the working directory {project}" in text
    assert "PYTHONPATH=/somewhere" in text
    assert "did you mean 'wordsplit_fd'?" in text


def test_a_missing_import_of_the_module_is_told_apart(project: Path) -> None:
    (project / "broken_fd.py").write_text("import no_such_dependency_fd\n")
    with pytest.raises(ValueError) as info:
        load_topology("broken_fd:topology")
    assert "No module named 'no_such_dependency_fd'" in str(info.value)
    assert "imported by 'broken_fd': install it" in str(info.value)
    sys.modules.pop("broken_fd", None)


@pytest.mark.parametrize(
    "target", ["./wordsplit_fd.py:topology", "wordsplit_fd.py:topology", "./wordsplit_fd:topology"]
)
def test_a_file_path_works(project: Path, target: str) -> None:
    assert load_topology(target).subtopologies
    assert sys.modules["helper_first_day"].X == 1


def test_a_file_elsewhere_imports_its_own_neighbours(project: Path) -> None:
    assert load_topology("sub/other_fd.py:topology").subtopologies
    assert sys.path[0] == str(project / "sub")
    assert sys.modules["helper_first_day"].X == 2  # sub/'s, not the working directory's


def test_file_paths_that_cannot_work_say_why(project: Path) -> None:
    with pytest.raises(ValueError, match=r"no such file './nope\.py'.*e\.g\. nope:topology"):
        load_topology("./nope.py:topology")
    (project / "shadow").mkdir()
    (project / "shadow" / "json.py").write_text("topology = None\n")
    with pytest.raises(ValueError, match="would be imported as 'json'.*rename the file"):
        load_topology("shadow/json.py:topology")
    (project / "my-app.py").write_text("topology = None\n")
    with pytest.raises(ValueError, match="not a Python module name"):
        load_topology("my-app.py:topology")
    with pytest.raises(ValueError, match=r"expected MODULE:ATTR \(e\.g\. wordsplit_fd:topology\)"):
        load_topology("wordsplit_fd.py")


# --- client properties ----------------------------------------------------------------------


def test_librdkafka_says_which_client_a_property_is_for() -> None:
    assert librdkafka_role("auto.offset.reset", "earliest") == "consumer"
    assert librdkafka_role("linger.ms", "5") == "producer"
    assert librdkafka_role("socket.timeout.ms", "1000") == "any"
    assert librdkafka_role("no.such.property") is None
    # A value librdkafka refuses: common ones are tried to ask.
    assert librdkafka_role("auto.offset.reset", "earlist") == "consumer"


@pytest.mark.parametrize(
    ("key", "wanted"),
    [
        ("auto.offset.reset=earliest", "did you mean 'consumer.auto.offset.reset'?"),
        ("auto.ofset.reset=earliest", "did you mean 'consumer.auto.offset.reset'?"),
        ("fetch.min.bytes=1", "did you mean 'consumer.fetch.min.bytes'?"),
        ("linger.ms=5", "did you mean 'producer.linger.ms'?"),
        ("socket.timeout.ms=1000", "'consumer.socket.timeout.ms' and 'producer.socket"),
        ("processing.thread=2", "did you mean 'processing.threads'?"),
    ],
)
def test_an_unprefixed_client_property_says_its_prefix(key: str, wanted: str) -> None:
    """Before: `unknown key; client properties need a prefix ...`, and
    `fetch.min.bytes` was offered 'cache.max.bytes'."""
    with pytest.raises(ConfigError) as info:
        load_config(sets=["application.id=a", "bootstrap.servers=b:1", key], env={})
    assert info.value.key == key.partition("=")[0]
    assert wanted in str(info.value), info.value
    assert "cache.max.bytes" not in str(info.value)


@pytest.mark.parametrize(
    ("key", "wanted"),
    [
        ("producer.auto.offset.reset", "the producer ignores it. Did you mean 'consumer.auto"),
        ("admin.auto.offset.reset", "the admin client ignores it"),
        ("consumer.linger.ms", "the consumer ignores it. Did you mean 'producer.linger.ms'?"),
        ("restore.consumer.linger.ms", "the restore consumer ignores it"),
    ],
)
def test_a_property_for_another_client_is_refused_with_the_right_prefix(
    key: str, wanted: str
) -> None:
    value = "earliest" if key.endswith("reset") else "5"
    config = StreamsConfig.from_dict({**REQUIRED, key: value})
    with pytest.raises(ConfigError) as info:
        check_client_properties(config)
    assert info.value.key == key
    assert wanted in str(info.value), info.value


def test_a_refused_value_names_the_property_and_the_values_it_takes() -> None:
    """Before: `librdkafka refused 'earlist': ...`, the value alone."""
    config = StreamsConfig.from_dict({**REQUIRED, "consumer.auto.offset.reset": "earlist"})
    with pytest.raises(ConfigError) as info:
        check_client_properties(config)
    assert info.value.reason.startswith(
        "librdkafka refused consumer.auto.offset.reset='earlist': Invalid value"
    ), info.value
    assert "(did you mean 'earliest'?)" in info.value.reason


def test_good_prefixed_properties_still_pass() -> None:
    config = StreamsConfig.from_dict(
        {
            **REQUIRED,
            "consumer.auto.offset.reset": "earliest",
            "producer.linger.ms": 5,
            "restore.consumer.fetch.min.bytes": 1,
            "admin.socket.timeout.ms": 5000,
        }
    )
    check_client_properties(config)


# --- no processing threads ------------------------------------------------------------------


def _status(state: str, waiting: str | None = None) -> AppStatus:
    return AppStatus.from_dict(
        {"state": state, "waiting_for": waiting, "startup_phase": "processing", "threads": []}
    )


def test_no_processing_threads_is_said_in_the_status_and_admin_status() -> None:
    status = with_thread_warning(_status("RUNNING"), [])
    assert status.waiting_for == NO_PROCESSING_THREADS
    text = admin_client.format_status(status.to_dict(), now=0.0)
    assert "waiting for  no processing threads: input is read but not processed" in text
    assert "(processing, since" not in text
    assert with_thread_warning(_status("RUNNING"), ["t1"]).waiting_for is None
    assert with_thread_warning(_status("ERROR"), []).waiting_for is None
    start_up = with_thread_warning(_status("REBALANCING", "the consumer group"), [])
    assert start_up.waiting_for == "the consumer group"  # start-up's own says more


class ThreadsApp:
    state = "RUNNING"

    def __init__(self) -> None:
        self.names = ["t1"]

    @property
    def processing_threads(self) -> list[str]:
        return list(self.names)

    def set_processing_threads(self, count: int, timeout: float | None = None) -> list[str]:
        self.names = [f"t{i}" for i in range(1, count + 1)]
        return list(self.names)

    def remove_processing_thread(self, timeout: float | None = None) -> str | None:
        return self.names.pop() if self.names else None


def test_threads_set_0_replies_with_a_warning() -> None:
    handler = AdminHandler(ThreadsApp())  # type: ignore[arg-type]
    reply = handler.handle(Request("threads.set", {"count": 0}))
    assert reply == {"names": [], "warning": NO_PROCESSING_THREADS}
    assert "warning" not in handler.handle(Request("threads.set", {"count": 2}))
    handler.handle(Request("threads.remove", {}))
    assert handler.handle(Request("threads.remove", {}))["warning"] == NO_PROCESSING_THREADS


# --- the default admin socket ---------------------------------------------------------------


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    # Short: pytest's tmp_path can be near AF_UNIX's 107 bytes by itself.
    with tempfile.TemporaryDirectory(prefix="fd") as d:
        yield Path(d)


@pytest.fixture
def dirs(short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Two candidate directories of our own instead of the machine's (where
    other daemons may answer), for daemon and client alike."""
    candidates = [str(short_tmp / "first"), str(short_tmp / "second")]
    monkeypatch.setattr(paths, "socket_dirs", lambda env=None: list(candidates))
    return candidates


def test_socket_directories_in_order_of_preference(short_tmp: Path) -> None:
    uid = os.getuid()
    found = paths.socket_dirs({"XDG_RUNTIME_DIR": str(short_tmp)})
    assert found[0] == f"{short_tmp}/streams-runtime"
    assert f"{tempfile.gettempdir()}/streams-runtime-{uid}" == found[1]
    assert found[-1] == f"/tmp/streams-runtime-{uid}"
    assert paths.socket_dirs({"XDG_RUNTIME_DIR": "relative"})[0] == found[1]


def test_default_socket_goes_in_a_private_directory(dirs: list[str]) -> None:
    path = paths.choose_default_socket("wordsplit")
    assert path == f"{dirs[0]}/wordsplit.sock"
    assert stat.S_IMODE(os.stat(dirs[0]).st_mode) == 0o700


def test_a_directory_others_may_enter_is_not_used(dirs: list[str]) -> None:
    os.mkdir(dirs[0])
    os.chmod(dirs[0], 0o777)
    assert paths.choose_default_socket("wordsplit") == f"{dirs[1]}/wordsplit.sock"


def test_a_long_application_id_is_cut_and_hashed_within_the_unix_limit(dirs: list[str]) -> None:
    long_id = "a" * 200
    path = paths.choose_default_socket(long_id)
    assert len(os.fsencode(path)) <= 107 - len("+1234567")
    assert "~" in os.path.basename(path)
    assert paths.choose_default_socket("a" * 199 + "b") != path, "same start, other name"


def _listen(path: str) -> socket.socket:
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(path)
    server.listen()
    return server


def test_a_second_daemon_of_the_application_adds_its_pid(dirs: list[str]) -> None:
    first = paths.choose_default_socket("wordsplit")
    with _listen(first):
        second = paths.choose_default_socket("wordsplit", pid=4242)
        assert second == f"{dirs[0]}/wordsplit+4242.sock"
        several = pytest.raises(paths.DefaultSocketError, match="several daemons of 'wordsplit'")
        with _listen(second), several:
            paths.find_default_socket("wordsplit")
        assert paths.find_default_socket("wordsplit") == first


def test_the_client_finds_the_only_daemon_or_the_one_of_its_application(dirs: list[str]) -> None:
    with pytest.raises(paths.DefaultSocketError, match="no daemon of any application answers"):
        paths.find_default_socket(None)
    # The name of one application is never taken for another's (`wordsplit-2`).
    a = paths.choose_default_socket("wordsplit")
    b = paths.choose_default_socket("wordsplit-2")
    with _listen(a):
        assert paths.find_default_socket(None) == a
        with _listen(b):
            assert paths.find_default_socket("wordsplit") == a
            assert paths.find_default_socket("wordsplit-2") == b
            with pytest.raises(paths.DefaultSocketError, match="--application-id"):
                paths.find_default_socket(None)
    with pytest.raises(paths.DefaultSocketError, match="2 left by daemons that are gone"):
        paths.find_default_socket(None)


def test_the_first_directory_with_a_daemon_decides(dirs: list[str]) -> None:
    """A daemon in a later directory (another $TMPDIR) does not make the
    answer ambiguous for the one in the directory this client would use."""
    os.makedirs(dirs[1], mode=0o700)
    mine = paths.choose_default_socket("mine")
    theirs = f"{dirs[1]}/theirs.sock"
    with _listen(mine), _listen(theirs):
        assert paths.find_default_socket(None) == mine
    os.unlink(theirs)
    with _listen(theirs):
        assert paths.find_default_socket(None) == theirs


def test_admin_socket_off_and_unset() -> None:
    for off in ("", "none", "NONE"):
        config = load_config(sets=["admin.socket=" + off], base=REQUIRED, env={})
        assert config.admin_socket == ""
        assert preflight(config) is None
    unset = StreamsConfig.from_dict(REQUIRED)
    assert unset.admin_socket is None
    check_startup(unset, uses_state_dir=False)  # an embedded App makes no directory


def test_preflight_chooses_the_default_socket(dirs: list[str]) -> None:
    path = preflight(StreamsConfig.from_dict(REQUIRED))
    assert path == f"{dirs[0]}/first-day.sock"
    explicit = preflight(StreamsConfig.from_dict({**REQUIRED, "admin.socket": "a.sock"}))
    assert explicit == os.path.abspath("a.sock")


def test_admin_command_finds_the_default_socket(
    dirs: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv(admin_client.SOCKET_ENV, raising=False)
    monkeypatch.delenv(admin_client.APPLICATION_ID_ENV, raising=False)
    path = paths.choose_default_socket("first-day")
    app = ThreadsApp()
    server = AdminServer(path, AdminHandler(app, shutdown=lambda: None))  # type: ignore[arg-type]
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(server.start(), loop).result(5)
    try:
        assert cli.main(["admin", "threads", "set", "0"]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == "threads: none"
        assert f"streams-runtime admin: warning: {NO_PROCESSING_THREADS}" in err
        assert cli.main(["admin", "--application-id", "first-day", "threads", "set", "1"]) == 0
        out, err = capsys.readouterr()
        assert out.strip() == "threads: t1" and "warning" not in err
        assert cli.main(["admin", "--application-id", "other", "threads"]) == 2
        assert "no daemon of application 'other'" in capsys.readouterr().err
        for off in ("none", ""):  # as the daemon reads the variable: no socket
            monkeypatch.setenv(admin_client.SOCKET_ENV, off)
            assert cli.main(["admin", "threads"]) == 2
            assert "admin.socket is off" in capsys.readouterr().err
    finally:
        asyncio.run_coroutine_threadsafe(server.stop(), loop).result(5)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()
