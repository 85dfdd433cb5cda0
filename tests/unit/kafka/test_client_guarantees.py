"""Issue 31, item 7: client overrides that break the processing guarantee, or
that make the four clients disagree about the cluster, are refused when the
config is built (a `ConfigError` naming the key from the API, exit 2 from the
CLI), with the reason and what to do. No broker: nothing here contacts one.
"""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from runtime import cli
from runtime.app import App
from runtime.config import ConfigError, StreamsConfig
from runtime.kafka.clients import consumer_config, restore_consumer_config
from runtime.kafka.startup_checks import check_client_properties
from runtime.topology.builder import StreamsBuilder

REQUIRED = {"application.id": "app", "bootstrap.servers": "127.0.0.1:1"}
EOS = {**REQUIRED, "processing.guarantee": "exactly_once_v2"}
CLIENT_PREFIXES = ("consumer.", "producer.", "restore.consumer.", "admin.")


def refused(given: dict[str, Any], key: str) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        StreamsConfig.from_dict(given)
    error = info.value
    assert error.key == key, error
    assert "\n" not in str(error) and len(str(error)) < 700, str(error)
    return error


# --- exactly_once_v2 -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value", "said"),
    [
        ("consumer.isolation.level", "read_uncommitted", "read_committed"),
        ("consumer.isolation.level", "READ_UNCOMMITTED ", "read_committed"),
        ("restore.consumer.isolation.level", "read_uncommitted", "changelogs"),
        ("producer.enable.idempotence", "false", "idempotent producer"),
        ("producer.enable.idempotence", False, "idempotent producer"),
        ("producer.enable.idempotence", "f", "idempotent producer"),
        ("producer.acks", "1", "acks=all"),
        ("producer.acks", 0, "acks=all"),
        ("producer.request.required.acks", "1", "acks=all"),  # librdkafka's alias
        ("producer.topic.acks", "0", "acks=all"),  # librdkafka strips "topic."
        ("producer.max.in.flight.requests.per.connection", 6, "at most 5"),
        ("producer.max.in.flight", "100", "at most 5"),
        ("producer.transactional.id", "mine", "set by the runtime"),
        ("consumer.enable.auto.commit", True, "commits offsets itself"),
        ("consumer.enable.auto.offset.store", "true", "commits offsets itself"),
    ],
)
def test_exactly_once_refuses_what_it_depends_on(key: str, value: Any, said: str) -> None:
    error = refused({**EOS, key: value}, key)
    assert said in error.reason
    # Confirming unsafe settings is for at_least_once only.
    refused({**EOS, "allow.unsafe.producer.settings": True, key: value}, key)


def test_exactly_once_accepts_the_values_it_uses_itself() -> None:
    config = StreamsConfig.from_dict(
        {
            **EOS,
            "consumer.isolation.level": "READ_COMMITTED",
            "restore.consumer.isolation.level": "read_committed",
            "producer.enable.idempotence": "true",
            "producer.acks": "all",
            "producer.request.required.acks": -1,
            "producer.max.in.flight": 5,
            "consumer.enable.auto.commit": "false",
        }
    )
    check_client_properties(config)  # and librdkafka takes them together


# --- at_least_once ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("producer.acks", "0"),
        ("producer.acks", "1"),
        ("producer.acks", 1),
        ("producer.request.required.acks", "0"),
        ("producer.enable.idempotence", "false"),
    ],
)
def test_at_least_once_refuses_lossy_producers_unless_confirmed(key: str, value: Any) -> None:
    error = refused({**REQUIRED, key: value}, key)
    assert "allow.unsafe.producer.settings=true" in error.reason
    confirmed = {
        **REQUIRED,
        "allow.unsafe.producer.settings": "true",
        "producer.enable.idempotence": False,  # librdkafka's idempotence needs acks=all
        key: value,
    }
    check_client_properties(StreamsConfig.from_dict(confirmed))


def test_confirmed_acks_still_need_idempotence_off_and_librdkafka_says_so() -> None:
    config = StreamsConfig.from_dict(
        {**REQUIRED, "allow.unsafe.producer.settings": True, "producer.acks": "1"}
    )
    with pytest.raises(ConfigError) as info:
        check_client_properties(config)
    assert info.value.key == "producer.acks"


def test_at_least_once_keeps_what_only_exactly_once_needs() -> None:
    config = StreamsConfig.from_dict(
        {
            **REQUIRED,
            "consumer.isolation.level": "read_uncommitted",
            "restore.consumer.isolation.level": "read_uncommitted",
            "producer.acks": "all",
        }
    )
    assert config.consumer_overrides == {"isolation.level": "read_uncommitted"}


@pytest.mark.parametrize("guarantee", ["at_least_once", "exactly_once_v2"])
@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("producer.transactional.id", "x"),
        ("consumer.enable.auto.commit", "t"),
        ("restore.consumer.enable.auto.commit", True),
        ("restore.consumer.enable.partition.eof", "false"),  # restores would never end
    ],
)
def test_refused_under_either_guarantee(key: str, value: Any, guarantee: str) -> None:
    error = refused({**REQUIRED, "processing.guarantee": guarantee, key: value}, key)
    assert "remove" in error.reason.lower()


# --- one cluster: bootstrap servers and security settings ------------------------------------


