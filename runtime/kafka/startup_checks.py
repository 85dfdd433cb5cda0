"""Start-up checks of the config that need the machine: state.dir, the admin
socket's directory, client properties, and the remote state bucket.

`StreamsConfig` validates each value on its own, without touching the file
system or librdkafka. What only the machine can answer is checked here, before
anything starts (`App.start` calls `check_startup` first): whether `state.dir`
can be created and written, whether the directory of `admin.socket` exists
and takes a new file (the daemon binds the socket only after the group join,
so before this check a missing directory stopped a daemon that had already
joined, issue 31), and whether librdkafka takes the pass-through properties
(`consumer.*`, `producer.*`, `restore.consumer.*`, `admin.*`, and the
unprefixed security properties given to all four).
Each failure is a `ConfigError` naming the key, so `streams-runtime run` exits 2
with a message instead of failing after the group join. With `state.remote.url`
set, the bucket must answer a HEAD request (and boto3 must be installed): a
wrong bucket, wrong credentials or an unreachable endpoint stop start-up here
rather than every snapshot failing later.

The clients are built from the same functions the runtime uses
(`runtime.kafka.clients`) with `bootstrap.servers` emptied, so librdkafka
checks every property (and combinations, e.g. `acks` with idempotence) without
contacting any broker; each is closed at once. Called by whichever thread
starts the app, usually the main thread.
"""

from __future__ import annotations

import difflib
import os
import re
import tempfile
from collections.abc import Callable, Mapping
from typing import Any

from confluent_kafka import Consumer, KafkaException, Producer
from confluent_kafka.admin import AdminClient

from runtime.config import ConfigError, StreamsConfig
from runtime.config_values import show_value
from runtime.kafka.clients import (
    admin_config,
    consumer_config,
    producer_config,
    restore_consumer_config,
)

__all__ = [
    "check_admin_socket_dir",
    "check_client_properties",
    "check_remote_state",
    "check_startup",
    "check_state_dir",
]

# librdkafka names the property in quotes or backticks: `No such configuration
# property: "foo"`, `Invalid value for configuration property "x"`, "`acks`
# must be set to `all` when `enable.idempotence` is true".
_PROPERTY_IN_MESSAGE = re.compile(r"[\"`]([A-Za-z0-9._-]+)[\"`]")

# What the check overrides in every client config: no broker, no log lines.
_OFFLINE = {"bootstrap.servers": "", "log_level": 0}


def check_startup(config: StreamsConfig, *, uses_state_dir: bool) -> None:
    """All start-up checks; raises `ConfigError` naming the first bad key.

    `uses_state_dir`: whether this app writes under `state.dir` (stores, or the
    transactional id under exactly_once_v2). A stateless at-least-once app
    never does, so a `state.dir` it cannot write does not stop it.
    """
    if uses_state_dir:
        check_state_dir(config.state_dir)
    if config.admin_socket is not None:
        check_admin_socket_dir(config.admin_socket)
    check_client_properties(config)
    if config.state_remote_url:
        check_remote_state(config)


def check_remote_state(config: StreamsConfig) -> None:
    """boto3 is installed and the bucket of `state.remote.url` answers."""
    from runtime.state.remote.objects import ObjectStore, RemoteStoreError
    from runtime.state.remote.settings import RemoteSettings

    settings = RemoteSettings.from_config(config)
    assert settings is not None
    try:
        ObjectStore(settings, connect_timeout=5.0, read_timeout=10.0).check_bucket()
    except RemoteStoreError as exc:
        key = "state.remote.url"
        if config.state_remote_endpoint and exc.code in ("", "EndpointConnectionError"):
            key = "state.remote.endpoint"
        raise ConfigError(key, f"remote state unusable: {exc}") from None


def check_state_dir(path: str) -> None:
    """Create `path` if missing and prove it is a writable directory."""
    try:
        os.makedirs(path, exist_ok=True)
        if not os.path.isdir(path):
            raise ConfigError("state.dir", f"{show_value(path)} is not a directory")
        with tempfile.TemporaryFile(dir=path, prefix=".write-check-"):
            pass
    except ConfigError:
        raise
    except (OSError, ValueError) as exc:  # ValueError: a path the OS cannot take
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ConfigError(
            "state.dir", f"cannot create or write {show_value(path)}: {reason}"
        ) from None


def check_admin_socket_dir(path: str) -> None:
    """The directory `admin.socket` goes in exists, is a directory and takes
    a new file (the socket is bound there, under a temporary name first, and
    renamed into place). Nothing is created: a socket directory such as
    /run/streams-runtime is made by whoever runs the daemon, with the
    permissions they choose. Raises `ConfigError` naming `admin.socket`."""
    directory = os.path.dirname(os.path.abspath(path))
    shown = show_value(directory)
    if not os.path.exists(directory):
        raise ConfigError(
            "admin.socket",
            f"the directory {shown} does not exist: create it, or choose another path",
        )
    if not os.path.isdir(directory):
        raise ConfigError("admin.socket", f"{shown} is not a directory")
    # A real entry, as bind() makes one: os.access() says yes to root on a
    # read-only file system or /proc.
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".admin-socket-check-")
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        raise ConfigError(
            "admin.socket",
            f"cannot create the socket in {shown}: {exc.strerror or exc}; choose another "
            "path, or fix the directory's permissions",
        ) from None


