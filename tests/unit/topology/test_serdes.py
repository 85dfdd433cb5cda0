"""Serdes: byte formats, None passthrough, and resolving names from config."""

from __future__ import annotations

import struct
import sys
import types
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.topology import serdes

INT64_MIN = -(2**63)
INT64_MAX = 2**63 - 1


@pytest.mark.parametrize("serde", [serdes.BYTES, serdes.STRING, serdes.INT64, serdes.JSON])
def test_none_passes_through_both_ways(serde: serdes.Serde) -> None:
    assert serde.serialize(None) is None
    assert serde.deserialize(None) is None


def test_bytes_serde() -> None:
    assert serdes.BYTES.serialize(b"\x00\xff") == b"\x00\xff"
    assert serdes.BYTES.serialize(bytearray(b"ab")) == b"ab"
    assert serdes.BYTES.serialize(memoryview(b"ab")) == b"ab"
    assert serdes.BYTES.deserialize(b"ab") == b"ab"
    with pytest.raises(TypeError):
        serdes.BYTES.serialize("text")


def test_string_serde_is_utf8() -> None:
    assert serdes.STRING.serialize("grüße") == "grüße".encode()
    assert serdes.STRING.deserialize("grüße".encode()) == "grüße"
    assert serdes.STRING.serialize("") == b""
    with pytest.raises(TypeError):
        serdes.STRING.serialize(42)
    with pytest.raises(UnicodeDecodeError):
        serdes.STRING.deserialize(b"\xff\xfe")


def test_int64_matches_kafka_long_serializer() -> None:
    assert serdes.INT64.serialize(1) == b"\x00\x00\x00\x00\x00\x00\x00\x01"
    assert serdes.INT64.serialize(0) == b"\x00" * 8
    assert serdes.INT64.serialize(-1) == b"\xff" * 8
    assert serdes.INT64.serialize(256) == b"\x00\x00\x00\x00\x00\x00\x01\x00"
    assert serdes.INT64.serialize(INT64_MIN) == b"\x80" + b"\x00" * 7
    assert serdes.INT64.serialize(INT64_MAX) == b"\x7f" + b"\xff" * 7
    assert serdes.INT64.deserialize(b"\xff" * 7 + b"\xfe") == -2


def test_int64_rejects_bad_input() -> None:
    with pytest.raises(TypeError):
        serdes.INT64.serialize(True)
    with pytest.raises(TypeError):
        serdes.INT64.serialize(1.5)
    with pytest.raises(struct.error):
        serdes.INT64.serialize(2**63)
    with pytest.raises(ValueError):
        serdes.INT64.deserialize(b"\x00\x01")


@given(st.integers(min_value=INT64_MIN, max_value=INT64_MAX))
def test_int64_round_trip(n: int) -> None:
    data = serdes.INT64.serialize(n)
    assert data is not None and len(data) == 8
    assert serdes.INT64.deserialize(data) == n
    assert data == n.to_bytes(8, "big", signed=True)


@given(st.text())
def test_string_round_trip(text: str) -> None:
    assert serdes.STRING.deserialize(serdes.STRING.serialize(text)) == text


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.text()
    | st.floats(allow_nan=False, allow_infinity=False),
    lambda children: st.lists(children) | st.dictionaries(st.text(), children),
    max_leaves=20,
)


@given(json_values.filter(lambda v: v is not None))
def test_json_round_trip(value: object) -> None:
    assert serdes.JSON.deserialize(serdes.JSON.serialize(value)) == value


def test_json_is_compact_utf8() -> None:
    assert serdes.JSON.serialize({"a": [1, 2], "b": "x"}) == b'{"a":[1,2],"b":"x"}'
    assert serdes.JSON.deserialize(b'{"a": 1}') == {"a": 1}
    assert serdes.JSON.serialize({"name": "Zoë"}) == '{"name":"Zoë"}'.encode()


