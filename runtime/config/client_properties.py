"""Checks of the librdkafka properties passed through to the four clients.

Unknown keys under `consumer.`, `producer.`, `restore.consumer.` and `admin.`
(and the unprefixed security properties, for every client) go to
confluent-kafka as given. Here, before any client is built: the properties
the runtime sets itself (`RUNTIME_OWNED`), values no client could take
(`passthrough_value_problem`: types, NUL, control characters in ids and
paths), and connection settings that differ between the clients
(`check_one_cluster`). Whether librdkafka takes a value is checked at
start-up by building the clients (`runtime.kafka.startup_checks`); whether
it breaks the processing guarantee, in `runtime.config.guarantees`. Pure:
called while a config is built, on the caller's thread.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from runtime.config.keys import ConfigError
from runtime.config_values import (
    JAVA_LONG_MAX,
    check_bootstrap_servers,
    is_control,
    show_value,
)
from runtime.config_values import Invalid as _Invalid

# Client properties the runtime sets itself and that must not be overridden. A
# consumer's group.id: the group is application.id (offsets, fencing, the
# status topic all depend on it); and confluent-kafka aborts the whole process
# (a C assertion, SIGABRT) building a consumer whose group.id is empty.
RUNTIME_OWNED: Mapping[str, Mapping[str, str]] = {
    "consumer_overrides": {
        "group.id": "set by the runtime: the consumer group is application.id",
    },
    "restore_consumer_overrides": {
        "group.id": "set by the runtime (the restore consumer never joins a group)",
    },
    # Under exactly_once_v2 the runtime keeps one per instance in state.dir,
    # so a restarted instance fences its crashed predecessor and aborts its
    # open transaction; one shared by two instances fences them in turn, and
    # under at_least_once a transactional producer refuses every record sent
    # outside a transaction (issue 31).
    "producer_overrides": {
        "transactional.id": (
            "set by the runtime: under exactly_once_v2 each instance keeps its own in "
            "state.dir (a restarted instance fences its crashed predecessor with it); "
            "under at_least_once the producer is not transactional. Remove the key"
        ),
    },
}


def passthrough_value_problem(prop: str, value: Any) -> str | None:
    """Why a client property value cannot reach librdkafka, or None if it can.

    Only the type is checked here; whether librdkafka takes the value is checked
    at start-up by building the clients (`runtime.kafka.startup_checks`).
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        if abs(value) > JAVA_LONG_MAX:
            return f"client property value {show_value(value)} is out of range"
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"client property value {value} is not finite"
    if isinstance(value, str):
        if "\x00" in value:
            return f"client property value contains a NUL character: {show_value(value)}"
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            return f"client property value is not valid UTF-8 text: {show_value(value)}"
        if prop in ("bootstrap.servers", "metadata.broker.list"):
            try:
                check_bootstrap_servers(value)
            except _Invalid as exc:
                return exc.reason
        if _names_or_path(prop) and any(is_control(c) for c in value):
            # Client ids reach broker logs and metrics labels, locations are
            # file names: a newline there forges lines (PEM text, which has
            # newlines, is given in the *.pem properties instead).
            return f"client property value contains control characters: {show_value(value)}"
        return None
    return (
        "a client property takes a string, number or boolean, got "
        f"{type(value).__name__} {show_value(value)}"
    )


def _names_or_path(prop: str) -> bool:
    """A client property whose value is an id or a file path (no control characters)."""
    return prop in ("client.id", "group.instance.id", "client.rack") or prop.endswith(
        (".location", ".dir", ".path")
    )


CLIENT_ATTRS: tuple[str, ...] = (
    "consumer_overrides",
    "producer_overrides",
    "restore_consumer_overrides",
    "admin_overrides",
)


# librdkafka's other names for the properties checked here. Topic-level
# properties may also be given with a "topic." prefix (librdkafka strips it):
# `producer.topic.acks=0` is `acks=0`.
_ALIASES: Mapping[str, str] = {
    "request.required.acks": "acks",
    "topic.acks": "acks",
    "topic.request.required.acks": "acks",
    "max.in.flight.requests.per.connection": "max.in.flight",
    "metadata.broker.list": "bootstrap.servers",
    "sasl.mechanisms": "sasl.mechanism",
}


def canonical(prop: str) -> str:
    return _ALIASES.get(prop, prop)


def is_security_property(prop: str) -> bool:
    """Whether a librdkafka property says how to reach and authenticate to the
    cluster: these must be the same for the four clients, and may be given
    unprefixed (`security.protocol`, `sasl.*`, `ssl.*`) for all of them."""
    prop = canonical(prop)
    return (
        prop == "security.protocol"
        or prop.startswith(("sasl.", "ssl."))
        or prop in ("enable.ssl.certificate.verification", "enable.sasl.oauthbearer.unsecure.jwt")
    )


def is_secret(prop: str) -> bool:
    """Properties whose values never appear in messages or `as_display_dict`."""
    return any(w in prop.lower() for w in ("password", "secret", "key.pem", "oauthbearer.config"))


