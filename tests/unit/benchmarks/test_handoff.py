"""benchmarks.handoff runs (tiny sizes), and its frame and ring carry bytes intact."""

from __future__ import annotations

import json

from benchmarks import handoff


def test_every_transport_and_batch_reports_cpu_per_record() -> None:
    lines: list[str] = []
    code = handoff.main(
        ["--batches", "1,10", "--records", "40", "--repeats", "1", "--json"], out=lines.append
    )
    assert code == 0
    rows = [json.loads(line) for line in lines]
    assert [(r["transport"], r["batch"]) for r in rows] == [
        (t, b) for b in (1, 10) for t in ("codec", *handoff.TRANSPORTS)
    ]
    for row in rows:
        if row["transport"] == "codec":
            assert row["pack_us"] > 0 and row["unpack_us"] > 0
        else:
            assert row["total_us"] == round(row["client_us"] + row["worker_us"], 3) or (
                abs(row["total_us"] - row["client_us"] - row["worker_us"]) < 0.002
            )


def test_pack_unpack_round_trip() -> None:
    records = handoff.make_records(7) + [(b"", b"")]
    assert handoff.unpack(handoff.pack(records)) == records
    assert handoff.unpack(handoff.pack([])) == []


def test_ring_keeps_order_across_the_wrap_and_refuses_what_does_not_fit() -> None:
    ring = handoff.Ring(64)
    try:
        sent = []
        for i in range(40):  # many times the capacity: every offset wraps
            payload = bytes([i]) * (i % 29)
            assert ring.put(payload)
            sent.append(payload)
            assert ring.get() == payload
        assert ring.get() is None
        assert ring.put(b"x" * 20) and ring.put(b"y" * 20)
        assert not ring.put(b"z" * 20)  # 3 x 24 bytes > 64
        assert ring.get() == b"x" * 20 and ring.get() == b"y" * 20
    finally:
        ring.close()
        ring.shm.unlink()


def test_the_worker_returns_every_record() -> None:
    for transport in handoff.TRANSPORTS:
        # Many batches, every one checked: a torn read of a ring counter shows.
        _, _, out = handoff.run_handoff(transport, batch=10, batches=300, verify=True)
        assert out == handoff.make_records(10)
