"""Tests for runtime.config: defaults, coercion, validation, routing, loading."""

from __future__ import annotations

import os
import pickle
import tempfile
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime import config as config_module
from runtime.config import (
    KEYS,
    MAX_WAIT_MS,
    ConfigError,
    ConfigKey,
    StreamsConfig,
    config_table_markdown,
    load_config,
)
from runtime.config_values import Invalid
from runtime.topology import serdes

REQUIRED = {"application.id": "app", "bootstrap.servers": "127.0.0.1:9092"}


def build(extra: dict[str, Any]) -> StreamsConfig:
    return StreamsConfig.from_dict({**REQUIRED, **extra})


class UpperSerde:
    """A user serde, resolved by 'module:attr' in the tests below."""

    def serialize(self, obj: Any) -> bytes | None:
        return None if obj is None else obj.upper().encode()

    def deserialize(self, data: bytes | None) -> Any:
        return None if data is None else data.decode().lower()


UPPER = UpperSerde()
NOT_A_SERDE = object()


# Defaults


def test_defaults() -> None:
    c = build({})
    assert c.application_id == "app"
    assert c.bootstrap_servers == "127.0.0.1:9092"
    assert c.client_id == "app"
    assert c.processing_threads == min(os.cpu_count() or 1, 64)
    assert c.processing_threads_limit == 64
    assert c.processing_guarantee == "at_least_once"
    assert not c.exactly_once
    assert c.commit_interval_ms == 30000
    assert c.buffered_records_per_partition == 5000
    assert c.task_timeslice_ms == 100
    assert c.max_poll_records == 1000
    assert c.poll_ms == 100
    assert c.state_dir == os.path.join(tempfile.gettempdir(), "streams-runtime")
    assert c.default_key_serde is serdes.BYTES
    assert c.default_value_serde is serdes.BYTES
    assert c.deserialization_exception_handler == "log_and_fail"
    assert c.processing_exception_handler == "log_and_fail"
    assert c.dead_letter_queue_topic is None
    assert c.replication_factor == -1
    assert c.log_level == "info"
    assert c.shutdown_timeout_ms == 30000
    assert c.consumer_overrides == {}
    assert c.producer_overrides == {}
    assert c.restore_consumer_overrides == {}
    assert c.admin_overrides == {}


def test_exactly_once_commit_interval_default_is_100() -> None:
    c = build({"processing.guarantee": "exactly_once_v2"})
    assert c.exactly_once
    assert c.commit_interval_ms == 100


def test_explicit_commit_interval_wins_under_exactly_once() -> None:
    c = build({"processing.guarantee": "exactly_once_v2", "commit.interval.ms": 5000})
    assert c.commit_interval_ms == 5000


def test_client_id_given() -> None:
    assert build({"client.id": "me"}).client_id == "me"


def test_none_means_default() -> None:
    assert build({"poll.ms": None}).poll_ms == 100


def test_config_is_frozen() -> None:
    c = build({})
    with pytest.raises(AttributeError):
        c.poll_ms = 5  # type: ignore[misc]


def test_raw_keeps_input() -> None:
    given = {**REQUIRED, "processing.threads": "3", "consumer.fetch.min.bytes": "1"}
    assert StreamsConfig.from_dict(given).raw == given


# Coercion


def test_string_values_are_coerced() -> None:
    c = build(
        {
            "processing.threads": "8",
            "commit.interval.ms": " 250 ",
            "replication.factor": "-1",
            "processing.guarantee": "EXACTLY_ONCE_V2",
            "log.level": "DEBUG",
        }
    )
    assert c.processing_threads == 8
    assert c.commit_interval_ms == 250
    assert c.replication_factor == -1
    assert c.processing_guarantee == "exactly_once_v2"
    assert c.log_level == "debug"


@pytest.mark.parametrize("value", [True, False])
def test_bools_are_not_ints(value: bool) -> None:
    with pytest.raises(ConfigError, match="processing.threads"):
        build({"processing.threads": value})


