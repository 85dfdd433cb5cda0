"""The Spark session `audit` and `backfill` run on: the active one if there
is one, else a new one from `--master`, `--spark-conf`, `--source` and
`--spark-log-level` (runtime.spark.session). The CLI process's main thread.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any


def spark_conf(pairs: Sequence[str] | None) -> dict[str, str]:
    conf = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ValueError(f"--spark-conf expects key=value, got {pair!r}")
        conf[key.strip()] = value.strip()
    return conf


def start_spark(args: argparse.Namespace, app_name: str) -> tuple[Any, bool]:
    """(session, created): the active session if there is one, else a new one."""
    from runtime.spark.session import check_pyspark, spark_session

    check_pyspark()
    from pyspark.sql import SparkSession

    existed = SparkSession.getActiveSession() is not None
    conf = spark_conf(args.spark_conf)
    if args.source is not None:
        from runtime.spark.names import SOURCE_CONF

        # Also tells spark_session() not to fetch the connector for streams-kafka.
        conf[SOURCE_CONF] = args.source
    spark = spark_session(args.master, app_name, conf, log_level=args.spark_log_level)
    return spark, not existed
