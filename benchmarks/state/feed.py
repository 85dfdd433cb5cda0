"""The state benchmark's steady feed: ``rate`` records a second for ``count``
records after the backlog, so that commits come at the commit interval with
a steady load and their p99 is a percentile, not the largest of a handful.

Run by the runtime's child once its backlog is processed, as its own process
(``python -m benchmarks.state.feed '<json spec>'``) so that producing takes
no GIL time from the app it measures. Exits 0 once every record is
acknowledged; 1 with the delivery errors otherwise.
"""

from __future__ import annotations

import json
import os
import sys
import time
from typing import Any

from benchmarks.state.workload import records


def feed(spec: dict[str, Any]) -> int:
    from confluent_kafka import Producer

    producer = Producer(
        {"bootstrap.servers": spec["bootstrap"], "linger.ms": 5, "enable.idempotence": True}
    )
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    rate = float(spec["rate"])
    started = time.monotonic()
    generated = records(
        int(spec["records"]),
        int(spec["keys"]),
        int(spec["partitions"]),
        int(spec["base_ms"]),
        int(spec["span_ms"]),
        first=int(spec["records"]),
        count=int(spec["count"]),
        feed_rate=rate,
    )
    parent = os.getppid()
    for i, (key, value, partition, ts) in enumerate(generated):
        # Paced per record: a burst every second would commit in bursts too.
        if i % 1000 == 0 and os.getppid() != parent:
            return 1  # the app measured is gone (the run was stopped)
        ahead = started + i / rate - time.monotonic()
        if ahead > 0:
            time.sleep(ahead)
        producer.produce(
            spec["topic"], value, key, partition=partition, timestamp=ts, on_delivery=on_delivery
        )
        producer.poll(0)
    if producer.flush(60) or errors:
        print(f"feeding {spec['topic']} failed: {errors[:3]}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(feed(json.loads(sys.argv[1])))
