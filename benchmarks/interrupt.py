"""Ctrl-C (SIGINT) ends a benchmark invocation, once and cleanly.

Why a handler of our own rather than Python's default KeyboardInterrupt:

- a session that went on to its next run after Ctrl-C (issue 37) must be
  impossible: the first SIGINT sets a flag that the session loops check
  after every run (``check()``), so even a KeyboardInterrupt that some code
  swallowed, or a child that died of the same Ctrl-C and was recorded as one
  more failed run, ends the session;
- the clean-up after it (stop the running child, which makes its final
  commit against a live broker; write the partial results; stop the broker)
  takes a few seconds, and a second Ctrl-C from an impatient user must not
  break it half-way and leave a broker or a child behind: later SIGINTs only
  say that it is stopping; the third one gives up on the clean-up
  (``os._exit``; the broker's orphan guard still kills the broker);
- a benchmark started in the background by a non-interactive shell inherits
  SIGINT ignored, and Python then installs no handler at all: ``kill -INT``
  did nothing. ``install()`` installs it regardless.

Children in the invocation's process group get the terminal's SIGINT
themselves and close (the compare child closes its model, the JVM runs its
shutdown hooks); a child that only the harness was told about is stopped by
the harness (``register_child``/``stop_children``).

Main thread only: ``install()`` and the handler; ``interrupted()`` from any.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType

EXIT_INTERRUPTED = 130  # as a shell reports a process ended by SIGINT

_interrupted = threading.Event()
_signals = 0
_children: dict[int, Callable[[], None]] = {}
_children_lock = threading.Lock()


def install() -> None:
    """Handle SIGINT as the module docstring says (call once, from the main thread)."""
    signal.signal(signal.SIGINT, _on_sigint)


def _on_sigint(_signum: int, _frame: FrameType | None) -> None:
    global _signals
    _signals += 1
    if _signals == 1:
        _interrupted.set()
        print(
            "\n[bench] interrupted: stopping the running child, writing the partial "
            "results, stopping the broker (Ctrl-C twice more to abandon the clean-up)",
            file=sys.stderr,
            flush=True,
        )
        raise KeyboardInterrupt
    if _signals == 2:
        print("[bench] still stopping; Ctrl-C once more to give up", file=sys.stderr, flush=True)
        return
    print("[bench] clean-up abandoned", file=sys.stderr, flush=True)
    os._exit(EXIT_INTERRUPTED)


def interrupted() -> bool:
    """True once SIGINT arrived (or ``mark()`` was called)."""
    return _interrupted.is_set()


def mark() -> None:
    """Record an interrupt that arrived another way (a KeyboardInterrupt caught by a loop)."""
    _interrupted.set()


def check() -> None:
    """Raise KeyboardInterrupt if an interrupt arrived, even if its exception was swallowed."""
    if _interrupted.is_set():
        raise KeyboardInterrupt


def reset() -> None:
    """Forget an interrupt (tests run several sessions in one process)."""
    global _signals
    _signals = 0
    _interrupted.clear()


def register_child(pid: int, stop: Callable[[], None]) -> None:
    """``stop()`` ends child ``pid`` (gracefully, then by force); called on an interrupt."""
    with _children_lock:
        _children[pid] = stop


def unregister_child(pid: int) -> None:
    with _children_lock:
        _children.pop(pid, None)


def stop_children() -> None:
    """Stop every registered child that is still there (after an interrupt)."""
    with _children_lock:
        stops = list(_children.values())
        _children.clear()
    for stop in stops:
        with contextlib.suppress(Exception):
            stop()
