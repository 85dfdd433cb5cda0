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
unprefixed security properties given to all four), and whether each is for
the client its prefix names: librdkafka ignores a consumer property given to
a producer (`producer.auto.offset.reset`) with no more than a log line, so
such a key is refused with the prefix it needs (`librdkafka_role`, which
`runtime.config` also asks about an unprefixed key such as
`auto.offset.reset`: issue 32).
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
from runtime.librdkafka_properties import (
    CLIENT_NAMES,
    PREFIX_ROLE,
    Role,
    close_property,
    error_text,
    librdkafka_role,
    unknown_property_hint,
)

__all__ = [
    "Role",
    "check_admin_socket_dir",
    "check_client_properties",
    "close_property",
    "librdkafka_role",
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
    if config.admin_socket:  # unset: the daemon's default (runtime.admin.paths); "": off
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
    for prefix, overrides, _ in clients:
        # Only the keys written with this prefix: an unprefixed security
        # property goes to every client and is for all of them.
        given = {p: v for p, v in overrides.items() if prefix + p in config.raw}
        wrong = _wrong_client(prefix, given)
        if wrong is not None:
            raise wrong


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


def _wrong_client(prefix: str, overrides: Mapping[str, Any]) -> ConfigError | None:
    """A `ConfigError` for the first property under `prefix` that its client
    ignores (a consumer property given to the producer or the admin client, a
    producer property given to a consumer), naming the prefix it needs."""
    expected = PREFIX_ROLE[prefix]
    for prop, value in overrides.items():
        if value is None:
            continue
        # A secret is not kept in librdkafka_role's cache: common values are tried.
        role = librdkafka_role(prop, "" if _secret_property(prop) else _as_text(value))
        if role is None or role == "any" or role == expected:
            continue
        right = "consumer." if role == "consumer" else "producer."
        return ConfigError(
            prefix + prop,
            f"{prop} is a librdkafka {role} property: {CLIENT_NAMES[prefix]} ignores it. "
            f"Did you mean {right + prop!r}?",
        )
    return None


def _as_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


# Values librdkafka takes for some properties users set most, for a "did you
# mean" when it refuses one (its message does not list them).
_PROPERTY_VALUES: Mapping[str, tuple[str, ...]] = {
    "auto.offset.reset": ("earliest", "latest", "smallest", "largest", "beginning", "end", "error"),
    "isolation.level": ("read_committed", "read_uncommitted"),
    "compression.type": ("none", "gzip", "snappy", "lz4", "zstd"),
    "compression.codec": ("none", "gzip", "snappy", "lz4", "zstd"),
    "security.protocol": ("plaintext", "ssl", "sasl_plaintext", "sasl_ssl"),
    "group.protocol": ("classic", "consumer"),
    "sasl.mechanism": ("GSSAPI", "PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "OAUTHBEARER"),
    "client.dns.lookup": ("use_all_dns_ips", "resolve_canonical_bootstrap_servers_only"),
}


def _value_hint(prop: str, value: Any, message: str) -> str:
    """The values librdkafka takes for `prop`, and the one `value` is closest to."""
    choices = _PROPERTY_VALUES.get(prop)
    if choices is None or "Invalid value" not in message:
        return ""
    close = difflib.get_close_matches(_as_text(value).lower(), [c.lower() for c in choices], n=1)
    hint = f"; it takes {', '.join(choices)}"
    if close:
        hint += f" (did you mean {choices[[c.lower() for c in choices].index(close[0])]!r}?)"
    return hint


def _refused(prefix: str, prop: str, value: Any, message: str) -> ConfigError:
    """librdkafka refused `prefix + prop` = `value`: the message names the key
    and the value (a value alone, "refused 'earliest'", says nothing of which
    of several properties it was), then librdkafka's reason and a hint."""
    shown = "(hidden)" if _secret_property(prop) else show_value(value)
    return ConfigError(
        prefix + prop,
        f"librdkafka refused {prefix + prop}={shown}: {message}"
        + unknown_property_hint(prefix, prop, message)
        + _value_hint(prop, value, message),
    )


def _secret_property(prop: str) -> bool:
    return any(w in prop.lower() for w in ("password", "secret", "key.pem", "oauthbearer.config"))


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
    message = error_text(exc)
    for prop in _PROPERTY_IN_MESSAGE.findall(message):
        if prop in overrides:
            return _refused(prefix, prop, overrides[prop], message)
    base = {k: v for k, v in settings.items() if k not in overrides}
    for prop, value in overrides.items():
        alone = _build_error({**base, prop: value, **_OFFLINE}, build)
        if alone is not None:
            return _refused(prefix, prop, value, message)
    given = ", ".join(prefix + p for p in sorted(overrides)) or "none"
    return ConfigError(f"{prefix}*", f"librdkafka refused the client config ({given}): {message}")
