"""The KafkaError inside an exception chain, as confluent-kafka leaves it.

When a client call serves a callback while a fatal error is pending, the call
raises SystemError whose `__context__` can be the raw `KafkaError` value
(not an exception: the C code sets it unnormalized). Python's own tools trip
over such a link: `traceback` reads `__suppress_context__` from it and raises
AttributeError, so a log line with `exc_info` or a thread's excepthook fails
while reporting the real failure, and the failure is lost (seen in CI: the
polling thread stopped without its error, the app ended NOT_RUNNING instead
of ERROR). `runtime.logging.repair_chain` makes such a chain loggable.

Any thread may call these functions.
"""

from __future__ import annotations

from confluent_kafka import KafkaError, KafkaException

_MAX_LINKS = 16


def kafka_error_in(exc: BaseException) -> KafkaError | None:
    """The KafkaError an exception carries, or one it was raised from
    (a raw KafkaError link included)."""
    seen: object = exc
    for _ in range(_MAX_LINKS):
        if seen is None:
            return None
        if isinstance(seen, KafkaError):
            return seen
        if isinstance(seen, KafkaException) and seen.args and isinstance(seen.args[0], KafkaError):
            return seen.args[0]
        if not isinstance(seen, BaseException):
            return None
        seen = seen.__cause__ or seen.__context__
    return None


def as_exception(value: object) -> BaseException:
    """What a bare `except:` caught, as an exception.

    confluent-kafka can also leave the raw `KafkaError` itself raised (its
    C code restores an error whose type is not an exception class): then
    `except BaseException` does not match at all and only a bare `except:`
    catches it (seen in CI: the polling thread ended with such a value, its
    failure unrecorded, the app NOT_RUNNING instead of ERROR). A KafkaError
    becomes the KafkaException confluent-kafka meant to raise; anything else
    that is not an exception, a RuntimeError naming it.
    """
    if isinstance(value, BaseException):
        return value
    if isinstance(value, KafkaError):
        return KafkaException(value)
    return RuntimeError(f"a client call raised a non-exception: {value!r}")
