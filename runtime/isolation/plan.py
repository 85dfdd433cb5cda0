"""What a child process runs with (pure; any thread): a process-isolated
query's, or a processing process's (`worker_spec`, `processes` > 1).

The child runs the query as a plain topology under application.id
`<application.id>-<query>`. Why that id: the names of the query's internal
topics and changelogs are then exactly those it has in the daemon's process
(`<application.id>-<query>-<name>`), so a query moved between isolation
levels keeps its state; and everything keyed by application.id (consumer
group, transactional id, status topic, state directory) is its own, so the
child never fences or confuses the daemon's clients.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from runtime.config import ConfigError, StreamsConfig

THREAD = "thread"
PROCESS = "process"
LOWER_PRIORITY_NICE = 19

# Keys a child does not take: the other queries' settings, and the admin
# socket and metrics endpoint (they would collide; the daemon reports for it).
_NOT_FOR_THE_CHILD = ("query.", "admin.socket", "metrics.")


def isolation_of(config: StreamsConfig, name: str) -> str:
    return str(config.query_settings.get(name, {}).get("isolation", THREAD))


def child_application_id(config: StreamsConfig, name: str) -> str:
    return f"{config.application_id}-{name}"


def child_nice(config: StreamsConfig, name: str, priorities: Mapping[str, int]) -> int:
    """`query.<name>.nice`, else 19 if another query has a higher priority, else 0."""
    given = config.query_settings.get(name, {}).get("nice")
    if given is not None:
        return int(given)
    own = priorities.get(name, 0)
    return LOWER_PRIORITY_NICE if any(p > own for p in priorities.values()) else 0


QUERY_ROLE = "query"
WORKER_ROLE = "worker"


@dataclass(frozen=True)
class ChildSpec:
    """The first line a child reads on stdin (JSON). `role`: `query` (one
    process-isolated named query) or `worker` (slot `slot` of a daemon with
    `processes` > 1: the whole topology, runtime.isolation.workers)."""

    query: str
    source: str
    config: dict[str, Any]
    nice: int
    parent_group: str
    role: str = QUERY_ROLE
    slot: int = -1
    # A worker starts with these paused, as the daemon's other processes are
    # (`pause` before a slot was started or restarted must hold in it too).
    paused_all: bool = False
    paused_tasks: tuple[str, ...] = ()
    # A worker starts with the named queries as the daemon's other processes
    # run them now: added, removed and paused at runtime
    # (runtime.isolation.pool_queries).
    queries_added: tuple[dict[str, Any], ...] = ()
    queries_removed: tuple[str, ...] = ()
    queries_paused: tuple[str, ...] = ()

    def to_line(self) -> str:
        return json.dumps(self.__dict__) + "\n"

    @classmethod
    def from_line(cls, line: str) -> ChildSpec:
        fields = json.loads(line)
        for name in ("paused_tasks", "queries_added", "queries_removed", "queries_paused"):
            fields[name] = tuple(fields.get(name, ()))
        return cls(**fields)


def _text_config(config: StreamsConfig, who: str, skip: tuple[str, ...]) -> dict[str, Any]:
    """The config's keys as given, as text a child can parse; raises
    ConfigError for a value that is an object."""
    raw: dict[str, Any] = {}
    for key, value in config.raw.items():
        if key.startswith(skip):
            continue
        if isinstance(value, os.PathLike):
            value = os.fspath(value)
        if value is not None and not isinstance(value, str | int | float | bool):
            raise ConfigError(
                key,
                f"{who}, which gets the config as text: give {key} as a string (a serde or "
                "partitioner as 'module:attr')",
            )
        raw[key] = value
    return raw


# What a worker does not take: the endpoints (the supervisor has them) and
# the supervisor's own keys.
_NOT_FOR_A_WORKER = ("admin.socket", "metrics.", "processes", "process.slot", "process.daemon")


def worker_spec(config: StreamsConfig, source: str, slot: int, daemon: str = "") -> ChildSpec:
    """Slot `slot`'s spec: the daemon's config with the slot's identity
    (client.id and group.instance.id suffixed `-p<slot>`, `process.slot`,
    which picks its transactional id) and the daemon's (`process.daemon`:
    `daemon`, which standby placement reads). Raises ConfigError like `child_spec`."""
    raw = _text_config(
        config, "the app runs in several processes (processes > 1)", _NOT_FOR_A_WORKER
    )
    suffix = f"-p{slot}"
    raw["client.id"] = f"{config.client_id}{suffix}"
    raw["process.slot"] = slot
    if daemon:
        raw["process.daemon"] = daemon
    for key in ("consumer.group.instance.id", "group.instance.id"):
        if raw.get(key):
            raw[key] = f"{raw[key]}{suffix}"
    return ChildSpec(
        query="",
        source=source,
        config=raw,
        nice=0,
        parent_group=config.application_id,
        role=WORKER_ROLE,
        slot=slot,
    )


def child_spec(
    config: StreamsConfig,
    name: str,
    source: str,
    priorities: Mapping[str, int],
    max_threads: int | None = None,
) -> ChildSpec:
    """The child's spec for query `name`; raises ConfigError when a config
    value cannot be passed to another process (an object, not text)."""
    raw = _text_config(
        config,
        f"query {name!r} runs in its own process (query.{name}.isolation=process)",
        _NOT_FOR_THE_CHILD + ("processes", "process."),
    )
    settings = config.query_settings.get(name, {})
    raw["application.id"] = child_application_id(config, name)
    raw["client.id"] = f"{config.client_id}-{name}"
    threads = max_threads if max_threads is not None else settings.get("max.threads")
    if threads is not None:
        raw["processing.threads"] = int(threads)
    raw.pop("processing.threads.autoscale", None)
    return ChildSpec(
        query=name,
        source=source,
        config=raw,
        nice=child_nice(config, name, priorities),
        parent_group=config.application_id,
    )
