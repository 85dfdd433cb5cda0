"""Reading the runtime's own log lines in a test (structlog, JSON lines).

`capture_logs(level)` points the runtime's logging at a string buffer for the
test and puts it back after; `logged_events(stream, *names)` returns the
events of those names, in order. One version here for every test that checks
what the runtime logs (start-up phases, state-fault warnings, first-hour
messages). Threads: the test's own.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import structlog

from runtime.logging import configure_logging


@contextmanager
def capture_logs(level: str = "info") -> Iterator[io.StringIO]:
    stream = io.StringIO()
    configure_logging(level, json=True, stream=stream)
    try:
        yield stream
    finally:
        structlog.contextvars.clear_contextvars()
        configure_logging()


def logged_events(stream: io.StringIO, *names: str) -> list[dict[str, Any]]:
    """The JSON log events named `names` (any event when none is given)."""
    lines = (json.loads(line) for line in stream.getvalue().splitlines() if line.startswith("{"))
    return [e for e in lines if not names or e.get("event") in names]
