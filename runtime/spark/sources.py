"""Which Kafka source the Spark jobs read with, and one read of exact offset ranges on either.

Two formats read Kafka into the same columns:

- `kafka`: Spark's own connector (JVM; `runtime.spark.connector` puts it on the classpath).
  The default: records go from Kafka to Spark's rows without passing through Python, and
  the benchmark (`benchmarks/spark_read.py`, the docs' "Spark performance") measured it the
  faster reader.
- `streams-kafka`: the project's data source (confluent-kafka in Spark's Python workers,
  `runtime.spark.source`). Needs no JVM package, and its writer keeps record timestamps,
  which Spark's Kafka sink cannot set (the backfill writes with it for that reason).

`streams-runtime audit` and `backfill` read with `DEFAULT_SOURCE` unless told otherwise: the
`source` argument of `run_audit` / `run_backfill`, or the Spark setting `SOURCE_CONF`
(`--spark-conf spark.streamsRuntime.kafkaSource=streams-kafka` on the command line; with that
setting `spark_session()` does not fetch the connector either).

Both formats take the same options here (the project's source accepts Spark's names), and
the ranges are always explicit offsets learnt from the fetch path (`runtime.spark.kafka.
watermarks`), so both read exactly the same records, on Tansu too (whose ListOffsets
under-reports the end).

Called on the driver.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from runtime.spark import kafka as k
from runtime.spark.names import (
    DEFAULT_SOURCE,
    KAFKA,
    SOURCE_CONF,
    STREAMS_KAFKA,
    check_source,
)

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession


COLUMNS = ("key", "value", "topic", "partition", "offset", "timestamp", "headers")

# Consumer settings Spark's connector refuses (it manages them itself) or that name
# librdkafka-only behaviour; they are dropped when `consumer.*` overrides of an app's
# config reach the Java consumer.
_REFUSED_BY_SPARK = frozenset(
    {
        "auto.offset.reset",
        "enable.auto.commit",
        "key.deserializer",
        "value.deserializer",
        "interceptor.classes",
        "group.id",
        "enable.partition.eof",
        "enable.auto.offset.store",
    }
)


def session_source(spark: SparkSession, source: str | None) -> str:
    """`source` if given, else the session's `SOURCE_CONF`, else `DEFAULT_SOURCE`."""
    if source is not None:
        return check_source(source)
    return check_source(spark.conf.get(SOURCE_CONF, DEFAULT_SOURCE) or DEFAULT_SOURCE, SOURCE_CONF)


def read_ranges(
    spark: SparkSession,
    source: str,
    bootstrap: str,
    topics: Sequence[str],
    starts: Mapping[k.TopicPartitionKey, int],
    ends: Mapping[k.TopicPartitionKey, int],
    isolation: str = "read_committed",
    overrides: Mapping[str, str] | None = None,
) -> DataFrame:
    """The records `[starts, ends)` of every partition of `topics`, columns `COLUMNS`.

    `starts` and `ends` must name every partition of `topics` (Spark's connector insists).
    `overrides` are client settings (`consumer.*` of an app's config), passed as
    `kafka.<key>`; those Spark's connector refuses are dropped for it.
    """
    check_source(source)
    if source == KAFKA:
        from runtime.spark.connector import check_connector

        check_connector(spark)
    else:
        from runtime.spark.source import register

        register(spark)
    reader = (
        spark.read.format(source)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", ",".join(topics))
        .option("startingOffsets", json.dumps(k.offsets_to_json(starts)))
        .option("endingOffsets", json.dumps(k.offsets_to_json(ends)))
        .option("kafka.isolation.level", isolation)
        .option("includeHeaders", "true")
    )
    if source == STREAMS_KAFKA:
        reader = reader.option("maxRecordsPerPartition", "0")  # one Spark partition each
    for key, value in (overrides or {}).items():
        if source == KAFKA and key in _REFUSED_BY_SPARK:
            continue
        reader = reader.option(f"kafka.{key}", str(value))
    return reader.load().select(*COLUMNS)
