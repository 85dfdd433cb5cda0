"""Standby placement: which instance keeps a warm copy of which task.

librdkafka's assignor tells an instance only its own partitions, so the
instances of an application tell each other, through the compacted internal
topic `<application.id>-status`, which tasks each one runs and that it is
alive. From that shared view every instance computes the same answer with
rendezvous (highest-random-weight) hashing: for each stateful task, the live
instances other than its active owner are ranked by hash(task, instance), and
the first `num.standby.replicas` keep a standby. Nobody coordinates; when an
instance joins or leaves, only the tasks that ranked it change hands.

Instances that share a machine are one *daemon* (the processing processes
of one `streams-runtime run` with `processes` > 1 publish the supervisor's
id as `daemon`; a plain instance is a daemon of its own). A standby on the
active's daemon protects nothing (same machine) and would contend for the
task's directory (`runtime.state.task_lock`), and two standbys on one daemon
would too: walking the ranking, an instance is skipped when its daemon
already holds the active or a standby of the task.

The same topic carries the records of runtime-owned placement
(`task.assignment=runtime`): the placer's `PlacementPlan` and `scale-down`
requests, and the status fields the placer reads; the decision itself is
`runtime.placement.placer`. Pure functions and records; any thread may call.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class InstanceStatus:
    """What one instance publishes about itself.

    The fields after `timestamp_ms` serve runtime-owned placement
    (`task.assignment=runtime`): the consumer's member id (to tell whether the
    instance is in the group's current generation), its capacity (processing
    threads), the changelog lag of each copy it keeps (learners and
    standbys), the newest plan version it applied (its acknowledgement) and
    whether it is leaving.
    """

    instance_id: str
    active_tasks: frozenset[str]
    standby_tasks: frozenset[str] = field(default_factory=frozenset)
    timestamp_ms: int = 0
    member_id: str = ""
    capacity: int = 1
    lags: Mapping[str, int] = field(default_factory=dict)
    plan_version: int = 0
    leaving: bool = False
    daemon: str = ""  # the supervisor's id under `processes` > 1; "" for a plain instance

    @property
    def machine(self) -> str:
        """What standby placement keeps copies apart by: the daemon, or the instance."""
        return self.daemon or self.instance_id

    def encode(self) -> bytes:
        return json.dumps(
            {
                "active": sorted(self.active_tasks),
                "standby": sorted(self.standby_tasks),
                "ts": self.timestamp_ms,
                "member": self.member_id,
                "capacity": self.capacity,
                "lags": dict(sorted(self.lags.items())),
                "plan": self.plan_version,
                "leaving": self.leaving,
                "daemon": self.daemon,
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
                str(raw.get("member", "")),
                int(raw.get("capacity", 1)),
                {str(t): int(lag) for t, lag in dict(raw.get("lags", {})).items()},
                int(raw.get("plan", 0)),
                bool(raw.get("leaving", False)),
                str(raw.get("daemon", "")),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


PLAN_KEY = b"__placement_plan__"
SCALE_DOWN_KEY = b"__scale_down__"


@dataclass(frozen=True)
class PlacementPlan:
    """The placer's decision (`task.assignment=runtime`), versioned.

    `owners`: task -> the one instance that may run it; a task absent has no
    owner (being handed over, `moves` names to whom). `learners`: task -> an
    instance restoring a copy to take it over later. `leave`: instances asked
    to leave (`scale-down`).
    """

    version: int = 0
    placer: str = ""
    owners: Mapping[str, str] = field(default_factory=dict)
    learners: Mapping[str, str] = field(default_factory=dict)
    moves: Mapping[str, str] = field(default_factory=dict)
    leave: frozenset[str] = frozenset()
    leave_ms: int = 0  # the time of the scale-down request `leave` answers

    def encode(self) -> bytes:
        return json.dumps(
            {
                "version": self.version,
                "leave_ms": self.leave_ms,
                "placer": self.placer,
                "owners": dict(sorted(self.owners.items())),
                "learners": dict(sorted(self.learners.items())),
                "moves": dict(sorted(self.moves.items())),
                "leave": sorted(self.leave),
            },
            separators=(",", ":"),
        ).encode()

    @classmethod
    def decode(cls, data: bytes) -> PlacementPlan | None:
        try:
            raw = json.loads(data)
            return cls(
                int(raw["version"]),
                str(raw["placer"]),
                {str(k): str(v) for k, v in dict(raw["owners"]).items()},
                {str(k): str(v) for k, v in dict(raw.get("learners", {})).items()},
                {str(k): str(v) for k, v in dict(raw.get("moves", {})).items()},
                frozenset(str(i) for i in raw.get("leave", ())),
                int(raw.get("leave_ms", 0)),
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None

    def tasks_of(self, instance_id: str) -> frozenset[str]:
        return frozenset(t for t, o in self.owners.items() if o == instance_id)

    def copies_for(self, instance_id: str) -> frozenset[str]:
        """Tasks `instance_id` learns: its learners and the tasks moving to it."""
        return frozenset(
            t
            for mapping in (self.learners, self.moves)
            for t, o in mapping.items()
            if o == instance_id
        )


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
    task_id: str,
    active_owner: str | None,
    live: Iterable[str],
    replicas: int,
    daemon_of: Mapping[str, str] | None = None,
) -> list[str]:
    """The instances that should keep a standby of `task_id`, best first.

    `daemon_of`: instance -> its daemon (absent: a daemon of its own). At
    most one copy of the task per daemon: none on the active owner's, one on
    each other's (its best-ranked instance), so the ranking of instances
    that share no daemon is plain rendezvous hashing."""
    machine = daemon_of or {}
    taken = set() if active_owner is None else {machine.get(active_owner, active_owner)}
    chosen: list[str] = []
    for instance in sorted(
        (i for i in live if i != active_owner), key=lambda i: _weight(task_id, i), reverse=True
    ):
        if len(chosen) == replicas:
            break
        daemon = machine.get(instance, instance)
        if daemon not in taken:
            taken.add(daemon)
            chosen.append(instance)
    return chosen


def standbys_for(
    me: str,
    stateful_tasks: Iterable[str],
    live: Mapping[str, InstanceStatus],
    replicas: int,
) -> set[str]:
    """The stateful tasks this instance should keep as standbys.

    A task whose active owner is unknown (between rebalances) still gets
    standbys among all live instances but the owner-to-be cannot be
    excluded; a task active here is never a standby here, nor on another
    instance of this daemon (`InstanceStatus.machine`).
    """
    if replicas <= 0:
        return set()
    owner_of: dict[str, str] = {}
    for instance, status in live.items():
        for task in status.active_tasks:
            owner_of[task] = instance
    daemon_of = {i: s.machine for i, s in live.items()}
    chosen = set()
    instances = sorted(live)
    for task in stateful_tasks:
        owner = owner_of.get(task)
        if owner == me:
            continue
        if me in standby_owners(task, owner, instances, replicas, daemon_of):
            chosen.add(task)
    return chosen
