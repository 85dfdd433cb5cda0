"""`streams-runtime backfill --engine spark`: a DSL topology over a topic's history, on Spark.

What it does, in order:

1. Checks that the consumer group `application.id` has no committed offsets
   (a backfill builds a *new* application's state; it refuses to overwrite
   a running or finished one) and creates the internal topics and
   changelogs exactly as the daemon would (`resolve_topics`).
2. Learns the end of every source partition (read_committed, from the
   fetch path: see `runtime.spark.kafka`). The backfill reads `[earliest,
   end)`; anything appended later is the daemon's.
3. Runs the stages (`runtime.spark.plan`): each subtopology's nodes over its
   input in Spark's Python workers (`runtime.spark.graph`), aggregations
   grouped by task partition and key (and window) in Spark: `count` in Spark
   SQL, `reduce`/`aggregate` folded in order in Python. One progress line per
   stage.
4. Writes, in one Spark job, what the topology writes to user topics and,
   for each store, the final aggregates to its changelog topic, partition =
   the task that owns the key (the repartition partition the key hashes to
   with murmur2, or the source partition without a repartition). Idempotent
   producers; a delivery error fails the job before anything is committed.
5. Commits offsets for the group `application.id`: the source ends of step
   2, and the current ends of the repartition and `through` topics (nothing
   the backfill handled is left for the daemon there).

Reading: Spark's Kafka connector (`format("kafka")`, the faster reader)
unless `source="streams-kafka"` (or the session setting
`spark.streamsRuntime.kafkaSource`) selects the project's source; both read
the exact ranges of step 2. Writing: always the project's source
(`streams-kafka`), because Spark's Kafka sink cannot set record timestamps
and the output and changelog records must carry those of the records that
made them, as the daemon's do.

A daemon started afterwards with the same `application.id` (and a state
directory without that application's old state) restores every store from
its changelog, then continues from the committed offsets: no record is
counted twice or missed.

Output is final values: one record per key (or window) of an aggregation,
where a daemon emits one per key per commit. Records reach an aggregation
in an order the daemon could have used: per source partition in offset
order, partitions merged by stream time. Counts do not depend on order;
`reduce`/`aggregate` and window grace (late records) see that order. Windows
older than the store's retention at the end of the history go downstream but
not into the changelog, as the daemon would have expired them.

Runs on the driver's calling thread.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from confluent_kafka import ConsumerGroupTopicPartitions, KafkaException, TopicPartition
from confluent_kafka.admin import AdminClient

from runtime.config import StreamsConfig
from runtime.kafka.clients import admin_config
from runtime.kafka.topics import TopicError, resolve_topics
from runtime.spark import kafka as k
from runtime.spark.graph import (
    INPUT_SCHEMA,
    KIND_CAPTURE,
    KIND_RECORD,
    KIND_STREAM_TIME,
    OUTPUT_SCHEMA,
    RESULT_SCHEMA,
    fold_pass,
    input_pass,
    result_pass,
)
from runtime.spark.names import KAFKA, STREAMS_KAFKA
from runtime.spark.plan import BackfillError, BackfillPlan, StagePlan, check_nodes, plan_backfill
from runtime.spark.sources import read_ranges, session_source
from runtime.topology.topology import Topology

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

Progress = Callable[..., None]

_KAFKA_COLUMNS = ("topic", "partition", "key", "value", "timestamp", "headers")


@dataclass
class BackfillResult:
    """What a backfill read, wrote and committed."""

    application_id: str
    source_offsets: dict[str, dict[int, int]]
    committed: dict[str, dict[int, int]]
    records_read: int
    records_written: dict[str, int] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def changelog_records(self) -> int:
        return sum(n for topic, n in self.records_written.items() if topic.endswith("-changelog"))


def _quiet(message: str, **fields: Any) -> None:
    pass


def _by_topic(offsets: Mapping[k.TopicPartitionKey, int]) -> dict[str, dict[int, int]]:
    out: dict[str, dict[int, int]] = {}
    for (topic, p), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[p] = offset
    return out


def check_fresh_group(
    admin: AdminClient, group: str, partitions: Mapping[str, int], timeout: float = 30.0
) -> None:
    """BackfillError if the group has committed offsets for any of these topics."""
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p) for t, n in sorted(partitions.items()) for p in range(n)]
    )
    try:
        result = admin.list_consumer_group_offsets([request], request_timeout=timeout)[
            group
        ].result(timeout=timeout)
    except KafkaException as exc:
        raise BackfillError(f"cannot read committed offsets of group {group!r}: {exc}") from exc
    committed = [
        f"{tp.topic}-{tp.partition}@{tp.offset}"
        for tp in result.topic_partitions or []
        if tp.error is None and tp.offset >= 0
    ]
    if committed:
        shown = ", ".join(committed[:5]) + (" ..." if len(committed) > 5 else "")
        raise BackfillError(
            f"consumer group {group!r} already has committed offsets ({shown}): a backfill "
            "builds a new application's state from the history, so give it a new "
            "application.id (or reset this one: delete the group and its internal topics)"
        )


def commit_offsets(
    admin: AdminClient,
    group: str,
    offsets: Mapping[k.TopicPartitionKey, int],
    timeout: float = 30.0,
) -> None:
    request = ConsumerGroupTopicPartitions(
        group, [TopicPartition(t, p, o) for (t, p), o in sorted(offsets.items())]
    )
    try:
        result = admin.alter_consumer_group_offsets([request], request_timeout=timeout)[
            group
        ].result(timeout=timeout)
    except KafkaException as exc:
        raise BackfillError(
            f"the backfill wrote its output but could not commit offsets for group {group!r}: "
            f"{exc} (is a daemon with this application.id running?)"
        ) from exc
    failed = [
        f"{tp.topic}-{tp.partition}: {tp.error}" for tp in result.topic_partitions or [] if tp.error
    ]
    if failed:
        raise BackfillError(f"committing offsets for group {group!r} failed: {failed[:5]}")


class _Job:
    """One backfill's Spark plan: DataFrames per stage, what goes to Kafka."""

    def __init__(
        self,
        spark: SparkSession,
        plan: BackfillPlan,
        config: StreamsConfig,
        starts: Mapping[k.TopicPartitionKey, int],
        ends: Mapping[k.TopicPartitionKey, int],
        progress: Progress,
        source: str,
    ) -> None:
        self.spark = spark
        self.source = source
        self.plan = plan
        self.config = config
        self.starts = starts
        self.ends = ends
        self.progress = progress
        self.handed: dict[str, list[DataFrame]] = {}
        self.to_kafka: list[DataFrame] = []
        self.written: dict[str, int] = {}
        self.cached: list[DataFrame] = []

    def _history(self, stage: StagePlan) -> DataFrame | None:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        topics = list(stage.history_topics)
        if not topics:
            return None
        starts = {tp: o for tp, o in self.starts.items() if tp[0] in topics}
        ends = {tp: o for tp, o in self.ends.items() if tp[0] in topics}
        df = read_ranges(
            self.spark,
            self.source,
            self.config.bootstrap_servers,
            topics,
            starts,
            ends,
            "read_committed",
            {key: str(value) for key, value in self.config.consumer_overrides.items()},
        )
        ts = F.coalesce(F.unix_millis("timestamp"), F.lit(-1).cast("long"))
        if self.plan.needs_order:
            index = F.create_map(*[x for i, t in enumerate(topics) for x in (F.lit(t), F.lit(i))])
            running = (
                Window.partitionBy("topic", "partition")
                .orderBy("offset")
                .rowsBetween(Window.unboundedPreceding, Window.currentRow)
            )
            order = F.array(
                F.max(ts).over(running),
                index[F.col("topic")].cast("long"),
                F.col("partition").cast("long"),
                F.col("offset"),
            )
        else:
            order = F.array().cast("array<bigint>")
        return df.select(
            "topic",
            "partition",
            "offset",
            "key",
            "value",
            ts.alias("timestamp"),
            "headers",
            order.alias("order"),
            F.lit(-1).cast("long").alias("stream_time"),
        )

    def _cache(self, df: DataFrame) -> DataFrame:
        from pyspark import StorageLevel

        df = df.persist(StorageLevel.MEMORY_AND_DISK)
        self.cached.append(df)
        return df

    def _route(self, df: DataFrame, label: str) -> dict[str, int]:
        """Count `df`'s records per topic (materializing it), queue those for Kafka,
        hand on those later stages read."""
        from pyspark.sql import functions as F

        counts: dict[str, int] = {}
        captured = 0
        for r in df.groupBy("kind", "topic").agg(F.count("*").alias("n")).collect():
            if r["kind"] == KIND_RECORD:
                counts[r["topic"]] = r["n"]
            elif r["kind"] == KIND_CAPTURE:
                captured += r["n"]
        kafka_topics = [t for t in counts if t in self.plan.kafka_topics]
        if kafka_topics:
            self.to_kafka.append(
                df.filter(
                    (F.col("kind") == KIND_RECORD) & F.col("topic").isin(kafka_topics)
                ).select(*_KAFKA_COLUMNS)
            )
            for t in kafka_topics:
                self.written[t] = self.written.get(t, 0) + counts[t]
        for topic in counts:
            if self.plan.readers_of(topic):
                self.handed.setdefault(topic, []).append(
                    df.filter((F.col("kind") == KIND_RECORD) & (F.col("topic") == topic)).select(
                        "topic",
                        "partition",
                        F.lit(-1).cast("long").alias("offset"),
                        "key",
                        "value",
                        "timestamp",
                        "headers",
                        "order",
                        F.lit(-1).cast("long").alias("stream_time"),
                    )
                )
        shown = [f"{n} to {t}" for t, n in sorted(counts.items())]
        if captured:
            shown.append(f"{captured} values to aggregate")
        self.progress(f"{label}: {', '.join(shown) or 'no output'}")
        return counts

    def run_stage(self, stage: StagePlan) -> None:
        from pyspark.sql import Window
        from pyspark.sql import functions as F

        parts = []
        history = self._history(stage)
        if history is not None:
            parts.append(history)
        for topic in stage.handed_topics:
            parts.extend(self.handed.get(topic, []))
        if not parts:
            self.progress(f"stage {stage.id}: no input")
            return
        df = functools.reduce(lambda a, b: a.unionByName(b), parts)
        if stage.windowed:
            running = (
                Window.partitionBy("partition")
                .orderBy("order")
                .rowsBetween(Window.unboundedPreceding, Window.currentRow)
            )
            df = df.withColumn("stream_time", F.max("timestamp").over(running))
        df = df.select(*INPUT_SCHEMA.fieldNames())
        out = self._cache(
            df.mapInArrow(functools.partial(input_pass, self.plan, stage.id), OUTPUT_SCHEMA)
        )
        sources = ", ".join([*stage.history_topics, *stage.handed_topics])
        self.progress(f"stage {stage.id} (subtopology {stage.id}) reads {sources}")
        self._route(out, f"stage {stage.id}")
        if not stage.aggregates:
            return
        captures = out.filter(F.col("kind") == KIND_CAPTURE)
        group = ["agg", "partition", "key", "window_start"]
        counted = [a.index for a in stage.aggregates if a.is_count]
        folded = [a.index for a in stage.aggregates if not a.is_count]
        results = []
        if counted:
            results.append(
                captures.filter(F.col("agg").isin(counted))
                .groupBy(*group)
                .agg(F.count("*").alias("count"), F.max("timestamp").alias("timestamp"))
                .select(
                    *group,
                    F.lit(None).cast("binary").alias("value"),
                    "count",
                    "timestamp",
                )
            )
        if folded:
            results.append(
                captures.filter(F.col("agg").isin(folded))
                .repartition(*group)
                .sortWithinPartitions(*group, "order")
                .select(*group, "value", "timestamp")
                .mapInArrow(functools.partial(fold_pass, self.plan, stage.id), RESULT_SCHEMA)
            )
        result = functools.reduce(lambda a, b: a.unionByName(b), results)
        stream_times: dict[int, int] = {}
        if stage.windowed:
            stream_times = {
                r["partition"]: r["ts"]
                for r in out.filter(F.col("kind") == KIND_STREAM_TIME)
                .groupBy("partition")
                .agg(F.max("timestamp").alias("ts"))
                .collect()
            }
        updates = self._cache(
            result.select(*RESULT_SCHEMA.fieldNames()).mapInArrow(
                functools.partial(result_pass, self.plan, stage.id, stream_times), OUTPUT_SCHEMA
            )
        )
        names = ", ".join(
            f"{a.store} ({'count' if a.is_count else 'fold'})" for a in stage.aggregates
        )
        self.progress(f"stage {stage.id} aggregates into {names}")
        self._route(updates, f"stage {stage.id} aggregates")

    def write(self) -> None:
        if not self.to_kafka:
            self.progress("nothing to write")
            return
        df = functools.reduce(lambda a, b: a.unionByName(b), self.to_kafka)
        total = sum(self.written.values())
        self.progress(f"writing {total} records to {', '.join(sorted(self.written))}")
        from runtime.spark.source import register

        register(self.spark)
        # The project's writer: it sets each record's timestamp (Spark's sink cannot).
        writer = (
            df.write.format(STREAMS_KAFKA)
            .option("bootstrap.servers", self.config.bootstrap_servers)
            .mode("append")
        )
        for key, value in self.config.producer_overrides.items():
            writer = writer.option(f"kafka.{key}", str(value))
        writer.save()

    def release(self) -> None:
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def run_backfill(
    spark: SparkSession,
    topology: Topology,
    config: StreamsConfig,
    progress: Progress | None = None,
    commit: bool = True,
    source: str | None = None,
) -> BackfillResult:
    """Backfill `topology` over its source topics' history; see the module docstring.

    `source` reads the history: `kafka` or `streams-kafka` (None: the session's
    setting, else `kafka`). Raises BackfillError (the topology, the group or the
    cluster does not allow it; a record failed under log_and_fail; a bad source),
    TopicError (topics missing or mis-partitioned), ConnectorUnavailable (the
    `kafka` source is not on the session's classpath) and Spark's own errors.
    """
    say: Progress = progress or _quiet
    started = time.monotonic()
    try:
        source = session_source(spark, source)
    except ValueError as exc:
        raise BackfillError(str(exc)) from None
    check_nodes(topology)  # before touching the cluster
    admin = AdminClient(admin_config(config))
    extra = {config.dead_letter_queue_topic: 1} if config.dead_letter_queue_topic else {}
    layout = resolve_topics(
        admin, topology, config.application_id, config.replication_factor, extra
    )
    plan = plan_backfill(topology, config, layout)
    sources = {
        t: layout.partitions[t]
        for t in (*plan.history_topics, *plan.internal_topics, *plan.through_topics)
        if t in layout.partitions
    }
    check_fresh_group(admin, config.application_id, sources)

    marks = k.watermarks(config.bootstrap_servers, plan.history_topics, "read_committed")
    starts = {tp: lo for tp, (lo, _) in marks.items()}
    ends = {tp: hi for tp, (_, hi) in marks.items()}
    records = sum(ends[tp] - starts[tp] for tp in marks)
    say(
        f"backfill of {config.application_id!r}: {len(plan.stages)} stage(s), history of "
        f"{', '.join(plan.history_topics)} ({records} offsets in {len(marks)} partitions, "
        f"read with {source})"
    )
    if plan.changelog_topics:
        leftovers = k.watermarks(
            config.bootstrap_servers, plan.changelog_topics, "read_uncommitted"
        )
        stale = sum(hi - lo for lo, hi in leftovers.values())
        if stale:
            say(
                f"warning: the changelog topics already hold {stale} records (an earlier, "
                "unfinished backfill?); the final aggregates written now supersede them per key"
            )

    if source == KAFKA:
        from runtime.spark.connector import check_connector

        check_connector(spark)  # before the job, not in its first stage
    job = _Job(spark, plan, config, starts, ends, say, source)
    try:
        for stage in plan.stages:
            job.run_stage(stage)
        job.write()
    finally:
        job.release()

    committed: dict[k.TopicPartitionKey, int] = dict(ends)
    handed = [*plan.internal_topics, *plan.through_topics]
    if handed:
        for tp, (_, hi) in k.watermarks(
            config.bootstrap_servers, handed, "read_uncommitted"
        ).items():
            committed[tp] = hi
    if commit:
        commit_offsets(admin, config.application_id, committed)
        say(f"committed offsets for group {config.application_id!r}: {_by_topic(committed)}")
    result = BackfillResult(
        application_id=config.application_id,
        source_offsets=_by_topic(ends),
        committed=_by_topic(committed) if commit else {},
        records_read=records,
        records_written=dict(job.written),
        seconds=time.monotonic() - started,
    )
    say(
        f"done in {result.seconds:.1f}s: {sum(result.records_written.values())} records written "
        f"({result.changelog_records} to changelogs); start the daemon with "
        f"application.id={config.application_id}: it restores the stores from the changelogs "
        "and continues from the committed offsets"
    )
    return result


__all__ = ["BackfillError", "BackfillResult", "TopicError", "run_backfill"]
