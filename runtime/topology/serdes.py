"""Serializers/deserializers (serdes) for keys and values.

A serde is any object with `serialize(obj) -> bytes | None` and
`deserialize(data) -> obj`; `None` passes through both ways as `None` (Kafka's
tombstone). The built-in serdes are stateless and shared by all threads.
"""

from __future__ import annotations

import importlib
import json
import re
import struct
from typing import Any, Protocol, runtime_checkable

import orjson

from runtime.topology.windows import Windowed


@runtime_checkable
class Serde(Protocol):
    def serialize(self, obj: Any) -> bytes | None: ...

    def deserialize(self, data: bytes | None) -> Any: ...


class BytesSerde:
    """Raw bytes in and out (bytearray and memoryview are accepted on write)."""

    name = "bytes"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        if isinstance(obj, bytes):
            return obj
        if isinstance(obj, bytearray | memoryview):
            return bytes(obj)
        raise TypeError(f"BYTES serde expects bytes, got {type(obj).__name__}")

    def deserialize(self, data: bytes | None) -> bytes | None:
        return data

    def __repr__(self) -> str:
        return "serdes.BYTES"


class StringSerde:
    """UTF-8 text, as Kafka's StringSerializer."""

    name = "string"

    def serialize(self, obj: Any) -> bytes | None:
        if type(obj) is str:  # the common case first
            return obj.encode()
        if obj is None:
            return None
        if not isinstance(obj, str):
            raise TypeError(f"STRING serde expects str, got {type(obj).__name__}")
        return obj.encode("utf-8")

    def deserialize(self, data: bytes | None) -> str | None:
        return None if data is None else data.decode()

    def __repr__(self) -> str:
        return "serdes.STRING"


_INT64 = struct.Struct(">q")
_INT64_MIN = -(1 << 63)
_INT64_MAX = (1 << 63) - 1


class Int64Serde:
    """Signed 64-bit integer, 8 bytes big-endian, as Kafka's LongSerializer.

    A fixed-size serde: every value is `fixed_size` bytes, and `holds(obj)`
    says whether `serialize(obj)` succeeds. A store cache may then keep such
    values as (immutable) ints and serialize them when it emits them
    (`runtime.state.cache`).
    """

    name = "int64"
    fixed_size = 8

    def serialize(self, obj: Any) -> bytes | None:
        if type(obj) is int:  # the common case first: no isinstance walk
            return _INT64.pack(obj)
        if obj is None:
            return None
        if isinstance(obj, bool) or not isinstance(obj, int):
            raise TypeError(f"INT64 serde expects int, got {type(obj).__name__}")
        return _INT64.pack(obj)

    def deserialize(self, data: bytes | None) -> int | None:
        if data is None:
            return None
        if len(data) != 8:
            raise ValueError(f"INT64 serde expects 8 bytes, got {len(data)}")
        value: int = _INT64.unpack(data)[0]
        return value

    def holds(self, obj: Any) -> bool:
        """True when `serialize(obj)` gives 8 bytes without an error."""
        return type(obj) is int and _INT64_MIN <= obj <= _INT64_MAX

    def __repr__(self) -> str:
        return "serdes.INT64"


# Built once: json.dumps with non-default separators builds an encoder per call.
_JSON_ENCODER = json.JSONEncoder(separators=(",", ":"))
_JSON_DECODER = json.JSONDecoder()
_ORJSON_OPTIONS = orjson.OPT_NON_STR_KEYS  # int, None... keys as strings, as json does
# orjson reads integers beyond 64 bits as floats (precision lost without a word):
# a float this large in its result may be one, and json reads the text exactly.
# (A search of the text for 19 digits in a row cost more than orjson's parse.)
_BIG = 9.2e18  # just under 2**63


def _has_big_float(obj: Any) -> bool:
    """Whether a decoded document holds a float of magnitude >= _BIG (any depth)."""
    kind = type(obj)
    if kind is float:
        return obj >= _BIG or obj <= -_BIG
    if kind is dict:
        values = obj.values()
    elif kind is list:
        values = obj
    else:
        return False
    for value in values:
        vkind = type(value)
        if vkind is float:
            if value >= _BIG or value <= -_BIG:
                return True
        elif (vkind is dict or vkind is list) and _has_big_float(value):
            return True
    return False


class JsonSerde:
    """JSON text in UTF-8, compact separators.

    Why orjson: JSON is most of the per-record Python work of a JSON map (a
    py-spy profile of the stateless benchmark put 36% of the GIL time in the
    standard library's encoder and decoder); orjson does the same in C several
    times faster. The standard library stays as the fallback for what orjson
    refuses or would read differently: integers beyond 64 bits, NaN and
    Infinity on input, lone surrogates. Differences on output: non-ASCII text
    is written as UTF-8 (not as \\u escapes), NaN and infinities as null (JSON
    has no such numbers), datetimes and dataclasses are serialized instead of
    refused. NaN and infinities aside, both ways are valid JSON that any reader
    decodes to the same values.
    """

    name = "json"

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        try:
            return orjson.dumps(obj, option=_ORJSON_OPTIONS)
        except TypeError:  # orjson.JSONEncodeError: big ints, surrogates, unknown types
            return _JSON_ENCODER.encode(obj).encode("utf-8")

    def deserialize(self, data: bytes | None) -> Any:
        if data is None:
            return None
        try:
            obj = orjson.loads(data)
        except orjson.JSONDecodeError:
            pass  # json accepts some of it (NaN, 1e400, lone surrogates) or says why not
        else:
            if not _has_big_float(obj):
                return obj
        # Decoding first skips json's encoding detection on bytes.
        return _JSON_DECODER.decode(bytes(data).decode("utf-8"))

    def __repr__(self) -> str:
        return "serdes.JSON"


