"""Standby placement: which instance keeps a warm copy of which task.

librdkafka's assignor tells an instance only its own partitions, so the
instances of an application tell each other, through the compacted internal
topic `<application.id>-status`, which tasks each one runs and that it is
alive. From that shared view every instance computes the same answer with
rendezvous (highest-random-weight) hashing: for each stateful task, the live
instances other than its active owner are ranked by hash(task, instance), and
the first `num.standby.replicas` keep a standby. Nobody coordinates; when an
instance joins or leaves, only the tasks that ranked it change hands.

All placement decisions live in this module, so that a later runtime-owned
assignor can replace the inputs (or the whole module) without touching the
restoration thread or the tasks. Pure functions; any thread may call.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstanceStatus:
    """What one instance publishes about itself."""

    instance_id: str
    active_tasks: frozenset[str]
    standby_tasks: frozenset[str] = field(default_factory=frozenset)
    timestamp_ms: int = 0

    def encode(self) -> bytes:
        return json.dumps(
            {
                "active": sorted(self.active_tasks),
                "standby": sorted(self.standby_tasks),
                "ts": self.timestamp_ms,
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, instance_id: str, data: bytes) -> InstanceStatus | None:
        """None for a tombstone or a record this version cannot read."""
        try:
            raw = json.loads(data)
            return cls(
                instance_id,
                frozenset(raw["active"]),
                frozenset(raw.get("standby", ())),
                int(raw["ts"]),
            )
        except (ValueError, KeyError, TypeError):
            return None


SHUTDOWN_REQUEST_KEY = b"__shutdown_application__"


@dataclass(frozen=True)
class ShutdownRequest:
    """SHUTDOWN_APPLICATION: one instance asks all of them to stop."""

    requested_by: str
    reason: str
    timestamp_ms: int

    def encode(self) -> bytes:
        return json.dumps(
            {"by": self.requested_by, "reason": self.reason, "ts": self.timestamp_ms}
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> ShutdownRequest | None:
        try:
            raw = json.loads(data)
            return cls(str(raw["by"]), str(raw["reason"]), int(raw["ts"]))
        except (ValueError, KeyError, TypeError):
            return None


def status_topic_name(application_id: str) -> str:
    return f"{application_id}-status"


def live_instances(
    statuses: Mapping[str, InstanceStatus], now_ms: int | None = None, timeout_ms: int = 10_000
) -> dict[str, InstanceStatus]:
    """Instances whose last status is younger than `timeout_ms`."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    return {i: s for i, s in statuses.items() if now - s.timestamp_ms <= timeout_ms}


def _weight(task_id: str, instance_id: str) -> bytes:
    return hashlib.blake2b(f"{task_id}|{instance_id}".encode(), digest_size=8).digest()


def standby_owners(
    task_id: str, active_owner: str | None, live: Iterable[str], replicas: int
) -> list[str]:
    """The instances that should keep a standby of `task_id`, best first."""
    candidates = sorted(
        (i for i in live if i != active_owner), key=lambda i: _weight(task_id, i), reverse=True
    )
    return candidates[:replicas]


def standbys_for(
    me: str,
    stateful_tasks: Iterable[str],
    live: Mapping[str, InstanceStatus],
    replicas: int,
) -> set[str]:
    """The stateful tasks this instance should keep as standbys.

    A task whose active owner is unknown (between rebalances) still gets
    standbys among all live instances but the owner-to-be cannot be
    excluded; a task active here is never a standby here.
    """
    if replicas <= 0:
        return set()
    owner_of: dict[str, str] = {}
    for instance, status in live.items():
        for task in status.active_tasks:
            owner_of[task] = instance
    chosen = set()
    instances = sorted(live)
    for task in stateful_tasks:
        owner = owner_of.get(task)
        if owner == me:
            continue
        if me in standby_owners(task, owner, instances, replicas):
            chosen.add(task)
    return chosen
