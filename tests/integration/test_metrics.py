"""Prometheus metrics and health endpoints.

First without Kafka (a fake app behind `start_metrics_server`): every exported name is
produced and parses as Prometheus text, and /healthz, /readyz follow the app state. Then a
real daemon with `metrics.port=0`: the test learns the port from the `metrics_listening`
log event (and checks the admin status says the same), scrapes twice while a producer
feeds records, and sees the counters grow.
"""

from __future__ import annotations

import dataclasses
import json
import signal
import socket
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from runtime.admin.client import request
from runtime.metrics import FAMILIES, METRIC_NAMES, make_registry, start_metrics_server
from runtime.status import AppStatus, QueryStatus, RestoreProgress, TaskStatus, ThreadStatus
from tests.configs import app_config
from tests.harness import Daemon, clean_env
from tests.kafka_helpers import create_topic, produce, unique_name, wait_until

FULL_STATUS = AppStatus(
    application_id="app", client_id="app-1", instance_id="app-1-x", state="RUNNING",
    started_at=1_699_999_999.0, processing_guarantee="at_least_once",
    assignment_strategy="cooperative-sticky",
    threads=(ThreadStatus("app-1-ProcessingThread-1", alive=True, task=None, batches=4,
                          busy_seconds=0.25),),
    tasks=(TaskStatus("0_0", "RUNNING", None, ("my-topic-0",), buffered=3, processed=5,
                      skipped=1, dead_lettered=1),
           TaskStatus("0_1", "RUNNING", "t-1,t-2", ("my-topic-1",), buffered=0, processed=0,
                      skipped=0, dead_lettered=0, key_parallel=True, threads_per_task=4,
                      in_flight=7, watermark_lag=2, parallelism=1.5, retried=1),
           TaskStatus("1_0", "RESTORING", None, ("rep-0",), buffered=0, processed=0,
                      skipped=0, dead_lettered=0,
                      restore=RestoreProgress(restored=10, remaining=90, rate=5.0))),
    consumed=9, processed=5, produced=4, skipped=1, dead_lettered=1,
    commits=2, commit_failures=0, last_commit=1_700_000_000.0,
    last_commit_duration_s=0.01, failed_threads=1,
    lag={"my-topic-0": 4}, total_lag=4, broker_down_since=1_700_000_001.0,
    retrying_call="init_transactions", retrying_since=1_700_000_002.0,
    transactions_committed=3, transactions_aborted=1, restored=10,
    dropped={"late": 2},
    partitions={"my-topic": 8, "out": 8}, partition_expansions=1, tasks_created_by_expansion=4,
    held_partitions=["my-topic-7"], expansion_waiting_for="internal topics growing",
    restores={"0_0": {"source": "snapshot+tail", "seconds": 1.5, "records": 20,
                      "snapshot": "0000000000001-0123abcd", "downloaded_bytes": 100}},
    remote_state={"snapshots_uploaded": 2, "snapshot_failures": 0, "bytes_uploaded": 300,
                  "bytes_downloaded": 100, "snapshot_restore_failures": 0,
                  "last_snapshot": {"0_0": {"created": 1_700_000_002.0}}},
    state_memory={"read_at": 1_700_000_003.0, "memory_bytes": 268435456,
                  "write_buffer_limit_bytes": 67108864, "block_cache_usage_bytes": 5000,
                  "block_cache_pinned_bytes": 4000, "write_buffer_usage_bytes": 3000,
                  "forced_flushes": 2, "stalls": 1, "stall_seconds": 0.5, "write_stalls": 1,
                  "stalls_without_progress": 3,
                  "stores": [{"task": "0_0", "store": "counts", "estimated_keys": 10,
                              "memtable_bytes": 3000, "table_readers_bytes": 100,
                              "pending_compaction_bytes": 0, "live_sst_bytes": 2000,
                              "delayed_write_rate": 16777216, "write_stopped": 0,
                              "gets": 7, "get_seconds": 0.001, "writes": 2,
                              "write_seconds": 0.002}]},
    queries=(QueryStatus("orders", "FAILED", priority=10, tasks=2, processed=7,
                         records_per_s=3.5, busy_seconds=1.5, busy_share=0.75, lag=4,
                         p99_latency_ms=12.0, failure="boom"),),
)  # fmt: skip


