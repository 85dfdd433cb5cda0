"""The names of the two Kafka sources Spark jobs read with, and the setting that picks one.

Apart from `runtime.spark.sources` so that the session, the connector and the
data source can name them without importing each other. Pure; any thread.
"""

from __future__ import annotations

from collections.abc import Mapping

KAFKA = "kafka"
STREAMS_KAFKA = "streams-kafka"
SOURCES = (KAFKA, STREAMS_KAFKA)
DEFAULT_SOURCE = KAFKA
SOURCE_CONF = "spark.streamsRuntime.kafkaSource"


def check_source(source: str, where: str = "source") -> str:
    if source not in SOURCES:
        raise ValueError(f"{where} must be one of {', '.join(SOURCES)}, got {source!r}")
    return source


def conf_source(conf: Mapping[str, str]) -> str:
    """The source a session configuration asks for (`SOURCE_CONF`, else the default)."""
    return check_source(conf.get(SOURCE_CONF, DEFAULT_SOURCE), SOURCE_CONF)
