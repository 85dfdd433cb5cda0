"""Workload "spark-read": Spark's read throughput against a plain confluent-kafka consumer.

The question it answers (the Spark issue): what does reading a topic through the
Spark data source (`format("streams-kafka")`, confluent-kafka inside Spark's Python
workers, Arrow batches to the JVM) cost against the plain consumer it wraps?

Session: one broker (``--broker kafka|tansu``, default kafka; or ``--bootstrap``),
one topic of ``--partitions`` partitions loaded once with ``--records`` records
(string keys, values of ``--value-bytes``). Then, in one run, ``--repeats`` rounds of:

- plain: one ``Consumer`` assigned to every partition from the beginning,
  ``consume(10000)`` until each partition's EOF, counting records and summing value
  lengths (one Python thread: the baseline);
- spark: ``spark.read.format("streams-kafka")...load()`` aggregated to the same count
  and sum (``local[2]`` by default: two Python workers read in parallel, one per core),
  timed from the action's start (planning included) to its result.

A small warm-up read first starts Spark's Python workers, so the rounds measure
reading, not process start-up (the warm-up's time is reported). Ratio = Spark
records/s / plain records/s, per round and for the medians. Results go to
``<out>/spark_read.json`` and ``.md``.

Run: ``python -m benchmarks.spark_read`` (or through ``python -m benchmarks`` once it
is listed there; the entry point is ``spark_read``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from typing import Any

NAME = "spark-read"


def _load(bootstrap: str, topic: str, partitions: int, records: int, value_bytes: int) -> float:
    from confluent_kafka import Producer
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    time.sleep(0.5)
    producer = Producer(
        {
            "bootstrap.servers": bootstrap,
            "linger.ms": 20,
            "batch.num.messages": 10000,
            "queue.buffering.max.messages": 1_000_000,
            "partitioner": "murmur2_random",
        }
    )
    pad = "x" * max(0, value_bytes - 24)
    started = time.monotonic()
    for i in range(records):
        value = f'{{"i":{i:>9},"p":"{pad}"}}'.encode()
        while True:
            try:
                producer.produce(topic, key=f"key-{i % 100_000}".encode(), value=value)
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("records not delivered")
    return time.monotonic() - started


def plain_read(bootstrap: str, topic: str) -> dict[str, Any]:
    """Every record of `topic` with one plain consumer: count, value bytes, seconds."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-plain-{time.time_ns()}",
            "enable.auto.commit": False,
            "enable.partition.eof": True,
            "isolation.level": "read_committed",
            "fetch.wait.max.ms": 100,
        }
    )
    md = consumer.list_topics(topic, timeout=30)
    parts = sorted(md.topics[topic].partitions)
    started = time.monotonic()
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in parts])
    count = size = 0
    at_end: set[int] = set()
    while len(at_end) < len(parts):
        for m in consumer.consume(10000, 0.2):
            err = m.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    at_end.add(m.partition())
                continue
            count += 1
            size += len(m.value())
    seconds = time.monotonic() - started
    consumer.close()
    return {"records": count, "value_bytes": size, "seconds": seconds, "rate": count / seconds}


