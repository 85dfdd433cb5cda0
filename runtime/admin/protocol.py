"""The admin protocol: request lines parsed and checked, replies encoded.

Newline-delimited JSON over a Unix stream socket (runtime.admin.server). Each
request is one line holding a JSON object, `{"command": "<name>",
...arguments}`; each reply is one line, `{"ok": true, "result": ...}` or
`{"ok": false, "error": "..."}`. Every line gets exactly one reply, in order,
including malformed ones (not JSON, not an object, nested too deep, unknown
command, wrong argument, longer than `MAX_LINE_BYTES`). Commands and their
arguments are in `COMMANDS`; runtime.admin.handler carries them out.

Pure functions and constants: any thread.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from runtime.config import QUERY_SETTINGS
from runtime.config_values import THREADS_CEILING

__all__ = [
    "COMMANDS",
    "MAX_LINE_BYTES",
    "MAX_THREADS",
    "Argument",
    "CommandError",
    "ProtocolError",
    "Request",
    "encode_reply",
    "parse_request",
]

MAX_LINE_BYTES = 1 << 20
"""Longest request line accepted (1 MiB, newline excluded)."""

MAX_THREADS = THREADS_CEILING
"""Upper bound for `threads.set` in any config; the daemon's own bound is
`processing.threads.limit` (`AdminHandler(max_threads=...)`)."""

_MAX_TIMEOUT_S = 3600.0
_TASK_ID = re.compile(r"(?:[A-Za-z0-9_-]{1,64}__)?\d+_\d+")
_QUERY_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TARGET = re.compile(r"[A-Za-z_][A-Za-z0-9_.]*:[A-Za-z_][A-Za-z0-9_]*")


class ProtocolError(ValueError):
    """A request line that is not a valid request (the reply says why)."""


class CommandError(RuntimeError):
    """A valid request the app could not carry out (the reply says why)."""


# --- requests ------------------------------------------------------------------


def _timeout(value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ProtocolError(f"'timeout' must be a number of seconds, got {_show(value)}")
    if not math.isfinite(value) or not 0 <= value <= _MAX_TIMEOUT_S:
        raise ProtocolError(f"'timeout' must be between 0 and {_MAX_TIMEOUT_S:g} seconds")
    return float(value)


def _count(value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProtocolError(f"'count' must be an integer, got {_show(value)}")
    if not 0 <= value <= MAX_THREADS:
        raise ProtocolError(f"'count' must be between 0 and {MAX_THREADS}, got {value}")
    return value


def _task(value: Any) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not _TASK_ID.fullmatch(value):
        raise ProtocolError(
            f"'task' must be a task id such as \"0_1\" (or null for all), got {_show(value)}"
        )
    return value


def _query(value: Any) -> str:
    if not isinstance(value, str) or not _QUERY_NAME.fullmatch(value):
        raise ProtocolError(
            f"'name' must be a query name (1-64 letters, digits, '_' or '-'), got {_show(value)}"
        )
    return value


def _target(value: Any) -> str:
    if not isinstance(value, str) or not _TARGET.fullmatch(value):
        raise ProtocolError(f"'target' must be MODULE:ATTR, got {_show(value)}")
    return value


def _int_in(name: str, low: int, high: int) -> Callable[[Any], int]:
    def parse(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
            raise ProtocolError(
                f"{name!r} must be an integer from {low} to {high}, got {_show(value)}"
            )
        return value

    return parse


def _isolation(value: Any) -> str:
    choices = QUERY_SETTINGS["isolation"].choices
    if value not in choices:
        shown = " or ".join(repr(c) for c in choices)
        raise ProtocolError(f"'isolation' must be {shown}, got {_show(value)}")
    return str(value)


def _flag(value: Any) -> bool:
    if not isinstance(value, bool):
        raise ProtocolError(f"'reset' must be true or false, got {_show(value)}")
    return value


@dataclass(frozen=True)
class Argument:
    parse: Callable[[Any], Any]
    required: bool = False


COMMANDS: Mapping[str, Mapping[str, Argument]] = {
    "status": {},
    "tasks": {},
    "threads": {},
    "threads.add": {},
    "threads.remove": {"timeout": Argument(_timeout)},
    "threads.set": {"count": Argument(_count, required=True), "timeout": Argument(_timeout)},
    "pause": {"task": Argument(_task)},
    "resume": {"task": Argument(_task)},
    "queries": {},
    "query.add": {
        "target": Argument(_target, required=True),
        "name": Argument(_query, required=True),
        "priority": Argument(_int_in("priority", -1000, 1000)),
        "weight": Argument(_int_in("weight", 1, 10000)),
        "max_threads": Argument(_int_in("max_threads", 1, MAX_THREADS)),
        "isolation": Argument(_isolation),
        "timeout": Argument(_timeout),
    },
    "query.remove": {
        "name": Argument(_query, required=True),
        "reset": Argument(_flag),
        "timeout": Argument(_timeout),
    },
    "query.pause": {"name": Argument(_query, required=True)},
    "query.resume": {"name": Argument(_query, required=True)},
    "shutdown": {},
    "prepare-leave": {},
    "processes": {},
    "processes.add": {"timeout": Argument(_timeout)},
    "processes.remove": {"timeout": Argument(_timeout)},
    "processes.set": {
        "count": Argument(_int_in("count", 1, 256), required=True),
        "timeout": Argument(_timeout),
    },
}
"""Command name -> its arguments (name -> validator). Unknown arguments are errors."""


@dataclass(frozen=True)
class Request:
    command: str
    args: dict[str, Any] = field(default_factory=dict)


def _show(value: Any, limit: int = 60) -> str:
    """A short repr for error messages (requests may be up to 1 MiB).

    A value nested nearly as deep as `json.loads` allows can be too deep to
    encode again on a thread with a few more frames (RecursionError): then
    only its type is shown.
    """
    if isinstance(value, bytes):
        text = repr(value)
    else:
        try:
            text = json.dumps(value, default=repr)
        except (RecursionError, ValueError, TypeError):
            text = f"a deeply nested {type(value).__name__}"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_request(line: bytes | str) -> Request:
    """Validate one request line (without or with its newline). Raises ProtocolError."""
    if isinstance(line, bytes):
        if len(line.rstrip(b"\r\n")) > MAX_LINE_BYTES:
            raise ProtocolError(f"request longer than {MAX_LINE_BYTES} bytes")
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            raise ProtocolError("request is not UTF-8") from None
    else:
        text = line
    if not text.strip():
        raise ProtocolError('empty request; send a JSON object such as {"command": "status"}')
    try:
        message = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProtocolError(f"request is not valid JSON: {exc}") from None
    if not isinstance(message, dict):
        raise ProtocolError(f"request must be a JSON object, got {type(message).__name__}")
    command = message.get("command")
    if not isinstance(command, str):
        raise ProtocolError('request needs a "command" string, e.g. {"command": "status"}')
    spec = COMMANDS.get(command)
    if spec is None:
        known = ", ".join(COMMANDS)
        raise ProtocolError(f"unknown command {_show(command)}; known: {known}")
    args: dict[str, Any] = {}
    for name, value in message.items():
        if name == "command":
            continue
        argument = spec.get(name)
        if argument is None:
            allowed = ", ".join(spec) or "none"
            raise ProtocolError(
                f"unexpected argument {_show(name)} for {command!r} (arguments: {allowed})"
            )
        args[name] = argument.parse(value)
    for name, argument in spec.items():
        if argument.required and name not in args:
            raise ProtocolError(f"{command!r} needs the argument {name!r}")
    return Request(command, args)


def encode_reply(reply: Mapping[str, Any]) -> bytes:
    """One reply as one line of ASCII JSON (newlines inside strings are escaped)."""
    try:
        text = json.dumps(reply, separators=(",", ":"), default=str, allow_nan=False)
    except (ValueError, TypeError, RecursionError) as exc:
        text = json.dumps({"ok": False, "error": f"reply not encodable as JSON: {exc}"})
    return text.encode("ascii") + b"\n"
