"""What happens to a record that cannot be deserialized or processed.

Kafka Streams' handlers (KIP-1033/1034): `log_and_fail` stops the task (the
polling thread then decides what becomes of the app), `log_and_continue`
skips the record, `dead_letter_queue` skips it and writes the original bytes
to the dead-letter topic with headers naming the error and origin. When a
dead-letter topic is configured, `log_and_fail` and `log_and_continue` also
write the failed record there first, so nothing is lost silently.

Called by the processing thread that holds the failing task.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from runtime.logging import get_logger

LOG_AND_FAIL = "log_and_fail"
LOG_AND_CONTINUE = "log_and_continue"
DEAD_LETTER_QUEUE = "dead_letter_queue"

HEADER_EXCEPTION = "__streams.errors.exception"
HEADER_MESSAGE = "__streams.errors.message"
HEADER_STACKTRACE = "__streams.errors.stacktrace"
HEADER_TOPIC = "__streams.errors.topic"
HEADER_PARTITION = "__streams.errors.partition"
HEADER_OFFSET = "__streams.errors.offset"
HEADER_STAGE = "__streams.errors.stage"

log = get_logger("runtime.errors")


class TaskFailedError(Exception):
    """A task stopped on an error its handler does not skip (log_and_fail).

    Raised on the processing thread, parked in the task manager, and acted on
    by the polling thread; never thrown across threads.
    """

    def __init__(self, task_id: str, stage: str, cause: BaseException) -> None:
        super().__init__(f"task {task_id} failed in {stage}: {type(cause).__name__}: {cause}")
        self.task_id = task_id
        self.stage = stage
        self.cause = cause
        self.thread_name: str | None = None  # set when parked by the releasing thread


@dataclass(frozen=True)
class ErrorPolicy:
    """The configured handlers, resolved once at start-up."""

    deserialization: str
    processing: str
    dead_letter_topic: str | None

    def handler_for(self, stage: str) -> str:
        return self.deserialization if stage == "deserialization" else self.processing


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
