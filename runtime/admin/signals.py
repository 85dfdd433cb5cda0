"""Signals of `streams-runtime run` before and after the admin loop handles them.

The admin loop (`daemon.py`) turns SIGTERM/SIGINT into a graceful close, but it
only exists once `App.start()` has returned. Before this module, the time until
then was Python's defaults: SIGINT raised KeyboardInterrupt wherever the main
thread happened to be (a traceback and nothing closed when it landed between
`App.start()` returning and the loop's handlers), and SIGTERM killed the
process silently, however far start-up had got (issue 31, item 9).

`StartupSignals` is installed first thing in `streams-runtime run`, before
anything is started, and covers the whole life of the process around the
admin loop:

- Until `App.start()` is called, nothing needs closing: a signal raises
  `Interrupted`, which `run` reports in one line, exiting 128 + the signal's
  number (130 SIGINT, 143 SIGTERM, as a shell reports a process that signal
  ended).
- From `defer()` (right before `App.start()`) a signal is only recorded: the
  app's threads may be half started, and an exception thrown into the middle
  of that would leave them running unclosed. One exception: a signal that
  arrives while the main thread waits for the cluster (`wait_for_cluster`,
  nothing started yet, a wait that can last 30 s) still raises `Interrupted`.
  Once `App.start()` returns, the admin loop takes the recorded signals
  (`take()`) and acts on them as if they had just arrived: a graceful close,
  exit 0.
- After the admin loop removed its handlers (the app closed), these handlers
  are back: a late signal is recorded, and the exit already decided stands.

SIGTTIN and SIGTTOU are recorded as well (never raised): their default action
would stop the process; the admin loop replays them (a thread added/removed).

Before `run`'s first line nothing of ours can answer a signal. Right after
exec, while the interpreter starts, the operating system's default action
ends the process by that signal (a shell reports the same 130 or 143, and
nothing was started). Then, for the ~0.4 s Python spends importing the
`runtime` package (`runtime/__init__.py` imports the whole public API before
`runtime.cli` runs), Python's own defaults apply: SIGTERM still ends the
process silently, SIGINT raises KeyboardInterrupt with a traceback. Making
that `__init__` import lazily would shrink this window to a few ms.

Threads: Python runs signal handlers on the main thread only; `install`,
`defer` and `take` must be called there too.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

__all__ = ["SHUTDOWN_SIGNALS", "Interrupted", "StartupSignals"]

SHUTDOWN_SIGNALS = (signal.SIGTERM, signal.SIGINT)
_RECORDED_ONLY = (signal.SIGTTIN, signal.SIGTTOU)


class Interrupted(BaseException):
    """SIGTERM or SIGINT before the app started anything.

    A BaseException, as KeyboardInterrupt is: `except Exception` blocks on
    the way (loading the topology, the cluster wait's retries) must not
    swallow it.
    """

    def __init__(self, sig: signal.Signals) -> None:
        super().__init__(sig.name)
        self.signal = sig

    @property
    def exit_code(self) -> int:
        """128 + the signal's number: 130 for SIGINT, 143 for SIGTERM."""
        return 128 + int(self.signal)


class StartupSignals:
    """The handlers of SIGTERM, SIGINT, SIGTTIN, SIGTTOU outside the admin loop.

    Main thread only (see the module doc).
    """

    def __init__(self) -> None:
        self._pending: list[signal.Signals] = []
        self._raising = True
        self._interruptible: frozenset[CodeType] = frozenset()
        self.first_shutdown: signal.Signals | None = None
        """The first SIGTERM or SIGINT the process got, here or in the admin
        loop (which reports it with `shutdown_requested`): the exit's cause."""

    def install(self) -> StartupSignals:
        """Take the four signals over (again). Returns self."""
        for sig in (*SHUTDOWN_SIGNALS, *_RECORDED_ONLY):
            signal.signal(sig, self._on_signal)
        return self

    def defer(self, *interruptible: Callable[..., Any]) -> None:
        """From now on record signals instead of raising, except while one of
        the `interruptible` functions is on the main thread's stack (a wait
        that has started nothing, so an exception out of it is safe)."""
        self._raising = False
        self._interruptible = frozenset(f.__code__ for f in interruptible)

    def take(self) -> list[signal.Signals]:
        """The recorded signals not taken yet, oldest first (the admin loop
        replays them once its own handlers are in place)."""
        taken, self._pending = self._pending, []
        return taken

    def shutdown_requested(self, sig: signal.Signals) -> None:
        """Note a shutdown signal the admin loop received itself."""
        if self.first_shutdown is None:
            self.first_shutdown = sig

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        sig = signal.Signals(signum)
        if sig in _RECORDED_ONLY:
            self._pending.append(sig)
            return
        self.shutdown_requested(sig)
        if self._raising or self._in_interruptible(frame):
            # One exception only: the code that reports it must not be cut
            # short by a second signal (it is recorded, and changes nothing).
            self._raising = False
            self._interruptible = frozenset()
            raise Interrupted(sig)
        self._pending.append(sig)

    def _in_interruptible(self, frame: FrameType | None) -> bool:
        codes = self._interruptible
        while frame is not None and codes:
            if frame.f_code in codes:
                return True
            frame = frame.f_back
        return False
