"""Config fuzz over every key of the schema (issue 21): hostile values either validate
to a typed value within the key's rules, or raise `ConfigError` naming that key. Never
another exception, never a traceback at start-up.

Hostile values: integers of thousands of digits (typed and as text), Unicode digits,
empty and whitespace-only strings, negatives, floats (NaN, infinities), very long
strings, NUL and surrogate characters, containers, bytes. Each key is fuzzed through
`StreamsConfig.from_dict` (typed values, as an `App` dict gives them) and, for text,
through `--set` as the command line gives them. Pass-through client properties are
fuzzed too, including the offline librdkafka check that start-up runs.
"""

from __future__ import annotations

import re
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from runtime.config import (
    KEYS,
    PASSTHROUGH_PREFIXES,
    ConfigError,
    ConfigKey,
    StreamsConfig,
    load_config,
)
from runtime.kafka.startup_checks import check_client_properties
from runtime.topology.serdes import Serde

BASE = {"application.id": "fuzz", "bootstrap.servers": "127.0.0.1:9092"}


def power_of_ten(exponent: int) -> int:
    """10**exponent, negative for a negative exponent: integers no repr() can print."""
    return -(10**-exponent) if exponent < 0 else 10**exponent


# Named through a function: hypothesis cannot repr a 5000-digit int (nor can anyone).
huge_ints = st.sampled_from([5000, -5000, 4301, 300, 19]).map(power_of_ten) | st.sampled_from(
    [2**63, 2**63 - 1, -(2**63), 2**31, 2**31 - 1]
)
integers = st.integers() | huge_ints | st.integers(-3, 70_000)
unicode_digits = st.text(
    alphabet=st.characters(categories=["Nd"], exclude_characters="0123456789"),
    min_size=1,
    max_size=8,
)
blank = st.text(alphabet=" \t\n\r\x0b\x0c\u00a0\u2003\u3000", max_size=6)
long_strings = st.integers(300, 20_000).map(lambda n: "a" * n) | st.text(max_size=8).map(
    lambda t: (t or "x") * 1500
)
weird_strings = st.text(max_size=40) | st.sampled_from(
    ["\x00", "a\x00b", "\ud800", "５", "１２", "٣", "1_000", "0x10", "1e3", "1.5", "-0", "+5",
     "9" * 5000, "-" + "9" * 5000, "0" * 5000 + "1", "NaN", "inf", "true", "None", "null",
     "sys:exit", "os:system", "builtins:print", "no_such_mod_qq:x", ":", "a:", ":b",
     "127.0.0.1:notaport", "h:0", "h:65536", "[::1]:9092", "::1:9092", "a" * 64 + ":1",
     ".", "..", "a..b", "x" * 64, "exactly_once", "LOG_AND_FAIL ", " Info"]
)  # fmt: skip
numeric_text = (st.integers() | st.integers(-3, 70_000)).map(str) | st.floats().map(str)
hostile_text = unicode_digits | blank | long_strings | weird_strings | numeric_text
hostile = (
    hostile_text
    | integers
    | st.floats()
    | st.booleans()
    | st.none()
    | st.binary(max_size=10)
    | st.lists(st.integers(), max_size=2)
    | st.dictionaries(st.text(max_size=3), st.integers(), max_size=2)
)


def near_valid(spec: ConfigKey) -> st.SearchStrategy[Any]:
    """Values at the edges of what the key accepts (where range bugs live)."""
    if spec.kind == "int":
        edges = [b + d for b in (spec.min or 0, spec.max or 0, *spec.also) for d in (-1, 0, 1)]
        edges += [spec.clamp or 0, (spec.clamp or 0) + 1]
        values = st.sampled_from(edges)
        return values | values.map(str) | values.map(lambda n: f" {n} ")
    if spec.kind == "float":
        assert spec.min is not None and spec.max is not None
        edges = [spec.min, spec.max, spec.min - 1e-9, spec.max + 1e-9, (spec.min + spec.max) / 2]
        floats = st.sampled_from(edges)
        return floats | floats.map(str) | floats.map(lambda f: f" {f} ")
    if spec.kind == "enum":
        choices = st.sampled_from(spec.choices)
        return choices | choices.map(str.upper) | choices.map(lambda c: c[:-1])
    return st.nothing()


