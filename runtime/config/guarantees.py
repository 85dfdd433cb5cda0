"""Client overrides that would break the processing guarantee, refused.

`check_client_guarantees` runs for every client property while a config is
built: automatic offset commits, a restore consumer without end-of-partition
events, `isolation.level` other than `read_committed` under exactly_once_v2,
and producer `acks`, idempotence and in-flight settings that lose or reorder
output. Each refusal says why the runtime needs the setting and what to do.
Pure: called on the caller's thread.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from runtime.config.client_properties import CLIENT_ATTRS, canonical, show_property
from runtime.config.keys import INT_TEXT, ConfigError
from runtime.config_values import MAX_INT_DIGITS

# Client properties the runtime's guarantees depend on (issue 31, item 7).
#
# Overrides are passed to librdkafka after the runtime's own settings, so
# before this check `consumer.isolation.level=read_uncommitted` under
# exactly_once_v2 was accepted and over-counted 161 of 250 keys through ten
# SIGKILLs (the restore consumer's: 402 of 1,000). Each rule below names the
# property, why the runtime needs it and what to do; a refused setting stops
# the config from being built (exit 2 from the CLI, ConfigError from `App`).


def _rdkafka_bool(value: Any) -> bool | None:
    """A boolean as librdkafka reads it (true/t/1, false/f/0), or None when it
    would refuse the value (the start-up check then names the key)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("true", "t", "1"):
        return True
    if text in ("false", "f", "0"):
        return False
    return None


def _rdkafka_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    text = str(value).strip()
    return int(text) if INT_TEXT.fullmatch(text) and len(text) <= MAX_INT_DIGITS else None


def _acks(value: Any) -> str:
    """`acks` normalised: "all" for all/-1 (librdkafka takes both, any case)."""
    text = str(value).strip().lower()
    return "all" if text in ("all", "-1") else text


_COMMITS_OFFSETS = (
    "the runtime commits offsets itself, only after the output of the records before them "
    "is acknowledged (under exactly_once_v2: inside the transaction); automatic commits or "
    "offset stores would move them ahead of that, and records are lost after a crash"
)


def guarantee_problem(
    attr: str, prop: str, value: Any, exactly_once: bool, allow_unsafe: bool
) -> str | None:
    """Why the client property `prop` (of the clients under `attr`) breaks the
    processing guarantee, or None. Pure; `build_config` runs it for every override."""
    canon = canonical(prop)
    consumer = attr in ("consumer_overrides", "restore_consumer_overrides")
    if consumer and canon in ("enable.auto.commit", "enable.auto.offset.store"):
        if _rdkafka_bool(value) is True:
            return f"{_COMMITS_OFFSETS}; remove it (the runtime always sets false)"
        return None
    if attr == "restore_consumer_overrides" and canon == "enable.partition.eof":
        if _rdkafka_bool(value) is False:
            return (
                "the restoration thread learns that a changelog is restored from the end-of-"
                "partition event; without it no stateful task ever finishes restoring. Remove it"
            )
        return None
    if consumer and canon == "isolation.level" and exactly_once:
        if str(value).strip().lower() != "read_committed":
            what = (
                "input" if attr == "consumer_overrides" else "the state it restores from changelogs"
            )
            return (
                f"exactly_once_v2 reads {what} with read_committed: any other level hands "
                "over records of aborted transactions (the output of a crashed attempt, "
                "which is then counted twice). Remove it, or set read_committed"
            )
        return None
    if attr != "producer_overrides":
        return None
    if canon == "acks":
        acks = _acks(value)
        if acks == "all":
            return None
        if exactly_once:
            return (
                "exactly_once_v2 needs acks=all (transactions use the idempotent producer, "
                "and output not yet replicated can be lost with its partition leader). "
                "Remove it, or set all"
            )
        if acks in ("0", "1") and not allow_unsafe:
            loss = (
                "with acks=0 the producer never learns whether output arrived"
                if acks == "0"
                else "with acks=1 output the partition leader acknowledged is lost if the "
                "leader fails before replicating it"
            )
            return (
                f"{loss}, and at_least_once commits input offsets past it. Remove it (the "
                "default is all), or confirm the loss with allow.unsafe.producer.settings=true "
                "and producer.enable.idempotence=false (librdkafka's idempotent producer "
                "needs acks=all)"
            )
        return None
    if canon == "enable.idempotence":
        if _rdkafka_bool(value) is not False:
            return None
        if exactly_once:
            return (
                "exactly_once_v2 needs the idempotent producer (transactions are built on "
                "it). Remove it"
            )
        if not allow_unsafe:
            return (
                "without idempotence a retried batch can be written twice or land behind a "
                "later one, breaking the output order of a partition. Remove it (the runtime "
                "sets true), or confirm with allow.unsafe.producer.settings=true"
            )
        return None
    if canon == "max.in.flight":
        number = _rdkafka_int(value)
        if number is not None and number > 5 and exactly_once:
            return (
                "exactly_once_v2's idempotent producer keeps order with at most 5 requests "
                "in flight per connection. Set 1 to 5, or remove it"
            )
    return None


def check_client_guarantees(
    overrides: Mapping[str, Mapping[str, Any]],
    values: Mapping[str, Any],
    prefix_by_attr: Mapping[str, str],
    source: Callable[[str], str],
) -> None:
    """Refuse client properties that break the processing guarantee (see above).

    `overrides` and `prefix_by_attr` are keyed by `StreamsConfig` attribute;
    `values` are the parsed known keys; `source(key)` says where a key came from."""
    exactly_once = values["processing.guarantee"] == "exactly_once_v2"
    allow_unsafe = bool(values["allow.unsafe.producer.settings"])
    for attr in CLIENT_ATTRS:
        prefix = prefix_by_attr[attr]
        for prop, value in overrides[attr].items():
            if value is None:
                continue
            reason = guarantee_problem(attr, prop, value, exactly_once, allow_unsafe)
            if reason is not None:
                key = prefix + prop
                raise ConfigError(
                    key, f"{show_property(prop, value)} refused: {reason}{source(key)}"
                )
