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
speed. The output stream, the format (JSON or console) and the level are switched for every
logger, including cached ones, because all three sit behind small indirections owned by this
module. (The level used to be baked into a logger's class at first use, so module-level
loggers, bound at import, ignored ``log.level``.)
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Mapping, MutableMapping
from typing import Any, TextIO, cast

import structlog
from structlog.typing import EventDict, FilteringBoundLogger, WrappedLogger

__all__ = ["configure_logging", "get_logger", "librdkafka_logger", "repair_chain"]

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
        try:
            return (self.target or sys.stderr).write(text)
        except (BrokenPipeError, ValueError):
            # The reader is gone (`... 2>&1 | head`) or the stream closed: the
            # line is lost, but the thread that logged it goes on (raising
            # here once stopped a daemon's shutdown half-way).
            return 0

    def flush(self) -> None:
        with contextlib.suppress(BrokenPipeError, ValueError):
            (self.target or sys.stderr).flush()


def repair_chain(exc: BaseException) -> BaseException:
    """Replace every link of `exc`'s chain that is not an exception (a raw
    KafkaError that confluent-kafka's C code sets as a SystemError's
    context) by a RuntimeError naming it; returns `exc`.

    Python's `traceback` fails on such a link, so a log line with `exc_info`
    or a thread's excepthook would lose the failure it reports. Any thread.

    Never raises: it is called from the handlers that report a failure. It
    reads the link's text with a guard because a call into the C library can
    itself raise SystemError while that library has an error pending (the
    situation that leaves such links; see `runtime.kafka.error_chain`).
    """
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        for name in ("__cause__", "__context__"):
            link = getattr(current, name, None)
            if link is not None and not isinstance(link, BaseException):
                setattr(current, name, RuntimeError(_describe_link(link)))
        current = current.__cause__ or current.__context__
    return exc


def log_failure(logger: FilteringBoundLogger, event: str, exc: BaseException) -> None:
    """Log a thread's failure with its traceback (the chain repaired first),
    or without the traceback if formatting it fails anyway: the line that
    reports a failure must not become a second failure that hides the
    first. Any thread."""
    error = f"{type(exc).__name__}: {exc}"
    try:
        logger.error(event, error=error, exc_info=repair_chain(exc))
    except Exception:  # noqa: BLE001 - a chain the formatter cannot read
        logger.error(event, error=error, traceback="unavailable")


def _describe_link(link: object) -> str:
    """`str(link)` (a KafkaError's reason), or its type's name when even
    that call fails."""
    try:
        return f"{type(link).__name__}: {link}"
    except Exception:  # noqa: BLE001 - the C library refused the call; keep the type
        return type(link).__name__


class _RendererSwitch:
    """The final processor: renders with whichever renderer is currently configured."""

    def __init__(self) -> None:
        self.json = True
        self.console: structlog.dev.ConsoleRenderer = structlog.dev.ConsoleRenderer(colors=False)
        self._json_renderer = structlog.processors.JSONRenderer()

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> str:
        exc_info = event_dict.get("exc_info")
        if isinstance(exc_info, BaseException):
            # A chain with a raw KafkaError link would fail the formatting
            # and lose the line (see runtime/kafka/error_chain.py).
            repair_chain(exc_info)
        if self.json:
            event_dict = structlog.processors.format_exc_info(logger, method_name, event_dict)
            return cast(str, self._json_renderer(logger, method_name, event_dict))
        return self.console(logger, method_name, event_dict)


class _LevelSwitch:
    """The first processor: drops events below the configured level.

    The loggers' own class lets everything through (it is cached per logger at
    first use, often at import, before the config is read); this check reads
    the current level, so `configure_logging` changes it for every logger.
    """

    def __init__(self) -> None:
        self.min_level = _LEVELS["info"]

    def __call__(self, logger: WrappedLogger, method_name: str, event_dict: EventDict) -> EventDict:
        if _LEVELS.get(method_name, 50) < self.min_level:
            raise structlog.DropEvent
        return event_dict


_stream = _StreamSwitch(None)
_renderer = _RendererSwitch()
_level = _LevelSwitch()


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