@pytest.mark.parametrize(
    "number", [2**63, -(2**63) - 1, 12345678901234567890123, 10**19, 9007199254740993]
)
def test_json_reads_and_writes_integers_beyond_64_bits_exactly(number: int) -> None:
    # orjson alone would read the first four as floats and refuse to write them.
    data = serdes.JSON.serialize({"id": number})
    assert data == f'{{"id":{number}}}'.encode()
    assert serdes.JSON.deserialize(data) == {"id": number}


def test_json_reads_what_the_standard_library_reads() -> None:
    assert serdes.JSON.deserialize(b'[NaN, 1e400, "\\ud800"]')[1:] == [float("inf"), "\ud800"]
    assert serdes.JSON.serialize({1: "a", None: "b"}) == b'{"1":"a","null":"b"}'
    assert serdes.JSON.serialize(float("nan")) == b"null"
    with pytest.raises(ValueError):
        serdes.JSON.deserialize(b"{not json")
    with pytest.raises(TypeError):
        serdes.JSON.serialize({1, 2})


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("bytes", serdes.BYTES),
        ("string", serdes.STRING),
        ("STRING", serdes.STRING),
        (" int64 ", serdes.INT64),
        ("json", serdes.JSON),
    ],
)
def test_serde_from_name_builtins(name: str, expected: serdes.Serde) -> None:
    assert serdes.serde_from_name(name) is expected


class _UpperSerde:
    def serialize(self, obj: object) -> bytes | None:
        return None if obj is None else str(obj).upper().encode()

    def deserialize(self, data: bytes | None) -> str | None:
        return None if data is None else data.decode()


@pytest.fixture
def serde_module() -> Iterator[types.ModuleType]:
    module = types.ModuleType("_serde_test_module")
    module.INSTANCE = _UpperSerde()  # type: ignore[attr-defined]
    module.UpperSerde = _UpperSerde  # type: ignore[attr-defined]
    module.make = lambda: _UpperSerde()  # type: ignore[attr-defined]
    module.not_a_serde = 42  # type: ignore[attr-defined]
    sys.modules[module.__name__] = module
    yield module
    del sys.modules[module.__name__]


def test_serde_from_name_module_attr(serde_module: types.ModuleType) -> None:
    assert serdes.serde_from_name("_serde_test_module:INSTANCE") is serde_module.INSTANCE
    from_class = serdes.serde_from_name("_serde_test_module:UpperSerde")
    assert isinstance(from_class, _UpperSerde)


def test_serde_from_name_calls_nothing_but_serde_classes(serde_module: types.ModuleType) -> None:
    """A name is configuration: functions (a factory, `sys:exit`) are refused, not called."""
    calls: list[str] = []
    serde_module.make = lambda: calls.append("make")  # type: ignore[attr-defined]
    serde_module.NotASerde = type("NotASerde", (), {"__init__": lambda s: calls.append("init")})  # type: ignore[attr-defined]
    with pytest.raises(ValueError, match="is a function, not a serde"):
        serdes.serde_from_name("_serde_test_module:make")
    with pytest.raises(ValueError, match="no serialize/deserialize"):
        serdes.serde_from_name("_serde_test_module:NotASerde")
    for name in ("sys:exit", "os:system", "builtins:print", "os:_exit", "builtins:exec"):
        with pytest.raises(ValueError, match="not a serde"):
            serdes.serde_from_name(name)
    with pytest.raises(ValueError, match="dotted Python names"):
        serdes.serde_from_name("os:system('true')")
    assert calls == []


@pytest.mark.parametrize(
    "name",
    [
        "nope",
        "",
        ":attr",
        "module:",
        "no_such_module_xyz:thing",
        "_serde_test_module:missing",
        "_serde_test_module:not_a_serde",
    ],
)
def test_serde_from_name_bad_names_raise_value_error(
    name: str, serde_module: types.ModuleType
) -> None:
    with pytest.raises(ValueError):
        serdes.serde_from_name(name)
