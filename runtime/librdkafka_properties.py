"""librdkafka's properties as the runtime asks about them, offline.

Which kind of client a property is for (`librdkafka_role`: librdkafka is
asked itself, with a throwaway client and no broker), the commonly set
properties a misspelt one may mean (`close_property`, `unknown_property_hint`),
and the text of a librdkafka error. Used by the config (a property given
unprefixed or to the wrong client is refused naming the right prefix) and by
the start-up checks. Below the config: imports nothing of the runtime. Any
thread (each probe has its own client and logger).
"""

from __future__ import annotations

import difflib
import functools
import logging
import re
from collections.abc import Mapping
from typing import Any, Literal

from confluent_kafka import Consumer, KafkaException, Producer


def error_text(exc: Exception) -> str:
    """librdkafka's own text of an error (the KafkaError's `str()`), else `str(exc)`."""
    if isinstance(exc, KafkaException) and exc.args and hasattr(exc.args[0], "str"):
        return str(exc.args[0].str())
    return str(exc)


# librdkafka properties users set most, for a "did you mean" on a misspelt one
# (librdkafka offers no list through confluent-kafka). Not a whitelist: any
# property librdkafka takes passes the check.
_COMMON_PROPERTIES = (
    "acks",
    "allow.auto.create.topics",
    "auto.offset.reset",
    "batch.num.messages",
    "batch.size",
    "client.rack",
    "compression.type",
    "connections.max.idle.ms",
    "debug",
    "delivery.timeout.ms",
    "enable.idempotence",
    "fetch.max.bytes",
    "fetch.min.bytes",
    "fetch.queue.backoff.ms",
    "fetch.wait.max.ms",
    "group.instance.id",
    "group.protocol",
    "group.remote.assignor",
    "heartbeat.interval.ms",
    "isolation.level",
    "linger.ms",
    "max.in.flight.requests.per.connection",
    "max.partition.fetch.bytes",
    "max.poll.interval.ms",
    "message.max.bytes",
    "message.timeout.ms",
    "metadata.max.age.ms",
    "partition.assignment.strategy",
    "queue.buffering.max.kbytes",
    "queue.buffering.max.messages",
    "queued.max.messages.kbytes",
    "queued.min.messages",
    "receive.message.max.bytes",
    "reconnect.backoff.max.ms",
    "reconnect.backoff.ms",
    "request.timeout.ms",
    "retries",
    "retry.backoff.ms",
    "sasl.mechanism",
    "sasl.password",
    "sasl.username",
    "security.protocol",
    "session.timeout.ms",
    "socket.connection.setup.timeout.ms",
    "socket.keepalive.enable",
    "socket.timeout.ms",
    "ssl.ca.location",
    "ssl.certificate.location",
    "ssl.endpoint.identification.algorithm",
    "ssl.key.location",
    "statistics.interval.ms",
    "topic.metadata.refresh.interval.ms",
    "transaction.timeout.ms",
)


def unknown_property_hint(prefix: str, prop: str, message: str) -> str:
    """What to do about a property librdkafka does not know: the likely
    intended name, else where the names are listed."""
    if "No such configuration property" not in message:
        return ""
    close = difflib.get_close_matches(prop, _COMMON_PROPERTIES, n=1, cutoff=0.8)
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    return "; see librdkafka's CONFIGURATION.md for the property names"


# --- which client a librdkafka property is for ----------------------------------------

Role = Literal["consumer", "producer", "any"]

# The kind of librdkafka handle behind each prefix (the admin client is a
# producer-type handle: it ignores consumer properties, as a producer does).
PREFIX_ROLE: Mapping[str, Role] = {
    "consumer.": "consumer",
    "restore.consumer.": "consumer",
    "producer.": "producer",
    "admin.": "producer",
}
CLIENT_NAMES = {
    "consumer.": "the consumer",
    "restore.consumer.": "the restore consumer",
    "producer.": "the producer",
    "admin.": "the admin client",
}
# librdkafka's warning when a handle is given the other kind's property.
_IGNORED = re.compile(r"is an? (consumer|producer) property and will be ignored")
# Values tried, after the user's own, to ask about a property: librdkafka
# says which client a property is for only once it took a value for it.
_PROBE_VALUES = ("1", "true", "earliest", "none", "read_committed")


# Properties whose value librdkafka loads as code: never set on a probe.
_NOT_PROBED = frozenset({"plugin.library.paths", "ssl.engine.location"})


class _Collect(logging.Handler):
    """Keeps librdkafka's log lines of one probe client."""

    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


def _ignored_by(kind: str, prop: str, value: str) -> bool | None:
    """Whether a probe client of `kind` ("consumer" or "producer"), given
    `prop`=`value` and no broker, says it ignores the property; None if
    librdkafka refuses the pair (no such property, or a value it does not take)."""
    handler = _Collect()
    logger = logging.getLogger(f"streams_runtime.probe.{id(handler)}")
    logger.propagate = False
    logger.addHandler(handler)
    settings: dict[str, Any] = {"bootstrap.servers": "", prop: value, "logger": logger}
    try:
        if kind == "consumer":
            settings["group.id"] = "streams-runtime-probe"
            Consumer(settings).close()  # delivers the log lines
        else:
            producer = Producer(settings)
            producer.poll(0)  # delivers the log lines
            del producer
    except (KafkaException, TypeError, ValueError):
        return None
    finally:
        logger.removeHandler(handler)
    return any(_IGNORED.search(line) for line in handler.lines)


@functools.lru_cache(maxsize=256)
def librdkafka_role(prop: str, value: str = "") -> Role | None:
    """Which kind of librdkafka client `prop` is for: "consumer", "producer"
    or "any" (both); None if librdkafka has no such property.

    Asks librdkafka itself, offline (no broker; about a millisecond): a
    consumer warns that it ignores a producer property and vice versa.
    `value` is the user's value; when librdkafka does not take it, a few
    common ones are tried, and "any" is the answer if none is taken. Any
    thread (each probe has its own client and logger).
    """
    if prop in _NOT_PROBED:
        return "any"
    values = [value] if value else []
    values += [v for v in _PROBE_VALUES if v != value]
    for candidate in values:
        by_producer = _ignored_by("producer", prop, candidate)
        if by_producer is None:
            continue
        if by_producer:
            return "consumer"
        by_consumer = _ignored_by("consumer", prop, candidate)
        if by_consumer is None:
            continue
        return "producer" if by_consumer else "any"
    try:
        Producer({"bootstrap.servers": "", prop: value or "1"})
    except KafkaException as exc:
        if "No such configuration property" in error_text(exc):
            return None
    except (TypeError, ValueError):
        return None
    return "any"


def close_property(prop: str) -> str | None:
    """The commonly set librdkafka property `prop` is a misspelling of, if any."""
    close = difflib.get_close_matches(prop, _COMMON_PROPERTIES, n=1, cutoff=0.8)
    return close[0] if close else None
