"""What the instances say on the status topic, as one snapshot other threads read.

The compacted `<application.id>-status` topic carries every instance's
status (tasks, standbys, learners' lags, capacity, leaving), the placer's
newest `PlacementPlan`, `scale-down` requests and SHUTDOWN_APPLICATION
requests (`runtime.placement.records`). Its reader
(`runtime.placement.status_reader`, made by `reader`) runs on the
restoration thread's loop, over the one restore consumer, and hands each
record to `apply` and each end or position to `advance`. This class keeps
the decoding and the state, and publishes an immutable `StatusSnapshot` by
replacing one reference: the polling thread (standby placement, shutdown
requests, the placer and the plan follower) reads `snapshot` once per
decision and sees one consistent view, never a plan from one moment beside
statuses from another.

Threads: `apply` and `advance` on the restoration thread (through the
reader); `reader` once by the wiring's restoration thread constructor;
`snapshot` from any thread.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from runtime.placement.records import (
    PLAN_KEY,
    SCALE_DOWN_KEY,
    SHUTDOWN_REQUEST_KEY,
    InstanceStatus,
    PlacementPlan,
    ShutdownRequest,
)
from runtime.placement.status_reader import StatusTopicReader


@dataclass(frozen=True)
class StatusSnapshot:
    """The status topic as read up to `position` (the next offset; -1 before
    anything was read). Immutable: a newer read is a new snapshot."""

    statuses: Mapping[str, InstanceStatus] = field(default_factory=lambda: MappingProxyType({}))
    plan: PlacementPlan = field(default_factory=PlacementPlan)
    shutdown_request: ShutdownRequest | None = None
    scale_down_request: Mapping[str, Any] | None = None
    position: int = -1


class StatusTopicView:
    """Decodes status-topic records into `snapshot`. See the module docstring."""

    def __init__(self) -> None:
        self.snapshot = StatusSnapshot()

    def reader(self, topic: str) -> StatusTopicReader:
        """The reader that fills this view from `topic` on the restoration
        thread's loop (`runtime.state.restoration_seams.SideReaderSource`)."""
        return StatusTopicReader(topic, self)

    def apply(self, key: bytes | None, value: bytes | None) -> None:
        """One record of the status topic (restoration thread)."""
        if key is None:
            return
        now = self.snapshot
        if key == SHUTDOWN_REQUEST_KEY:
            request = ShutdownRequest.decode(value) if value is not None else None
            if request is not None:
                self.snapshot = dataclasses.replace(now, shutdown_request=request)
            return
        if key == PLAN_KEY:
            plan = PlacementPlan.decode(value) if value is not None else None
            if plan is not None and plan.version > now.plan.version:
                self.snapshot = dataclasses.replace(now, plan=plan)
            return
        if key == SCALE_DOWN_KEY:
            try:
                request = json.loads(value) if value is not None else None
            except ValueError:
                request = None
            scale_down = MappingProxyType(request) if isinstance(request, dict) else None
            self.snapshot = dataclasses.replace(now, scale_down_request=scale_down)
            return
        instance = key.decode("utf-8", "replace")
        statuses = dict(now.statuses)
        status = InstanceStatus.decode(instance, value) if value is not None else None
        if status is None:
            statuses.pop(instance, None)
        else:
            statuses[instance] = status
        self.snapshot = dataclasses.replace(now, statuses=MappingProxyType(statuses))

    def advance(self, position: int) -> None:
        """The topic was read up to `position` (the next offset) (restoration thread)."""
        if position > self.snapshot.position:
            self.snapshot = dataclasses.replace(self.snapshot, position=position)