def configure_logging(
    level: str = "info",
    json: bool | None = None,
    stream: Any = None,
    fields: Mapping[str, Any] | None = None,
) -> None:
    """Configure structlog for the whole process; may be called again with other arguments.

    ``level``: debug, info, warning, error or critical (case-insensitive).
    ``json``: True forces JSON lines, False the console renderer; None (default) picks JSON
    unless ``stream`` is a terminal. ``stream``: any text stream; default ``sys.stderr``, looked
    up at each write, so redirections and pytest's capture work.

    Every event carries ``timestamp`` (ISO 8601, UTC), ``level``, ``event``, ``thread`` and
    the bound contextvars, and ``fields`` (for every thread: a process-isolated query's child
    says whose lines it writes). Any thread may call this, though start-up belongs on the
    main one.
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
        _level.min_level = min_level
        _fields.fields = dict(fields or {})
        structlog.configure(
            processors=[
                _level,
                structlog.contextvars.merge_contextvars,
                _fields,
                structlog.processors.add_log_level,
                _add_thread,
                structlog.processors.TimeStamper(fmt="iso", utc=True),
                structlog.processors.StackInfoRenderer(),
                _renderer,
            ],
            wrapper_class=structlog.make_filtering_bound_logger(_LEVELS["debug"]),
            logger_factory=structlog.WriteLoggerFactory(file=cast(TextIO, _stream)),
            context_class=dict,
            cache_logger_on_first_use=True,
        )


class _Fields:
    """Adds fixed fields to every event (not overriding the event's own).

    One shared instance, changed in place like `_level`: loggers made at
    import time keep the processor list they were first bound with."""

    def __init__(self) -> None:
        self.fields: Mapping[str, Any] = {}

    def __call__(
        self, _logger: Any, _method: str, event: MutableMapping[str, Any]
    ) -> MutableMapping[str, Any]:
        for key, value in self.fields.items():
            event.setdefault(key, value)
        return event


_fields = _Fields()


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


# --- librdkafka's own log ----------------------------------------------------------------

# librdkafka facilities that report a broker connection failing or timing out.
# The clients' error callbacks already turn an outage into one `broker_unreachable`
# line (and `broker_reachable_again`), so these repeat it once per broker and
# retry: debug only.
_CONNECTION_FACILITIES = frozenset({"FAIL", "ERROR", "REQTMOUT", "BROKERFAIL", "DISCONNECT"})


def librdkafka_level(syslog_level: int, facility: str) -> str:
    """The runtime's level for one librdkafka line.

    librdkafka's errors (syslog 0-3) are almost all transient and reported
    again through the clients' error callbacks or exceptions, so they are
    warnings here, not errors; warnings stay warnings (a misplaced property,
    `CONFWARN`); notices and info are info; debug is debug. Connection noise
    (see `_CONNECTION_FACILITIES`) is debug.
    """
    if facility in _CONNECTION_FACILITIES:
        return "debug"
    if syslog_level <= 4:
        return "warning"
    if syslog_level <= 6:
        return "info"
    return "debug"


# confluent-kafka maps syslog levels to these before calling Logger.log.
_SYSLOG_OF_PYTHON_LEVEL = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}


class _LibrdkafkaHandler(logging.Handler):
    """Turns confluent-kafka's `logger.log(level, "%s [%s] %s", facility, client,
    message)` calls into structured events (`librdkafka`, with `facility`,
    `client`, `message`), so no raw `%3|...|FAIL|...` line reaches stderr.

    Runs on whichever thread serves the client's queue (the polling thread for
    the consumer and producer, the restoration thread for its consumer, the
    caller of `poll()` for an admin client).
    """

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args
        if isinstance(args, tuple) and len(args) == 3:
            facility, client, message = (str(a) for a in args)
        else:
            facility, client, message = "", "", record.getMessage()
        syslog = _SYSLOG_OF_PYTHON_LEVEL.get(record.levelno, 6)
        level = librdkafka_level(syslog, facility)
        logger = get_logger("librdkafka")
        getattr(logger, level)(
            "librdkafka", facility=facility, client=client, message=message.strip()
        )


_librdkafka_logger: logging.Logger | None = None
_librdkafka_lock = threading.Lock()


def librdkafka_logger() -> logging.Logger:
    """The `logger` to put in every confluent-kafka client config the runtime
    builds: librdkafka's log lines then go through structlog (see
    `librdkafka_level`) instead of straight to stderr. One shared instance; any
    thread. It does not propagate to the stdlib root logger."""
    global _librdkafka_logger
    with _librdkafka_lock:
        if _librdkafka_logger is None:
            logger = logging.getLogger("streams_runtime.librdkafka")
            logger.setLevel(logging.DEBUG)  # structlog's level decides
            logger.propagate = False
            logger.addHandler(_LibrdkafkaHandler())
            _librdkafka_logger = logger
        return _librdkafka_logger
