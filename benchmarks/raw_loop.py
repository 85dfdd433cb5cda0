"""The raw baseline: one confluent-kafka Consumer + one Producer in a plain loop.

No framework: ``consume(1000, timeout)``, apply the workload's transform to each
value (for the stateless workload: ``json.loads`` -> add a field -> ``json.dumps``),
``produce`` with the same key, until every record is produced, then ``flush()``.
Timed from the first ``consume`` call to the end of ``flush()``.

For a like-for-like comparison the clients use the runtime's own client defaults
(``runtime/polling/clients.py``): an idempotent producer with ``linger.ms=5`` and
the Java (murmur2) key partitioner, and a consumer with the same fetch settings.
The consumer is ``assign()``-ed to every input partition rather than subscribed:
the raw loop pays no consumer-group join, which the runtime must (its join time
is reported separately).

Runs in a child process (``benchmarks.child``).
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from benchmarks.child import OtherLoad, cpu_seconds, usage, usage_since


def _resolve(path: str) -> Callable[[bytes], bytes]:
    module_name, attr = path.split(":")
    fn: Callable[[bytes], bytes] = getattr(importlib.import_module(module_name), attr)
    return fn


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: bootstrap, input_topic, output_topic, partitions, records, transform, deadline_s."""
    transform = _resolve(spec["transform"])
    records = int(spec["records"])
    output_topic = spec["output_topic"]
    consumer = Consumer(
        {
            "bootstrap.servers": spec["bootstrap"],
            "group.id": spec.get("group_id", f"bench-raw-{time.monotonic_ns()}"),
            "enable.auto.commit": False,
            "auto.offset.reset": "earliest",
            "enable.partition.eof": False,
            # As the runtime's consumer (runtime/polling/clients.py).
            "queued.max.messages.kbytes": 32768,
            "fetch.wait.max.ms": 100,
        }
    )
    producer = Producer(
        {
            "bootstrap.servers": spec["bootstrap"],
            # As the runtime's producer (runtime/polling/clients.py).
            "enable.idempotence": True,
            "linger.ms": 5,
            "queue.buffering.max.messages": 1_000_000,
            "queue.buffering.max.kbytes": 1_048_576,
            "partitioner": "murmur2_random",
            **spec.get("producer_overrides", {}),
        }
    )
    consumer.assign(
        [TopicPartition(spec["input_topic"], p, 0) for p in range(int(spec["partitions"]))]
    )
    produce = producer.produce
    poll = producer.poll
    consume = consumer.consume
    produced = 0
    first_record_at: float | None = None
    deadline = time.monotonic() + float(spec.get("deadline_s", 600))

    other = OtherLoad(spec.get("broker_pid"))
    other.start()
    cpu0 = cpu_seconds()
    usage0 = usage()
    started = time.perf_counter()
    while produced < records:
        batch = consume(1000, 0.1)
        if not batch:
            if time.monotonic() > deadline:
                raise TimeoutError(f"raw loop: only {produced} of {records} records produced")
            continue
        if first_record_at is None:
            first_record_at = time.perf_counter()
        for message in batch:
            err = message.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    continue
                raise KafkaException(err)
            value = transform(message.value() or b"")
            while True:
                try:
                    produce(output_topic, value, message.key())
                    break
                except BufferError:
                    poll(0.05)
            produced += 1
        poll(0)
    produced_at = time.perf_counter()
    remaining = producer.flush(60)
    flushed_at = time.perf_counter()
    cpu = cpu_seconds() - cpu0
    window_usage = usage_since(usage0)
    other_cpu = other.stop()
    consumer.close()
    if remaining:
        raise RuntimeError(f"raw loop: {remaining} records not acknowledged after flush")
    assert first_record_at is not None
    total = flushed_at - started
    from_first = flushed_at - first_record_at
    return {
        "records": produced,
        "seconds": total,
        "seconds_from_first_record": from_first,
        "first_record_s": first_record_at - started,
        "flush_s": flushed_at - produced_at,
        "records_per_s": records / total,
        "records_per_s_from_first_record": records / from_first,
        "cpu_s": cpu,
        **window_usage,
        # Other processes' CPU seconds during the timed window (noise check).
        "other_cpu_window_s": other_cpu,
    }
