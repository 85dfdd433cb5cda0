"""One measured run of quixstreams in a fresh process (the quixstreams peer).

``<quix venv>/bin/python -m benchmarks.peers.quix_child SPEC_JSON``, started by
the harness (``benchmarks.compare.session``) with the protocol of
``benchmarks/compare/child.py``: events as JSON lines to ``spec["event_fd"]``
(``ready``, ``go``, ``processed_all``, ``result``, ``failed``), each with ``t``
= ``time.monotonic()``; commands on stdin (``go``, ``stop``).

It runs in its own virtualenv (``benchmarks.peers.build.quix_python``):
quixstreams pins confluent-kafka < 2.13, older than the runtime's, so it cannot
share the project's environment. It imports nothing from ``runtime``.

The topologies, as a quixstreams user writes them, with the runtime's input and
output bytes:

- ``stateless``: JSON values (quixstreams' default JSON serde, orjson: compact,
  keys in input order), ``value["seen"] = True``, JSON out;
- ``count``: a stateful ``apply`` keeps the count per message key in
  quixstreams' RocksDB state (changelog topic on, its default), and emits the
  new count as an 8-byte big-endian integer (quixstreams' own integer serde
  writes 4 bytes) for every input record: quixstreams has no store cache, so
  nothing is folded per commit.
- ``session``: ``session_window(1 s gap, 2 s grace).count().current()``: the
  running count of the record's session for every input record, as an 8-byte
  integer, keyed by the message key's bytes plus the session's start (8 bytes
  big-endian). quixstreams writes the session in the value and no tombstone for a
  session it replaces; its start stays put while a session grows (the data
  brings each key's records in time order), so the latest count per (key,
  start) adds up to the input as the runtime's and Kafka Streams' per session
  do, and the harness's completion check applies unchanged.

No ``join``: quixstreams' ``join_interval`` matches an arriving record only
with partners at or before its own timestamp (a left record looks back
``backward_ms``, a right one ``forward_ms``), so a pair whose later-stamped
record is processed first is never joined: its output depends on the order
the two topics arrive in, unlike a windowed join's (``benchmarks/peers/models.py``).

quixstreams is single-threaded (it scales by running more processes), so the
thread count must be 1. Gating: one ``update`` step before the topology holds
the processing loop at its first record until ``go`` and counts records (one
Python call per record: well under 1% of quixstreams' per-record cost).
``ready`` comes once that first record is held, every input partition is
assigned and nothing changed for ``settle_s``.

A worker of the two-process model (``spec["role"] == "worker"``, started by
``benchmarks/peers/quix_group.py``) cannot hold its loop: a held loop serves no
rebalance, and the second process's join would wait for the first one's
``max.poll.interval.ms``. It pauses the input partitions of every assignment
until ``go`` instead (its loop keeps polling and serving rebalances; nothing is
fetched, so nothing is buffered at ``go`` either), reports each assignment it
gets (``assignment``) and its processed count after ``go`` (``progress``); the
group process decides when all of them are ready.
"""

from __future__ import annotations

import json
import logging
import shutil
import struct
import sys
import tempfile
import threading
import time
from typing import Any

from benchmarks.compare.child_protocol import Commands, Events, run_and_exit


class _Gate:
    """Holds the processing loop at its first record until ``go``; counts records.

    ``pass_`` runs on quixstreams' one processing thread (the main thread).
    """

    def __init__(self, go: threading.Event) -> None:
        self._go = go
        self.open = False
        self.reached = threading.Event()
        self.processed = 0

    def pass_(self, _value: Any) -> None:
        if not self.open:
            self.reached.set()
            self._go.wait()
            self.open = True
        self.processed += 1


def enrich(value: dict[str, Any]) -> dict[str, Any]:
    """The stateless map (``benchmarks.workloads.stateless.enrich``): add one field."""
    value["seen"] = True
    return value


def count(_value: Any, state: Any) -> int:
    """Count per message key in quixstreams' state store."""
    n: int = state.get("count", 0) + 1
    state.set("count", n)
    return n


def _int64_serializer(field: str | None = None) -> Any:
    """8-byte big-endian integers; ``field``: of that item of a dict value."""
    from quixstreams.models.serializers import Serializer

    pack = struct.Struct(">q").pack

    class Int64Serializer(Serializer):  # type: ignore[misc]
        """8-byte big-endian, as Kafka's LongSerializer and the runtime's serdes.INT64."""

        def __call__(self, value: Any, ctx: Any) -> bytes:
            return pack(value if field is None else value[field])

    return Int64Serializer()


