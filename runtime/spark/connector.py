"""Spark's own Kafka connector on the session's classpath, fetched with Maven like the broker.

`format("kafka")` lives in a JVM package, `org.apache.spark:spark-sql-kafka-0-10_2.13`,
that PySpark does not ship. Its version must equal Spark's. `ensure_connector()` fetches it
and its runtime dependencies with Maven into the project's cache
(`<cache>/spark-sql-kafka-0-10_2.13-<version>/libs`, beside the broker's jars:
`runtime.brokers.kafka_dist.ensure_maven_jars`, the same lock and atomic rename), once per
machine; `spark_session()` puts the jars on `spark.jars`. Jars whose artifact PySpark already
ships (Scala, Hadoop's client, slf4j, lz4, snappy) are left off: two versions of one library
on a classpath is a bug waiting for its class. What remains is the connector, its token
provider, `kafka-clients` and `commons-pool2`.

The alternative for a machine with internet access and no Maven: let Spark resolve the
package itself at session start (`spark.jars.packages`, see `package_coordinate()`);
`spark_session()` then fetches nothing.

Called on the driver only (any thread; the fetch is serialised by a file lock).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from runtime.brokers.kafka_dist import BrokerUnavailable, cache_root, ensure_maven_jars
from runtime.spark.failures import SparkUnavailableError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

CONNECTOR_ARTIFACT = "spark-sql-kafka-0-10_2.13"
CONNECTOR_GROUP = "org.apache.spark"
PACKAGES_CONF = "spark.jars.packages"
JARS_CONF = "spark.jars"

# artifact-version[-classifier].jar: the version starts at the first "-<digits>.<digit>"
# ("spark-sql-kafka-0-10_2.13-4.2.0.jar" -> "spark-sql-kafka-0-10_2.13").
_JAR_NAME = re.compile(r"^(?P<artifact>.+?)-\d+\.\d.*\.jar$")


class ConnectorUnavailable(SparkUnavailableError):
    """Spark's Kafka connector is not on the classpath and cannot be fetched here."""


def spark_version() -> str:
    import pyspark

    return str(pyspark.__version__)


def package_coordinate(version: str | None = None) -> str:
    """`org.apache.spark:spark-sql-kafka-0-10_2.13:<Spark's version>` (for `spark.jars.packages`)."""
    return f"{CONNECTOR_GROUP}:{CONNECTOR_ARTIFACT}:{version or spark_version()}"


def _advice(version: str) -> str:
    from runtime.spark.names import SOURCE_CONF, STREAMS_KAFKA

    return (
        f"; with internet access Spark can fetch it itself ({PACKAGES_CONF}="
        f"{package_coordinate(version)}, e.g. --spark-conf {PACKAGES_CONF}=...), or use the "
        f"project's data source instead (--spark-conf {SOURCE_CONF}={STREAMS_KAFKA})"
    )


def ensure_connector(version: str | None = None) -> tuple[Path, ...]:
    """The connector's jars for Spark `version` (default: the installed PySpark's), fetched
    with Maven on first use; ConnectorUnavailable if Maven is missing or fails."""
    version = version or spark_version()
    try:
        home = ensure_maven_jars(
            CONNECTOR_ARTIFACT,
            version,
            [(CONNECTOR_GROUP, CONNECTOR_ARTIFACT, version)],
            {},
            label=f"Spark's Kafka connector {package_coordinate(version)}",
            hint=_advice(version),
        )
    except BrokerUnavailable as exc:  # kafka_dist's error type; this is not a broker
        raise ConnectorUnavailable(str(exc)) from None
    jars = tuple(sorted((home / "libs").glob("*.jar")))
    if not any(jar.name.startswith(f"{CONNECTOR_ARTIFACT}-") for jar in jars):
        raise ConnectorUnavailable(
            f"the connector cache {home} is incomplete (no {CONNECTOR_ARTIFACT} jar); "
            "delete it to refetch"
        )
    return jars


def artifact_of(jar_name: str) -> str:
    """The artifact id in a Maven-style jar file name (the name itself if it has no version)."""
    match = _JAR_NAME.match(jar_name)
    return match.group("artifact") if match else jar_name.removesuffix(".jar")


def spark_jars_dir() -> Path | None:
    """The directory of the jars Spark starts with (`$SPARK_HOME/jars` or PySpark's own)."""
    try:
        from pyspark.find_spark_home import _find_spark_home

        home = Path(_find_spark_home())
    except Exception:  # an unusual install: then nothing is filtered
        return None
    jars = home / "jars"
    return jars if jars.is_dir() else None


def classpath_jars(jars: tuple[Path, ...], shipped: Path | None) -> list[Path]:
    """`jars` less those whose artifact Spark already ships in `shipped` (any version)."""
    if shipped is None:
        return list(jars)
    have = {artifact_of(p.name) for p in shipped.glob("*.jar")}
    return [jar for jar in jars if artifact_of(jar.name) not in have]


def brings_connector(conf: Mapping[str, str]) -> bool:
    """Whether `conf` already brings the connector (`spark.jars.packages` or `spark.jars` name it)."""
    return any(CONNECTOR_ARTIFACT in conf.get(key, "") for key in (PACKAGES_CONF, JARS_CONF))


def connector_conf(conf: Mapping[str, str]) -> dict[str, str]:
    """What to add to a new session's `conf` so that `format("kafka")` works: `spark.jars`
    with the cached connector (after the user's own jars), or nothing if `conf` brings it."""
    if brings_connector(conf):
        return {}
    jars = classpath_jars(ensure_connector(), spark_jars_dir())
    listed = [j for j in conf.get(JARS_CONF, "").split(",") if j.strip()]
    return {JARS_CONF: ",".join([*listed, *(str(j) for j in jars)])}


def has_connector(spark: SparkSession) -> bool:
    """Whether `format("kafka")` resolves in this session (Spark's own lookup, on the JVM).

    True when the JVM cannot be asked (a Spark Connect session): Spark then says itself.
    """
    try:
        jvm = spark._jvm
        conf = spark._jsparkSession.sessionState().conf()
    except Exception:
        return True
    if jvm is None:
        return True
    try:
        jvm.org.apache.spark.sql.execution.datasources.DataSource.lookupDataSource("kafka", conf)
    except Exception:
        return False
    return True


def check_connector(spark: SparkSession) -> None:
    """ConnectorUnavailable, with what to do, if `format("kafka")` does not resolve."""
    if not has_connector(spark):
        version = spark.version
        raise ConnectorUnavailable(
            f"Spark's Kafka connector ({package_coordinate(version)}) is not on this "
            "session's classpath: start the session with runtime.spark.spark_session() "
            f"(it fetches the connector with Maven into {cache_root()})" + _advice(version)
        )
