"""Configuration of the shared Kafka clients.

One consumer and one producer per process, created here from the validated
config and used only by the polling thread. User overrides (`consumer.*`,
`producer.*`) win over our defaults except for the few settings the runtime's
correctness depends on, which are forced and documented.
"""

from __future__ import annotations

from typing import Any

from runtime.config import StreamsConfig

# Settings the commit protocol relies on: offsets are committed explicitly by
# the polling thread, never automatically.
_FORCED_CONSUMER = {"enable.auto.commit": False, "enable.auto.offset.store": False}


def consumer_config(
    config: StreamsConfig, assignment_strategy: str, callbacks: dict[str, Any]
) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "group.id": config.application_id,
        "client.id": f"{config.client_id}-consumer",
        "auto.offset.reset": "earliest",
        "partition.assignment.strategy": assignment_strategy,
        "enable.partition.eof": False,
        "isolation.level": "read_committed" if config.exactly_once else "read_uncommitted",
        "queued.max.messages.kbytes": 32768,
        "fetch.wait.max.ms": 100,
        # Broker restarts are reported through error_cb; librdkafka's own
        # line per closed connection is noise on stderr.
        "log.connection.close": False,
    }
    settings.update(config.consumer_overrides)
    settings.update(_FORCED_CONSUMER)
    settings.update(callbacks)
    return settings


def producer_config(config: StreamsConfig, callbacks: dict[str, Any]) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": f"{config.client_id}-producer",
        # Idempotence keeps per-partition order through retries (rule 2).
        "enable.idempotence": True,
        "linger.ms": 5,
        "queue.buffering.max.messages": 1_000_000,
        "queue.buffering.max.kbytes": 1_048_576,
        # Failed deliveries are all we need to hear about: a Python callback
        # per acknowledged record would cost more than producing it.
        "delivery.report.only.error": True,
        "log.connection.close": False,
    }
    settings.update(config.producer_overrides)
    settings.update(callbacks)
    return settings


def restore_consumer_config(config: StreamsConfig) -> dict[str, Any]:
    """The restoration thread's consumer: assign() only, never joins the group."""
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        # librdkafka insists on a group id even for a consumer that only
        # assigns; it is never used to join or commit.
        "group.id": f"{config.application_id}-restore-consumer",
        "client.id": f"{config.client_id}-restore-consumer",
        "auto.offset.reset": "earliest",
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
        "queued.min.messages": 20000,
        "log.connection.close": False,
    }
    settings.update(config.restore_consumer_overrides)
    settings.update(_FORCED_CONSUMER)
    return settings


def admin_config(config: StreamsConfig) -> dict[str, Any]:
    settings: dict[str, Any] = {
        "bootstrap.servers": config.bootstrap_servers,
        "client.id": f"{config.client_id}-admin",
        "log.connection.close": False,
    }
    settings.update(config.admin_overrides)
    return settings
