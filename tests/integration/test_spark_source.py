"""The Kafka data source for PySpark, on the session broker with Spark local[2].

Batch reads must return exactly what a plain consumer reads (splitting large ranges),
writes must round-trip and fail on delivery errors, and a streaming query must resume
from its checkpoint with only the new records.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from runtime.spark import FORMAT, spark_session
from runtime.spark.kafka import KafkaSourceError, watermarks
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def spark():  # type: ignore[no-untyped-def]
    """One local[2] session for the module (shared with the other Spark test modules:
    Spark keeps one session per process, so it is not stopped here)."""
    return spark_session("local[2]", "streams-runtime-tests")


def read(spark, bootstrap: str, topic: str, **options: str):  # type: ignore[no-untyped-def]
    reader = spark.read.format(FORMAT).option("bootstrap.servers", bootstrap).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_batch_read_of_200k_records_equals_a_plain_consumer(spark, bootstrap: str) -> None:
    topic = unique_name("spark-read")
    create_topic(bootstrap, topic, 4)
    records = [(f"key-{i % 5000}", f"value-{i}-" + "x" * (i % 50)) for i in range(200_000)]
    records.append((None, "null-key"))
    produce(bootstrap, topic, records)
    with_headers = unique_name("spark-read-headers")
    create_topic(bootstrap, with_headers, 1)
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap})
    producer.produce(with_headers, key=b"h", value=b"1", headers=[("a", b"x"), ("b", None)])
    producer.produce(with_headers, key=b"n", value=None)
    producer.flush(30)

    expected = consume_all(bootstrap, topic, expected=len(records), idle=0.5)
    df = read(spark, bootstrap, topic, maxRecordsPerPartition="30000")
    assert df.rdd.getNumPartitions() > 4  # large ranges were split
    table = df.toArrow()
    assert table.num_rows == len(records)
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
    assert got == sorted((m.partition, m.offset, m.key, m.value, m.timestamp) for m in expected)
    assert set(table.column("topic").to_pylist()) == {topic}

    rows = read(spark, bootstrap, with_headers).orderBy("offset").collect()
    assert [(r.key, r.value) for r in rows] == [(b"h", b"1"), (b"n", None)]
    assert [(h.key, h.value) for h in rows[0].headers] == [("a", b"x"), ("b", None)]
    assert rows[1].headers is None


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
        (f"k{i}".encode(), f"v{i}".encode(), i % 3, [("n", str(i).encode())], 1_700_000_000_000 + i)
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


def test_streaming_query_resumes_from_its_checkpoint(spark, bootstrap: str, tmp_path: Path) -> None:
    topic = unique_name("spark-stream")
    create_topic(bootstrap, topic, 3)
    produce(bootstrap, topic, [(f"k{i}", f"first-{i}") for i in range(1000)])
    seen: list[tuple[int, bytes]] = []
    batches: list[int] = []

    def collect(batch_df, batch_id: int) -> None:  # type: ignore[no-untyped-def]
        rows = batch_df.select("offset", "value").collect()
        batches.append(len(rows))
        seen.extend((r.offset, r.value) for r in rows)

    def run_once(**options: str) -> None:
        reader = (
            spark.readStream.format(FORMAT)
            .option("bootstrap.servers", bootstrap)
            .option("topic", topic)
            .option("startingOffsets", "earliest")
        )
        for key, value in options.items():
            reader = reader.option(key, value)
        query = (
            reader.load()
            .writeStream.foreachBatch(collect)
            .option("checkpointLocation", str(tmp_path / "checkpoint"))
            .trigger(availableNow=True)
            .start()
        )
        assert query.awaitTermination(180)
        assert query.exception() is None

    run_once(maxOffsetsPerTrigger="400")
    assert sorted(v for _, v in seen) == sorted(f"first-{i}".encode() for i in range(1000))
    assert len([n for n in batches if n]) >= 3  # bounded micro-batches

    seen.clear()
    produce(bootstrap, topic, [(f"k{i}", f"second-{i}") for i in range(300)])
    run_once()
    assert sorted(v for _, v in seen) == sorted(f"second-{i}".encode() for i in range(300))

    seen.clear()
    run_once()  # nothing new: nothing read
    assert seen == []
    assert sum(hi for _, hi in watermarks(bootstrap, [topic]).values()) == 1300


def test_bad_options_are_named(spark, bootstrap: str) -> None:
    with pytest.raises(KafkaSourceError, match="topic"):
        from runtime.spark.source import ReadOptions

        ReadOptions.parse({"bootstrap.servers": bootstrap})
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, bootstrap, "x", startingOffsets="yesterday").count()
