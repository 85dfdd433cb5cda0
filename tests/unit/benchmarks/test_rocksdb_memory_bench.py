"""benchmarks.rocksdb_memory runs both modes (tiny sizes) and reports RSS."""

from __future__ import annotations

import json

from benchmarks import rocksdb_memory


def test_both_modes_report_rss() -> None:
    lines: list[str] = []
    argv = ["--stores", "4", "--rounds", "2", "--keys", "50", "--budget-mib", "16", "--json"]
    assert rocksdb_memory.main(argv, out=lines.append) == 0
    results = [json.loads(line) for line in lines]
    assert [r["mode"] for r in results] == ["default", "shared"]
    assert all(r["rss_peak_mib"] >= r["rss_start_mib"] > 0 for r in results)
    assert results[1]["budget_mib"] == 16 and 0 < results[1]["cache_usage_mib"] <= 16.2
