"""The Spark pipeline side, through PySpark (the `spark` extra; Spark 4.0+, Java 17+).

Spark's own Kafka connector (`format("kafka")`) is fetched with Maven into the
project's cache and put on the classpath by `spark_session` (`connector`); the
Spark jobs read with it by default. The project's own Kafka data source
(`format("streams-kafka")`, confluent-kafka inside Spark's Python workers:
`source`, `kafka`) is the alternative reader and the writer that keeps record
timestamps; `sources` chooses between them and reads exact offset ranges with
either. Also here: the output audit (`audit`) and the backfill of DSL
topologies over a topic's history (`backfill`, with the worker-side graph
runner in `graph`). `session` starts Spark (Java check, connector, small local
defaults, the JVM's stderr without its incubator-module notice) and prints
progress; `preflight` checks, before the commands start Spark, that their
topics exist.

Threads: everything runs on the driver's calling thread or inside Spark's
Python worker processes; nothing here touches the daemon's threads or clients.
Importing this package does not import PySpark; the names below load on use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {
    "FORMAT": "runtime.spark.source",
    "ConnectorUnavailable": "runtime.spark.connector",
    "ensure_connector": "runtime.spark.connector",
    "package_coordinate": "runtime.spark.connector",
    "DEFAULT_SOURCE": "runtime.spark.names",
    "SOURCE_CONF": "runtime.spark.names",
    "SOURCES": "runtime.spark.names",
    "KafkaDataSource": "runtime.spark.source",
    "JavaMissingError": "runtime.spark.failures",
    "SparkUnavailableError": "runtime.spark.failures",
    "check_java": "runtime.spark.session",
    "register": "runtime.spark.source",
    "spark_session": "runtime.spark.session",
    "AuditReport": "runtime.spark.audit",
    "run_audit": "runtime.spark.audit",
    "BackfillError": "runtime.spark.plan",
    "BackfillResult": "runtime.spark.backfill",
    "run_backfill": "runtime.spark.backfill",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'runtime.spark' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)
