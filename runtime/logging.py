"""Structured logging set-up for the daemon, built on structlog's fast, stdlib-free path.

Why: the runtime is a long-lived daemon whose logs are read by machines (JSON lines under
systemd, containers, CI) and by people at a terminal (coloured console output). Every event
names the thread that logged it, because the interesting questions here are about threads
(polling, processing-N, restoration, admin), plus whatever was bound with
``structlog.contextvars.bind_contextvars`` (task id, application id, ...).

This module only sets things up; it must not sit on hot paths. Log per batch, per
rebalance, per commit, never per record.

Threads: call :func:`configure_logging` at start-up from the main thread (tests call it
again with other arguments; that is safe from any thread). :func:`get_logger` and the loggers
it returns may be used from any thread; writes to the stream are serialised by structlog.

Reconfiguring: loggers are cached on first use (``cache_logger_on_first_use=True``) for
speed. The output stream and the format (JSON or console) are switched for every logger,
including cached ones, because both sit behind small indirections owned by this module. The
level, however, is baked into a logger's class when it is first used: a new level applies to
loggers first used after the call.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, WrappedLogger

__all__ = ["configure_logging", "get_logger"]

_LEVELS = {
    "debug": 10,
    "info": 20,
    "warning": 30,
    "warn": 30,
    "error": 40,
    "critical": 50,
}

_configure_lock = threading.Lock()


class _StreamSwitch:
    """A file-like object forwarding to the currently configured stream.

    structlog's WriteLogger binds ``file.write`` when a logger is first used; pointing it at
    this switch lets a later :func:`configure_logging` redirect cached loggers too. A target
    of None means whatever ``sys.stderr`` is at write time (pytest swaps it per test).
    """

    def __init__(self, target: TextIO | None) -> None:
        self.target = target

    def write(self, text: str) -> int:
        return (self.target or sys.stderr).write(text)

    def flush(self) -> None:
        (self.target or sys.stderr).flush()


class _RendererSwitch:
    """The final processor: renders with whichever renderer is currently configured."""

    def __init__(self) -> None:
        self.json = True
        self.console: structlog.dev.ConsoleRenderer = structlog.dev.ConsoleRenderer(colors=False)
        self._json_renderer = structlog.processors.JSONRenderer()

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        if self.json:
            event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
            return cast(str, self._json_renderer(logger, method_name, event_dict))
        return self.console(logger, method_name, event_dict)


_stream = _StreamSwitch(None)
_renderer = _RendererSwitch()


def _add_thread(logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
    """Name the thread that logged the event (polling, processing-N, restoration, ...)."""
    event_dict["thread"] = threading.current_thread().name
    return event_dict


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except ValueError:  # closed stream
        return False


def configure_logging(level: str = "info", json: bool | None = None, stream: Any = None) -> None:
    """Configure structlog for the whole process; may be called again with other arguments.

    ``level``: debug, info, warning, error or critical (case-insensitive).
    ``json``: True forces JSON lines, False the console renderer; None (default) picks JSON
    unless ``stream`` is a terminal. ``stream``: any text stream; default ``sys.stderr``, looked
    up at each write, so redirections and pytest's capture work.

    Every event carries ``timestamp`` (ISO 8601, UTC), ``level``, ``event``, ``thread`` and
    the bound contextvars. Any thread may call this, though start-up belongs on the main one.
    """
    try:
        min_level = _LEVELS[level.lower()]
    except KeyError:
        raise ValueError(
            f"unknown log level {level!r}; expected one of {', '.join(_LEVELS)}"
        ) from None
    target: TextIO | None = stream
    shown_on: TextIO = stream if stream is not None else sys.stderr
    use_json = (not _is_terminal(shown_on)) if json is None else json

    with _configure_lock:
        _stream.target = target
        _renderer.console = structlog.dev.ConsoleRenderer(colors=_is_terminal(shown_on))
        _renderer.json = use_json
        structlog.configure(
            processors=[
                structlog.contextvars.merge_contextvars,
                structlog.processors.add_log_level,
                _add_thread,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.StackInfoRenderer(),
                _renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(min_level),
            logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, _stream)),
            context_class=dict,
            cache_logger_on_first_use=True,
        )


def get_logger(name: str | None = None) -> FilteringBoundLogger:
    """Return a structlog logger, bound with ``logger=name`` when a name is given.

    Configures logging with the defaults first if nothing configured structlog yet, so a
    library-style module-level ``log = get_logger(__name__)`` never logs in structlog's
    development format by accident. Any thread may call this.
    """
    if not structlog.is_configured():
        configure_logging()
    logger = cast(FilteringBoundLogger, structlog.get_logger())
    if name is not None:
        logger = logger.bind(logger=name)
    return logger
