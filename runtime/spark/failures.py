"""One line for a failed Spark job: the Python error that caused it.

An exception raised in a Spark Python worker reaches the driver as text inside
PySpark's `PythonException` ("An exception was thrown from the Python worker.
Please see the stack trace below.", then the worker's traceback), often
wrapped again in a Py4J error carrying the JVM's stack. `failure_reason`
finds the worker's own error line (`ValueError: ...`) in that text, so the
CLI can end with it instead of with PySpark's preamble.

Pure text handling; any thread.
"""

from __future__ import annotations

import re

__all__ = ["failure_reason", "python_error_line"]

# "ValueError: bad", "runtime.spark.kafka.KafkaSourceError: ...", "KeyError: 'x'",
# "ZeroDivisionError: division by zero", "StopIteration" (no message).
_ERROR_LINE = re.compile(
    r"^(?P<type>(?:[A-Za-z_][A-Za-z0-9_]*\.)*[A-Za-z_][A-Za-z0-9_]*"
    r"(?:Error|Exception|Exit|Interrupt|Iteration|Warning))(?::\s?(?P<message>.*))?$"
)
_TRACEBACK = "Traceback (most recent call last):"
_JVM_FRAME = re.compile(r"^\s*at [\w$.<>]+\(.*\)$")


def python_error_line(text: str) -> str | None:
    """The error line ending the last Python traceback in `text`, or None.

    A chained traceback ("The above exception was the direct cause of ...")
    ends with the error that was raised last: that one is reported, as Python
    itself does last. The module path of the type is dropped
    (`runtime.spark.kafka.KafkaSourceError` -> `KafkaSourceError`).
    """
    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if line.strip() == _TRACEBACK]
    if not starts:
        return None
    found: str | None = None
    for line in lines[starts[-1] + 1 :]:
        stripped = line.strip()
        if _JVM_FRAME.match(line) or stripped.startswith(("py4j.", "org.apache.", "java.")):
            break  # the JVM's stack follows the worker's traceback
        if line.startswith((" ", "\t")) or not stripped:
            continue  # a frame ("  File ...") or the source line under it
        match = _ERROR_LINE.match(stripped)
        if match:
            kind = match.group("type").rsplit(".", 1)[-1]
            message = match.group("message")
            found = f"{kind}: {message}" if message else kind
    return found


def failure_reason(exc: BaseException) -> str:
    """`exc` in one line: a Spark worker's Python error as the worker raised it,
    marked as such; otherwise the exception's type and first line."""
    text = str(exc)
    worker = python_error_line(text)
    if worker is not None:
        return f"{worker} (raised in a Spark Python worker)"
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{type(exc).__name__}: {first}"


class JavaMissingError(RuntimeError):
    """No usable Java runtime for Spark."""


class SparkUnavailableError(RuntimeError):
    """PySpark (the `spark` extra) is not installed, or too old."""
