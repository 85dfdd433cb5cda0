"""RocksDB memory and metrics on a running daemon (issue 34, items 1 and 3):
a count app on Kafka with a small shared budget, statistics and a config
setter; `/metrics` has the RocksDB families with sane values, `admin status`
a state-memory line, and the setter's change is in each store's options."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runtime.admin.client import request
from tests.integration.test_metrics import samples, scrape
from tests.kafka_helpers import create_topic, produce, unique_name, wait_until

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20


@pytest.mark.integration
def test_count_app_exposes_rocksdb_memory(bootstrap: str, tmp_path: Path) -> None:
    source, sink, app_id = unique_name("rdb-in"), unique_name("rdb-out"), unique_name("rdb")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, sink, 2)
    sock = str(tmp_path / "admin.sock")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMS_RUNTIME_")}
    env.update(PYTHONPATH=str(REPO), STREAMS_TEST_INPUT=source, STREAMS_TEST_OUTPUT=sink)
    sets = {
        "application.id": app_id, "bootstrap.servers": bootstrap, "processing.threads": 1,
        "commit.interval.ms": 300, "state.dir": tmp_path / "state", "admin.socket": sock,
        "metrics.port": 0, "consumer.session.timeout.ms": 6000,
        "consumer.heartbeat.interval.ms": 500,
        "state.rocksdb.memory.bytes": 64 * MIB, "state.rocksdb.write.buffer.ratio": 0.5,
        "state.rocksdb.statistics": "true", "state.rocksdb.metrics.interval.ms": 200,
        "state.rocksdb.config.setter": "tests.apps.count_app:rocksdb_setter",
    }  # fmt: skip
    argv = [sys.executable, "-m", "runtime", "run", "tests.apps.count_app:topology"]
    for key, value in sets.items():
        argv += ["--set", f"{key}={value}"]
    log_path = tmp_path / "daemon.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)

    def listening() -> dict[str, Any] | None:
        for line in log_path.read_text().splitlines():
            if line.startswith("{") and json.loads(line).get("event") == "metrics_listening":
                return dict(json.loads(line))
        assert proc.poll() is None, log_path.read_text()[-3000:]
        return None

    try:
        wait_until(listening, 60, interval=0.1, message="no metrics_listening event")
        event = listening()
        assert event is not None
        base = f"http://{event['host']}:{event['port']}"
        wait_until(lambda: scrape(base + "/readyz")[0] == 200, 60, interval=0.2)
        produce(bootstrap, source, ((f"k{i % 50}", str(i)) for i in range(2000)))

        def counted() -> dict[str, list[Any]] | None:
            got = samples(scrape(base + "/metrics")[2])
            keys = got.get("streams_rocksdb_estimated_keys", [])
            if len(keys) == 2 and sum(s.value for s in keys) >= 50:
                return got
            return None

        wait_until(counted, 90, interval=0.3, message="RocksDB keys never showed in /metrics")
        got = counted()
        assert got is not None
        value = {name: got[name][0].value for name in got if len(got[name]) == 1}
        assert value["streams_rocksdb_memory_budget_bytes"] == 64 * MIB
        assert value["streams_rocksdb_memtable_limit_bytes"] == 32 * MIB
        assert 0 < value["streams_rocksdb_block_cache_usage_bytes"] <= 64 * MIB
        assert 0 < value["streams_rocksdb_memtable_usage_bytes"] <= 32 * MIB
        assert value["streams_rocksdb_memtable_stall_seconds_total"] == 0
        tasks = {s.labels["task"] for s in got["streams_rocksdb_estimated_keys"]}
        assert tasks == {"0_0", "0_1"}
        assert {s.labels["store"] for s in got["streams_rocksdb_estimated_keys"]} == {"counts"}
        # 50 keys over two partitions; RocksDB's estimate counts memtable entries.
        assert 50 <= sum(s.value for s in got["streams_rocksdb_estimated_keys"]) <= 4000
        assert all(s.value > 0 for s in got["streams_rocksdb_store_memtable_bytes"])
        assert all(s.value == 0 for s in got["streams_rocksdb_write_stopped"])
        assert all(s.value == 0 for s in got["streams_rocksdb_delayed_write_rate_bytes"])
        assert all(s.value >= 0 for s in got["streams_rocksdb_pending_compaction_bytes"])
        assert sum(s.value for s in got["streams_rocksdb_write_seconds_count"]) >= 2
        assert sum(s.value for s in got["streams_rocksdb_get_seconds_count"]) >= 50

        memory = request(sock, "status")["state_memory"]
        assert memory["memory_bytes"] == 64 * MIB and len(memory["stores"]) == 2
        shown = subprocess.run(
            [sys.executable, "-m", "runtime", "admin", "--socket", sock, "status"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert shown.returncode == 0, shown.stderr
        (line,) = [ln for ln in shown.stdout.splitlines() if ln.startswith("state memory")]
        assert "of 64.0 MiB (memtables" in line and "2 stores" in line
        assert line.endswith("write stalls: none")

        # The config setter ran for every store (its change is in RocksDB's OPTIONS file).
        options = sorted((tmp_path / "state" / app_id).glob("0_*/rocksdb/counts/OPTIONS-*"))
        assert len({p.parent for p in options}) == 2
        assert all("max_write_buffer_number=3" in p.read_text() for p in options)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        print(log_path.read_text()[-4000:])
