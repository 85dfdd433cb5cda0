"""The join and session benchmark workloads' data and bookkeeping (no broker, no JVM).

Their completion checks rest on the data's shape: the join is complete at a
pair count the harness computes from the backlog, the session count when the
latest count per session adds up to the input, so no record may be late. These
tests pin that shape, the quixstreams rule (session yes, join n/a with its
reason) and the report's lines for both.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from benchmarks.compare import workloads as wl
from benchmarks.compare.report import backlog_line
from benchmarks.compare.workloads import WORKLOADS, generate, join_expected
from benchmarks.peers import report
from benchmarks.peers.models import QUIX_NOT_RUN, runs


def test_join_backlog_interleaves_both_topics_with_one_partner_per_left_record() -> None:
    backlog = generate(WORKLOADS["join"], 0, 60_000, 8)
    left = [r for r in backlog if r[4] == 0]
    right = [r for r in backlog if r[4] == 1]
    assert len(left) == len(right) == 30_000
    # Co-partitioned: a key's records are on the same partition in both topics.
    partition_of: dict[bytes, set[int]] = defaultdict(set)
    for key, _value, partition, _ts, _side in backlog:
        partition_of[key].add(partition)
    assert all(len(p) == 1 for p in partition_of.values())
    assert join_expected(backlog) == len(left)


def test_join_expected_counts_pairs_within_the_window_bounds_inclusive() -> None:
    d = wl.JOIN_DIFFERENCE_MS
    backlog = [
        (b"a", b"l", 0, 10_000, 0),
        (b"a", b"r", 0, 10_000 + d, 1),  # at the bound: joins
        (b"a", b"r", 0, 10_000 - d - 1, 1),  # one past it: does not
        (b"b", b"r", 0, 10_000, 1),  # another key
    ]
    assert join_expected(backlog) == 1


def test_session_records_are_in_time_order_per_key_and_sometimes_extend_a_session() -> None:
    backlog = generate(WORKLOADS["session"], 0, 100_000, 8)
    last: dict[bytes, int] = {}
    extend = new = 0
    for key, _value, _partition, ts, side in backlog:
        assert side == 0
        if key in last:
            assert ts > last[key]  # no bridging merges: a session keeps its start
            if ts - last[key] <= wl.SESSION_GAP_MS:
                extend += 1
            else:
                new += 1
        last[key] = ts
    assert 0.2 < extend / (extend + new) < 0.5
    # Out of order within a partition by less than the grace: nothing is late.
    newest = [0] * 8
    for _key, _value, partition, ts, _side in backlog:
        assert newest[partition] - ts < wl.SESSION_GRACE_MS
        newest[partition] = max(newest[partition], ts)


def test_quixstreams_runs_the_session_count_but_not_the_join() -> None:
    assert runs("quixstreams", "session", 1)
    assert not runs("quixstreams", "join", 1)
    assert "join_interval" in QUIX_NOT_RUN["join"]
    assert all(runs(m, w, 2) for m in ("runtime", "ks-classic") for w in ("join", "session"))


def test_the_report_shows_quixstreams_join_as_na_and_the_join_target() -> None:
    def run(workload: str, model: str, rate: float) -> dict[str, Any]:
        return {
            "workload": workload,
            "model": model,
            "threads": 1,
            "repeat": 1,
            "correct": True,
            "records_per_s": rate,
            "records_per_s_first_to_last": rate,
            "cpu_s_per_million": 10.0,
            "peak_rss_mb": 100.0,
            "connections_at_ready": 5,
        }

    join = {"output_check": "count", "output_target": 5, "inputs": 2}
    session = {"output_check": "sum", "output_target": None, "inputs": 1}
    for w in (join, session):
        w.update(title="t", description="d", backlog=10, backlog_per_partition=[10])
        w.update(feed_rate=0.0, feed_seconds=0.0)
    result = {
        "command": "python -m benchmarks peers",
        "repeats": 1,
        "threads": [1],
        "models": ["runtime", "ks-classic", "quixstreams"],
        "config": {},
        "machine": {},
        "workloads": {"join": join, "session": session},
        "runs": [
            run("join", "runtime", 2_000.0),
            run("join", "ks-classic", 1_000.0),
            run("session", "runtime", 3_000.0),
            run("session", "quixstreams", 1_000.0),
        ],
    }
    result["summary"] = report.summarize(result)
    text = report.markdown(result)
    assert "| join | 1 | 2,000 | 1,000 |  | 2.00x | n/a |" in text
    assert f"quixstreams, join: n/a, {QUIX_NOT_RUN['join']}." in text
    assert "complete at 5 output records; no latency phase" in backlog_line(join)
    assert "(both input topics together)" in backlog_line(join)