class FakeApp:
    def __init__(self) -> None:
        self.state = "RUNNING"

    def status(self) -> AppStatus:
        return dataclasses.replace(FULL_STATUS, state=self.state)


def scrape(url: str, method: str = "GET") -> tuple[int, str, str]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.headers.get("Content-Type", ""), resp.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.headers.get("Content-Type", ""), err.read().decode()


def samples(text: str) -> dict[str, list[Any]]:
    out: dict[str, list[Any]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out.setdefault(sample.name, []).append(sample)
    return out


def test_collector_exports_every_name() -> None:
    text = generate_latest(make_registry(FakeApp(), process_metrics=False)).decode()
    got = samples(text)
    assert set(got) >= METRIC_NAMES, METRIC_NAMES - set(got)
    (lag,) = got["streams_consumer_lag"]
    assert lag.labels == {"topic": "my-topic", "partition": "0"} and lag.value == 4
    states = {s.labels["state"]: s.value for s in got["streams_app_state"]}
    assert states["RUNNING"] == 1 and sum(states.values()) == 1
    assert got["streams_broker_unreachable"][0].value == 1
    assert got["streams_coordinator_retry_seconds"][0].value > 0  # since 2023
    query_states = {s.labels["state"]: s.value for s in got["streams_query_state"]}
    assert query_states == {"RUNNING": 0, "PAUSED": 0, "FAILED": 1}
    (share,) = got["streams_query_busy_share"]
    assert share.labels == {"query": "orders"} and share.value == 0.75
    assert got["streams_query_latency_p99_seconds"][0].value == 0.012
    (in_flight,) = got["streams_task_in_flight_records"]
    assert in_flight.labels == {"task": "0_1"} and in_flight.value == 7
    assert got["streams_task_watermark_lag_records"][0].value == 2
    assert got["streams_task_parallelism"][0].value == 1.5
    threads_max = {s.labels["task"]: s.value for s in got["streams_task_threads_max"]}
    assert threads_max == {"0_0": 1, "0_1": 4, "1_0": 1}
    assert got["streams_process_batch_seconds_count"][0].value == 4
    assert got["streams_poison_records_total"][0].value == 1  # dead-lettered counts as skipped
    counts = {s.labels["topic"]: s.value for s in got["streams_topic_partitions"]}
    assert counts == {"my-topic": 8, "out": 8}
    assert got["streams_partition_expansions_total"][0].value == 1
    assert got["streams_tasks_created_by_expansion_total"][0].value == 4
    assert got["streams_held_partitions"][0].value == 1
    assert got["streams_partition_expansion_waiting"][0].value == 1
    assert got["streams_rocksdb_memory_budget_bytes"][0].value == 268435456
    assert got["streams_rocksdb_block_cache_usage_bytes"][0].value == 5000
    (keys,) = got["streams_rocksdb_estimated_keys"]
    assert keys.labels == {"task": "0_0", "store": "counts"} and keys.value == 10
    assert got["streams_rocksdb_delayed_write_rate_bytes"][0].value == 16777216
    assert got["streams_rocksdb_get_seconds_count"][0].value == 7
    assert got["streams_rocksdb_memtable_stall_seconds_total"][0].value == 0.5
    assert got["streams_rocksdb_memtable_stalls_without_progress_total"][0].value == 3


def test_endpoints_follow_app_state() -> None:
    app = FakeApp()
    server = start_metrics_server(app, "127.0.0.1", 0)
    try:
        base = server.url
        status, ctype, body = scrape(base + "/metrics")
        assert status == 200 and ctype.startswith("text/plain; version=0.0.4")
        assert "streams_records_consumed_total 9.0" in body
        assert "process_resident_memory_bytes" in body  # prometheus-client's process metrics
        assert scrape(base + "/healthz")[0] == 200
        assert scrape(base + "/readyz?verbose=1")[:1] == (200,)
        app.state = "REBALANCING"
        assert scrape(base + "/readyz")[::2] == (503, "REBALANCING\n")
        assert scrape(base + "/healthz")[0] == 200
        app.state = "ERROR"
        assert scrape(base + "/healthz")[0] == 503
        assert scrape(base + "/nope")[0] == 404
        assert scrape(base + "/metrics", method="POST")[0] == 405
        assert scrape(base + "/metrics", method="HEAD")[::2] == (200, "")
        with socket.create_connection(("127.0.0.1", server.port), timeout=5) as raw:
            raw.sendall(b"garbage\r\n\r\n")
            assert raw.recv(100).startswith(b"HTTP/1.1 400")
    finally:
        server.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()


# --- a real daemon ------------------------------------------------------------------------


@pytest.mark.integration
def test_daemon_serves_metrics_and_health(bootstrap: str) -> None:
    workdir = Path(tempfile.mkdtemp(prefix="met"))
    source, sink, app_id = unique_name("met-in"), unique_name("met-out"), unique_name("met")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    sock = str(workdir / "admin.sock")
    env = clean_env(
        STREAMS_TEST_INPUT=source,
        STREAMS_TEST_OUTPUT=sink,
        STREAMS_RUNTIME_METRICS_PORT="0",  # the environment route, as in containers
    )
    sets = app_config(
        bootstrap, app_id, workdir / "state", threads=1, commit_ms=300, **{"admin.socket": sock}
    )
    log_path = workdir / "daemon.log"
    daemon = Daemon(log_path, "tests.apps.passthrough:topology", sets, env).start()

    def listening() -> dict[str, Any] | None:
        for line in log_path.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "metrics_listening":
                return dict(json.loads(line))
        daemon.assert_alive()
        return None

    try:
        wait_until(listening, 60, interval=0.1, message="no metrics_listening event")
        event = listening()
        assert event is not None
        base = f"http://{event['host']}:{event['port']}"
        wait_until(lambda: scrape(base + "/readyz")[0] == 200, 60, interval=0.2)
        assert request(sock, "status")["daemon"]["metrics"]["port"] == event["port"]
        assert scrape(base + "/healthz")[0] == 200

        produce(bootstrap, source, ((f"k{i % 8}", str(i)) for i in range(500)))
        wait_until(lambda: request(sock, "status")["commits"] > 0, 60, interval=0.2)
        status, _, first_text = scrape(base + "/metrics")
        assert status == 200
        for name, (kind, _) in FAMILIES.items():
            exposed = name + {"counter": "_total", "info": "_info"}.get(kind, "")
            assert f"# TYPE {exposed} " in first_text, name
        first = samples(first_text)
        assert first["streams_processing_threads_alive"][0].value == 1
        assert first["streams_last_commit_timestamp_seconds"][0].value > 0
        running = [s for s in first["streams_app_state"] if s.labels["state"] == "RUNNING"]
        assert running[0].value == 1

        produce(bootstrap, source, ((f"k{i % 8}", str(i)) for i in range(500, 1000)))
        consumed_before = first["streams_records_consumed_total"][0].value
        processed_before = first["streams_records_processed_total"][0].value

        def grown() -> bool:
            now = samples(scrape(base + "/metrics")[2])
            return (
                now["streams_records_consumed_total"][0].value >= consumed_before + 500
                and now["streams_records_processed_total"][0].value >= processed_before + 500
            )

        wait_until(grown, 60, interval=0.2, message="counters did not grow between scrapes")
        daemon.send(signal.SIGTERM)
        assert daemon.wait(30) == 0, daemon.tail()
    finally:
        daemon.kill()
        print(daemon.tail(4000))
