"""The project's Kafka data source for PySpark (`format("streams-kafka")`), on confluent-kafka.

Spark's own connector (`format("kafka")`, `runtime.spark.connector`) is the first choice and
the default of the Spark jobs; this source is the alternative that needs no JVM package
(plain Python inside Spark's Python workers, the `spark` extra only) and the writer that
keeps what Spark's Kafka sink drops:

- Writes set each record's timestamp from a `timestamp` column (Spark's sink has no such
  column: its records get the time of writing). The backfill writes with it, so output
  and changelog records carry the timestamps of the records that made them, as the
  daemon's do.
- Keyed rows without a partition land where the Java client (and Spark's sink, and the
  runtime's partitioner) puts them: murmur2, librdkafka's `murmur2_random`.

It takes Spark's option names (`kafka.bootstrap.servers`, `subscribe`, `startingOffsets`,
`endingOffsets`, `kafka.isolation.level`, `failOnDataLoss`, `minPartitions`,
`maxRecordsPerPartition`, `kafka.<property>`), so switching a batch job between the two is
changing the format's name. Register it with `runtime.spark.register(spark)` (done by
`runtime.spark.spark_session`), then:

    df = (spark.read.format("streams-kafka")
          .option("kafka.bootstrap.servers", "127.0.0.1:9092")
          .option("subscribe", "orders,refunds")
          .option("startingOffsets", "earliest")       # or latest, or JSON per partition
          .option("endingOffsets", "latest")
          .load())

Schema: `key binary, value binary, topic string, partition int, offset long,
timestamp timestamp, headers array<struct<key string, value binary>>`
(headers null when a record has none).

Batch reads plan one Spark input partition per Kafka partition range
`[start, end)`, split into pieces of at most `maxRecordsPerPartition` records
(default 1,000,000; 0 never splits) and into at least `minPartitions` pieces.
Streaming reads are Spark's connector's job (`spark.readStream.format("kafka")`, offsets
in the query's checkpoint): this source has none.

Writes (`df.write.format("streams-kafka")`, and `writeStream`): columns
`value` (binary or string), optional `key`, `topic` (else the `topic`
option), `partition`, `headers`, `timestamp`. An idempotent producer per Spark
task; the task fails if any record is not acknowledged, so a job that
succeeded wrote everything. A retried task writes its records again
(at-least-once, as Spark's own Kafka sink).

Options besides Spark's: `bootstrap.servers` and `topic` (short forms),
`isolation.level` (`read_committed`, the default, or `read_uncommitted`),
`pollTimeoutMs` (how long a read may make no progress before it fails, default
120000); `kafka.<property>` is any librdkafka property of the clients.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.types import (
    ArrayType,
    BinaryType,
    IntegerType,
    LongType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from runtime.spark import kafka as k
from runtime.spark.names import STREAMS_KAFKA
from runtime.spark.row_producer import RowProducer, header_pairs

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession

FORMAT = STREAMS_KAFKA

HEADERS_TYPE = ArrayType(
    StructType([StructField("key", StringType()), StructField("value", BinaryType())])
)
SCHEMA = StructType(
    [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("headers", HEADERS_TYPE),
    ]
)


@dataclass(frozen=True)
class ReadOptions:
    """The reader's options, validated on the driver (picklable, shipped to workers)."""

    bootstrap: str
    topics: tuple[str, ...]
    starting: str
    ending: str
    isolation: str
    fail_on_data_loss: bool
    max_records: int
    min_partitions: int
    poll_timeout_s: float
    overrides: tuple[tuple[str, str], ...]

    @classmethod
    def parse(cls, options: Mapping[str, str]) -> ReadOptions:
        opts = {key.lower(): value for key, value in options.items()}
        bootstrap = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise k.KafkaSourceError("option 'bootstrap.servers' is required")
        return cls(
            bootstrap=bootstrap,
            topics=tuple(k.parse_topics(opts.get("topic") or opts.get("subscribe"))),
            starting=opts.get("startingoffsets", ""),
            ending=opts.get("endingoffsets", ""),
            isolation=opts.get("isolation.level")
            or opts.get("kafka.isolation.level")
            or "read_committed",
            fail_on_data_loss=_bool(opts.get("failondataloss", "true"), "failOnDataLoss"),
            max_records=_int(
                opts.get("maxrecordsperpartition", "1000000"), "maxRecordsPerPartition"
            ),
            min_partitions=_int(opts.get("minpartitions", "0"), "minPartitions"),
            poll_timeout_s=_int(opts.get("polltimeoutms", "120000"), "pollTimeoutMs") / 1000,
            overrides=tuple(sorted(k.client_overrides(options).items())),
        )

    def __post_init__(self) -> None:
        k.parse_offsets(self.starting, "earliest", "startingOffsets")
        k.parse_offsets(self.ending, "latest", "endingOffsets")

    def consumer_settings(self) -> dict[str, Any]:
        return k.consumer_settings(self.bootstrap, self.isolation, dict(self.overrides))

    def watermarks(self) -> dict[k.TopicPartitionKey, tuple[int, int]]:
        return k.watermarks(
            self.bootstrap,
            self.topics,
            self.isolation,
            dict(self.overrides),
            timeout=min(self.poll_timeout_s, 30.0),
        )


