"""`streams-runtime demo`: a local broker, a sample app, a load, a live view.

The broker is Apache Kafka when it can run here (Java 17+ and Maven, or a cached copy; about
2-3 s to start after the first fetch) and Tansu otherwise (``--broker`` chooses): the demo should
show the runtime on the real thing, but must still start on a machine without Java.

The sample app is a stateless order pipeline: JSON orders in, each enriched
with its total, large orders split off to an alerts topic, malformed input to
the dead-letter topic. A load generator thread produces orders at a steady
rate (with an occasional malformed one); the main thread prints one status
line a second: state, threads, records/s in and out, lag, tasks.
"""

from __future__ import annotations

import json
import random
import shutil
import signal
import sys
import tempfile
import threading
import time

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.app import App
from runtime.brokers import make_broker, resolve_kind
from runtime.logging import configure_logging
from runtime.topology import StreamsBuilder, Topology, serdes

INPUT, OUTPUT, ALERTS = "demo-orders", "demo-enriched", "demo-alerts"


def build_topology() -> Topology:
    """The demo's topology (also usable with `streams-runtime run runtime.demo:build_topology`)."""
    builder = StreamsBuilder()
    orders = builder.stream(INPUT, key_serde=serdes.STRING, value_serde=serdes.JSON)
    enriched = orders.filter(lambda key, order: order.get("qty", 0) > 0).map_values(
        lambda order: {**order, "total": round(order["qty"] * order["price"], 2)}
    )
    branches = (
        enriched.split(name="orders-")
        .branch(lambda key, order: order["total"] >= 900, name="large")
        .default_branch(name="normal")
    )
    branches["orders-large"].to(ALERTS, key_serde=serdes.STRING, value_serde=serdes.JSON)
    branches["orders-normal"].to(OUTPUT, key_serde=serdes.STRING, value_serde=serdes.JSON)
    return builder.build()


class LoadGenerator(threading.Thread):
    """Produces orders at `rate` records/s until stopped; 1 in 5000 is malformed."""

    def __init__(self, bootstrap: str, rate: int) -> None:
        super().__init__(name="demo-load", daemon=True)
        self._producer = Producer(
            {"bootstrap.servers": bootstrap, "linger.ms": 20, "log.connection.close": False}
        )
        self._rate = rate
        self._stop_event = threading.Event()
        self.sent = 0

    def stop(self) -> None:
        self._stop_event.set()

    def run(self) -> None:
        rng = random.Random(7)
        started = time.monotonic()
        while not self._stop_event.is_set():
            due = int((time.monotonic() - started) * self._rate)
            for _ in range(min(due - self.sent, 5000)):
                customer = f"customer-{rng.randrange(1000)}"
                if rng.randrange(5000) == 0:
                    value = b"{not json"
                else:
                    order = {
                        "id": self.sent,
                        "qty": rng.randrange(0, 10),
                        "price": rng.randrange(1, 120),
                    }
                    value = json.dumps(order).encode()
                while True:
                    try:
                        self._producer.produce(INPUT, value, customer.encode())
                        break
                    except BufferError:
                        self._producer.poll(0.05)
                self.sent += 1
            self._producer.poll(0)
            self._stop_event.wait(0.01)
        self._producer.flush(10)


def run_demo(
    duration: float | None, rate: int, threads: int, partitions: int, broker_kind: str = "auto"
) -> int:
    state_dir = tempfile.mkdtemp(prefix="streams-runtime-demo-")
    log_file = open(f"{state_dir}/demo.log", "w")  # noqa: SIM115 - closed below
    configure_logging("info", json=True, stream=log_file)
    kind = resolve_kind(broker_kind)
    print(f"starting the development broker ({kind}) ...", flush=True)
    broker = make_broker(kind)
    try:
        broker.start(60.0)
    except RuntimeError as exc:  # BrokerUnavailable included: no Java, no Maven
        print(f"the broker did not start: {exc}", file=sys.stderr, flush=True)
        log_file.close()
        shutil.rmtree(state_dir, ignore_errors=True)
        return 1
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        admin = AdminClient({"bootstrap.servers": broker.bootstrap, "log.connection.close": False})
        futures = admin.create_topics([NewTopic(t, partitions, 1) for t in (INPUT, OUTPUT, ALERTS)])
        for future in futures.values():
            future.result(30)
        app = App(
            build_topology(),
            {
                "application.id": "demo-orders",
                "bootstrap.servers": broker.bootstrap,
                "processing.threads": threads,
                "commit.interval.ms": 1000,
                "state.dir": state_dir,
                "deserialization.exception.handler": "dead_letter_queue",
                "consumer.session.timeout.ms": 6000,
            },
        )
        app.start()
        load = LoadGenerator(broker.bootstrap, rate)
        load.start()
        print(
            f"broker {broker.bootstrap} | app 'demo-orders', {threads} processing threads | "
            f"load {rate} records/s | logs: {state_dir}/demo.log | Ctrl-C to stop",
            flush=True,
        )
        started = time.monotonic()
        last = app.status()
        last_time = time.monotonic()
        while not stop.wait(1.0):
            now = time.monotonic()
            status = app.status()
            elapsed = now - last_time
            rate_in = (status.processed - last.processed) / elapsed
            rate_out = (status.produced - last.produced) / elapsed
            line = (
                f"[{now - started:6.0f}s] {status.state:<11} threads={len(app.processing_threads)} "
                f"tasks={len(status.tasks)} in={rate_in:8.0f}/s out={rate_out:8.0f}/s "
                f"lag={status.total_lag:<7} dlq={status.dead_lettered} sent={load.sent}"
            )
            if sys.stdout.isatty():
                print("\r" + line, end="", flush=True)
            else:
                print(line, flush=True)
            last, last_time = status, now
            if duration is not None and now - started >= duration:
                break
        print("\nstopping ...", flush=True)
        load.stop()
        load.join(15)
        app.close(30)
        final = app.status()
        print(
            f"processed {final.processed} records, produced {final.produced}, "
            f"dead-lettered {final.dead_lettered}; final state {final.state}"
        )
        return 0 if final.state == "NOT_RUNNING" else 1
    finally:
        broker.stop()
        log_file.close()
        shutil.rmtree(state_dir, ignore_errors=True)