def spark_read_once(spark: Any, bootstrap: str, topic: str, **options: str) -> dict[str, Any]:
    from pyspark.sql import functions as F

    from runtime.spark import FORMAT

    started = time.monotonic()
    reader = spark.read.format(FORMAT).option("bootstrap.servers", bootstrap).option("topic", topic)
    for key, value in options.items():
        reader = reader.option(key, value)
    row = (
        reader.load().agg(F.count("*").alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
    )
    seconds = time.monotonic() - started
    return {
        "records": row["n"],
        "value_bytes": row["b"],
        "seconds": seconds,
        "rate": row["n"] / seconds,
    }


def spark_read(
    records: int = 1_000_000,
    partitions: int = 4,
    value_bytes: int = 100,
    repeats: int = 3,
    bootstrap: str | None = None,
    master: str = "local[2]",
    out_dir: str = "benchmarks/results",
    max_records_per_partition: int = 250_000,
    broker_kind: str = "kafka",
) -> dict[str, Any]:
    """Run the workload (see the module docstring); returns and writes the results."""
    from benchmarks.harness import broker_description, start_broker
    from runtime.spark import spark_session

    broker = None
    if bootstrap is None:
        broker = start_broker(broker_kind)
        bootstrap = broker.bootstrap
    try:
        topic = f"bench-spark-read-{time.time_ns()}"
        load_s = _load(bootstrap, topic, partitions, records, value_bytes)
        print(f"loaded {records:,} records into {topic} in {load_s:.1f}s", file=sys.stderr)
        spark_started = time.monotonic()
        spark = spark_session(master, "bench-spark-read")
        session_s = time.monotonic() - spark_started
        options = {"maxRecordsPerPartition": str(max_records_per_partition)}
        warm = spark_read_once(
            spark, bootstrap, topic, endingOffsets=json.dumps({topic: {"0": 1000}}), **options
        )
        rounds = []
        for r in range(repeats):
            plain = plain_read(bootstrap, topic)
            sparked = spark_read_once(spark, bootstrap, topic, **options)
            if (plain["records"], plain["value_bytes"]) != (
                sparked["records"],
                sparked["value_bytes"],
            ):
                raise RuntimeError(f"spark read {sparked} but the plain consumer {plain}")
            ratio = sparked["rate"] / plain["rate"]
            rounds.append({"plain": plain, "spark": sparked, "ratio": ratio})
            print(
                f"round {r + 1}: plain {plain['rate']:,.0f} rec/s, spark {sparked['rate']:,.0f} "
                f"rec/s, ratio {ratio:.2f}",
                file=sys.stderr,
            )
        import pyspark

        plain_median = statistics.median(x["plain"]["rate"] for x in rounds)
        spark_median = statistics.median(x["spark"]["rate"] for x in rounds)
        result = {
            "workload": NAME,
            "records": records,
            "partitions": partitions,
            "value_bytes": value_bytes,
            "repeats": repeats,
            "master": master,
            "max_records_per_partition": max_records_per_partition,
            "spark_input_partitions": -(-records // max_records_per_partition),
            "load_seconds": load_s,
            "spark_session_seconds": session_s,
            "warmup": warm,
            "rounds": rounds,
            "plain_rate_median": plain_median,
            "spark_rate_median": spark_median,
            "ratio_median": spark_median / plain_median,
            "machine": {
                "nproc": os.cpu_count(),
                "python": platform.python_version(),
                "pyspark": pyspark.__version__,
                "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "broker": broker_description(broker_kind) if broker is not None else bootstrap,
            },
        }
        write(out_dir, result)
        return result
    finally:
        if broker is not None:
            broker.stop()


def markdown(result: dict[str, Any]) -> str:
    lines = [
        "# Benchmark: spark-read",
        "",
        f"Reading {result['records']:,} records (~{result['value_bytes']} B values, string keys, "
        f"{result['partitions']} partitions) from {result['machine'].get('broker', 'the dev broker')}: Spark "
        f'`format("streams-kafka")` on `{result["master"]}` '
        f"({result['spark_input_partitions']} input partitions) against one plain "
        "confluent-kafka consumer, same run, alternated. Both count records and sum value "
        "bytes, and must agree.",
        "",
        "| round | plain records/s | Spark records/s | Spark / plain |",
        "| --- | ---: | ---: | ---: |",
    ]
    for i, r in enumerate(result["rounds"], 1):
        lines.append(
            f"| {i} | {r['plain']['rate']:,.0f} | {r['spark']['rate']:,.0f} | {r['ratio']:.2f}x |"
        )
    lines += [
        f"| **median** | **{result['plain_rate_median']:,.0f}** | "
        f"**{result['spark_rate_median']:,.0f}** | **{result['ratio_median']:.2f}x** |",
        "",
        f"Spark on `{result['master']}` reads with one consumer per Spark task, in "
        "parallel Python workers; the plain baseline is one consumer on one thread. The "
        f"broker ({result['machine'].get('broker', 'tansu')}) runs on the same cores. Run with "
        "`--master local[1]` for a one-core comparison.",
        "",
        f"Spark session start: {result['spark_session_seconds']:.1f}s; warm-up read (starts the "
        f"Python workers): {result['warmup']['seconds']:.1f}s; both excluded from the rounds. "
        "Spark's time includes planning (end offsets from the fetch path) and the aggregation.",
        "",
        f"Machine: {result['machine']['nproc']} cores, Python {result['machine']['python']}, "
        f"PySpark {result['machine']['pyspark']}, {result['machine']['date']}.",
        "",
    ]
    return "\n".join(lines)


def write(out_dir: str, result: dict[str, Any]) -> list[str]:
    os.makedirs(out_dir, exist_ok=True)
    json_path = os.path.join(out_dir, "spark_read.json")
    with open(json_path, "w") as f:
        json.dump(result, f, indent=2, default=str)
        f.write("\n")
    md_path = os.path.join(out_dir, "spark_read.md")
    with open(md_path, "w") as f:
        f.write(markdown(result))
    return [json_path, md_path]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--partitions", type=int, default=4)
    parser.add_argument("--value-bytes", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--bootstrap", help="use this broker instead of starting one")
    parser.add_argument(
        "--broker", choices=("kafka", "tansu"), default="kafka", help="the broker to start"
    )
    parser.add_argument("--master", default="local[2]")
    parser.add_argument("--max-records-per-partition", type=int, default=250_000)
    parser.add_argument("--out", default="benchmarks/results")


def main(args: argparse.Namespace) -> int:
    result = spark_read(
        records=args.records,
        partitions=args.partitions,
        value_bytes=args.value_bytes,
        repeats=args.repeats,
        bootstrap=args.bootstrap,
        master=args.master,
        out_dir=args.out,
        max_records_per_partition=args.max_records_per_partition,
        broker_kind=args.broker,
    )
    print(markdown(result))
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spark_read", description=__doc__)
    add_arguments(parser)
    sys.exit(main(parser.parse_args()))
