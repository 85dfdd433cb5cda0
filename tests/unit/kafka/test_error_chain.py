"""A raw KafkaError in an exception's chain (as confluent-kafka's C code
leaves it) is found, and repaired so that formatting the chain works."""

from __future__ import annotations

import ctypes
import io
import json
import sys
import traceback

import pytest
from confluent_kafka import KafkaError, KafkaException

from runtime.kafka.error_chain import as_exception, kafka_error_in
from runtime.logging import (
    _describe_link,
    configure_logging,
    get_logger,
    log_failure,
    repair_chain,
)


def _system_error_with_raw_link(code: int) -> SystemError:
    try:
        try:
            raise SystemError("<built-in method flush> returned a result with an exception set")
        except SystemError as exc:
            exc.__context__ = KafkaError(code)  # type: ignore[assignment]  # as the C code does
            raise
    except SystemError as exc:
        return exc


def test_a_raw_link_breaks_traceback_formatting_without_repair() -> None:
    # The premise of the module: if this stops failing, the repair is moot.
    with pytest.raises(AttributeError):
        traceback.format_exception(_system_error_with_raw_link(KafkaError._FATAL))


def test_the_kafka_error_behind_a_raw_link_is_found() -> None:
    error = kafka_error_in(_system_error_with_raw_link(KafkaError._GAPLESS_GUARANTEE))
    assert error is not None and error.code() == KafkaError._GAPLESS_GUARANTEE


def test_the_kafka_error_of_a_wrapped_cause_is_found() -> None:
    cause = KafkaException(KafkaError(KafkaError._FENCED))
    outer = RuntimeError("commit failed")
    outer.__cause__ = cause
    error = kafka_error_in(outer)
    assert error is not None and error.code() == KafkaError._FENCED
    assert kafka_error_in(RuntimeError("no kafka here")) is None


def test_a_repaired_chain_formats_and_keeps_the_kafka_error() -> None:
    exc = repair_chain(_system_error_with_raw_link(KafkaError._GAPLESS_GUARANTEE))
    text = "".join(traceback.format_exception(exc))
    assert "SystemError" in text and "_GAPLESS_GUARANTEE" in text
    assert isinstance(exc.__context__, RuntimeError)


def test_a_log_line_with_such_an_exception_is_written() -> None:
    stream = io.StringIO()
    configure_logging(level="info", json=True, stream=stream)
    try:
        get_logger("test").error("failed", exc_info=_system_error_with_raw_link(KafkaError._FATAL))
    finally:
        configure_logging()
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert line["event"] == "failed"
    assert "SystemError" in line["exception"]


class _Unreadable:
    """A link whose text cannot be read (a C call refused while the library
    has an error pending raises SystemError)."""

    def __str__(self) -> str:
        raise SystemError("returned a result with an exception set")


def test_a_link_whose_text_cannot_be_read_is_named_by_its_type() -> None:
    # Python refuses such an object as a context from Python code, so the
    # description is tested alone; repair_chain uses it for every link.
    assert _describe_link(_Unreadable()) == "_Unreadable"
    assert _describe_link(KafkaError(KafkaError._FATAL)).startswith("KafkaError: ")


def test_a_failure_is_logged_with_its_repaired_traceback() -> None:
    stream = io.StringIO()
    configure_logging(level="info", json=True, stream=stream)
    exc = _system_error_with_raw_link(KafkaError._FATAL)
    try:
        log_failure(get_logger("test"), "thread_failed", exc)
    finally:
        configure_logging()
    line = json.loads(stream.getvalue().strip().splitlines()[-1])
    assert line["event"] == "thread_failed" and line["error"].startswith("SystemError")
    assert "SystemError" in line["exception"]
    assert isinstance(exc.__context__, RuntimeError)  # repaired in place


def raise_raw_kafka_error(error: KafkaError) -> None:
    """Raise `error` itself, as confluent-kafka's C code can leave it: an
    error whose type is not an exception class (PyErr_Restore checks nothing)."""
    restore = ctypes.pythonapi.PyErr_Restore
    restore.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.c_void_p]
    restore.restype = None
    # PyErr_Restore steals one reference of each; ctypes' py_object lends them.
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(KafkaError))
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(error))
    restore(KafkaError, error, None)


def test_a_raw_kafka_error_passes_except_baseexception() -> None:
    # The premise of `as_exception`: only a bare except catches such a value.
    caught: list[str] = []
    try:
        try:
            raise_raw_kafka_error(KafkaError(KafkaError._GAPLESS_GUARANTEE))
        except BaseException:
            caught.append("BaseException")
    except:  # noqa: E722 - the point of the test
        caught.append(type(sys.exc_info()[1]).__name__)
    assert caught == ["KafkaError"]


def test_as_exception_turns_a_raw_kafka_error_into_the_kafka_exception() -> None:
    try:
        raise_raw_kafka_error(KafkaError(KafkaError._GAPLESS_GUARANTEE))
    except:  # noqa: E722 - the point of the test
        exc = as_exception(sys.exc_info()[1])
    assert isinstance(exc, KafkaException)
    assert kafka_error_in(exc).code() == KafkaError._GAPLESS_GUARANTEE  # type: ignore[union-attr]
    "".join(traceback.format_exception(exc))  # formats: a real exception
    same = ValueError("x")
    assert as_exception(same) is same
    assert "non-exception" in str(as_exception(42))