def show_property(prop: str, value: Any) -> str:
    return "(hidden)" if is_secret(prop) else show_value(value)


_ONE_CLUSTER = (
    "the runtime's four clients must reach one cluster the same way (the producer commits "
    "the consumer's offsets, the restore consumer reads what the producer wrote), and one "
    "that cannot connect hangs or fails only after start-up"
)


def _servers(value: Any) -> list[str]:
    """A broker list for comparison: entries stripped, lower-cased, sorted."""
    return sorted(entry.strip().lower() for entry in str(value).split(",") if entry.strip())


def check_one_cluster(
    shared: Mapping[str, Any],
    overrides: dict[str, dict[str, Any]],
    bootstrap_servers: str,
    prefix_by_attr: Mapping[str, str],
    source: Callable[[str], str],
) -> None:
    """Refuse connection settings that differ between the four clients, then
    give each client the unprefixed security settings (`shared`).

    `overrides` and `prefix_by_attr` are keyed by `StreamsConfig` attribute
    (`consumer_overrides`: `consumer.`); `source(key)` says where a key came from.

    A prefixed `bootstrap.servers` must name the same brokers as the
    unprefixed one; a security property (`is_security_property`) must have
    the same value, or be unset, for all four clients. Refusing here is the
    fix for settings given to one client only: a producer alone with
    `producer.security.protocol=SASL_SSL` started, and the other clients
    hung at the group join or the first admin request (issue 31)."""
    names = {
        "consumer_overrides": "consumer",
        "producer_overrides": "producer",
        "restore_consumer_overrides": "restore consumer",
        "admin_overrides": "admin client",
    }
    prefixes = ", ".join(prefix_by_attr[a] for a in CLIENT_ATTRS)
    # Each client's value of each security property: prefixed, else unprefixed.
    effective: dict[str, dict[str, tuple[str, Any]]] = {attr: {} for attr in CLIENT_ATTRS}
    for prop, value in shared.items():
        for attr in CLIENT_ATTRS:
            effective[attr][canonical(prop)] = (prop, value)
    for attr in CLIENT_ATTRS:
        prefix = prefix_by_attr[attr]
        for prop, value in overrides[attr].items():
            if value is None:
                continue
            canon = canonical(prop)
            key = prefix + prop
            if canon == "bootstrap.servers":
                if _servers(value) != _servers(bootstrap_servers):
                    raise ConfigError(
                        key,
                        f"{show_value(value)} differs from bootstrap.servers "
                        f"({show_value(bootstrap_servers)}): {_ONE_CLUSTER}. Set "
                        f"bootstrap.servers alone (unprefixed) for all clients{source(key)}",
                    )
            elif is_security_property(canon):
                if canon in effective[attr] and effective[attr][canon][0] in shared:
                    unprefixed = effective[attr][canon]
                    if _comparable(canon, unprefixed[1]) != _comparable(canon, value):
                        raise ConfigError(
                            key,
                            f"{show_property(prop, value)} differs from the unprefixed "
                            f"{unprefixed[0]} ({show_property(prop, unprefixed[1])}): {_ONE_CLUSTER}. "
                            f"Remove {key} and keep the unprefixed one{source(key)}",
                        )
                effective[attr][canon] = (prop, value)
    security = sorted({canon for attr in CLIENT_ATTRS for canon in effective[attr]})
    for canon in security:
        seen = {
            attr: _comparable(canon, effective[attr][canon][1])
            if canon in effective[attr]
            else None
            for attr in CLIENT_ATTRS
        }
        if len(set(seen.values())) == 1:
            continue
        # Name the first client whose own (prefixed) setting makes the difference.
        attr = next(a for a in CLIENT_ATTRS if seen[a] is not None)
        prop = effective[attr][canon][0]
        key = prefix_by_attr[attr] + prop
        # Clients grouped by value, each value shown as first given.
        groups: dict[str | None, tuple[str, list[str]]] = {}
        for a in CLIENT_ATTRS:
            shown = "unset" if seen[a] is None else show_property(canon, effective[a][canon][1])
            groups.setdefault(seen[a], (shown, []))[1].append(names[a])
        found = "; ".join(
            f"{shown} for the {' and '.join(clients)}" for shown, clients in groups.values()
        )
        raise ConfigError(
            key,
            f"differs between clients ({found}): {_ONE_CLUSTER}. Set {canon} unprefixed "
            f"(it then applies to every client), or the same under every prefix "
            f"({prefixes}){source(key)}",
        )
    for attr in CLIENT_ATTRS:
        given = {canonical(p) for p, v in overrides[attr].items() if v is not None}
        for prop, value in shared.items():
            if canonical(prop) not in given:
                overrides[attr][prop] = value


def _comparable(canon: str, value: Any) -> str:
    """A security value for comparison: enum-like ones ignore case and spaces."""
    if isinstance(value, bool):
        return "true" if value else "false"
    text = str(value).strip()
    if canon in ("security.protocol", "sasl.mechanism") or canon.startswith("enable."):
        return text.lower()
    return text