def check_client_properties(config: StreamsConfig) -> None:
    """Build each client librdkafka-side, offline; a bad property raises `ConfigError`."""
    clients: list[tuple[str, Mapping[str, Any], Callable[[dict[str, Any]], Any]]] = [
        (
            "consumer.",
            config.consumer_overrides,
            lambda c: Consumer(c).close(),
        ),
        ("producer.", config.producer_overrides, Producer),
        ("restore.consumer.", config.restore_consumer_overrides, lambda c: Consumer(c).close()),
        ("admin.", config.admin_overrides, AdminClient),
    ]
    settings = {
        "consumer.": consumer_config(config, "cooperative-sticky", {}),
        "producer.": producer_config(config, {}),
        "restore.consumer.": restore_consumer_config(config),
        "admin.": admin_config(config),
    }
    if config.exactly_once:
        # As the polling thread sets it: checks transactional combinations too.
        settings["producer."].setdefault("transaction.timeout.ms", 10000)
        settings["producer."]["transactional.id"] = f"{config.application_id}-check"
    for prefix, overrides, build in clients:
        try:
            _check_client(prefix, overrides, {**settings[prefix], **_OFFLINE}, build)
        except ConfigError as exc:
            raise _as_given(exc, prefix, config.raw) from None


def _as_given(exc: ConfigError, prefix: str, raw: Mapping[str, Any]) -> ConfigError:
    """The error naming the key as the user wrote it: an unprefixed security
    property (`ssl.ca.location`) reaches every client as if prefixed, but the
    message must name what is in the user's file."""
    prop = exc.key.removeprefix(prefix)
    if exc.key.startswith(prefix) and exc.key not in raw and prop in raw:
        return ConfigError(prop, exc.reason)
    return exc


def _check_client(
    prefix: str,
    overrides: Mapping[str, Any],
    settings: dict[str, Any],
    build: Callable[[dict[str, Any]], Any],
) -> None:
    error = _build_error(settings, build)
    if error is None:
        return
    raise _client_error(prefix, overrides, settings, build, error)


def _build_error(
    settings: dict[str, Any], build: Callable[[dict[str, Any]], Any]
) -> Exception | None:
    """Why librdkafka refuses `settings`, or None if it builds the client."""
    try:
        client = build(settings)
    except (KafkaException, TypeError, ValueError) as exc:
        return exc
    # Producer and AdminClient have no close(); dropping the last reference
    # destroys the librdkafka handle (no broker was ever contacted).
    del client
    return None


def _message(exc: Exception) -> str:
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


def _hint(prefix: str, prop: str, message: str) -> str:
    """What to do about a property librdkafka does not know: the likely
    intended name, else where the names are listed."""
    if "No such configuration property" not in message:
        return ""
    close = difflib.get_close_matches(prop, _COMMON_PROPERTIES, n=1, cutoff=0.8)
    if close:
        return f"; did you mean {prefix + close[0]!r}?"
    return "; see librdkafka's CONFIGURATION.md for the property names"


def _client_error(
    prefix: str,
    overrides: Mapping[str, Any],
    settings: dict[str, Any],
    build: Callable[[dict[str, Any]], Any],
    exc: Exception,
) -> ConfigError:
    """A `ConfigError` naming the user's property librdkafka refused, if it can tell.

    librdkafka names the property in its message, but sometimes by another name
    (`retries` is reported as `message.send.max.retries`), so each user
    property is also tried alone on top of the runtime's settings: the first
    that fails alone is named. A refusal only a combination of user properties
    causes names the prefix.
    """
    message = _message(exc)
    for prop in _PROPERTY_IN_MESSAGE.findall(message):
        if prop in overrides:
            return ConfigError(
                prefix + prop,
                f"librdkafka refused {show_value(overrides[prop])}: {message}"
                + _hint(prefix, prop, message),
            )
    base = {k: v for k, v in settings.items() if k not in overrides}
    for prop, value in overrides.items():
        alone = _build_error({**base, prop: value, **_OFFLINE}, build)
        if alone is not None:
            return ConfigError(
                prefix + prop,
                f"librdkafka refused {show_value(value)}: {message}" + _hint(prefix, prop, message),
            )
    given = ", ".join(prefix + p for p in sorted(overrides)) or "none"
    return ConfigError(f"{prefix}*", f"librdkafka refused the client config ({given}): {message}")