class TimeWindowedSerde:
    """`Windowed` keys in Kafka's TimeWindowedSerde layout.

    Serialized: the inner key's bytes followed by the window start as 8 bytes
    big-endian (Kafka's `WindowKeySchema.toBinary`); the end is not written,
    so deserializing needs the window size (`end = start + window_size_ms`).
    `inner` None means "the configured default key serde": nodes resolve it
    at init (`runtime.topology.nodes.resolve_serde`); used unresolved it raises.
    """

    name = "windowed"

    __slots__ = ("inner", "window_size_ms")

    def __init__(self, inner: Serde | None, window_size_ms: int) -> None:
        if inner is not None and not isinstance(inner, Serde):
            raise TypeError(f"windowed(): {inner!r} has no serialize()/deserialize() methods")
        if isinstance(window_size_ms, bool) or not isinstance(window_size_ms, int):
            raise TypeError(f"windowed(): window size must be int ms, got {window_size_ms!r}")
        if window_size_ms <= 0:
            raise ValueError(f"windowed(): window size must be > 0 ms, got {window_size_ms}")
        self.inner = inner
        self.window_size_ms = window_size_ms

    def with_inner(self, inner: Serde) -> TimeWindowedSerde:
        return TimeWindowedSerde(inner, self.window_size_ms)

    def _inner(self) -> Serde:
        if self.inner is None:
            raise ValueError("windowed serde without an inner key serde (not resolved)")
        return self.inner

    def serialize(self, obj: Any) -> bytes | None:
        if obj is None:
            return None
        if not isinstance(obj, Windowed):
            raise TypeError(f"windowed serde expects a Windowed key, got {type(obj).__name__}")
        key = self._inner().serialize(obj.key)
        return (key or b"") + _INT64.pack(obj.start)

    def deserialize(self, data: bytes | None) -> Windowed | None:
        if data is None:
            return None
        if len(data) < 8:
            raise ValueError(f"windowed serde expects at least 8 bytes, got {len(data)}")
        start: int = _INT64.unpack_from(data, len(data) - 8)[0]
        key = self._inner().deserialize(data[:-8])
        return Windowed(key, start, start + self.window_size_ms)

    def __repr__(self) -> str:
        return f"serdes.windowed({self.inner!r}, {self.window_size_ms})"


def windowed(inner_key_serde: Serde | None, window_size_ms: int) -> TimeWindowedSerde:
    """A serde for `Windowed` keys of windows of `window_size_ms` (Kafka's layout).

    Use it to write a windowed table's stream to a topic, or to read such a
    topic: `inner key bytes + 8-byte big-endian window start`.
    """
    return TimeWindowedSerde(inner_key_serde, window_size_ms)


BYTES = BytesSerde()
STRING = StringSerde()
INT64 = Int64Serde()
JSON = JsonSerde()

BUILTIN: dict[str, Serde] = {"bytes": BYTES, "string": STRING, "int64": INT64, "json": JSON}


_DOTTED = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*", re.ASCII)


def _short(text: str, limit: int = 80) -> str:
    """repr(text), cut for error messages (a config value may be long)."""
    if len(text) <= limit:
        return repr(text)
    return f"{repr(text[:limit])[:limit]}... ({len(text)} characters)"


def _is_serde_class(target: Any) -> bool:
    return isinstance(target, type) and all(
        callable(getattr(target, method, None)) for method in ("serialize", "deserialize")
    )


def serde_from_name(name: str) -> Serde:
    """Resolve a config value to a serde.

    Accepts a built-in name (`bytes`, `string`, `int64`, `json`, any case) or
    `module:attr` naming a serde object (anything with `serialize` and
    `deserialize`) or a serde class, instantiated with no arguments. Nothing
    else is called: a name is configuration, and `sys:exit` or `os:system` must
    be refused, not run. Raises `ValueError` with a readable reason otherwise.
    """
    builtin = BUILTIN.get(name.strip().lower())
    if builtin is not None:
        return builtin
    shown = _short(name)
    module_name, sep, attr = name.strip().partition(":")
    if not sep or not module_name or not attr:
        raise ValueError(f"unknown serde {shown}: use one of {sorted(BUILTIN)} or 'module:attr'")
    if not _DOTTED.fullmatch(module_name) or not _DOTTED.fullmatch(attr):
        raise ValueError(f"serde {shown}: 'module:attr' must be dotted Python names")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"serde {shown}: cannot import module {_short(module_name)}: {exc}"
        ) from exc
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError as exc:
            raise ValueError(
                f"serde {shown}: module {_short(module_name)} has no {_short(attr)}"
            ) from exc
    if isinstance(target, type):
        if not _is_serde_class(target):
            raise ValueError(
                f"serde {shown} is the class {target.__name__}, which has no "
                "serialize/deserialize methods"
            )
        target = target()
    elif not isinstance(target, Serde):
        kind = "a function" if callable(target) else f"a {type(target).__name__}"
        raise ValueError(
            f"serde {shown} is {kind}, not a serde: name an object with serialize and "
            "deserialize methods, or such a class (nothing else is called)"
        )
    if not isinstance(target, Serde):
        raise ValueError(f"serde {shown} has no serialize/deserialize methods")
    return target