def _bool(text: str, what: str) -> bool:
    lowered = text.strip().lower()
    if lowered not in ("true", "false"):
        raise k.KafkaSourceError(f"option {what!r} must be true or false, got {text!r}")
    return lowered == "true"


def _int(text: str, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise k.KafkaSourceError(f"option {what!r} must be an integer, got {text!r}") from None
    if value < 0:
        raise k.KafkaSourceError(f"option {what!r} must be >= 0, got {value}")
    return value


# -- reading ---------------------------------------------------------------------


def _arrow_schema() -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(SCHEMA, timezone="UTC")


def _to_arrow(messages: Sequence[Any], topic: str, partition: int, schema: pa.Schema) -> Any:
    """One Arrow batch of consumed messages (the hot loop of every read)."""
    import pyarrow as pa

    n = len(messages)
    keys = [m.key() for m in messages]
    values = [m.value() for m in messages]
    offsets = [m.offset() for m in messages]
    stamps = []
    for m in messages:
        kind, ts = m.timestamp()
        stamps.append(ts * 1000 if kind else None)  # 0: TIMESTAMP_NOT_AVAILABLE
    raw_headers = [m.headers() for m in messages]
    headers_field = schema.field("headers").type
    if any(raw_headers):
        headers = pa.array(
            [[{"key": hk, "value": hv} for hk, hv in h] if h else None for h in raw_headers],
            type=headers_field,
        )
    else:
        headers = pa.nulls(n, type=headers_field)
    return pa.RecordBatch.from_arrays(
        [
            pa.array(keys, type=pa.binary()),
            pa.array(values, type=pa.binary()),
            pa.array([topic] * n, type=pa.string()),
            pa.array([partition] * n, type=pa.int32()),
            pa.array(offsets, type=pa.int64()),
            pa.array(stamps, type=schema.field("timestamp").type),
            headers,
        ],
        schema=schema,
    )


def read_partition(options: ReadOptions, value: tuple[str, int, int, int] | None) -> Iterator[Any]:
    """Arrow batches of one planned range (runs in a Spark Python worker).

    Spark reads a plan without partitions as one partition of value None.
    """
    if value is None:
        return
    topic, partition, start, end = value
    schema = _arrow_schema()
    offset_range = k.OffsetRange(topic, partition, start, end)
    for messages in k.read_range(
        options.consumer_settings(),
        offset_range,
        fail_on_data_loss=options.fail_on_data_loss,
        idle_timeout=options.poll_timeout_s,
    ):
        yield _to_arrow(messages, topic, partition, schema)


class KafkaBatchReader(DataSourceReader):
    """Plans ranges from the options' offsets; reads each in a worker."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options

    def partitions(self) -> Sequence[InputPartition]:
        o = self.options
        marks = o.watermarks()
        starts = k.resolve_offsets(
            k.parse_offsets(o.starting, "earliest", "startingOffsets"), marks, "startingOffsets"
        )
        ends = k.resolve_offsets(
            k.parse_offsets(o.ending, "latest", "endingOffsets"), marks, "endingOffsets"
        )
        ranges = k.plan_ranges(starts, ends, o.max_records, o.min_partitions)
        return [InputPartition((r.topic, r.partition, r.start, r.end)) for r in ranges]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return read_partition(self.options, getattr(partition, "value", None))


# -- writing ---------------------------------------------------------------------


@dataclass(frozen=True)
class WriteOptions:
    bootstrap: str
    topic: str | None
    overrides: tuple[tuple[str, str], ...]
    columns: tuple[str, ...]

    @classmethod
    def parse(cls, options: Mapping[str, str], schema: StructType) -> WriteOptions:
        opts = {key.lower(): value for key, value in options.items()}
        bootstrap = opts.get("bootstrap.servers") or opts.get("kafka.bootstrap.servers")
        if not bootstrap:
            raise k.KafkaSourceError("option 'bootstrap.servers' is required")
        names = {f.name.lower(): f for f in schema.fields}
        if "value" not in names:
            raise k.KafkaSourceError(
                f"writing to Kafka needs a 'value' column (binary or string); got {schema.simpleString()}"
            )
        topic = opts.get("topic")
        if topic is not None and "," in topic:
            raise k.KafkaSourceError(f"write option 'topic' names one topic, got {topic!r}")
        if not topic and "topic" not in names:
            raise k.KafkaSourceError(
                "writing to Kafka needs the 'topic' option or a 'topic' column"
            )
        allowed = {"key", "value", "topic", "partition", "headers", "timestamp"}
        extra = sorted(set(names) - allowed)
        if extra:
            raise k.KafkaSourceError(
                f"unexpected columns {extra}: a Kafka write takes {sorted(allowed)}"
            )
        for col in ("key", "value"):
            if col in names and not isinstance(names[col].dataType, BinaryType | StringType):
                raise k.KafkaSourceError(f"column {col!r} must be binary or string")
        return cls(
            bootstrap=bootstrap,
            topic=topic,
            overrides=tuple(sorted(k.client_overrides(options).items())),
            columns=tuple(f.name for f in schema.fields),
        )


@dataclass
class KafkaCommitMessage(WriterCommitMessage):
    records: int


def _as_bytes(value: Any) -> bytes | None:
    if value is None or isinstance(value, bytes):
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    return bytes(value)


def _timestamps_ms(column: Any) -> list[int | None]:
    import pyarrow as pa

    if pa.types.is_timestamp(column.type):
        unit = {"s": 1000, "ms": 1, "us": 0.001, "ns": 0.000001}[column.type.unit]
        raw = column.cast(pa.int64()).to_pylist()
        return [None if v is None else int(v * unit) for v in raw]
    values: list[int | None] = column.to_pylist()
    return values


class KafkaBatchWriter(DataSourceArrowWriter):
    """Produces each Arrow batch of a Spark task; fails the task on delivery errors."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> KafkaCommitMessage:
        o = self.options
        producer = RowProducer(k.producer_settings(o.bootstrap, dict(o.overrides)))
        for batch in iterator:
            n = batch.num_rows
            names = [name.lower() for name in batch.schema.names]
            col = {name: batch.column(i) for i, name in enumerate(names)}
            values = [_as_bytes(v) for v in col["value"].to_pylist()]
            keys = [_as_bytes(v) for v in col["key"].to_pylist()] if "key" in col else [None] * n
            topics = col["topic"].to_pylist() if "topic" in col else [o.topic] * n
            parts = col["partition"].to_pylist() if "partition" in col else [None] * n
            stamps = _timestamps_ms(col["timestamp"]) if "timestamp" in col else [None] * n
            headers = col["headers"].to_pylist() if "headers" in col else [None] * n
            produce = producer.produce
            for i in range(n):
                topic = topics[i] or o.topic
                if not topic:
                    raise k.KafkaSourceError("a row has no topic and no 'topic' option is set")
                produce(topic, keys[i], values[i], parts[i], stamps[i], header_pairs(headers[i]))
        return KafkaCommitMessage(producer.close())

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        pass


class KafkaStreamWriter(DataSourceStreamWriter):
    """`writeStream` sink: each micro-batch's rows produced as by the batch writer."""

    def __init__(self, options: WriteOptions) -> None:
        self.options = options

    def write(self, iterator: Iterator[Any]) -> KafkaCommitMessage:
        o = self.options
        producer = RowProducer(k.producer_settings(o.bootstrap, dict(o.overrides)))
        for row in iterator:
            d = row.asDict()
            topic = d.get("topic") or o.topic
            if not topic:
                raise k.KafkaSourceError("a row has no topic and no 'topic' option is set")
            stamp = d.get("timestamp")
            if stamp is not None and not isinstance(stamp, int):
                stamp = int(stamp.timestamp() * 1000)
            producer.produce(
                topic,
                _as_bytes(d.get("key")),
                _as_bytes(d.get("value")),
                d.get("partition"),
                stamp,
                header_pairs(d.get("headers")),
            )
        return KafkaCommitMessage(producer.close())

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        pass


class KafkaDataSource(DataSource):
    """`format("streams-kafka")`: see the module docstring."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(ReadOptions.parse(self.options))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceArrowWriter:
        return KafkaBatchWriter(WriteOptions.parse(self.options, schema))

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        return KafkaStreamWriter(WriteOptions.parse(self.options, schema))


def register(spark: SparkSession) -> None:
    """Make `format("streams-kafka")` available in this session (idempotent)."""
    spark.dataSource.register(KafkaDataSource)