def assert_typed_and_in_range(spec: ConfigKey, value: Any) -> None:
    """What a validated value of `spec` may be."""
    if value is None:
        assert spec.nullable or spec.name == "errors.dead.letter.queue.topic.name"
        return
    if spec.kind == "int":
        assert type(value) is int
        in_range = (spec.min is None or value >= spec.min) and (
            spec.max is None or value <= spec.max
        )
        assert in_range or value in spec.also, value
        if spec.clamp is not None:
            assert value <= spec.clamp
    elif spec.kind == "float":
        assert type(value) is float
        assert spec.min is not None and spec.max is not None
        assert spec.min <= value <= spec.max, value  # NaN and infinities fail this
    elif spec.kind == "callable":
        assert callable(value)
    elif spec.kind == "bool":
        assert type(value) is bool
    elif spec.kind == "enum":
        assert value in spec.choices
    elif spec.kind == "serde":
        assert isinstance(value, Serde)
    elif spec.kind == "partitioner":
        assert callable(value.static_partition)
    elif value == "" and spec.off_words:
        pass  # the key's "off" (admin.socket="" or "none": no socket)
    else:
        assert type(value) is str and value.strip() and "\x00" not in value
        assert len(value) <= spec.max_length
        if spec.pattern is not None:
            assert re.fullmatch(spec.pattern, value)


def check_one(key: str, value: Any) -> None:
    spec = KEYS[key]
    try:
        config = StreamsConfig.from_dict({**BASE, key: value})
    except ConfigError as exc:
        assert exc.key == key, (key, value, exc)
        assert len(str(exc)) < 1000, "the message stays readable whatever the value"
        return
    assert_typed_and_in_range(spec, getattr(config, spec.attr))


def check_one_set(key: str, text: str) -> None:
    """The same value as `--set key=value` gives it (always text)."""
    spec = KEYS[key]
    try:
        config = load_config(sets=[f"{key}={text}"], env={}, base=BASE)
    except ConfigError as exc:
        assert exc.key == key, (key, text, exc)
        assert len(str(exc)) < 1000
        return
    assert_typed_and_in_range(spec, getattr(config, spec.attr))


FUZZ = settings(
    max_examples=120,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@pytest.mark.parametrize("key", sorted(KEYS))
def test_every_key_validates_or_names_itself(key: str) -> None:
    spec = KEYS[key]

    @FUZZ
    @given(value=hostile | near_valid(spec), text=hostile_text | near_valid(spec).map(str))
    def fuzz(value: Any, text: str) -> None:
        check_one(key, value)
        check_one_set(key, text)

    fuzz()


def test_the_fuzz_covers_every_key_kind() -> None:
    kinds = {spec.kind for spec in KEYS.values()}
    assert kinds == {"str", "int", "float", "bool", "enum", "serde", "partitioner", "callable"}


@pytest.mark.parametrize("prefix", PASSTHROUGH_PREFIXES)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    prop=st.sampled_from(
        ["session.timeout.ms", "linger.ms", "acks", "retries", "socket.timeout.ms",
         "compression.type", "no.such.property", "bootstrap.servers", "client.id",
         "group.id", "group.instance.id", "transactional.id", "security.protocol"]
    ),
    value=hostile,
)  # fmt: skip
# Found by this fuzz: a lone surrogate made confluent-kafka raise SystemError.
@example(prop="client.id", value="\ud800")
def test_client_properties_are_refused_naming_the_key(prefix: str, prop: str, value: Any) -> None:
    key = prefix + prop
    try:
        config = StreamsConfig.from_dict({**BASE, key: value})
        check_client_properties(config)
    except ConfigError as exc:
        assert exc.key in (key, f"{prefix}*"), (key, value, exc)
        assert len(str(exc)) < 2000
