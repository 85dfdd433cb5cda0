"""The child side of the harness protocol: events out, commands in.

Shared by every measured child (``compare/child.py`` for the runtime and the
baseline, ``peers/quix_child.py`` for quixstreams). It imports nothing from
``runtime``: the quixstreams child runs in a virtualenv without it.

- events go to the file descriptor ``spec["event_fd"]`` as JSON lines, each
  with ``t`` = ``time.monotonic()`` (one clock for every process on the machine);
- commands come on stdin, one per line: ``go`` and ``stop``; end of input
  means both.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any, NoReturn, TextIO


class Events:
    """Writes one JSON line per event; any thread."""

    def __init__(self, fd: int) -> None:
        self._out: TextIO = os.fdopen(fd, "w", buffering=1)
        self._lock = threading.Lock()

    def emit(self, kind: str, **data: Any) -> None:
        line = json.dumps({"event": kind, "t": time.monotonic(), **data}, default=str)
        with self._lock:
            self._out.write(line + "\n")
            self._out.flush()


class Commands(threading.Thread):
    """Reads ``go`` / ``stop`` from stdin; end of input means both."""

    def __init__(self) -> None:
        super().__init__(name="bench-commands", daemon=True)
        self.go = threading.Event()
        self.stop = threading.Event()

    def run(self) -> None:
        for line in sys.stdin:
            command = line.strip()
            if command == "go":
                self.go.set()
            elif command == "stop":
                self.stop.set()
        self.go.set()
        self.stop.set()


def run_and_exit(
    events: Events,
    body: Callable[[], dict[str, Any]],
    on_failure: Callable[[], None] | None = None,
) -> NoReturn:
    """Run a child's measured `body`, report its `result` (or `failed`, after
    `on_failure`), then end the process with `os._exit`: leftover threads
    (librdkafka callbacks, a stuck close) must not keep it alive, the
    harness waits for this exit."""
    try:
        result = body()
    except BaseException as exc:  # noqa: BLE001 - reported to the harness
        traceback.print_exc()
        if on_failure is not None:
            on_failure()
        events.emit("failed", error=f"{type(exc).__name__}: {exc}")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    events.emit("result", **result)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)
