"""Named queries changed at runtime in a daemon with `processes` > 1.

Every processing process runs the whole topology, so a named query runs in
all of them (`query.<name>.isolation=thread`, each process its share of the
query's tasks). `add_query`, `remove_query`, `pause_query` and
`resume_query` of the pool are carried to every running process
(runtime.isolation.child's `query.*` requests), and remembered: a process
started later (a new slot, a restart after a death) starts with the same
queries, settings and paused set (`PoolQueries.spec_fields`), as it starts
with the paused tasks.

Order and failures. An `add` goes to one process first: whatever is wrong
with the query (its name, its source, a topic) is refused there, before
any other process changed anything. The rest then add it at once (each
subscription change is one rebalance of the group). A `remove` with
`reset` removes the query everywhere first and lets the last process reset
its offsets, topics and state: a reset while another process still
consumes the query's input would be overwritten by that process's next
commit.

A process-isolated query (`isolation=process`) is not supported with
processes > 1 yet: the pool refuses it with the reason.

Any thread may call; one lock lets one change run at a time.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from runtime.isolation.plan import PROCESS
from runtime.logging import get_logger
from runtime.topology.named_queries import QueryError

log = get_logger("runtime.isolation")

# Ask the named processes (None: every running one) `op` with `fields`;
# slot name -> result. Raises RuntimeError naming each process that failed.
AskEach = Callable[..., dict[str, Any]]


@dataclass(frozen=True)
class AddedQuery:
    """A query added at runtime: where each process imports it from, and its
    scheduling settings (None: the `query.<name>.*` keys, else defaults)."""

    name: str
    source: str
    priority: int | None = None
    weight: int | None = None
    max_threads: int | None = None


class PoolQueries:
    """The pool's named-query changes (see the module doc)."""

    def __init__(self, ask_each: AskEach, slot_names: Callable[[], list[str]]) -> None:
        self._ask_each = ask_each
        self._slot_names = slot_names
        self._change = threading.Lock()
        self._lock = threading.Lock()
        self._added: dict[str, AddedQuery] = {}
        self._removed: set[str] = set()
        self._paused: set[str] = set()

    def add(self, query: AddedQuery, isolation: str | None, timeout: float) -> None:
        if isolation == PROCESS:
            raise QueryError(
                f"query {query.name!r}: isolation 'process' is not supported together with "
                "processes > 1 yet; add it with isolation 'thread' (it then runs in every "
                "processing process)"
            )
        fields = {
            "name": query.name,
            "source": query.source,
            "priority": query.priority,
            "weight": query.weight,
            "max_threads": query.max_threads,
            "timeout": timeout,
        }
        wait = timeout + 10.0
        with self._change:
            names = self._slot_names()
            if not names:
                raise RuntimeError("no processing process runs: cannot add a query now")
            first, rest = names[0], names[1:]
            self._ask_each("query.add", wait, [first], **fields)
            # From here on the query exists in the group: remember it even if
            # a process below fails (it gets it at its restart).
            with self._lock:
                self._added[query.name] = query
                self._removed.discard(query.name)
            if rest:
                self._ask_each("query.add", wait, rest, **fields)
        log.info("pool_query_added", query=query.name, source=query.source, processes=len(names))

    def remove(self, name: str, reset: bool, timeout: float) -> None:
        wait = timeout + 10.0
        with self._change:
            names = self._slot_names()
            last = names[-1:] if reset else []
            others = names[:-1] if reset else names
            if others:
                self._ask_each(
                    "query.remove", wait, others, name=name, reset=False, timeout=timeout
                )
            with self._lock:
                self._added.pop(name, None)
                self._removed.add(name)
                self._paused.discard(name)
            if last:
                self._ask_each("query.remove", wait, last, name=name, reset=True, timeout=timeout)
        log.info("pool_query_removed", query=name, reset=reset, processes=len(names))

    def pause(self, name: str) -> None:
        with self._change:
            self._ask_each("query.pause", 10.0, None, name=name)
            with self._lock:
                self._paused.add(name)

    def resume(self, name: str) -> None:
        with self._change:
            self._ask_each("query.resume", 30.0, None, name=name)
            with self._lock:
                self._paused.discard(name)

    def spec_fields(self) -> dict[str, Any]:
        """What a process started now starts with (`ChildSpec` fields)."""
        with self._lock:
            return {
                "queries_added": tuple(_added_line(q) for q in self._added.values()),
                "queries_removed": tuple(sorted(self._removed)),
                "queries_paused": tuple(sorted(self._paused)),
            }


def _added_line(query: AddedQuery) -> dict[str, Any]:
    return {
        "name": query.name,
        "source": query.source,
        "priority": query.priority,
        "weight": query.weight,
        "max_threads": query.max_threads,
    }


def apply_to_config(raw: dict[str, Any], added: Mapping[str, Any]) -> None:
    """An added query's settings as `query.<name>.*` keys of a process's
    config (the way a process started with the query reads them)."""
    for field, key in (
        ("priority", "priority"),
        ("weight", "weight"),
        ("max_threads", "max.threads"),
    ):
        value = added.get(field)
        if value is not None:
            raw[f"query.{added['name']}.{key}"] = value
