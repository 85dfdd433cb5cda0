"""Reaching the cluster at start-up, with one clear message when it cannot be reached.

`App.start` and `streams-runtime topics create` call `wait_for_cluster` before
anything else talks to the brokers. It asks for metadata in short slices, so
that Ctrl-C is served within a second (one long `list_topics` call blocks
signal handling for its whole timeout), logs `broker_unreachable` once, as
soon as the first attempt fails, and after `timeout` raises `TopicError`
naming `bootstrap.servers`, librdkafka's last connection error and what to
check. librdkafka's own per-attempt lines go to debug (`runtime.logging`).

Called by the thread that starts the app (usually the main thread), with an
admin client it owns.
"""

from __future__ import annotations

import time
from typing import Any

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient, ClusterMetadata

from runtime.config import StreamsConfig
from runtime.kafka.clients import admin_config
from runtime.kafka.topics import TopicError
from runtime.logging import get_logger

log = get_logger("runtime.cluster")

__all__ = ["StartupAdmin", "wait_for_cluster"]

_SLICE_S = 1.0


class StartupAdmin:
    """A short-lived admin client for start-up that remembers librdkafka's last
    client error (`Connect to ... failed: Connection refused`) for the message."""

    def __init__(self, config: StreamsConfig) -> None:
        self.bootstrap = config.bootstrap_servers
        self.last_error: str | None = None
        settings: dict[str, Any] = admin_config(config)
        settings["error_cb"] = self._on_error
        self.client = AdminClient(settings)

    def _on_error(self, error: KafkaError) -> None:
        # "1/1 brokers are down" says less than the connection error before it.
        if error.code() != KafkaError._ALL_BROKERS_DOWN or self.last_error is None:
            self.last_error = error.str()

    def wait_for_cluster(self, timeout: float = 30.0) -> ClusterMetadata:
        return wait_for_cluster(self.client, self.bootstrap, timeout, lambda: self.last_error)


def wait_for_cluster(
    admin: AdminClient,
    bootstrap: str,
    timeout: float = 30.0,
    last_error: Any = None,
) -> ClusterMetadata:
    """The cluster's metadata, once a broker answers; `TopicError` after `timeout` s.

    `last_error()`, if given, returns the client's last error text for the
    messages (see `StartupAdmin`).
    """
    deadline = time.monotonic() + timeout
    warned = False
    while True:
        remaining = deadline - time.monotonic()
        try:
            return admin.list_topics(timeout=max(0.1, min(_SLICE_S, remaining)))
        except KafkaException as exc:
            # Serves the client's error callback and librdkafka's log lines.
            admin.poll(0)
            reason = (last_error() if last_error is not None else None) or _text(exc)
            if time.monotonic() >= deadline:
                raise TopicError(
                    f"cannot reach the Kafka cluster at bootstrap.servers={bootstrap!r} within "
                    f"{timeout:.0f} s ({reason}): check bootstrap.servers and that the broker "
                    "is running"
                ) from exc
            if not warned:
                warned = True
                log.warning(
                    "broker_unreachable",
                    bootstrap_servers=bootstrap,
                    error=reason,
                    retrying_for_s=round(timeout),
                    hint="check bootstrap.servers and that the broker is running",
                )


def _text(exc: KafkaException) -> str:
    error: Any = exc.args[0] if exc.args else None
    return str(error.str()) if hasattr(error, "str") else str(exc)
