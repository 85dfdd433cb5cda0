"""Spark's Kafka connector on the classpath (issue 19): which jars, when, and the errors that
say what to do. No JVM is started here; the fetch itself runs in the integration tests'
session (`spark_session()` fetches it on first use)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from runtime.spark import connector
from runtime.spark.connector import (
    ConnectorUnavailable,
    artifact_of,
    classpath_jars,
    connector_conf,
    ensure_connector,
    package_coordinate,
)
from runtime.spark.names import DEFAULT_SOURCE, SOURCE_CONF, STREAMS_KAFKA, conf_source
from runtime.spark.session import SparkUnavailableError, spark_session
from runtime.spark.sources import session_source


def test_artifact_names_are_read_from_maven_style_jar_names() -> None:
    assert artifact_of("spark-sql-kafka-0-10_2.13-4.2.0.jar") == "spark-sql-kafka-0-10_2.13"
    assert artifact_of("kafka-clients-3.9.2.jar") == "kafka-clients"
    assert artifact_of("commons-pool2-2.13.1.jar") == "commons-pool2"
    assert artifact_of("commons-pool-1.5.4.jar") == "commons-pool"
    assert artifact_of("zstd-jni-1.5.6-4.jar") == "zstd-jni"
    assert artifact_of("netty-transport-native-epoll-4.1.118.Final-linux-x86_64.jar") == (
        "netty-transport-native-epoll"
    )
    assert artifact_of("no-version.jar") == "no-version"


def test_jars_spark_already_ships_are_left_off_the_classpath(tmp_path: Path) -> None:
    shipped = tmp_path / "spark-jars"
    shipped.mkdir()
    for name in ("scala-library-2.13.16.jar", "slf4j-api-2.0.17.jar", "commons-pool-1.5.4.jar"):
        (shipped / name).touch()
    fetched = tuple(
        tmp_path / name
        for name in (
            "commons-pool2-2.13.1.jar",
            "kafka-clients-3.9.2.jar",
            "scala-library-2.13.15.jar",  # another version of a shipped artifact: left off
            "slf4j-api-1.7.36.jar",
            "spark-sql-kafka-0-10_2.13-4.2.0.jar",
        )
    )
    kept = [p.name for p in classpath_jars(fetched, shipped)]
    assert kept == [
        "commons-pool2-2.13.1.jar",
        "kafka-clients-3.9.2.jar",
        "spark-sql-kafka-0-10_2.13-4.2.0.jar",
    ]
    assert classpath_jars(fetched, None) == list(fetched)


def test_the_connector_goes_after_the_users_jars_unless_the_conf_brings_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    jar = tmp_path / "spark-sql-kafka-0-10_2.13-4.2.0.jar"
    monkeypatch.setattr(connector, "ensure_connector", lambda: (jar,))
    monkeypatch.setattr(connector, "spark_jars_dir", lambda: None)
    assert connector_conf({}) == {"spark.jars": str(jar)}
    assert connector_conf({"spark.jars": "/opt/mine.jar"}) == {"spark.jars": f"/opt/mine.jar,{jar}"}
    # Spark resolves it itself (internet access): nothing fetched, nothing added.
    monkeypatch.setattr(connector, "ensure_connector", _must_not_fetch)
    assert connector_conf({"spark.jars.packages": package_coordinate("4.2.0")}) == {}


def _must_not_fetch() -> Any:
    raise AssertionError("fetched the connector although the conf brings it")


def test_without_maven_the_error_says_what_to_do(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no mvn
    monkeypatch.setenv("STREAMS_CACHE_DIR", str(tmp_path / "cache"))
    with pytest.raises(ConnectorUnavailable) as caught:
        ensure_connector("4.2.0")
    message = str(caught.value)
    assert "org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0 is not cached in" in message
    assert "apt-get install maven" in message
    assert "spark.jars.packages=org.apache.spark:spark-sql-kafka-0-10_2.13:4.2.0" in message
    assert f"{SOURCE_CONF}=streams-kafka" in message
    assert isinstance(caught.value, SparkUnavailableError)  # the CLI: exit 2, this message


def test_the_source_comes_from_the_argument_the_session_or_the_default() -> None:
    class Conf:
        def __init__(self, values: dict[str, str]) -> None:
            self.values = values

        def get(self, key: str, default: str | None = None) -> str | None:
            return self.values.get(key, default)

    class Session:
        def __init__(self, values: dict[str, str]) -> None:
            self.conf = Conf(values)

    assert DEFAULT_SOURCE == "kafka"
    assert session_source(Session({}), None) == "kafka"  # type: ignore[arg-type]
    assert session_source(Session({SOURCE_CONF: STREAMS_KAFKA}), None) == STREAMS_KAFKA  # type: ignore[arg-type]
    assert session_source(Session({SOURCE_CONF: STREAMS_KAFKA}), "kafka") == "kafka"  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=f"{SOURCE_CONF} must be one of kafka, streams-kafka"):
        session_source(Session({SOURCE_CONF: "jdbc"}), None)  # type: ignore[arg-type]
    assert conf_source({}) == "kafka"


def test_a_bad_source_setting_fails_before_spark_starts() -> None:
    with pytest.raises(ValueError, match=f"{SOURCE_CONF} must be one of"):
        spark_session(conf={SOURCE_CONF: "kafak"})
