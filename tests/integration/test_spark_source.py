"""Spark's Kafka connector and the project's data source, on the session broker with local[2].

Batch reads with either format must return exactly what a plain consumer reads; keyed
writes through either sink must land where the Java client (and the runtime's
partitioner) puts them; the project's writer keeps record timestamps, Spark's sink does
not (why the backfill writes with the project's); writes fail on delivery errors.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from confluent_kafka import Producer

from runtime.partitioning.default import default_partition
from runtime.spark import FORMAT, spark_session
from runtime.spark.kafka import KafkaSourceError, offsets_to_json, watermarks
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name

# Event time an hour ago: a fixed 2023 stamp let the broker's 7-day time
# retention delete a topic's data between the write and the read (a CI run
# read 0 of 3,000 records).
RECENT_MS = int(time.time() * 1000) - 3_600_000

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    """One local[2] session for the module (shared with the other Spark test modules:
    Spark keeps one session per process, so it is not stopped here)."""
    return spark_session("local[2]", "streams-runtime-tests")


def read(spark, bootstrap: str, topic: str, fmt: str = FORMAT, **options: str):  # type: ignore[no-untyped-def]
    reader = (
        spark.read.format(fmt)
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("includeHeaders", "true")
    )
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def read_to_end(spark, bootstrap: str, topic: str):  # type: ignore[no-untyped-def]
    """Spark's connector up to the ends from the fetch path: its own "latest" (ListOffsets)
    falls short on Tansu, as runtime.spark.sources explains."""
    ends = {tp: hi for tp, (_, hi) in watermarks(bootstrap, [topic]).items()}
    return read(spark, bootstrap, topic, "kafka", endingOffsets=json.dumps(offsets_to_json(ends)))


def test_batch_reads_of_both_formats_equal_a_plain_consumer(spark, bootstrap: str) -> None:
    topic = unique_name("spark-read")
    create_topic(bootstrap, topic, 4)
    records = [(f"key-{i % 5000}", f"value-{i}-" + "x" * (i % 50)) for i in range(100_000)]
    records.append((None, "null-key"))
    produce(bootstrap, topic, records)
    with_headers = unique_name("spark-read-headers")
    create_topic(bootstrap, with_headers, 1)
    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(with_headers, key=b"h", value=b"1", headers=[("a", b"x"), ("b", None)])
    producer.produce(with_headers, key=b"n", value=None)
    producer.flush(30)

    expected = consume_all(bootstrap, topic, expected=len(records), idle=0.5)
    want = sorted((m.partition, m.offset, m.key, m.value, m.timestamp) for m in expected)
    split = read(spark, bootstrap, topic, maxRecordsPerPartition="10000")
    assert split.rdd.getNumPartitions() > 4  # the project's source split large ranges
    for df in (split, read_to_end(spark, bootstrap, topic)):
        table = df.select("partition", "offset", "key", "value", "timestamp", "topic").toArrow()
        got = sorted(
            zip(
                table.column("partition").to_pylist(),
                table.column("offset").to_pylist(),
                table.column("key").to_pylist(),
                table.column("value").to_pylist(),
                [int(t.timestamp() * 1000) for t in table.column("timestamp").to_pylist()],
                strict=True,
            )
        )
        assert got == want
        assert set(table.column("topic").to_pylist()) == {topic}

    for df in (read(spark, bootstrap, with_headers), read_to_end(spark, bootstrap, with_headers)):
        rows = df.orderBy("offset").collect()
        assert [(r.key, r.value) for r in rows] == [(b"h", b"1"), (b"n", None)]
        assert [(h.key, h.value) for h in rows[0].headers] == [("a", b"x"), ("b", None)]
    # Records without headers: null from the project's source, an empty list from Spark's.
    assert rows[1].headers in (None, [])


def test_offsets_per_partition_and_several_topics(spark, bootstrap: str) -> None:
    a, b = unique_name("spark-a"), unique_name("spark-b")
    create_topic(bootstrap, a, 2)
    create_topic(bootstrap, b, 1)
    produce(bootstrap, a, [(f"k{i}", f"a{i}", i % 2) for i in range(100)])
    produce(bootstrap, b, [(f"k{i}", f"b{i}") for i in range(10)])
    starting = json.dumps({a: {"0": 10, "1": -2}})
    ending = json.dumps({a: {"0": 20, "1": -1}, b: {"0": 5}})
    df = read(spark, bootstrap, f"{a},{b}", startingOffsets=starting, endingOffsets=ending)
    got = sorted(
        (r.topic, r.partition, r.offset)
        for r in df.select("topic", "partition", "offset").collect()
    )
    want = (
        [(a, 0, o) for o in range(10, 20)]
        + [(a, 1, o) for o in range(50)]
        + [(b, 0, o) for o in range(5)]
    )
    assert got == sorted(want)
    # latest..latest is empty; a missing topic is a clear error.
    assert read(spark, bootstrap, a, startingOffsets="latest").count() == 0
    with pytest.raises(Exception, match="not available"):
        read(spark, bootstrap, unique_name("no-such-topic"), pollTimeoutMs="2000").count()


def test_write_a_dataframe_and_read_it_back(spark, bootstrap: str) -> None:
    topic = unique_name("spark-write")
    create_topic(bootstrap, topic, 3)
    rows = [
        (f"k{i}".encode(), f"v{i}".encode(), i % 3, [("n", str(i).encode())], RECENT_MS + i)
        for i in range(3000)
    ]
    df = spark.createDataFrame(
        rows,
        "key binary, value binary, partition int, headers array<struct<key:string,value:binary>>, "
        "timestamp long",
    ).repartition(4)
    df.write.format(FORMAT).option("bootstrap.servers", bootstrap).option("topic", topic).mode(
        "append"
    ).save()
    back = read(spark, bootstrap, topic).collect()
    assert len(back) == len(rows)
    got = sorted(
        (
            r.key,
            r.value,
            r.partition,
            [(h.key, h.value) for h in r.headers],
            int(r.timestamp.timestamp() * 1000),
        )
        for r in back
    )
    assert got == sorted((k, v, p, h, ts) for k, v, p, h, ts in rows)

    # string columns and a topic column work too; keyed rows land by murmur2 as in Java.
    other = unique_name("spark-write-str")
    create_topic(bootstrap, other, 2)
    spark.createDataFrame(
        [(other, "a", "1"), (other, "b", "2")], "topic string, key string, value string"
    ).write.format(FORMAT).option("bootstrap.servers", bootstrap).mode("append").save()
    plain = {m.key: m.value for m in consume_all(bootstrap, other)}
    assert plain == {b"a": b"1", b"b": b"2"}


def test_a_delivery_error_fails_the_write(spark, bootstrap: str) -> None:
    topic = unique_name("spark-write-bad")
    create_topic(bootstrap, topic, 2)
    df = spark.createDataFrame([(b"k", b"v", 7)], "key binary, value binary, partition int")
    with pytest.raises(Exception, match="Unknown partition"):
        df.write.format(FORMAT).option("bootstrap.servers", bootstrap).option(
            "topic", topic
        ).option("kafka.message.timeout.ms", "5000").mode("append").save()
    with pytest.raises(Exception, match="value"):
        spark.createDataFrame([(b"k",)], "key binary").write.format(FORMAT).option(
            "bootstrap.servers", bootstrap
        ).option("topic", topic).mode("append").save()


def test_keyed_writes_land_where_the_java_client_puts_them_through_both_sinks(
    spark, bootstrap: str
) -> None:
    """Spark's sink (the Java producer) and the project's (librdkafka murmur2_random) put a
    key on the partition the runtime's partitioner computes; only the project's sink
    writes the rows' timestamps (Spark's has no timestamp column: it is ignored)."""
    keys = [f"k{i}".encode() for i in range(1000)] + ["ключ-ü".encode(), b"\x00\xff", b""]
    rows = [(key, b"v", RECENT_MS + i) for i, key in enumerate(keys)]
    df = spark.createDataFrame(rows, "key binary, value binary, timestamp long").repartition(3)
    written: dict[str, dict[bytes | None, tuple[int, int]]] = {}
    before = int(time.time() * 1000)
    for fmt in ("kafka", FORMAT):
        topic = unique_name(f"spark-keyed-{fmt}")
        create_topic(bootstrap, topic, 5)
        df.write.format(fmt).option("kafka.bootstrap.servers", bootstrap).option(
            "topic", topic
        ).mode("append").save()
        written[fmt] = {m.key: (m.partition, m.timestamp) for m in consume_all(bootstrap, topic)}
        assert sorted(written[fmt]) == sorted(keys)  # type: ignore[type-var]
        for key, (partition, _) in written[fmt].items():
            assert key is not None and partition == default_partition(key, 5), (fmt, key)
    stamps = dict(zip(keys, (ts for _, _, ts in rows), strict=True))
    assert all(ts == stamps[key] for key, (_, ts) in written[FORMAT].items())
    assert all(ts >= before for _, ts in written["kafka"].values())  # Spark's: time of writing


def test_a_streaming_copy_through_the_project_sink_keeps_timestamps(
    spark, bootstrap: str, tmp_path: Path, on_kafka: bool
) -> None:
    """Spark's streaming reader into the project's streaming sink: a restarted query copies
    only what is new (Spark's checkpoint), with the source records' timestamps."""
    if not on_kafka:
        pytest.skip("Spark's streaming reader ends at ListOffsets(latest), short on Tansu")
    source, copy = unique_name("spark-stream-in"), unique_name("spark-stream-out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, copy, 2)
    producer = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random"})

    def feed(first: int, count: int) -> None:
        for i in range(first, first + count):
            producer.produce(source, key=f"k{i}", value=f"v{i}", timestamp=RECENT_MS + i)
        assert producer.flush(30) == 0

    def run_once() -> None:
        query = (
            spark.readStream.format("kafka")
            .option("kafka.bootstrap.servers", bootstrap)
            .option("subscribe", source)
            .option("startingOffsets", "earliest")
            .load()
            .select("key", "value", "timestamp")
            .writeStream.format(FORMAT)
            .option("kafka.bootstrap.servers", bootstrap)
            .option("topic", copy)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)
        assert query.exception() is None

    def copied() -> list[tuple[bytes | None, bytes | None, int]]:
        return sorted((m.key, m.value, m.timestamp) for m in consume_all(bootstrap, copy))

    def want(count: int) -> list[tuple[bytes | None, bytes | None, int]]:
        return sorted((f"k{i}".encode(), f"v{i}".encode(), RECENT_MS + i) for i in range(count))

    feed(0, 300)
    run_once()
    assert copied() == want(300)
    feed(300, 100)
    run_once()
    assert copied() == want(400)  # nothing copied twice


def test_bad_options_are_named(spark, bootstrap: str) -> None:
    with pytest.raises(KafkaSourceError, match="topic"):
        from runtime.spark.source import ReadOptions

        ReadOptions.parse({"bootstrap.servers": bootstrap})
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, bootstrap, "x", startingOffsets="yesterday").count()