_START = struct.Struct(">q").pack


def session_output(value: dict[str, Any], key: str, _timestamp: int, _headers: Any) -> Any:
    """A ``current()`` session result -> the output key (message key + start) and count."""
    return {"key": key.encode() + _START(value["start"]), "count": value["value"]}


def build(app: Any, spec: dict[str, Any], gate: _Gate) -> None:
    kind = spec["topology"]
    if kind == "stateless":
        source = app.topic(
            spec["input_topic"], key_deserializer="string", value_deserializer="json"
        )
        sink = app.topic(spec["output_topic"], key_serializer="string", value_serializer="json")
        sdf = app.dataframe(source).update(gate.pass_).apply(enrich)
    elif kind == "count":
        source = app.topic(
            spec["input_topic"], key_deserializer="string", value_deserializer="string"
        )
        sink = app.topic(
            spec["output_topic"], key_serializer="string", value_serializer=_int64_serializer()
        )
        # quixstreams derives its changelog topic's config from the source's broker config
        # and requires retention.ms there; Tansu's DescribeConfigs leaves it out (Kafka does
        # not). Fill in Kafka's default so the peer runs on both brokers.
        extra = source.broker_config.extra_config
        extra.setdefault("retention.ms", "604800000")
        sdf = app.dataframe(source).update(gate.pass_).apply(count, stateful=True)
    elif kind == "session":
        source = app.topic(
            spec["input_topic"], key_deserializer="string", value_deserializer="string"
        )
        sink = app.topic(
            spec["output_topic"],
            key_serializer="bytes",
            value_serializer=_int64_serializer("count"),
        )
        source.broker_config.extra_config.setdefault("retention.ms", "604800000")
        sdf = (
            app.dataframe(source)
            .update(gate.pass_)
            .session_window(inactivity_gap_ms=1000, grace_ms=2000)
            .count()
            .current()
            .apply(session_output, metadata=True)
        )
        sdf.to_topic(sink, key=lambda value: value["key"])
        return
    else:
        raise ValueError(f"quixstreams peer: no topology {kind!r} (stateless, count, session)")
    sdf.to_topic(sink)


def run(spec: dict[str, Any], events: Events) -> dict[str, Any]:
    from quixstreams import Application

    if int(spec["threads"]) != 1:
        raise ValueError("quixstreams is single-threaded: threads must be 1")
    partitions = int(spec["partitions"])
    backlog = int(spec.get("backlog", 0))
    settle_s = float(spec.get("settle_s", 0.5))
    ready_timeout = float(spec.get("ready_timeout_s", 120))
    config = dict(spec.get("config") or {})
    state_dir = tempfile.mkdtemp(prefix="bench-peers-quix-state-")
    commands = Commands()
    commands.start()
    gate = _Gate(commands.go)
    app = Application(
        broker_address=spec["bootstrap"],
        consumer_group=spec["application_id"],
        # The input is loaded before the run starts: read it from the beginning.
        auto_offset_reset="earliest",
        commit_interval=float(config.pop("commit.interval.ms", 1000)) / 1000.0,
        consumer_extra_config={
            k.removeprefix("consumer."): v for k, v in config.items() if k.startswith("consumer.")
        },
        producer_extra_config={
            k.removeprefix("producer."): v for k, v in config.items() if k.startswith("producer.")
        },
        state_dir=state_dir,
        loglevel=logging.WARNING,
        processing_guarantee="at-least-once",
    )
    build(app, spec, gate)
    if spec.get("role") == "worker":
        try:
            return _run_worker(app, spec, events, commands, gate)
        finally:
            shutil.rmtree(state_dir, ignore_errors=True)
    started = time.monotonic()
    failure: list[BaseException] = []
    result: dict[str, Any] = {}
    finished = threading.Event()  # app.run() returned

    def watch() -> None:
        """Ready, go, processed_all, stop: everything but processing, on a side thread."""
        try:
            deadline = started + ready_timeout
            last: Any = None
            since = time.monotonic()
            while True:
                if finished.is_set():
                    return
                now = time.monotonic()
                signature = None
                if gate.reached.is_set():
                    assigned = sorted(
                        tp.partition
                        for tp in app._consumer.assignment()  # noqa: SLF001 - read-only look
                        if tp.topic == spec["input_topic"]
                    )
                    if len(assigned) == partitions:
                        signature = tuple(assigned)
                if signature != last:
                    last, since = signature, now
                elif signature is not None and now - since >= settle_s:
                    break
                if now > deadline:
                    raise TimeoutError(f"quixstreams not ready after {ready_timeout:.0f} s")
                time.sleep(0.05)
            events.emit("ready", join_s=since - started, ready_s=time.monotonic() - started)
            commands.go.wait()
            events.emit("go", processed_at_go={})
            processed_all_sent = backlog <= 0
            while not commands.stop.wait(0.05) and not finished.is_set():
                if not processed_all_sent and gate.processed >= backlog:
                    processed_all_sent = True
                    events.emit("processed_all")
            result["status"] = {"processed": gate.processed}
        except BaseException as exc:  # noqa: BLE001 - reported through the main thread
            failure.append(exc)
        finally:
            result["stop_requested"] = time.monotonic()
            commands.go.set()  # never leave the processing loop held
            app.stop()

    watcher = threading.Thread(target=watch, name="bench-watch", daemon=True)
    watcher.start()
    try:
        # The processing loop, on this (main) thread, until app.stop(); it commits and
        # closes its clients and stores before it returns.
        app.run()
    finally:
        stopped = time.monotonic()
        finished.set()
        commands.go.set()
        watcher.join(30)
        result["close_s"] = stopped - result.pop("stop_requested", stopped)
        shutil.rmtree(state_dir, ignore_errors=True)
    if failure:
        raise failure[0]
    result["closed_cleanly"] = True
    return result


