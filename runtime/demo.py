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
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
from typing import Any

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewTopic

from runtime.app import App
from runtime.brokers import make_broker, resolve_kind
from runtime.logging import configure_logging, librdkafka_logger
from runtime.status import ThreadStatus
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
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 20,
                "log.connection.close": False,
                "logger": librdkafka_logger(),
            }
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


def thread_view(
    threads: tuple[ThreadStatus, ...], previous: dict[str, float], elapsed: float
) -> str:
    """Each processing thread in a few characters: `T1 0_3 61%` (its latest
    task and the share of the last interval it was busy) or `T2 idle`."""
    parts = []
    for t in threads:
        short = "T" + t.name.rsplit("-", 1)[-1]
        busy = (t.busy_seconds - previous.get(t.name, t.busy_seconds)) / elapsed if elapsed else 0
        if t.state in ("stopping", "stopped"):
            parts.append(f"{short} {t.state}")
        elif t.last_task is None or busy < 0.005:
            parts.append(f"{short} idle")
        else:
            parts.append(f"{short} {t.last_task} {min(busy, 1.0):4.0%}")
    return " | ".join(parts)


class LagWatch:
    """Whether the demo's load outruns the machine: lag grew every second for
    `SECONDS` seconds while fewer records came in than the load sends. Said
    once per demo (main thread)."""

    SECONDS = 10

    def __init__(self) -> None:
        self._lag = -1
        self._growing = 0
        self._said = False

    def note(self, lag: int, rate_in: float, rate: int) -> bool:
        grew = lag > self._lag >= 0 and rate_in < rate
        self._lag = lag
        self._growing = self._growing + 1 if grew else 0
        if self._growing >= self.SECONDS and not self._said:
            self._said = True
            return True
        return False


def run_demo(
    duration: float | None, rate: int, threads: int, partitions: int, broker_kind: str = "auto"
) -> int:
    state_dir = tempfile.mkdtemp(prefix="streams-runtime-demo-")
    # The log outlives the demo (the state directory does not): it is where
    # to look when something in the live view surprises.
    log_fd, log_path = tempfile.mkstemp(prefix="streams-runtime-demo-", suffix=".log")
    log_file = os.fdopen(log_fd, "w")
    configure_logging("info", json=True, stream=log_file)
    kind = resolve_kind(broker_kind)
    print(f"starting the development broker ({kind}) ...", flush=True)
    broker = make_broker(kind)
    try:
        broker.start(60.0)
    except RuntimeError as exc:  # BrokerUnavailable included: no Java, no Maven
        other = "tansu" if kind == "kafka" else "kafka"
        print(
            f"the {kind} broker did not start: {exc} (log: {log_path}); "
            f"try `streams-runtime demo --broker {other}`",
            file=sys.stderr,
            flush=True,
        )
        log_file.close()
        shutil.rmtree(state_dir, ignore_errors=True)
        return 1
    stop = threading.Event()
    load: LoadGenerator | None = None
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        admin_settings: dict[str, Any] = {
            "bootstrap.servers": broker.bootstrap,
            "log.connection.close": False,
            "logger": librdkafka_logger(),
        }
        admin = AdminClient(admin_settings)
        futures = admin.create_topics([NewTopic(t, partitions, 1) for t in (INPUT, OUTPUT, ALERTS)])
        for future in futures.values():
            future.result(30)
        del admin
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
            f"load {rate} records/s | logs: {log_path} | Ctrl-C to stop\n"
            "out is about 10% below in while the app keeps up (the filter drops orders with qty 0, "
            "1 in 10); "
            f"large orders go to {ALERTS}, the rest to {OUTPUT}, bad JSON to the dead-letter topic. "
            "Per thread: its latest task and how busy it was.",
            flush=True,
        )
        started = time.monotonic()
        last = app.status()
        last_time = time.monotonic()
        falling_behind = LagWatch()
        while not stop.wait(1.0):
            now = time.monotonic()
            status = app.status()
            elapsed = now - last_time
            rate_in = (status.processed - last.processed) / elapsed
            rate_out = (status.produced - last.produced) / elapsed
            if status.waiting_for:
                # Start-up: say what it waits for instead of rates of zero.
                doing = f"waiting for {status.waiting_for}"
            else:
                busy = {t.name: t.busy_seconds for t in last.threads}
                doing = (
                    f"in={rate_in:7.0f}/s out={rate_out:7.0f}/s lag={status.total_lag:<6} "
                    f"dlq={status.dead_lettered} | {thread_view(status.threads, busy, elapsed)}"
                )
            line = (
                f"[{now - started:5.0f}s] {status.state:<11} tasks={len(status.tasks):<2} {doing}"
            )
            if sys.stdout.isatty():
                print("\r\033[K" + line, end="", flush=True)
            else:
                print(line, flush=True)
            if not status.waiting_for and falling_behind.note(status.total_lag, rate_in, rate):
                # Said once: the lag is the machine's limit, not a fault.
                print(
                    f"\n(lag has grown for {LagWatch.SECONDS} s: this machine does not keep up "
                    f"with {rate} records/s, so out stays further below in and lag grows; "
                    f"try --rate {max(1000, int(rate_in * 0.8) // 1000 * 1000)})",
                    flush=True,
                )
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
            f"dead-lettered {final.dead_lettered}; final state {final.state}; "
            f"log kept at {log_path}"
        )
        return 0 if final.state == "NOT_RUNNING" else 1
    finally:
        # The load generator's producer goes before the broker, so it has no
        # broker to miss (it would log connection failures until exit).
        load = None
        broker.stop()
        log_file.close()
        shutil.rmtree(state_dir, ignore_errors=True)
