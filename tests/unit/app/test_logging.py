"""configure_logging: JSON lines carrying thread, level, timestamp and bound context."""

from __future__ import annotations

import io
import json
import threading
from collections.abc import Iterator
from datetime import datetime

import pytest
import structlog

from runtime.logging import configure_logging, get_logger


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    yield
    structlog.contextvars.clear_contextvars()
    configure_logging()


def test_json_line_has_thread_level_timestamp_and_contextvars() -> None:
    stream = io.StringIO()
    configure_logging("info", json=True, stream=stream)

    def work() -> None:
        structlog.contextvars.bind_contextvars(task_id="1_3")
        get_logger("runtime.test").info("batch_processed", records=42)
        get_logger().debug("filtered_out")

    thread = threading.Thread(target=work, name="processing-7")
    thread.start()
    thread.join()

    lines = stream.getvalue().splitlines()
    assert len(lines) == 1
    event = json.loads(lines[0])
    assert event["event"] == "batch_processed"
    assert event["level"] == "info"
    assert event["thread"] == "processing-7"
    assert event["task_id"] == "1_3"
    assert event["logger"] == "runtime.test"
    assert event["records"] == 42
    assert datetime.fromisoformat(event["timestamp"]).utcoffset() is not None


def test_reconfigure_redirects_already_used_loggers() -> None:
    first, second = io.StringIO(), io.StringIO()
    configure_logging("debug", json=True, stream=first)
    log = get_logger("cached")
    log.info("one")
    configure_logging("debug", json=False, stream=second)
    log.info("two")

    assert json.loads(first.getvalue())["event"] == "one"
    assert "two" in second.getvalue()
    assert "two" not in first.getvalue()
    assert not second.getvalue().startswith("{")


def test_default_stream_follows_sys_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    configure_logging("info", json=True)
    get_logger("follows").info("to_current_stderr")

    captured = capsys.readouterr()
    assert json.loads(captured.err)["event"] == "to_current_stderr"


def test_a_new_level_applies_to_loggers_bound_before_it() -> None:
    """Module loggers are bound at import, before `log.level` is read."""
    early = get_logger("runtime.early")
    early.info("warm_up")  # first use caches the logger
    stream = io.StringIO()
    configure_logging("warning", json=True, stream=stream)
    early.info("dropped")
    early.warning("kept")
    configure_logging("debug", json=True, stream=stream)
    early.debug("now_kept")
    events = [json.loads(line)["event"] for line in stream.getvalue().splitlines()]
    assert events == ["kept", "now_kept"]


def test_a_closed_stream_drops_lines_instead_of_raising() -> None:
    """A daemon whose stderr reader went away (`| head`) must still shut down."""

    class Gone(io.StringIO):
        def write(self, text: str) -> int:
            raise BrokenPipeError(32, "Broken pipe")

    configure_logging("info", json=True, stream=Gone())
    get_logger("runtime.test").info("lost")  # no exception
    closed = io.StringIO()
    closed.close()
    configure_logging("info", json=True, stream=closed)
    get_logger("runtime.test").warning("lost too")


def test_fixed_fields_reach_every_thread_and_loggers_bound_before_them() -> None:
    """A process-isolated query's child marks all its lines with its query."""
    early = get_logger("runtime.early")
    early.info("warm")  # bound and cached before the fields exist
    stream = io.StringIO()
    configure_logging("info", json=True, stream=stream, fields={"query": "side", "query_pid": 7})
    worker = threading.Thread(target=lambda: early.info("from_a_thread"))
    worker.start()
    worker.join()
    get_logger("runtime.late").info("own_query_wins", query="other")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(e["event"], e["query"], e["query_pid"]) for e in lines] == [
        ("from_a_thread", "side", 7),
        ("own_query_wins", "other", 7),
    ]
    configure_logging("info", json=True, stream=stream)
    get_logger("runtime.late").info("after")
    assert "query" not in json.loads(stream.getvalue().splitlines()[-1])
