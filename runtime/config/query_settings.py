"""The `query.<name>.<setting>` keys of named queries.

One family of keys per query (`App({"name": topology, ...})`), each parsed
like a known key (`ConfigKey`); the table is rendered into the configuration
reference with the others. Pure: called while a config is built.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from runtime.config.keys import ConfigError, ConfigKey
from runtime.config_values import THREADS_CEILING, close_match
from runtime.config_values import Invalid as _Invalid

# Named queries (`App({"name": topology, ...})`): one family of keys per
# query, `query.<name>.<setting>`, parsed like the keys above.
_QUERY_KEY = re.compile(r"query\.([A-Za-z0-9_-]{1,64})\.(.+)", re.ASCII)
QUERY_SETTINGS: Mapping[str, ConfigKey] = {
    "priority": ConfigKey(
        "query.<name>.priority",
        "int",
        0,
        "Scheduling priority of the named query: a free processing thread serves the highest "
        "priority query that has work first, whatever the others wait for.",
        min=-1000,
        max=1000,
    ),
    "weight": ConfigKey(
        "query.<name>.weight",
        "int",
        1,
        "Share of processing time among queries of equal priority that have work: busy time "
        "comes out in proportion to the weights (weighted fair sharing, measured in busy time, "
        "not records).",
        min=1,
        max=10000,
    ),
    "max.threads": ConfigKey(
        "query.<name>.max.threads",
        "int",
        None,
        "Most processing threads working on the named query's tasks at once; unset: no cap.",
        min=1,
        max=THREADS_CEILING,
        nullable=True,
    ),
    "isolation": ConfigKey(
        "query.<name>.isolation",
        "enum",
        "thread",
        "`thread`: the named query shares the daemon's clients, processing threads and GIL with "
        "the others. `process`: it runs in a child process of its own (its own clients, threads "
        "and GIL, consumer group `<application.id>-<name>`, `query.<name>.max.threads` threads, "
        "niceness `query.<name>.nice`), so a CPU-bound query cannot delay the others' records "
        "and a crash in it stops it alone; its status, pause/resume and removal go through the "
        "daemon. The topology must be importable: `streams-runtime run` passes its MODULE:ATTR, "
        "a library user gives `App(..., source='module:attr')`. At least one query stays in the "
        "daemon's process. Measured beside a CPU-bound query (queries benchmark, 2 cores): the "
        "higher-priority query's p99 latency 6.9 ms (median of 13 runs, all within 1.5x of "
        "alone's 6.0 ms) against 11.0 ms with both in one process.",
        choices=("thread", "process"),
    ),
    "nice": ConfigKey(
        "query.<name>.nice",
        "int",
        None,
        "Niceness the child process of a `query.<name>.isolation=process` query adds to its own "
        "(0-19; higher yields the CPU to the other queries). Unset: 19 if another query has a "
        "higher `query.<name>.priority`, else 0.",
        min=0,
        max=19,
        nullable=True,
    ),
}


def query_setting(key: str, value: Any) -> tuple[str, str, Any]:
    """`(query, setting, parsed value)` of a `query.<name>.<setting>` key; raises ConfigError."""
    match = _QUERY_KEY.fullmatch(key)
    if match is None:
        raise ConfigError(
            key,
            "a query setting is query.<name>.<setting>, the name 1-64 of letters, digits, "
            f"'_' or '-', the setting one of {', '.join(QUERY_SETTINGS)}",
        )
    name, setting_name = match.groups()
    spec = QUERY_SETTINGS.get(setting_name)
    if spec is None:
        close = close_match(setting_name, list(QUERY_SETTINGS))
        hint = f" (did you mean {close!r}?)" if close else ""
        raise ConfigError(key, f"unknown query setting{hint}; one of {', '.join(QUERY_SETTINGS)}")
    try:
        return name, setting_name, spec.parse(value)
    except _Invalid as exc:
        raise ConfigError(key, exc.reason) from None
