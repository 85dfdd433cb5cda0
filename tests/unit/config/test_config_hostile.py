"""Hostile config values (issue 21, point 2 and 3): each is refused before anything
starts, with a `ConfigError` naming the key (exit 2 from `streams-runtime run`), or
accepted as a typed value in range. No broker: the start-up checks never contact one.
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from runtime import cli
from runtime.app import App, AppState
from runtime.config import (
    JAVA_LONG_MAX,
    KEYS,
    MAX_WAIT_MS,
    ConfigError,
    StreamsConfig,
    clamp_wait_s,
)
from runtime.kafka.startup_checks import check_client_properties, check_startup, check_state_dir
from runtime.topology import serdes
from runtime.topology.builder import StreamsBuilder

REQUIRED = {"application.id": "app", "bootstrap.servers": "127.0.0.1:9092"}


def build(extra: dict[str, Any]) -> StreamsConfig:
    return StreamsConfig.from_dict({**REQUIRED, **extra})


def refused(key: str, value: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        build({key: value})
    assert info.value.key == key, info.value
    assert len(str(info.value)) < 600, "error messages stay short whatever the value"
    return info.value


# --- integers ------------------------------------------------------------------------


@pytest.mark.parametrize("key", [k for k, spec in KEYS.items() if spec.kind == "int"])
def test_absurdly_long_integers_are_refused_naming_the_key(key: str) -> None:
    refused(key, "9" * 5000)  # int() alone would raise "Exceeds the limit (4300 digits)"
    refused(key, "-" + "1" * 5000)
    refused(key, 10**5000)  # a typed int (an App dict): its repr would raise too
    error = refused(key, "1" * 20)
    assert "1111" in str(error)


@pytest.mark.parametrize("text", ["５", "1_000", "٣", "1.0", "1e3", "0x10", "", " ", "+", "--1"])
def test_only_ascii_digits_are_integers(text: str) -> None:
    refused("processing.threads", text)


def test_leading_zeros_and_whitespace_are_fine() -> None:
    assert build({"processing.threads": " 0002 "}).processing_threads == 2
    assert build({"poll.ms": "0" * 100 + "5"}).poll_ms == 5


@pytest.mark.parametrize(
    ("key", "good", "bad"),
    [
        ("replication.factor", [1, 3, 32767, -1], [99999, 32768, 0, -2]),
        ("max.poll.records", [1, 1_000_000], [2_000_000, 1_000_001, 0]),
        ("processing.threads", [0, 64], [100000, 65, 1025, -1]),
        ("processing.threads.limit", [1, 1024], [0, 1025]),
        ("metrics.port", [0, 65535], [65536, -1]),
        ("admin.socket.max.connections", [1, 4096], [0, 4097]),
    ],
)
def test_ranges(key: str, good: list[int], bad: list[int]) -> None:
    attr = KEYS[key].attr
    for value in good:
        assert getattr(build({key: str(value)}), attr) == value
    for value in bad:
        refused(key, value)
        refused(key, str(value))


def test_processing_threads_limit_caps_the_thread_keys() -> None:
    c = build({"processing.threads.limit": 4})
    assert c.processing_threads <= 4 and c.processing_threads_max == 4
    for key in ("processing.threads", "processing.threads.min", "processing.threads.max"):
        with pytest.raises(ConfigError, match=r"above processing.threads.limit \(4\)") as info:
            build({"processing.threads.limit": 4, key: 5})
        assert info.value.key == key
    assert build({"processing.threads.limit": 1024, "processing.threads": 1024}).processing_threads


# --- timeouts: Kafka's "infinite" is accepted and clamped ------------------------------


@pytest.mark.parametrize(
    "key", ["shutdown.timeout.ms", "commit.interval.ms", "poll.ms", "task.timeslice.ms"]
)
def test_infinite_timeouts_are_clamped_to_a_wait_python_can_do(key: str) -> None:
    c = build({key: str(JAVA_LONG_MAX)})
    assert getattr(c, KEYS[key].attr) == MAX_WAIT_MS
    assert getattr(build({key: MAX_WAIT_MS - 1}), KEYS[key].attr) == MAX_WAIT_MS - 1
    refused(key, JAVA_LONG_MAX + 1)
    refused(key, str(JAVA_LONG_MAX + 1))


def test_state_cleanup_delay_is_not_a_wait_and_is_kept() -> None:
    assert build({"state.cleanup.delay.ms": JAVA_LONG_MAX}).state_cleanup_delay_ms == JAVA_LONG_MAX


def test_clamped_waits_are_accepted_by_python_waits() -> None:
    longest = clamp_wait_s(JAVA_LONG_MAX / 1000)
    assert longest == MAX_WAIT_MS / 1000 <= threading.TIMEOUT_MAX
    assert clamp_wait_s(-5) == 0.0 and clamp_wait_s(1.5) == 1.5
    with pytest.raises(ValueError):
        clamp_wait_s(float("nan"))
    # The waits the runtime makes with a timeout (Event.wait, Thread.join: a lock
    # acquire underneath), on a thread that is still running: no OverflowError.
    release = threading.Event()
    worker = threading.Thread(target=release.wait, args=(5,))
    worker.start()
    threading.Timer(0.05, release.set).start()
    worker.join(longest)
    assert not worker.is_alive()
    held = threading.Lock()
    held.acquire()
    threading.Timer(0.05, held.release).start()
    assert held.acquire(timeout=longest)
    with pytest.raises(OverflowError):  # what an unclamped "infinite" did (issue 21)
        threading.Lock().acquire(timeout=JAVA_LONG_MAX / 1000)


# --- hosts, ports, names ----------------------------------------------------------------


@pytest.mark.parametrize(
    "host",
    ["127.0.0.1", "0.0.0.0", "::", "::1", "localhost", "a" * 63, "metrics.example.com.",
     "bücher.example", "host_1", ".".join(["a" * 60] * 4)],
)  # fmt: skip
def test_metrics_host_accepts_addresses_and_names(host: str) -> None:
    assert build({"metrics.host": host}).metrics_host == host


@pytest.mark.parametrize(
    "host",
    ["a" * 64, "x." + "a" * 64, "", " ", "a..b", "exa mple", "[::1]", "256.1.1.1", "1.2.3",
     "-a.example", "a" * 254, "\u0000", "h\u0000st", "a/b", "host:80", "\ud800"],
)  # fmt: skip
def test_metrics_host_refuses_what_no_resolver_takes(host: str) -> None:
    refused("metrics.host", host)


@pytest.mark.parametrize(
    "servers",
    ["127.0.0.1:9092", "a:1,b:2", "a:1, b:2 ", "[::1]:9092", "SSL://broker:9093",
     "sasl_ssl://b:1,PLAINTEXT://c:2", "kafka-0.kafka:9092"],
)  # fmt: skip
def test_bootstrap_servers_accepted(servers: str) -> None:
    assert build({"bootstrap.servers": servers}).bootstrap_servers == servers


@pytest.mark.parametrize(
    "servers",
    ["127.0.0.1:notaport", "host", "host:0", "host:65536", ":9092", "a:1,,b:2", "a:1,",
     "::1:9092", "[::1]", "[nope]:1", "ftp://h:1", "h:+1", "h:９０９２", "a" * 64 + ":1",
     "h: 1"],
)  # fmt: skip
def test_bootstrap_servers_refused(servers: str) -> None:
    refused("bootstrap.servers", servers)


def test_names_that_are_paths_or_too_long() -> None:
    for value in (".", "..", "a" * 201):
        refused("application.id", value)
    refused("errors.dead.letter.queue.topic.name", "..")
    refused("client.id", "line\nbreak")
    refused("state.dir", "/tmp/\u0000x")
    refused("admin.socket", "/tmp/" + "s" * 110)
    refused("admin.socket", "\ud800")


def test_passthrough_values_must_be_scalars() -> None:
    for value in ([1], {"a": 1}, 10**30, float("inf"), "a\u0000b"):
        with pytest.raises(ConfigError) as info:
            build({"consumer.session.timeout.ms": value})
        assert info.value.key == "consumer.session.timeout.ms"
    with pytest.raises(ConfigError) as info:
        build({"producer.bootstrap.servers": "127.0.0.1:notaport"})
    assert info.value.key == "producer.bootstrap.servers"


def test_the_consumer_group_id_is_the_runtimes() -> None:
    """confluent-kafka aborts the process (SIGABRT) for an empty group.id; and the
    group is application.id in any case."""
    for key in ("consumer.group.id", "restore.consumer.group.id"):
        for value in ("", " ", "other-group", None):
            with pytest.raises(ConfigError, match="set by the runtime") as info:
                build({key: value})
            assert info.value.key == key


# --- serdes: names resolve to serde objects only ----------------------------------------


class MySerde:
    def serialize(self, obj: Any) -> bytes | None:
        return obj

    def deserialize(self, data: bytes | None) -> Any:
        return data


CALLED: list[str] = []


def factory() -> MySerde:
    CALLED.append("factory")
    return MySerde()


@pytest.mark.parametrize(
    "name",
    ["sys:exit", "os:_exit", "os:system", "builtins:exit", "builtins:quit", "builtins:input",
     f"{__name__}:factory", "builtins:object", "builtins:type", "sys:argv", "os:system.x",
     "no_such_module_xyz:thing", "sys", ":exit", "sys:", "a b:c", "x" * 2000],
)  # fmt: skip
def test_serde_names_never_call_anything_but_serde_classes(name: str) -> None:
    for key in ("default.key.serde", "default.value.serde"):
        refused(key, name)
    assert CALLED == []


def test_serde_class_and_object_names_resolve() -> None:
    assert isinstance(
        build({"default.key.serde": f"{__name__}:MySerde"}).default_key_serde, MySerde
    )
    assert build({"default.value.serde": "runtime.topology.serdes:JSON"}).default_value_serde is (
        serdes.JSON
    )


# --- start-up checks: state.dir and librdkafka properties, offline ----------------------


def test_state_dir_must_be_creatable_and_writable(tmp_path: Path) -> None:
    check_state_dir(str(tmp_path / "new" / "sub"))
    assert (tmp_path / "new" / "sub").is_dir()
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for bad in ("/dev/null/sub", str(a_file), str(a_file / "sub")):
        with pytest.raises(ConfigError) as info:
            check_state_dir(bad)
        # A long path is shortened in the message (one readable line): its start stays.
        assert info.value.key == "state.dir" and bad[:40] in str(info.value)


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("consumer.no.such.property", "1"),
        ("consumer.session.timeout.ms", "abc"),
        ("consumer.max.poll.interval.ms", "10"),  # below session.timeout.ms: a combination
        ("producer.acks", "2"),  # the runtime's idempotent producer needs acks=all
        ("producer.compression.type", "zip"),
        ("restore.consumer.fetch.max.bytes", "-1"),
        ("admin.socket.timeout.ms", "soon"),
        ("admin.nonsense", "1"),
    ],
)
def test_client_properties_checked_offline_naming_the_key(key: str, value: str) -> None:
    # Nothing listens at 127.0.0.1:1: a check that needed a broker would fail
    # with a connection error, not with librdkafka's verdict on the value.
    config = build({"bootstrap.servers": "127.0.0.1:1", key: value})
    with pytest.raises(ConfigError) as info:
        check_client_properties(config)
    assert info.value.key == key, info.value
    assert "librdkafka refused" in info.value.reason


def test_good_client_properties_pass_under_both_guarantees() -> None:
    for guarantee in ("at_least_once", "exactly_once_v2"):
        check_client_properties(
            build(
                {
                    "processing.guarantee": guarantee,
                    "consumer.session.timeout.ms": 6000,
                    "producer.linger.ms": "20",
                    "restore.consumer.fetch.max.bytes": 1048576,
                    "admin.socket.timeout.ms": 30000,
                }
            )
        )


def _stateful_topology() -> Any:
    builder = StreamsBuilder()
    builder.stream("in").group_by_key().count(store="counts")
    return builder.build()


def test_app_start_refuses_an_unwritable_state_dir_before_any_thread(tmp_path: Path) -> None:
    app = App(_stateful_topology(), {**REQUIRED, "state.dir": "/dev/null/sub"})
    before = {t.ident for t in threading.enumerate()}
    with pytest.raises(ConfigError) as info:
        app.start()
    assert info.value.key == "state.dir"
    assert app.state is AppState.CREATED
    assert {t.ident for t in threading.enumerate()} <= before
    # A stateless at-least-once app never writes there: not checked.
    check_startup(build({"state.dir": "/dev/null/sub"}), uses_state_dir=False)


# --- the command: exit 2 naming the key, never a traceback, never exit 0 -------------------


@pytest.mark.parametrize(
    ("setting", "named"),
    [
        ("processing.threads=" + "9" * 5000, "processing.threads"),
        ("replication.factor=99999", "replication.factor"),
        ("metrics.host=" + "a" * 64, "metrics.host"),
        ("consumer.no.such.property=1", "consumer.no.such.property"),
        ("producer.acks=1", "producer.acks"),
        ("restore.consumer.session.timeout.ms=x", "restore.consumer.session.timeout.ms"),
        ("admin.retries=-5", "admin.retries"),
        ("max.poll.records=2000000", "max.poll.records"),
        ("default.key.serde=sys:exit", "default.key.serde"),
        ("bootstrap.servers=127.0.0.1:notaport", "bootstrap.servers"),
        ("processing.threads=５", "processing.threads"),
        ("processing.threads=100000", "processing.threads"),
        ("shutdown.timeout.ms=99999999999999999999", "shutdown.timeout.ms"),
    ],
)
def test_run_exits_2_naming_the_key(
    setting: str, named: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("STREAMS_TEST_INPUT", "in")
    monkeypatch.setenv("STREAMS_TEST_OUTPUT", "out")
    for variable in [v for v in __import__("os").environ if v.startswith("STREAMS_RUNTIME_")]:
        monkeypatch.delenv(variable)
    argv = ["run", "tests.apps.passthrough:topology", "--set", "application.id=hostile"]
    argv += ["--set", "bootstrap.servers=127.0.0.1:1", "--set", f"state.dir={tmp_path}"]
    code = cli.main([*argv, "--set", setting])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"config key '{named}'" in err, err
    assert "Traceback" not in err


def test_run_exits_2_for_a_state_dir_it_would_use(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("STREAMS_TEST_INPUT", "in")
    monkeypatch.setenv("STREAMS_TEST_OUTPUT", "out")
    argv = ["run", "tests.apps.passthrough:topology", "--set", "application.id=hostile"]
    argv += ["--set", "bootstrap.servers=127.0.0.1:1", "--set", "state.dir=/dev/null/sub"]
    argv += ["--set", "processing.guarantee=exactly_once_v2"]  # keeps its transactional id there
    assert cli.main(argv) == 2
    assert "config key 'state.dir'" in capsys.readouterr().err
    assert sys.exc_info() == (None, None, None)