@pytest.mark.parametrize("value", ["1.5", "abc", "", 2.0, [1]])
def test_non_integers_rejected(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        build({"poll.ms": value})
    assert info.value.key == "poll.ms"
    assert "expected an integer between 0 and 9223372036854775807" in info.value.reason


def test_bool_kind_coercion() -> None:
    key = ConfigKey("x.enabled", "bool", False, "a flag")
    for text in ("true", "True", "yes", "on", "1", True):
        assert key.parse(text) is True
    for text in ("false", "FALSE", "no", "off", "0", False):
        assert key.parse(text) is False
    for bad in ("maybe", 1, 0, None):
        with pytest.raises(Invalid):
            key.parse(bad)


# Validation: every rule fails with the key in the message


def test_error_message_format() -> None:
    with pytest.raises(ConfigError) as info:
        build({"commit.interval.ms": "abc"})
    expected = "expected an integer between 0 and 9223372036854775807, got 'abc'"
    assert str(info.value) == f"config key 'commit.interval.ms': {expected}"
    assert info.value.key == "commit.interval.ms"
    assert info.value.reason == expected
    assert isinstance(info.value, ValueError)


def test_config_error_pickles() -> None:
    err = ConfigError("poll.ms", "bad")
    copy = pickle.loads(pickle.dumps(err))
    assert (copy.key, copy.reason, str(copy)) == ("poll.ms", "bad", str(err))


BAD_VALUES = [
    ("application.id", "has space"),
    ("application.id", ""),
    ("application.id", 42),
    ("bootstrap.servers", ""),
    ("bootstrap.servers", "   "),
    ("client.id", ""),
    ("processing.threads", -1),
    ("processing.guarantee", "exactly_once"),
    ("processing.guarantee", 1),
    ("allow.unsafe.producer.settings", "perhaps"),
    ("commit.interval.ms", -1),
    ("buffered.records.per.partition", 0),
    ("task.timeslice.ms", 0),
    ("gil.switch.interval.us", -1),
    ("num.threads.per.task", 0),
    ("processing.retry.attempts", -1),
    ("processing.retry.backoff.ms", "soon"),
    ("processing.retry.backoff.max.ms", -1),
    ("max.poll.records", 0),
    ("poll.ms", -5),
    ("max.task.idle.ms", -2),
    ("state.dir", ""),
    ("default.key.serde", "nope"),
    ("default.value.serde", 12),
    ("deserialization.exception.handler", "ignore"),
    ("processing.exception.handler", "log_and_retry"),
    ("production.exception.handler", "log_and_skip"),
    ("errors.dead.letter.queue.topic.name", "bad topic"),
    ("errors.dead.letter.queue.topic.name", "x" * 250),
    ("replication.factor", 0),
    ("replication.factor", -2),
    ("topics.create.missing", "perhaps"),
    ("topics.create.partitions", 0),
    ("log.level", "trace"),
    ("shutdown.timeout.ms", "-1"),
    ("cache.max.bytes", "-5"),
    ("num.standby.replicas", "-1"),
    ("task.assignment", "sticky"),
    ("state.store.layout", "per-store"),
    ("acceptable.recovery.lag", "-1"),
    ("max.warmup.replicas", "0"),
    ("state.cleanup.delay.ms", "soon"),
    ("state.rocksdb.memory.bytes", 1 << 20),
    ("state.rocksdb.memory.bytes", "lots"),
    ("state.rocksdb.write.buffer.ratio", "0"),
    ("state.rocksdb.write.buffer.ratio", 0.95),
    ("state.rocksdb.write.buffer.ratio", "nan"),
    ("state.rocksdb.write.buffer.ratio", True),
    ("state.rocksdb.config.setter", "json"),
    ("state.rocksdb.config.setter", "no_such_module_x:setter"),
    ("state.rocksdb.config.setter", "json:decoder"),
    ("state.rocksdb.config.setter", 5),
    ("state.rocksdb.statistics", "maybe"),
    ("state.rocksdb.metrics.interval.ms", 99),
    ("admin.socket", 5),  # "" and "none" turn the socket off (issue 32)
    ("metrics.port", 65536),
    ("metrics.host", ""),
    ("processing.threads.autoscale", "sometimes"),
    ("sched.idle.lower.priorities", "maybe"),
    ("processing.threads.min", -1),
    ("processing.threads.max", 0),
    ("processing.threads.limit", 0),
    ("processes", 0),
    ("processes", "all"),
    ("processes.resizable", "maybe"),
    ("process.restart.backoff.ms", -1),
    ("process.restart.backoff.max.ms", -1),
    ("process.slot", -2),
    ("process.daemon", "a\nb"),
    ("admin.socket.max.connections", 0),
    ("admin.socket.max.buffered.bytes", 1023),
    ("admin.socket.idle.timeout.ms", 0),
    ("metrics.max.connections", 0),
    ("metrics.idle.timeout.ms", 0),
    ("static.partitioner", "json:dumps"),
    ("partition.check.interval.ms", 99),
    ("state.remote.url", "http://bucket/prefix"),
    ("state.remote.url", "s3://Bad_Bucket/x"),
    ("state.remote.url", "s3://bucket/a//b"),
    ("state.remote.url", "s3://bucket/../x"),
    ("state.remote.endpoint", "127.0.0.1:9000"),
    ("state.remote.endpoint", "http://:9000"),
    ("state.remote.endpoint", "http://host:99999"),
    ("state.remote.checkpoint.interval.ms", 999),
    ("state.remote.snapshots.retained", 0),
    ("state.remote.snapshot.max.age.ms", "soon"),
]


def test_bad_values_cover_every_key() -> None:
    assert {key for key, _ in BAD_VALUES} == set(KEYS)


@pytest.mark.parametrize(("key", "value"), BAD_VALUES)
def test_bad_value_names_key(key: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        build({key: value})
    assert info.value.key == key
    assert f"config key '{key}'" in str(info.value)


@pytest.mark.parametrize("key", ["application.id", "bootstrap.servers"])
def test_required_keys(key: str) -> None:
    given = dict(REQUIRED)
    del given[key]
    with pytest.raises(ConfigError) as info:
        StreamsConfig.from_dict(given)
    assert info.value.key == key
    assert "required" in info.value.reason


def test_enum_error_suggests_choice() -> None:
    with pytest.raises(ConfigError, match="did you mean 'exactly_once_v2'"):
        build({"processing.guarantee": "exactly_once"})


def test_unknown_key_suggests_closest() -> None:
    with pytest.raises(ConfigError) as info:
        build({"proccessing.threads": 4})
    assert info.value.key == "proccessing.threads"
    assert "did you mean 'processing.threads'?" in str(info.value)


def test_unknown_key_without_prefix_mentions_prefixes() -> None:
    with pytest.raises(ConfigError) as info:
        build({"fetch.min.bytes": 1})
    assert "consumer." in info.value.reason
    assert "unknown key" in info.value.reason


def test_prefix_alone_is_an_error() -> None:
    with pytest.raises(ConfigError, match="'consumer.'"):
        build({"consumer.": 1})


# Pass-through routing


def test_passthrough_routing() -> None:
    c = build(
        {
            "consumer.session.timeout.ms": "6000",
            "restore.consumer.fetch.max.bytes": 1024,
            "producer.linger.ms": 5,
            "admin.request.timeout.ms": "1000",
        }
    )
    assert c.consumer_overrides == {"session.timeout.ms": "6000"}
    assert c.restore_consumer_overrides == {"fetch.max.bytes": 1024}
    assert c.producer_overrides == {"linger.ms": 5}
    assert c.admin_overrides == {"request.timeout.ms": "1000"}


# Dead-letter queue derivation


def test_dlq_unset_by_default() -> None:
    assert build({}).dead_letter_queue_topic is None


@pytest.mark.parametrize(
    "handler_key",
    [
        "deserialization.exception.handler",
        "processing.exception.handler",
        "production.exception.handler",
    ],
)
def test_dlq_derived_from_handler(handler_key: str) -> None:
    c = build({handler_key: "dead_letter_queue"})
    assert c.dead_letter_queue_topic == "app-dlq"


def test_dlq_explicit_name_wins() -> None:
    c = build({"processing.exception.handler": "dead_letter_queue", **_dlq("errors")})
    assert c.dead_letter_queue_topic == "errors"


def test_dlq_explicit_name_without_dlq_handler() -> None:
    c = build({"processing.exception.handler": "log_and_continue", **_dlq("errors")})
    assert c.dead_letter_queue_topic == "errors"


def _dlq(name: str) -> dict[str, str]:
    return {"errors.dead.letter.queue.topic.name": name}


# Serdes


def test_builtin_serde_names() -> None:
    c = build({"default.key.serde": "json", "default.value.serde": "STRING"})
    assert c.default_key_serde is serdes.JSON
    assert c.default_value_serde is serdes.STRING


def test_user_serde_module_attr() -> None:
    c = build(
        {"default.value.serde": f"{__name__}:UPPER", "default.key.serde": f"{__name__}:UpperSerde"}
    )
    assert c.default_value_serde is UPPER
    assert isinstance(c.default_key_serde, UpperSerde)
    assert c.default_key_serde.serialize("a") == b"A"


def test_serde_object_accepted() -> None:
    assert build({"default.key.serde": UPPER}).default_key_serde is UPPER


@pytest.mark.parametrize(
    "value",
    [
        "nope",
        "no_such_module_xyz:thing",
        f"{__name__}:missing",
        f"{__name__}:NOT_A_SERDE",
        UpperSerde,
    ],
)
def test_bad_serde_names_key(value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        build({"default.value.serde": value})
    assert info.value.key == "default.value.serde"
    assert str(info.value).startswith("config key 'default.value.serde': ")


# Display, overrides, README table


def test_as_display_dict() -> None:
    c = build(
        {
            "default.key.serde": "JSON",
            "default.value.serde": f"{__name__}:UPPER",
            "consumer.session.timeout.ms": 6000,
            "sasl.password": "hunter2",  # unprefixed: every client gets it
        }
    )
    shown = c.as_display_dict()
    assert shown["default.key.serde"] == "json"
    assert shown["default.value.serde"] == f"{__name__}:UPPER"
    assert shown["consumer.session.timeout.ms"] == 6000
    assert shown["producer.sasl.password"] != "hunter2"
    assert shown["application.id"] == "app"
    assert set(KEYS) <= set(shown)


def test_with_overrides_revalidates_and_rederives() -> None:
    c = build({})
    d = c.with_overrides(processing_guarantee="exactly_once_v2", processing_threads="2")
    assert (d.commit_interval_ms, d.processing_threads, d.exactly_once) == (100, 2, True)
    assert c.commit_interval_ms == 30000  # the original is unchanged
    e = d.with_overrides(processing_exception_handler="dead_letter_queue")
    assert e.dead_letter_queue_topic == "app-dlq"
    assert e.with_overrides(dead_letter_queue_topic="dlq").dead_letter_queue_topic == "dlq"
    with pytest.raises(ConfigError, match="poll.ms"):
        c.with_overrides(poll_ms=-1)
    with pytest.raises(ConfigError, match="did you mean 'poll_ms'"):
        c.with_overrides(pol_ms=1)


def test_with_overrides_replaces_passthrough_dict() -> None:
    c = build({"consumer.a": 1, "restore.consumer.b": 2})
    d = c.with_overrides(consumer_overrides={"c": 3})
    assert d.consumer_overrides == {"c": 3}
    assert d.restore_consumer_overrides == {"b": 2}


def test_config_table_markdown() -> None:
    table = config_table_markdown()
    lines = table.strip().splitlines()
    assert lines[0].startswith("| Key |")
    for key in KEYS:
        assert f"| `{key}` |" in table
    assert "`consumer.*`" in table
    assert all(line.count(" | ") == 3 for line in lines)


def test_readme_table_is_generated_from_the_keys() -> None:
    page = Path(__file__).resolve().parents[3] / config_module.CONFIG_TABLE_PAGE
    text = page.read_text(encoding="utf-8")
    assert config_module.readme_with_table(text) == text, "run ./dev docs"


def test_every_field_is_a_key_or_passthrough() -> None:
    attrs = {spec.attr for spec in KEYS.values()}
    attrs |= {"consumer_overrides", "producer_overrides", "restore_consumer_overrides"}
    attrs |= {"admin_overrides", "raw", "query_settings"}
    assert attrs == set(StreamsConfig.__dataclass_fields__)


# Loading: TOML, environment, --set


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "app.toml"
    path.write_text(text)
    return str(path)


def test_toml_flat_and_nested(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        """
"bootstrap.servers" = "broker:9092"
processing.threads = 3

[application]
id = "from-table"

[consumer]
"session.timeout.ms" = 6000

[restore.consumer]
"fetch.max.bytes" = 1024

[default]
key.serde = "json"
""",
    )
    c = load_config(path, env={})
    assert c.application_id == "from-table"
    assert c.bootstrap_servers == "broker:9092"
    assert c.processing_threads == 3
    assert c.consumer_overrides == {"session.timeout.ms": 6000}
    assert c.restore_consumer_overrides == {"fetch.max.bytes": 1024}
    assert c.default_key_serde is serdes.JSON


def test_toml_same_key_twice(tmp_path: Path) -> None:
    path = write(tmp_path, '"application.id" = "a"\n[application]\nid = "b"\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.key == "application.id"


def test_toml_missing_file(tmp_path: Path) -> None:
    path = str(tmp_path / "nope.toml")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert path in str(info.value)
    assert info.value.file == path


def test_toml_unparsable(tmp_path: Path) -> None:
    path = write(tmp_path, "this is = = not toml\n")
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert path in str(info.value)
    assert "TOML" in info.value.reason


def test_toml_bad_value_names_key_and_file(tmp_path: Path) -> None:
    path = write(tmp_path, '"application.id" = "a"\n"bootstrap.servers" = "b:9092"\npoll.ms = -1\n')
    with pytest.raises(ConfigError) as info:
        load_config(path, env={})
    assert info.value.key == "poll.ms"
    assert path in str(info.value)


def test_env_mapping() -> None:
    env = {
        "STREAMS_RUNTIME_APPLICATION_ID": "envapp",
        "STREAMS_RUNTIME_BOOTSTRAP_SERVERS": "b:9092",
        "STREAMS_RUNTIME_PROCESSING_THREADS": "6",
        "STREAMS_RUNTIME_CONSUMER_SESSION_TIMEOUT_MS": "6000",
        "STREAMS_RUNTIME_RESTORE_CONSUMER_FETCH_MAX_BYTES": "10",
        "OTHER_VARIABLE": "ignored",
    }
    c = load_config(env=env)
    assert (c.application_id, c.bootstrap_servers, c.processing_threads) == ("envapp", "b:9092", 6)
    assert c.consumer_overrides == {"session.timeout.ms": "6000"}
    assert c.restore_consumer_overrides == {"fetch.max.bytes": "10"}


def test_env_error_names_variable() -> None:
    env = {"STREAMS_RUNTIME_POLL_MS": "x"}
    with pytest.raises(ConfigError) as info:
        load_config(env=env, base=REQUIRED)
    assert info.value.key == "poll.ms"
    assert "STREAMS_RUNTIME_POLL_MS" in str(info.value)


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("STREAMS_RUNTIME_POLL_MS", "7")
    assert load_config(base=REQUIRED).poll_ms == 7


def test_precedence_base_toml_env_set(tmp_path: Path) -> None:
    base = {
        **REQUIRED,
        "poll.ms": 1,
        "max.poll.records": 1,
        "task.timeslice.ms": 1,
        "log.level": "error",
    }
    path = write(tmp_path, "poll.ms = 2\nmax.poll.records = 2\ntask.timeslice.ms = 2\n")
    env = {"STREAMS_RUNTIME_POLL_MS": "3", "STREAMS_RUNTIME_MAX_POLL_RECORDS": "3"}
    c = load_config(path, sets=["poll.ms=4"], env=env, base=base)
    assert c.log_level == "error"  # base only
    assert c.task_timeslice_ms == 2  # toml over base
    assert c.max_poll_records == 3  # env over toml
    assert c.poll_ms == 4  # --set over env
    assert c.raw["poll.ms"] == "4"


def test_set_parsing() -> None:
    c = load_config(sets=["application.id=a", "bootstrap.servers=h:1", "consumer.x=a=b"], env={})
    assert c.consumer_overrides == {"x": "a=b"}


@pytest.mark.parametrize("item", ["processing.threads", "=4"])
def test_set_without_equals(item: str) -> None:
    with pytest.raises(ConfigError) as info:
        load_config(sets=[item], env={}, base=REQUIRED)
    assert info.value.key == item
    assert item in str(info.value)


def test_set_error_says_where_from() -> None:
    with pytest.raises(ConfigError, match="--set poll.ms=x"):
        load_config(sets=["poll.ms=x"], env={}, base=REQUIRED)


# Property: an int key accepts exactly the integers in its range

LONG = 2**63 - 1
INT = 2**31 - 1
INT_RANGES = {
    "processing.threads.limit": lambda n: 1 <= n <= 1024,
    "processing.threads": lambda n: 0 <= n <= 64,  # the default processing.threads.limit
    "processes": lambda n: 1 <= n <= 256,
    "process.restart.backoff.ms": lambda n: 0 <= n <= 3_600_000,
    "process.restart.backoff.max.ms": lambda n: 0 <= n <= 3_600_000,
    "process.slot": lambda n: -1 <= n <= 255,
    "commit.interval.ms": lambda n: 0 <= n <= LONG,
    "buffered.records.per.partition": lambda n: 1 <= n <= INT,
    "task.timeslice.ms": lambda n: 1 <= n <= LONG,
    "gil.switch.interval.us": lambda n: 0 <= n <= 1_000_000,
    "num.threads.per.task": lambda n: 1 <= n <= 1024,
    "processing.retry.attempts": lambda n: 0 <= n <= INT,
    "processing.retry.backoff.ms": lambda n: 0 <= n <= LONG,
    "processing.retry.backoff.max.ms": lambda n: 0 <= n <= LONG,
    "max.poll.records": lambda n: 1 <= n <= 1_000_000,
    "poll.ms": lambda n: 0 <= n <= LONG,
    "max.task.idle.ms": lambda n: -1 <= n <= LONG,
    "replication.factor": lambda n: n == -1 or 1 <= n <= 32767,
    "topics.create.partitions": lambda n: 1 <= n <= INT,
    "shutdown.timeout.ms": lambda n: 0 <= n <= LONG,
    "cache.max.bytes": lambda n: 0 <= n <= LONG,
    "num.standby.replicas": lambda n: 0 <= n <= INT,
    "acceptable.recovery.lag": lambda n: 0 <= n <= LONG,
    "max.warmup.replicas": lambda n: 1 <= n <= INT,
    "state.cleanup.delay.ms": lambda n: 0 <= n <= LONG,
    "state.rocksdb.memory.bytes": lambda n: 16 * 1024 * 1024 <= n <= LONG,
    "state.rocksdb.metrics.interval.ms": lambda n: 100 <= n <= 3_600_000,
    "admin.socket.max.connections": lambda n: 1 <= n <= 4096,
    "admin.socket.max.buffered.bytes": lambda n: 1024 <= n <= INT,
    "admin.socket.idle.timeout.ms": lambda n: 1 <= n <= LONG,
    "metrics.port": lambda n: 0 <= n <= 65535,
    "metrics.max.connections": lambda n: 1 <= n <= 4096,
    "metrics.idle.timeout.ms": lambda n: 1 <= n <= LONG,
    "processing.threads.min": lambda n: 0 <= n <= 64,
    "processing.threads.max": lambda n: 1 <= n <= 64,
    "partition.check.interval.ms": lambda n: 100 <= n <= LONG,
    "state.remote.checkpoint.interval.ms": lambda n: 1000 <= n <= LONG,
    "state.remote.snapshots.retained": lambda n: 1 <= n <= 1000,
    "state.remote.snapshot.max.age.ms": lambda n: 1000 <= n <= LONG,
}
# Durations the runtime waits for: accepted up to Kafka's "infinite", stored clamped.
CLAMPED = {
    "commit.interval.ms", "task.timeslice.ms", "poll.ms", "shutdown.timeout.ms",
    "admin.socket.idle.timeout.ms", "partition.check.interval.ms", "metrics.idle.timeout.ms",
    "processing.retry.backoff.ms", "processing.retry.backoff.max.ms",
}  # fmt: skip


def test_processes_auto_is_the_cpus_this_process_may_use() -> None:
    config = StreamsConfig.from_dict({**REQUIRED, "processes": "auto"})
    assert config.processes == len(os.sched_getaffinity(0))
    assert StreamsConfig.from_dict({**REQUIRED, "processes": " AUTO "}).processes >= 1
    assert StreamsConfig.from_dict(REQUIRED).processes == 1
    with pytest.raises(ConfigError, match="or 'auto'"):
        StreamsConfig.from_dict({**REQUIRED, "processes": "many"})


def test_int_ranges_cover_every_int_key() -> None:
    assert set(INT_RANGES) == {name for name, spec in KEYS.items() if spec.kind == "int"}


@given(
    key=st.sampled_from(sorted(INT_RANGES)),
    n=st.one_of(
        st.integers(-3, 3),
        st.integers(),
        st.sampled_from([64, 65, 1024, 1025, 32767, 32768, 10**6, 10**6 + 1, INT, INT + 1]),
        st.sampled_from([LONG, LONG + 1, 10**19, 10**30]),
    ),
    as_text=st.booleans(),
)
def test_int_key_accepts_exactly_its_range(key: str, n: int, as_text: bool) -> None:
    value: Any = str(n) if as_text else n
    if INT_RANGES[key](n):
        c = build({key: value})
        assert getattr(c, KEYS[key].attr) == (min(n, MAX_WAIT_MS) if key in CLAMPED else n)
    else:
        with pytest.raises(ConfigError) as info:
            build({key: value})
        assert info.value.key == key


def test_remote_state_keys_parse() -> None:
    config = build(
        {
            "state.remote.url": "s3://my-bucket/some/prefix/",
            "state.remote.endpoint": "http://127.0.0.1:9000",
            "state.remote.checkpoint.interval.ms": 60000,
        }
    )
    assert config.state_remote_url == "s3://my-bucket/some/prefix/"
    assert config.state_remote_endpoint == "http://127.0.0.1:9000"
    assert config.state_remote_checkpoint_interval_ms == 60000
    assert config.state_remote_snapshots_retained == 3
    off = build({})
    assert off.state_remote_url is None and off.state_remote_endpoint is None
