"""What happens to a record that cannot be deserialized or processed.

Kafka Streams' handlers (KIP-1033/1034): `log_and_fail` stops the task (the
polling thread then decides what becomes of the app), `log_and_continue`
skips the record, `dead_letter_queue` skips it and writes the original bytes
to the dead-letter topic with headers naming the error and origin. When a
dead-letter topic is configured, `log_and_fail` and `log_and_continue` also
write the failed record there first, so nothing is lost silently.

A `TaskFailedError` says which record failed where (issue 32): the input
record (`topic[partition]@offset`, short escaped previews of its key and
value bytes), the serde that could not read it or the processor that raised
(with the user's line of code), and the ways out (the handler settings, or a
fix). `FailedRecord.of` finds these in the traceback of the user's error:
the per-record path both task kinds share (`RecordPath._process_record`,
runtime.processing.record_context) holds the consumed message as `message`
and the source node as `source`, a punctuation's loop holds `punctuation`, and
each processor node is `self` in its own frame. Reading them there keeps the
per-record path untouched (nothing is recorded until a record fails); a
traceback that holds none of them (an error outside the handlers) gives the
plain message.

Called by the processing thread that holds the failing task (the error is
built there, while the frames are fresh); `TaskFailedError.explain` by the
polling thread, which applies the failure policy.
"""

from __future__ import annotations

import dataclasses
import os
import sysconfig
import traceback
from dataclasses import dataclass
from types import FrameType, TracebackType
from typing import Any

from runtime.config_values import one_line
from runtime.error_handlers import (  # noqa: F401 - re-exported: the handlers' names live there
    DEAD_LETTER_QUEUE,
    HEADER_EXCEPTION,
    HEADER_MESSAGE,
    HEADER_OFFSET,
    HEADER_PARTITION,
    HEADER_STACKTRACE,
    HEADER_STAGE,
    HEADER_TOPIC,
    LOG_AND_CONTINUE,
    LOG_AND_FAIL,
)
from runtime.logging import get_logger

log = get_logger("runtime.errors")

# Bytes of a key or value shown in a failure message: enough to recognize a
# record, never a megabyte value in a log line.
PREVIEW_BYTES = 40


@dataclass(frozen=True)
class ErrorPolicy:
    """The configured handlers, resolved once at start-up."""

    deserialization: str
    processing: str
    dead_letter_topic: str | None

    def handler_for(self, stage: str) -> str:
        return self.deserialization if stage == "deserialization" else self.processing


def preview(data: bytes | None, limit: int = PREVIEW_BYTES) -> str:
    """A key or value for a one-line message: `null`, or Python's escaped
    bytes literal (non-printable bytes as `\\x..`), cut after `limit` bytes."""
    if data is None:
        return "null"
    if not isinstance(data, bytes | bytearray | memoryview):
        return f"<{type(data).__name__}>"
    raw = bytes(data)
    if len(raw) <= limit:
        return repr(raw)
    return f"{raw[:limit]!r}... ({len(raw)} bytes)"


class ParkedFailures:
    """Failures raised on processing threads, parked per task until the
    polling thread decides what becomes of the task (nothing is thrown across
    threads). A task with a parked failure is not scheduled until `clear`.
    Not thread-safe: the task manager calls it under its lock."""

    def __init__(self) -> None:
        self._by_task: dict[str, TaskFailedError] = {}
        self._to_report: list[TaskFailedError] = []

    def __contains__(self, task_id: object) -> bool:
        return task_id in self._by_task

    def park(self, task_id: str, error: TaskFailedError, thread_name: str) -> None:
        """The first failure of a task counts; a later one (another sharer of
        a key-parallel task) is dropped, its task is failed already."""
        if task_id not in self._by_task:
            error.thread_name = thread_name
            self._by_task[task_id] = error
            self._to_report.append(error)

    def drain(self) -> list[TaskFailedError]:
        """Failures parked since the last call; their tasks stay failed."""
        failures, self._to_report = self._to_report, []
        return failures

    def clear(self, task_id: str) -> None:
        """The task is schedulable again (re-added, removed, or rewound)."""
        self._by_task.pop(task_id, None)

    def task_ids(self) -> set[str]:
        return set(self._by_task)


@dataclass(frozen=True)
class FailedRecord:
    """Where a task failed, as far as the traceback tells (see the module docstring)."""

    topic: str | None = None
    partition: int | None = None
    offset: int | None = None
    key: str = "null"  # previews (`preview`)
    value: str = "null"
    serde: str | None = None  # "value serde serdes.JSON (default.value.serde)"
    processor: str | None = None  # "processor 'KSTREAM-MAPVALUES-0000000001'"
    code: str | None = None  # "app.py:12 in <lambda>": the user's line that raised
    punctuation: str | None = None  # "punctuation Heartbeat.beat"

    @property
    def origin(self) -> str | None:
        """`topic[partition]@offset`, as production failures name records too."""
        if self.topic is None or self.offset is None or self.offset < 0:
            return None
        return f"{self.topic}[{self.partition}]@{self.offset}"

    def what(self) -> str:
        """The record (or punctuation) in words."""
        if self.origin is not None:
            return f"record {self.origin} (key {self.key}, value {self.value})"
        return self.punctuation or "a record"

    def culprit(self) -> str | None:
        """The serde or processor that raised, with the user's line if known."""
        who = self.serde or self.processor
        if who is None:
            return self.code
        return f"{who} ({self.code})" if self.code is not None else who

    @classmethod
    def of(cls, cause: BaseException, stage: str) -> FailedRecord | None:
        """What `cause`'s traceback says about the record that failed in
        `stage`; None if it was not raised under a task's record or
        punctuation loop. Never raises: a message without these details beats
        a second error."""
        try:
            return _failed_record(cause, stage)
        except Exception:  # noqa: BLE001 - best effort only, see above
            return None


