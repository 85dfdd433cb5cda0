"""Many tasks with two stores each: RSS, commit time, store open, restore, records/s (issue 34).

One instance with one task per input partition (``--partitions``, 256 and 8
by default) and two RocksDB stores per task: ``group_by_key().count()`` and a
tumbling-window count on the same stream (``benchmarks/state/workload.py``).
Per side, on the same input topic of ``--records`` records:

- the runtime, once per store layout (``--layouts``; default: every layout
  the runtime accepts), each in a fresh child process: time to open every
  store (start, paused, until every task is RUNNING), records/s on the
  backlog, every commit's duration (median, p99, max; and the stores' share:
  every task's `post_commit`), peak RSS; then a steady feed (``--feed-s`` at
  ``--feed-rate``, from a feeder process) whose commits give the steady commit
  median and p99 (the backlog gives a handful of commits); then the same application id on an
  empty state directory: the restore time of every store from its changelog,
  the records restored, and both stores read back (their counts must add up
  to the input);
- Kafka Streams (the peer, ``peers.StateBench``), once per ``--ks-memory``
  setting (``default``: its defaults; ``bounded``: the documented shared
  LRUCache + WriteBufferManager recipe with the runtime's budget): the same
  figures, commit times from its stream threads' DEBUG commit lines.

A side that fails (an error, a wrong count) is reported with its reason and
its log; the command then gives no verdict and exits 1. Results:
``state.json`` and ``state.md`` in benchmarks/results/local/ (``--out``,
``--update-results``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import tempfile
import time
from typing import Any

from benchmarks import harness
from benchmarks.outputs import add_output_arguments, output_dir
from benchmarks.state import ks_side, report
from benchmarks.state.runtime_side import fed_records
from benchmarks.state.workload import accepted_layouts, records

NAME = "state"
KS_MEMORY = ("default", "bounded")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--partitions", default="256,8", help="tasks (input partitions) per round")
    parser.add_argument("--records", type=int, default=100_000, help="backlog records per round")
    parser.add_argument("--keys", type=int, default=25_600, help="distinct keys (25600)")
    parser.add_argument("--window-ms", type=int, default=60_000, help="tumbling window size")
    parser.add_argument(
        "--span-ms", type=int, default=600_000, help="event-time span of the input (10 windows)"
    )
    parser.add_argument(
        "--layouts",
        default=None,
        help="runtime store layouts, comma-separated (default: every layout the runtime "
        f"accepts: {','.join(accepted_layouts())})",
    )
    parser.add_argument(
        "--threads", type=int, default=1, help="processing.threads / num.stream.threads (1)"
    )
    parser.add_argument("--commit-interval-ms", type=int, default=1000)
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runtime sides per layout and task count, the layouts' order rotated each round; "
        "the throughput verdict takes the median of the rounds' consolidated / per-task ratios "
        "(this machine's speed drifts between runs, and the side run second tends to be "
        "faster: one pair decides nothing)",
    )
    parser.add_argument(
        "--feed-s",
        type=float,
        default=60.0,
        help="runtime sides: after the backlog, a steady feed this long, so that the commit "
        "p99 is over many commits (0: none)",
    )
    parser.add_argument(
        "--feed-rate", type=int, default=2000, help="records/s of the steady feed (2000)"
    )
    parser.add_argument(
        "--memory-mib",
        type=int,
        default=None,
        help="state.rocksdb.memory.bytes in MiB, also the bounded Kafka Streams budget "
        "(default: the runtime's default)",
    )
    parser.add_argument(
        "--rss-constant-mib",
        type=int,
        default=400,
        help="the RSS target's constant: peak RSS <= budget + this at the largest task count",
    )
    parser.add_argument(
        "--ks-memory",
        default=",".join(KS_MEMORY),
        help="Kafka Streams runs: default,bounded (empty: no Kafka Streams side)",
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra runtime config (repeatable)",
    )
    parser.add_argument("--quiet-wait", type=float, default=60.0, help="max s to wait for quiet")
    parser.add_argument("--timeout", type=float, default=900.0, help="max s per run")
    parser.add_argument("--tag", default="", help="suffix of the result files")
    harness.add_broker_argument(parser)
    add_output_arguments(parser)


def _budget(args: argparse.Namespace) -> tuple[int, float]:
    from runtime.state.rocksdb_memory import DEFAULT_MEMORY_BYTES, DEFAULT_WRITE_BUFFER_RATIO

    memory = args.memory_mib * (1 << 20) if args.memory_mib else DEFAULT_MEMORY_BYTES
    return memory, DEFAULT_WRITE_BUFFER_RATIO


def _extra_config(args: argparse.Namespace, memory: int) -> dict[str, str]:
    config = {"state.rocksdb.memory.bytes": str(memory)}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--set {item!r}: expected KEY=VALUE")
        config[key.strip()] = value.strip()
    return config


def load_input(bootstrap: str, topic: str, args: argparse.Namespace, partitions: int) -> int:
    """Produce the backlog once (explicit partition and timestamp); returns base_ms."""
    from confluent_kafka import Producer

    producer = Producer(
        harness.client_config(
            {
                "bootstrap.servers": bootstrap,
                "linger.ms": 50,
                "batch.num.messages": 10000,
                "queue.buffering.max.messages": 1_000_000,
                "enable.idempotence": True,
            }
        )
    )
    base_ms = int(time.time() * 1000) - args.span_ms
    errors: list[str] = []

    def on_delivery(err: Any, _msg: Any) -> None:
        if err is not None:
            errors.append(str(err))

    for i, (key, value, partition, ts) in enumerate(
        records(args.records, args.keys, partitions, base_ms, args.span_ms)
    ):
        while True:
            try:
                producer.produce(
                    topic, value, key, partition=partition, timestamp=ts, on_delivery=on_delivery
                )
                break
            except BufferError:
                producer.poll(0.05)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(120) or errors:
        raise RuntimeError(f"loading {topic} failed: {errors[:3]}")
    return base_ms


def _fresh_input(
    session: harness.BenchSession, args: argparse.Namespace, partitions: int
) -> dict[str, Any]:
    """A new input topic with the backlog loaded; the spec every side starts from."""
    topic = f"bench-state-in-{partitions}-{random.randrange(1 << 30)}"
    session.create_topic(topic, partitions)
    started = time.monotonic()
    base_ms = load_input(session.bootstrap, topic, args, partitions)
    print(
        f"[state] {partitions} partitions: {args.records} records loaded into {topic} in "
        f"{time.monotonic() - started:.1f} s",
        flush=True,
    )
    return {
        "bootstrap": session.bootstrap,
        "input_topic": topic,
        "partitions": partitions,
        "records": args.records,
        "keys": args.keys,
        "window_ms": args.window_ms,
        "span_ms": args.span_ms,
        "base_ms": base_ms,
        "threads": args.threads,
        "commit_interval_ms": args.commit_interval_ms,
        "feed_s": args.feed_s,
        "feed_rate": args.feed_rate,
    }


def _drop_topics(session: harness.BenchSession, input_topic: str, app_id: str | None) -> None:
    """A finished side's input and internal topics, so that the broker the next
    side shares carries no more partitions than the first side's did."""
    assert session.admin is not None
    names = [input_topic]
    if app_id:
        topics = session.admin.list_topics(timeout=30).topics
        names += [t for t in topics if t.startswith(f"{app_id}-")]
    for name in names:
        session.delete_topic(name)


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def _runtime_side(
    args: argparse.Namespace,
    session: harness.BenchSession,
    log_dir: str,
    base: dict[str, Any],
    layout: str,
    config: dict[str, str],
    number: int = 0,
) -> dict[str, Any]:
    partitions = base["partitions"]
    side: dict[str, Any] = {
        "side": "runtime",
        "layout": layout,
        "partitions": partitions,
        "round": number,
    }
    app_id = f"bench-state-{layout}-{partitions}-{random.randrange(1 << 30)}"
    side["application_id"] = app_id
    scratch = tempfile.mkdtemp(prefix="bench-state-")
    spec = dict(base, application_id=app_id, layout=layout, config=config, timeout_s=args.timeout)
    try:
        for mode in ("process", "restore"):
            harness.wait_for_quiet(session, args.quiet_wait)
            state_dir = os.path.join(scratch, mode)  # the restore's is new and empty
            suffix = f"-r{number}" if number else ""
            log = os.path.join(log_dir, f"runtime-{layout}-{partitions}-{mode}{suffix}.log")
            side["log_" + mode] = log
            result = harness.run_child(
                "state_runtime",
                dict(spec, mode=mode, state_dir=state_dir),
                log,
                args.timeout + 120,
                session,
            )
            side[mode] = result
            shutil.rmtree(state_dir, ignore_errors=True)  # the local state wiped
        _check_runtime(side, args.records + fed_records(spec))
        side["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a failed side is reported, not raised
        side["ok"] = False
        side["error"] = _first_line(exc)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return side


def _check_runtime(side: dict[str, Any], total: int) -> None:
    processed = side["process"].get("processed")
    if processed != total:
        raise RuntimeError(f"processed {processed} records of {total}")
    restored = side["restore"]
    for name in ("counted", "windowed_counted"):
        if restored.get(name) != total:
            raise RuntimeError(
                f"after the restore the {name.replace('_', ' ')} records add up to "
                f"{restored.get(name)}, not {total}"
            )


def _ks_side(
    args: argparse.Namespace,
    session: harness.BenchSession,
    log_dir: str,
    base: dict[str, Any],
    memory_setting: str,
    budget: tuple[int, float],
) -> dict[str, Any]:
    from benchmarks.peers import build

    partitions = base["partitions"]
    side: dict[str, Any] = {
        "side": "kafka-streams",
        "memory": memory_setting,
        "partitions": partitions,
    }
    log = os.path.join(log_dir, f"ks-{memory_setting}-{partitions}.log")
    side["log"] = log
    try:
        jar = build.kafka_streams_jar()
        harness.wait_for_quiet(session, args.quiet_wait)
        side["application_id"] = (
            f"bench-state-ks-{memory_setting}-{partitions}-{random.randrange(1 << 30)}"
        )
        spec = dict(
            base,
            application_id=side["application_id"],
            memory=memory_setting,
            memory_bytes=budget[0],
            write_buffer_ratio=budget[1],
            restore=True,
            timeout_s=args.timeout,
        )
        result = ks_side.run(jar, spec, log, args.timeout + 120)
        side["run"] = result
        if result.get("processed", 0) < args.records:
            raise RuntimeError(f"processed {result.get('processed')} records of {args.records}")
        side["ok"] = True
    except Exception as exc:  # noqa: BLE001 - a failed side is reported, not raised
        side["ok"] = False
        side["error"] = _first_line(exc)
    return side


def _rotated(layouts: list[str], number: int) -> list[str]:
    """The layouts in round `number`'s order: each round starts one further on."""
    if not layouts:
        return []
    shift = number % len(layouts)
    return layouts[shift:] + layouts[:shift]


def main(args: argparse.Namespace) -> int:
    if args.rounds < 1:
        raise SystemExit("--rounds: at least 1")
    args.out = output_dir(args)
    # Empty: no runtime side (a Kafka Streams-only run).
    given = args.layouts if args.layouts is not None else ",".join(accepted_layouts())
    layouts = [x.strip() for x in given.split(",") if x.strip()]
    unknown = sorted(set(layouts) - set(accepted_layouts()))
    if unknown:
        raise SystemExit(
            f"--layouts: this runtime does not accept {unknown}; it accepts {list(accepted_layouts())}"
        )
    ks_memory = [x.strip() for x in args.ks_memory.split(",") if x.strip()]
    if set(ks_memory) - set(KS_MEMORY):
        raise SystemExit(f"--ks-memory: choose from {','.join(KS_MEMORY)}")
    partition_counts = [int(p) for p in args.partitions.split(",") if p.strip()]
    budget = _budget(args)
    config = _extra_config(args, budget[0])
    name = f"state-{args.tag}" if args.tag else "state"
    log_dir = os.path.join(args.out, "logs", name)
    os.makedirs(log_dir, exist_ok=True)
    sides: list[dict[str, Any]] = []
    external = getattr(args, "external_broker", None)
    with harness.BenchSession(log_dir, args.broker, external=external) as session:
        machine = harness.machine_info(args.broker)
        print(f"[state] broker {session.bootstrap}; logs in {log_dir}", flush=True)
        for partitions in partition_counts:
            runs: list[tuple[str, str, int]] = [
                ("runtime", layout, number)
                for number in range(args.rounds)
                for layout in _rotated(layouts, number)
            ]
            runs += [("kafka-streams", setting, 0) for setting in ks_memory]
            for kind, what, number in runs:
                # Every side its own input, loaded the same way: a side's steady feed
                # appends to its topic, which no other side may read.
                base = _fresh_input(session, args, partitions)
                if kind == "runtime":
                    side = _runtime_side(args, session, log_dir, base, what, config, number)
                else:
                    side = _ks_side(args, session, log_dir, base, what, budget)
                sides.append(side)
                print(f"[state] {report.side_line(side)}", flush=True)
                _drop_topics(session, base["input_topic"], side.get("application_id"))
    result = {
        "workload": NAME,
        "machine": machine,
        "git": harness.git_version(),
        "settings": {
            "partitions": partition_counts,
            "records": args.records,
            "keys": args.keys,
            "window_ms": args.window_ms,
            "span_ms": args.span_ms,
            "layouts": layouts,
            "ks_memory": ks_memory,
            "threads": args.threads,
            "commit_interval_ms": args.commit_interval_ms,
            "rounds": args.rounds,
            "feed_s": args.feed_s,
            "feed_rate": args.feed_rate,
            "memory_bytes": budget[0],
            "write_buffer_ratio": budget[1],
            "rss_constant_mib": args.rss_constant_mib,
            "runtime_config": config,
        },
        "sides": sides,
    }
    result["verdicts"] = report.verdicts(result)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=1)
    text = report.markdown(result)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(text)
    print(text, flush=True)
    failed = [s for s in sides if not s.get("ok")]
    for side in failed:
        print(f"[state] FAILED: {report.side_name(side)}: {side.get('error')}", flush=True)
    return 1 if failed else 0
