"""FirstSeenPartitioner's costs: memory per key, new-key latency, start-up read.

    python -m benchmarks.first_seen --bootstrap 127.0.0.1:9092 [--keys 1000000]

Prints three figures (no results file): bytes per key of the in-memory map
(tracemalloc, keys like `user-123456`), new keys settled per second by one
thread and by four (each a claim written with acks=all and read back), and
how fast `open` reads an existing map. Run it on a quiet machine and name
the broker when quoting it.
"""

from __future__ import annotations

import argparse
import threading
import time
import tracemalloc
import uuid

from confluent_kafka import Producer

from benchmarks.harness import client_config
from runtime import FirstSeenPartitioner
from runtime.partitioning.claims import ClaimBook, encode_claim


def memory_per_key(count: int) -> float:
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    book = ClaimBook()
    for i in range(count):
        book.apply(f"user-{i}".encode(), i % 8)
    used = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(book) == count
    return used / count


def new_keys_per_second(bootstrap: str, threads: int, per_thread: int) -> float:
    app = f"bench-first-seen-{uuid.uuid4().hex[:8]}"
    partitioner = FirstSeenPartitioner()
    partitioner.open(app, {"bootstrap.servers": bootstrap}, 1)
    try:
        partitioner.static_partition("t", "warm-up", 8)

        def work(n: int) -> None:
            for i in range(per_thread):
                partitioner.static_partition("t", f"t{n}-key-{i}", 8)

        workers = [threading.Thread(target=work, args=(n,)) for n in range(threads)]
        started = time.perf_counter()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        return threads * per_thread / (time.perf_counter() - started)
    finally:
        partitioner.close()


def open_rate(bootstrap: str, count: int) -> tuple[float, float]:
    """(seconds, keys/s) for `open` to read a map of `count` claims."""
    app = f"bench-first-seen-{uuid.uuid4().hex[:8]}"
    writer = FirstSeenPartitioner()
    writer.open(app, {"bootstrap.servers": bootstrap}, 1)
    writer.close()
    producer = Producer(client_config({"bootstrap.servers": bootstrap, "linger.ms": 20}))
    for i in range(count):
        key, value = encode_claim(f"user-{i}".encode(), i % 8, 8)
        while True:
            try:
                producer.produce(f"{app}-partitioner", value, key, 0)
                break
            except BufferError:
                producer.poll(0.1)
    producer.flush(120)
    reader = FirstSeenPartitioner()
    started = time.perf_counter()
    reader.open(app, {"bootstrap.servers": bootstrap}, 1)
    elapsed = time.perf_counter() - started
    keys = reader.figures()["keys"]
    reader.close()
    assert keys == count, (keys, count)
    return elapsed, count / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--claims", type=int, default=2000)
    parser.add_argument("--map", type=int, default=200_000)
    args = parser.parse_args()
    print(f"memory: {memory_per_key(args.keys):.0f} bytes per key ({args.keys} keys)")
    for threads in (1, 4):
        rate = new_keys_per_second(args.bootstrap, threads, args.claims // threads)
        print(f"new keys: {rate:.0f}/s with {threads} thread(s)")
    seconds, rate = open_rate(args.bootstrap, args.map)
    print(f"open: {args.map} keys read in {seconds:.2f} s ({rate:.0f} keys/s)")


if __name__ == "__main__":
    main()
