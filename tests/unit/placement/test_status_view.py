"""The status topic read into one immutable snapshot (runtime.placement.status_view)."""

from __future__ import annotations

import pytest

from runtime.placement.records import (
    PLAN_KEY,
    SCALE_DOWN_KEY,
    SHUTDOWN_REQUEST_KEY,
    InstanceStatus,
    PlacementPlan,
    ShutdownRequest,
)
from runtime.placement.status_view import StatusTopicView


def test_records_build_a_new_snapshot_and_old_ones_stay_as_they_were() -> None:
    view = StatusTopicView()
    before = view.snapshot
    view.apply(b"i1", InstanceStatus("i1", frozenset({"0_0"}), timestamp_ms=5).encode())
    view.apply(PLAN_KEY, PlacementPlan(3, "i1", {"0_0": "i1"}).encode())
    view.advance(7)
    now = view.snapshot
    assert before.statuses == {} and before.plan.version == 0 and before.position == -1
    assert set(now.statuses) == {"i1"} and now.statuses["i1"].active_tasks == {"0_0"}
    assert now.plan.version == 3 and now.position == 7
    with pytest.raises(TypeError):
        now.statuses["i2"] = now.statuses["i1"]  # type: ignore[index]


def test_older_plans_positions_and_tombstones() -> None:
    view = StatusTopicView()
    view.apply(PLAN_KEY, PlacementPlan(3, "i1", {}).encode())
    view.apply(PLAN_KEY, PlacementPlan(2, "i1", {}).encode())  # older: ignored
    view.advance(9)
    view.advance(4)  # never backwards
    view.apply(b"i1", InstanceStatus("i1", frozenset(), timestamp_ms=1).encode())
    view.apply(b"i1", None)  # tombstone: gone
    assert view.snapshot.plan.version == 3 and view.snapshot.position == 9
    assert view.snapshot.statuses == {}


def test_requests_and_junk() -> None:
    view = StatusTopicView()
    view.apply(SHUTDOWN_REQUEST_KEY, ShutdownRequest("i2", "bad input", 11).encode())
    view.apply(SCALE_DOWN_KEY, b'{"fraction": 0.5}')
    view.apply(None, b"ignored")
    assert view.snapshot.shutdown_request == ShutdownRequest("i2", "bad input", 11)
    assert view.snapshot.scale_down_request == {"fraction": 0.5}
    view.apply(SCALE_DOWN_KEY, b"not json")
    assert view.snapshot.scale_down_request is None
