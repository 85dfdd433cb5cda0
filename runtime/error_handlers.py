"""The names of the error handlers and of the dead-letter headers.

Kafka Streams' vocabulary (KIP-1033/1034), shared by the two places records
fail: processing (`runtime.processing.errors`: deserialization and processing)
and production (`runtime.collector.production_errors`: a record the broker
refused). Constants only; below everything that uses them.
"""

from __future__ import annotations

LOG_AND_FAIL = "log_and_fail"
LOG_AND_CONTINUE = "log_and_continue"
DEAD_LETTER_QUEUE = "dead_letter_queue"

# Headers a dead-lettered record carries: the error and where the record came from.
HEADER_EXCEPTION = "__streams.errors.exception"
HEADER_MESSAGE = "__streams.errors.message"
HEADER_STACKTRACE = "__streams.errors.stacktrace"
HEADER_TOPIC = "__streams.errors.topic"
HEADER_PARTITION = "__streams.errors.partition"
HEADER_OFFSET = "__streams.errors.offset"
HEADER_STAGE = "__streams.errors.stage"