def _input_partitions(app: Any, topic: str, partitions: list[Any] | None = None) -> list[Any]:
    from confluent_kafka import TopicPartition

    listed = partitions if partitions is not None else app._consumer.assignment()  # noqa: SLF001
    return [TopicPartition(tp.topic, tp.partition) for tp in listed if tp.topic == topic]


def _run_worker(
    app: Any, spec: dict[str, Any], events: Events, commands: Commands, gate: _Gate
) -> dict[str, Any]:
    """One process of the two-process model: the pause gate (module docstring).
    `on_assign` runs on quixstreams' processing thread (the main one), inside
    its poll."""
    topic = spec["input_topic"]
    consumer = app._consumer  # noqa: SLF001 - the gate needs the consumer itself
    real_on_assign = app._on_assign  # noqa: SLF001
    assigned: list[int] = []

    def on_assign(consumer_: Any, partitions: list[Any]) -> None:
        real_on_assign(consumer_, partitions)
        mine = _input_partitions(app, topic, partitions)
        if not gate.open and mine:
            consumer.pause(mine)
        assigned[:] = sorted(tp.partition for tp in _input_partitions(app, topic))
        events.emit("assignment", partitions=list(assigned))

    # Read by `_run_dataframe` when the loop starts: overriding it on the
    # instance before `run()` is enough.
    app._on_assign = on_assign  # noqa: SLF001
    result: dict[str, Any] = {}
    finished = threading.Event()

    def watch() -> None:
        commands.go.wait()
        # From this thread, not the loop's: with every partition paused the
        # loop sits in a 1 s poll; librdkafka's resume is thread-safe and the
        # first fetched record ends that poll. Open first, so an assignment
        # served meanwhile is not paused again.
        gate.open = True
        consumer.resume(_input_partitions(app, topic))
        events.emit("go", processed_at_go={})
        reported = -1
        while not commands.stop.wait(0.05) and not finished.is_set():
            if gate.processed != reported:
                reported = gate.processed
                events.emit("progress", processed=reported)
        result["stop_requested"] = time.monotonic()
        app.stop()

    watcher = threading.Thread(target=watch, name="bench-watch", daemon=True)
    watcher.start()
    events.emit("listening")
    try:
        app.run()
    finally:
        stopped = time.monotonic()
        finished.set()
        commands.go.set()
        commands.stop.set()
        watcher.join(30)
    result["close_s"] = stopped - result.pop("stop_requested", stopped)
    result["status"] = {"processed": gate.processed, "partitions": list(assigned)}
    result["closed_cleanly"] = True
    return result


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[0])
    events = Events(int(spec["event_fd"]))
    run_and_exit(events, lambda: run(spec, events))


if __name__ == "__main__":
    main(sys.argv[1:])