def _frames(tb: TracebackType | None) -> list[tuple[FrameType, int]]:
    frames = []
    while tb is not None:
        frames.append((tb.tb_frame, tb.tb_lineno))
        tb = tb.tb_next
    return frames


def _is_message(value: Any) -> bool:
    """A consumed confluent-kafka message (or a test's stand-in for one)."""
    return all(callable(getattr(value, m, None)) for m in ("topic", "offset", "key", "value"))


def _failed_record(cause: BaseException, stage: str) -> FailedRecord | None:
    from runtime.topology.nodes import Node, ProcessorNode, SourceNode

    frames = _frames(cause.__traceback__)
    if not frames:
        return None
    # The frame that caught the error: a handler's failure was caught by the
    # task's record loop (or punctuation loop) itself. Any other frame there
    # (a processing thread that caught a bug outside the handlers) says
    # nothing of a record, whatever record its callees last held.
    catcher = frames[0][0].f_locals
    message: Any = catcher.get("message") if _is_message(catcher.get("message")) else None
    candidate = catcher.get("source")
    source = candidate if isinstance(candidate, SourceNode) else None
    punctuation: Any = catcher.get("punctuation")
    if not callable(getattr(punctuation, "callback", None)):
        punctuation = None
    if message is None and punctuation is None:
        return None
    node: Node | None = None
    for frame, _ in frames:
        owner = frame.f_locals.get("self")
        if isinstance(owner, Node):
            node = owner  # the deepest one raised (nodes call their children)
    code = _user_line(frames)
    if message is None:
        callback = punctuation.callback
        name = getattr(callback, "__qualname__", None) or type(callback).__name__
        return FailedRecord(punctuation=f"punctuation {name}", code=code)
    topic = message.topic()
    partition = message.partition() if callable(getattr(message, "partition", None)) else None
    key, value = message.key(), message.value()
    record = FailedRecord(
        topic=topic,
        partition=partition,
        offset=message.offset(),
        key=preview(key),
        value=preview(value),
    )
    if stage == "deserialization" and source is not None:
        return _with_serde(record, source, frames, key, value)
    if node is None or node is source:
        return dataclasses.replace(record, code=code)
    name = f"processor {node.name!r}"
    if isinstance(node, ProcessorNode):
        name += f" ({type(node.processor).__qualname__})"
    return dataclasses.replace(record, processor=name, code=code)


def _with_serde(
    record: FailedRecord,
    source: Any,
    frames: list[tuple[FrameType, int]],
    key: Any,
    value: Any,
) -> FailedRecord:
    """`record` naming the source's serde that raised: the key's or the
    value's, told by the data its deserialize frame was given (both when the
    traceback cannot tell, e.g. a serde written in C)."""
    serdes = {
        "key": getattr(getattr(source, "_key_de", None), "__self__", None),
        "value": getattr(getattr(source, "_value_de", None), "__self__", None),
    }
    given = {"key": source.key_serde, "value": source.value_serde}
    part: str | None = None
    for i, (frame, _) in enumerate(frames[:-1]):
        if frame.f_locals.get("self") is source and frame.f_code.co_name == "deserialize":
            part = _part_read(frames[i + 1][0], serdes, key, value)
            break

    def describe(which: str) -> str:
        origin = f"default.{which}.serde" if given[which] is None else "given in the topology"
        return f"{which} serde {_serde_name(serdes[which])} ({origin})"

    both = f"{describe('key')} or {describe('value')}"
    return dataclasses.replace(record, serde=describe(part) if part is not None else both)


def _part_read(frame: FrameType, serdes: dict[str, Any], key: Any, value: Any) -> str | None:
    """`key` or `value`: which one the deserializer in `frame` was reading."""
    owner = frame.f_locals.get("self")
    if serdes["key"] is not serdes["value"]:
        if owner is serdes["key"]:
            return "key"
        if owner is serdes["value"]:
            return "value"
    code = frame.f_code
    names = code.co_varnames[: code.co_argcount]
    if owner is not None:
        names = names[1:]
    if not names:
        return None
    data = frame.f_locals.get(names[0])
    if data is value and data is not key:
        return "value"
    if data is key and data is not value:
        return "key"
    return None


