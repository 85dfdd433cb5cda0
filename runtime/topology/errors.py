"""Errors of the topology package."""

from __future__ import annotations


class TopologyError(ValueError):
    """A mistake in how a topology was built, raised at build time.

    Examples: reading the same topic twice, two nodes with the same name, a
    non-callable predicate, a Processor instance where a supplier is expected.
    """


class SerializationError(TypeError):
    """A sink or repartition topic's serde could not serialize a record's key or value.

    A TypeError, as the built-in serdes' own refusals are (code that caught
    those keeps working), whatever the serde raised: `cause` holds that.

    Raised by `SinkNode.process` on the processing thread (the task's
    `processing.exception.handler` then decides) and by the start-up dry run
    (`runtime.topology.dry_run`). The message is one line: the topic, the
    node, the serde in force and where it came from, the Python type it got,
    the serde's own error, and the fix. `certain` is True when a built-in
    serde refused a Python type (a mistake in the topology, not bad data).
    """

    def __init__(
        self,
        message: str,
        *,
        topic: str,
        node: str,
        part: str,
        serde: object,
        cause: BaseException,
        certain: bool,
    ) -> None:
        super().__init__(message)
        self.topic = topic
        self.node = node
        self.part = part
        self.serde = serde
        self.cause = cause
        self.certain = certain
