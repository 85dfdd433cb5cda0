"""The raw baseline: one confluent-kafka Consumer + one Producer in a plain loop.

No framework: ``consume(1000, timeout)``, apply the workload's transform to each
value (for the stateless workload: ``json.loads`` -> add a field -> ``json.dumps``),
``produce`` with the same key, until every record is produced, then ``flush()``.
Timed from the first ``consume`` call to the end of ``flush()``.

For a like-for-like comparison the clients use the runtime's own client defaults
(``runtime/kafka/clients.py``): an idempotent producer with ``linger.ms=5`` and
the Java (murmur2) key partitioner, and a consumer with the same fetch settings.
The consumer is ``assign()``-ed to every input partition rather than subscribed:
the raw loop pays no consumer-group join, which the runtime must (its join time
is reported separately).

Runs in a child process (``benchmarks.child``).

``RawLoop`` is the same loop as a model of the compare harness (model ``raw``
in ``benchmarks/compare/child.py``, used by ``python -m benchmarks quick``):
gated like the other models (assigned, fetching, nothing consumed until
``go``), one thread, for the stateless map (the function above, one output per
input) and the stateful count (``CountByKey``: a dict, its output folded per
key every ``commit.interval.ms`` as the runtime's cache folds its output per
commit, so both wait for the same kind of tick; no store, no changelog).
"""

from __future__ import annotations

import importlib
import threading
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, KafkaException, Producer, TopicPartition

from benchmarks.child import OtherLoad, cpu_seconds, usage, usage_since
from runtime.gc_tuning import tune_for_app_process


def _resolve(path: str) -> Callable[[bytes], bytes]:
    module_name, attr = path.split(":")
    fn: Callable[[bytes], bytes] = getattr(importlib.import_module(module_name), attr)
    return fn


def _librdkafka_logger() -> Any:
    """The runtime's logger for librdkafka's lines: no raw ``%3|...`` lines in the
    run's log, the same lines as the runtime's own clients write."""
    from runtime.logging import librdkafka_logger

    return librdkafka_logger()


def consumer_config(bootstrap: str, group_id: str) -> dict[str, Any]:
    """The raw loop's consumer: the runtime's fetch settings, assign()-ed, never committing."""
    return {
        "bootstrap.servers": bootstrap,
        "group.id": group_id,
        "enable.auto.commit": False,
        "auto.offset.reset": "earliest",
        "enable.partition.eof": False,
        # As the runtime's consumer (runtime/kafka/clients.py).
        "queued.max.messages.kbytes": 32768,
        "fetch.wait.max.ms": 100,
        "logger": _librdkafka_logger(),
    }


