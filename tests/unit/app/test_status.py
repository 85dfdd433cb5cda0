"""AppStatus: typed attributes, the JSON shape, and the old mapping access."""

from __future__ import annotations

import json

import pytest

from runtime.status import AppStatus, RestoreProgress, TaskStatus, ThreadStatus


def sample() -> AppStatus:
    return AppStatus(
        application_id="app",
        client_id="app",
        instance_id="app-1",
        state="RUNNING",
        started_at=1.0,
        processing_guarantee="at_least_once",
        assignment_strategy="cooperative-sticky",
        threads=(ThreadStatus("t-1", True, "0_0", 3, 0.5),),
        tasks=(
            TaskStatus("0_0", "RUNNING", "t-1", ("in-0",), 2, 10, 1, 0),
            TaskStatus(
                "1_0", "RESTORING", None, ("rep-0",), 0, 0, 0, 0, RestoreProgress(5, 7, 1.5)
            ),
        ),
        processed=10,
        lag={"in-0": 4},
        total_lag=4,
    )


def test_to_dict_is_json_and_from_dict_gives_the_same_status_back() -> None:
    status = sample()
    data = json.loads(json.dumps(status.to_dict()))
    assert data["tasks"][0]["partitions"] == ["in-0"] and "restore" not in data["tasks"][0]
    assert data["tasks"][1]["restore"] == {"restored": 5, "remaining": 7, "rate": 1.5}
    assert AppStatus.from_dict(data) == status


def test_mapping_access_for_scripts_written_against_the_dict_api() -> None:
    status = sample()
    assert status["total_lag"] == 4 and status.get("nope", "d") == "d"
    assert "processed" in status and "nope" not in status
    assert status["tasks"][0]["id"] == "0_0"
    assert dict(status)["lag"] == {"in-0": 4}
    with pytest.raises(KeyError):
        status["nope"]


def test_partial_snapshots_take_empty_values() -> None:
    status = AppStatus.from_dict({"state": "RUNNING", "processed": 3})
    assert status.tasks == () and status.threads == () and status.total_lag == 0
    assert status.processed == 3 and status.application_id == ""