def _serde_name(serde: Any) -> str:
    """`serdes.JSON` for the built-in ones (their repr), `module.Class` for others
    (a default repr names an address, which says nothing)."""
    if serde is None:
        return "(unknown)"
    text = repr(serde)
    if text.startswith("<") or len(text) > 80:
        kind = type(serde)
        return f"{kind.__module__}.{kind.__qualname__}"
    return text


_RUNTIME_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_STDLIB_DIRS = tuple(
    os.path.realpath(p)
    for p in {sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib")}
    if p
)


def _user_line(frames: list[tuple[FrameType, int]]) -> str | None:
    """`file:line in function` of the deepest frame that is neither the
    runtime's nor the standard library's: the user's code that raised."""
    for frame, line in reversed(frames):
        path = os.path.abspath(frame.f_code.co_filename)
        if path.startswith(_RUNTIME_DIR + os.sep) or path.startswith("<"):
            continue
        real = os.path.realpath(path)
        parts = real.split(os.sep)
        in_site = "site-packages" in parts or "dist-packages" in parts
        if not in_site and any(real.startswith(d + os.sep) for d in _STDLIB_DIRS):
            continue
        return f"{_shown_path(path)}:{line} in {frame.f_code.co_name}"
    return None


def _shown_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


class TaskFailedError(Exception):
    """A task stopped on an error its handler does not skip (log_and_fail).

    Raised on the processing thread, parked in the task manager, and acted on
    by the polling thread; never thrown across threads. `record` says which
    record failed and where (None when the traceback does not tell); the
    message starts `task <id> failed in <stage>: ` as it always did.
    """

    def __init__(self, task_id: str, stage: str, cause: BaseException) -> None:
        self.task_id = task_id
        self.stage = stage
        self.cause = cause
        self.thread_name: str | None = None  # set when parked by the releasing thread
        self.record = FailedRecord.of(cause, stage)
        self.policy: ErrorPolicy | None = None
        super().__init__(self._text())

    def explain(self, policy: ErrorPolicy) -> None:
        """Name the ways out `policy` leaves (the handler setting in force, the
        dead-letter topic). The polling thread calls it when the failure is
        drained, before anyone reads the message."""
        self.policy = policy
        self.args = (self._text(),)

    def _text(self) -> str:
        cause = self.cause
        head = f"task {self.task_id} failed in {self.stage}"
        error = f"{type(cause).__name__}: {cause}"
        record = self.record
        if record is None or _topology_mistake(cause):
            # A serde mistake of the topology fails every record alike: its
            # message names the sink, the serde and the fix already.
            return one_line(f"{head}: {error}")
        culprit = record.culprit()
        if record.origin is None:  # a punctuation: its line of code is the culprit
            where = f"{record.what()} ({culprit})" if culprit else record.what()
        else:
            where = f"{record.what()}: {culprit}" if culprit else record.what()
        return one_line(f"{head}: {where}: {error}; {self._ways_out(record)}")

    def _ways_out(self, record: FailedRecord) -> str:
        key = (
            "deserialization.exception.handler"
            if self.stage == "deserialization"
            else "processing.exception.handler"
        )
        if record.origin is None:  # a punctuation: no record to skip or keep
            return (
                f"with {key}={LOG_AND_FAIL} a punctuation that raises stops the app: set "
                f"{key}={LOG_AND_CONTINUE} to go on (logged and counted); or fix the punctuation"
            )
        dead_letter = self.policy.dead_letter_topic if self.policy is not None else None
        if dead_letter is not None:
            keep = (
                f"{DEAD_LETTER_QUEUE} to skip it too (it was written to dead-letter topic "
                f"{dead_letter!r}, as each failed record is)"
            )
        else:
            keep = (
                f"{DEAD_LETTER_QUEUE} to skip it and keep a copy in "
                "errors.dead.letter.queue.topic.name (default <application.id>-dlq)"
            )
        if self.stage == "deserialization":
            fix = f"fix what produces {record.topic!r}"
        else:
            fix = "fix the processor"
        return (
            f"with {key}={LOG_AND_FAIL} such a record stops the app, and a restart meets it "
            f"again: set {key}={LOG_AND_CONTINUE} to skip it (logged and counted), or {keep}; "
            f"or {fix}"
        )


def _topology_mistake(cause: BaseException) -> bool:
    """A sink serde refused a Python type (runtime.topology.errors.SerializationError
    with `certain`): the topology is wrong, not this record."""
    from runtime.topology.errors import SerializationError

    return isinstance(cause, SerializationError) and cause.certain


def dead_letter_headers(
    exc: BaseException, stage: str, topic: str, partition: int, offset: int
) -> list[tuple[str, bytes | None]]:
    """Headers describing a failed record, as KIP-1034 names them."""
    stack = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return [
        (HEADER_EXCEPTION, type(exc).__qualname__.encode()),
        (HEADER_MESSAGE, str(exc).encode("utf-8", "replace")),
        (HEADER_STACKTRACE, stack[-4000:].encode("utf-8", "replace")),
        (HEADER_STAGE, stage.encode()),
        (HEADER_TOPIC, topic.encode()),
        (HEADER_PARTITION, str(partition).encode()),
        (HEADER_OFFSET, str(offset).encode()),
    ]