def producer_config(bootstrap: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """The raw loop's producer: as the runtime's (runtime/kafka/clients.py)."""
    return {
        "bootstrap.servers": bootstrap,
        "enable.idempotence": True,
        "linger.ms": 5,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        "partitioner": "murmur2_random",
        "logger": _librdkafka_logger(),
        **(overrides or {}),
    }


def run(spec: dict[str, Any]) -> dict[str, Any]:
    """spec: bootstrap, input_topic, output_topic, partitions, records, transform, deadline_s."""
    transform = _resolve(spec["transform"])
    records = int(spec["records"])
    output_topic = spec["output_topic"]
    consumer = Consumer(
        consumer_config(spec["bootstrap"], spec.get("group_id", f"bench-raw-{time.monotonic_ns()}"))
    )
    producer = Producer(producer_config(spec["bootstrap"], spec.get("producer_overrides", {})))
    consumer.assign(
        [TopicPartition(spec["input_topic"], p, 0) for p in range(int(spec["partitions"]))]
    )
    produce = producer.produce
    poll = producer.poll
    consume = consumer.consume
    produced = 0
    first_record_at: float | None = None
    deadline = time.monotonic() + float(spec.get("deadline_s", 600))

    # The GC settings every model gets (runtime.gc_tuning): like for like.
    tune_for_app_process()
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


# -- the raw loop as a model of the compare harness ------------------------------------


class CountByKey:
    """The stateful workload's count without a framework: a dict of counts.

    Output (the key's count, INT64 big-endian, as the runtime's ``serdes.INT64``)
    is folded per key until ``flush``, which the loop calls every
    ``commit.interval.ms``: the runtime's record cache emits the latest count
    per key at each commit, so the harness's reader ("the latest counts add up
    to the input") waits for a tick on both sides.
    """

    def __init__(self) -> None:
        self.counts: dict[bytes | None, int] = {}
        self.dirty: dict[bytes | None, None] = {}  # insertion-ordered set

    def process(self, key: bytes | None, _value: bytes | None) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1
        self.dirty[key] = None

    def flush(self) -> list[tuple[bytes | None, bytes]]:
        counts = self.counts
        out = [(key, counts[key].to_bytes(8, "big", signed=True)) for key in self.dirty]
        self.dirty.clear()
        return out


def operation_for(topology: str) -> Callable[[bytes], bytes] | CountByKey:
    """The raw loop's work for a compare topology: the stateless map's function or a count."""
    if topology == "stateless":
        from benchmarks.workloads.stateless import raw_transform

        return raw_transform
    if topology == "count":
        return CountByKey()
    raise ValueError(
        f"the raw loop runs the stateless map and the count only, not topology {topology!r}"
    )


class RawLoop(threading.Thread):
    """The raw consume-transform-produce loop as a compare-harness model, on its own thread.

    ``start()`` assigns every input partition (librdkafka starts fetching at
    once, as the other models buffer input before ``go``); nothing is consumed
    until ``release()``. ``processed`` counts records through the work
    (racy read from the child's monitor, as the runtime's ``progress()``).
    ``close()`` flushes the producer. Only this thread touches the clients.
    """

    def __init__(
        self,
        bootstrap: str,
        input_topic: str,
        output_topic: str,
        partitions: int,
        operation: Callable[[bytes], bytes] | CountByKey,
        flush_interval_s: float,
    ) -> None:
        super().__init__(name="raw-loop", daemon=True)
        self._consumer = Consumer(consumer_config(bootstrap, f"bench-raw-{time.monotonic_ns()}"))
        self._producer = Producer(producer_config(bootstrap))
        self._input = input_topic
        self._output = output_topic
        self._partitions = partitions
        self._operation = operation
        self._flush_interval_s = flush_interval_s
        self._go = threading.Event()
        self._halt = threading.Event()
        self.assigned = False
        self.consumed = 0
        self.processed = 0
        self.produced = 0
        self.flushes = 0
        self.failure: BaseException | None = None
        self.closed_cleanly = False

    def release(self) -> None:
        self._go.set()

    def run(self) -> None:
        consumer, producer = self._consumer, self._producer
        try:
            consumer.assign([TopicPartition(self._input, p, 0) for p in range(self._partitions)])
            self.assigned = True
            # The fold's timer runs from the start, as the runtime's commit timer
            # does: neither side's first tick is lined up with `go`.
            next_flush = time.monotonic() + self._flush_interval_s
            while not self._go.wait(0.01):
                if self._halt.is_set():
                    return
            if isinstance(self._operation, CountByKey):
                self._count_loop(self._operation, next_flush)
            else:
                self._map_loop(self._operation)
            self.closed_cleanly = producer.flush(30) == 0
        except BaseException as exc:  # noqa: BLE001 - reported through `failure`
            self.failure = exc
        finally:
            consumer.close()

    def _map_loop(self, transform: Callable[[bytes], bytes]) -> None:
        """The stateless runner's loop above, record for record."""
        consume, produce, poll = self._consumer.consume, self._producer.produce, self._producer.poll
        output = self._output
        while not self._halt.is_set():
            batch = consume(1000, 0.1)
            for message in batch:
                err = message.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                value = transform(message.value() or b"")
                while True:
                    try:
                        produce(output, value, message.key())
                        break
                    except BufferError:
                        poll(0.05)
                self.processed += 1
            self.consumed += len(batch)
            self.produced = self.processed
            poll(0)

    def _count_loop(self, count: CountByKey, next_flush: float) -> None:
        consume, produce, poll = self._consumer.consume, self._producer.produce, self._producer.poll
        output, interval = self._output, self._flush_interval_s
        while not self._halt.is_set():
            batch = consume(1000, 0.1)
            for message in batch:
                err = message.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        continue
                    raise KafkaException(err)
                count.process(message.key(), message.value())
                self.processed += 1
            self.consumed += len(batch)
            now = time.monotonic()
            if now >= next_flush:
                next_flush = now + interval
                self.flushes += 1
                for key, value in count.flush():
                    while True:
                        try:
                            produce(output, value, key)
                            break
                        except BufferError:
                            poll(0.05)
                    self.produced += 1
            poll(0)

    def close(self, timeout: float) -> bool:
        """Stop the loop, flush what it produced; True if it ended in time and flushed."""
        self._halt.set()
        self._go.set()
        self.join(timeout)
        return not self.is_alive() and self.closed_cleanly and self.failure is None

    def status(self) -> dict[str, Any]:
        return {
            "model": "raw",
            "consumed": self.consumed,
            "processed": self.processed,
            "produced": self.produced,
            "flushes": self.flushes,
            "failure": repr(self.failure) if self.failure else None,
        }