@pytest.mark.parametrize("prefix", CLIENT_PREFIXES)
@pytest.mark.parametrize("prop", ["bootstrap.servers", "metadata.broker.list"])
def test_a_client_pointed_at_other_brokers_is_refused(prefix: str, prop: str) -> None:
    error = refused({**REQUIRED, prefix + prop: "other:9092"}, prefix + prop)
    assert "bootstrap.servers" in error.reason and "unprefixed" in error.reason
    # The same brokers, written differently, are the same cluster.
    same = StreamsConfig.from_dict(
        {**REQUIRED, "bootstrap.servers": "a:1,b:2", prefix + prop: " B:2 , a:1"}
    )
    check_client_properties(same)


@pytest.mark.parametrize("prefix", CLIENT_PREFIXES)
@pytest.mark.parametrize(
    ("prop", "value"),
    [
        ("security.protocol", "SASL_SSL"),
        ("sasl.mechanism", "PLAIN"),
        ("sasl.mechanisms", "PLAIN"),
        ("sasl.username", "me"),
        ("sasl.password", "hunter2"),
        ("ssl.ca.location", "/etc/ssl/ca.pem"),
        ("enable.ssl.certificate.verification", "false"),
    ],
)
def test_security_settings_of_one_client_only_are_refused(
    prefix: str, prop: str, value: str
) -> None:
    error = refused({**REQUIRED, prefix + prop: value}, prefix + prop)
    assert "unprefixed" in error.reason and "every prefix" in error.reason
    assert "hunter2" not in str(error)  # secrets never reach a message
    # Set for all four, the same, it is accepted.
    StreamsConfig.from_dict({**REQUIRED, **{p + prop: value for p in CLIENT_PREFIXES}})


def test_a_prefixed_value_must_agree_with_the_unprefixed_one() -> None:
    given = {**REQUIRED, "security.protocol": "SASL_SSL", "producer.security.protocol": "SSL"}
    error = refused(given, "producer.security.protocol")
    assert "SASL_SSL" in error.reason
    same = StreamsConfig.from_dict({**given, "producer.security.protocol": "sasl_ssl"})
    assert same.producer_overrides["security.protocol"] == "sasl_ssl"
    assert same.consumer_overrides["security.protocol"] == "SASL_SSL"


def test_unprefixed_security_settings_reach_every_client() -> None:
    config = StreamsConfig.from_dict(
        {
            **REQUIRED,
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "PLAIN",
            "sasl.username": "me",
            "sasl.password": "hunter2",
        }
    )
    for attr in (
        "consumer_overrides",
        "producer_overrides",
        "restore_consumer_overrides",
        "admin_overrides",
    ):
        assert getattr(config, attr)["security.protocol"] == "SASL_PLAINTEXT", attr
        assert getattr(config, attr)["sasl.password"] == "hunter2", attr
    assert "hunter2" not in str(config.as_display_dict())
    check_client_properties(config)  # librdkafka takes them, offline


def test_a_bad_unprefixed_property_is_named_as_the_user_wrote_it() -> None:
    config = StreamsConfig.from_dict({**REQUIRED, "ssl.no.such.property": "1"})
    with pytest.raises(ConfigError) as info:
        check_client_properties(config)
    assert info.value.key == "ssl.no.such.property"


# --- the builders force the same settings (a config made without validation) ------------------


def test_builders_force_what_the_guarantee_needs() -> None:
    eos = replace(
        StreamsConfig.from_dict(EOS),
        consumer_overrides={"isolation.level": "read_uncommitted"},
        restore_consumer_overrides={
            "isolation.level": "read_uncommitted",
            "enable.partition.eof": False,
        },
    )
    assert consumer_config(eos, "range", {})["isolation.level"] == "read_committed"
    restore = restore_consumer_config(eos)
    assert restore["isolation.level"] == "read_committed"
    assert restore["enable.partition.eof"] is True


# --- from the API and from the command line ----------------------------------------------


def _topology() -> Any:
    builder = StreamsBuilder()
    builder.stream("in").group_by_key().count(store="counts")
    return builder.build()


def test_the_api_refuses_at_construction() -> None:
    with pytest.raises(ConfigError) as info:
        App(_topology(), {**EOS, "restore.consumer.isolation.level": "read_uncommitted"})
    assert info.value.key == "restore.consumer.isolation.level"


@pytest.mark.parametrize(
    "settings",
    [
        ["processing.guarantee=exactly_once_v2", "consumer.isolation.level=read_uncommitted"],
        ["processing.guarantee=exactly_once_v2", "restore.consumer.isolation.level=x"],
        ["producer.acks=0"],
        ["producer.bootstrap.servers=elsewhere:9092"],
        ["admin.security.protocol=SSL"],
    ],
)
def test_run_exits_2_naming_the_key(
    settings: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    monkeypatch.setenv("STREAMS_TEST_INPUT", "in")
    monkeypatch.setenv("STREAMS_TEST_OUTPUT", "out")
    for variable in [v for v in os.environ if v.startswith("STREAMS_RUNTIME_")]:
        monkeypatch.delenv(variable)
    argv = ["run", "tests.apps.passthrough:topology", "--set", "application.id=guarantees"]
    argv += ["--set", "bootstrap.servers=127.0.0.1:1", "--set", f"state.dir={tmp_path}"]
    for setting in settings:
        argv += ["--set", setting]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    named = settings[-1].split("=")[0]
    assert err.count("\n") == 1 and f"config key '{named}'" in err, err
