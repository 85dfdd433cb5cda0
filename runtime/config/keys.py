"""One known key: its type, default, validation and doc, and how a value is parsed.

`ConfigKey` coerces one value (typed, or a string from the environment or
`--set`) and says what a valid one looks like, with a did-you-mean for an
enum; `setting(...)` declares a `StreamsConfig` field as a key (the fields are
the table of known keys, runtime.config.settings). `ConfigError` is the one
error of the whole package. Pure and immutable: any thread may call it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from runtime.config_values import (
    MAX_INT_DIGITS,
    MAX_SERDE_CHARS,
    MAX_STR_CHARS,
    close_match,
    one_line,
    show_value,
)
from runtime.config_values import Invalid as _Invalid
from runtime.partitioning.static import (
    check_static_partitioner,
    static_partitioner_from_name,
)
from runtime.topology.serdes import BUILTIN, Serde, serde_from_name


class ConfigError(ValueError):
    """A configuration value, key or file is wrong.

    `key` is the dotted key (or the offending `--set` string; empty for an error
    about a whole file), `reason` says what is wrong, `file` names the TOML file
    for file-level errors. The CLI turns it into exit code 2. The message is
    one line whatever it quotes: control characters in the reason (a value,
    a `--set` string, a path, a librdkafka message echoing a value) are
    escaped, so a two-line value cannot print a two-line error (issue 31).
    """

    def __init__(self, key: str, reason: str, *, file: str | None = None) -> None:
        self.key = key
        self.reason = one_line(reason)
        self.file = file
        if file is not None and not key:
            message = f"config file {show_value(file, 200)}: {self.reason}"
        else:
            message = f"config key {show_value(key, 120)}: {self.reason}"
        super().__init__(message)

    def __reduce__(self) -> Any:
        return (_config_error, (self.key, self.reason, self.file))


def _config_error(key: str, reason: str, file: str | None) -> ConfigError:
    return ConfigError(key, reason, file=file)


class _Required:
    def __repr__(self) -> str:
        return "REQUIRED"


REQUIRED: Any = _Required()

Kind = Literal["str", "int", "float", "bool", "enum", "serde", "partitioner", "callable"]
Default = Any  # a plain value, REQUIRED, or Callable[[Mapping[str, Any]], Any]

# ASCII digits only: Python's int() also takes "５" and "1_000", which no other
# Kafka tool would read as a number.
INT_TEXT = re.compile(r"[+-]?[0-9]+", re.ASCII)
FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)", re.ASCII)
_TRUE = frozenset({"true", "yes", "on", "1"})
_FALSE = frozenset({"false", "no", "off", "0"})


@dataclass(frozen=True)
class ConfigKey:
    """One known key: name, type, default, validation and a one-line doc."""

    name: str
    kind: Kind
    default: Default
    doc: str
    min: float | None = None  # ints: whole numbers
    max: float | None = None
    also: tuple[int, ...] = ()  # integers allowed outside [min, max], e.g. -1
    choices: tuple[str, ...] = ()
    pattern: str | None = None
    nullable: bool = False
    clamp: int | None = None  # ints above it are accepted and stored as it (durations)
    max_length: int = MAX_STR_CHARS  # strings
    check: Callable[[str], None] | None = None  # more string validation; raises _Invalid
    default_doc: str | None = None  # how the README shows a computed default
    # Strings (compared lower-cased, stripped) that turn the setting off: parsed
    # as "" (admin.socket's "" or "none": no socket, while unset means a default).
    off_words: tuple[str, ...] = ()
    # ints: a word (compared lower-cased, stripped) that stands for a number
    # computed when the config is built (`processes=auto`: the usable CPUs).
    auto: tuple[str, Callable[[], int]] | None = None
    # kind "callable": turns `module:attr` into the object (raises ValueError),
    # and checks an object given from code (raises ValueError).
    resolve: Callable[[str], Any] | None = None
    check_object: Callable[[Any], Any] | None = None
    attr: str = ""  # the StreamsConfig attribute; filled in from the field name

    @property
    def required(self) -> bool:
        return self.default is REQUIRED

    def default_for(self, values: Mapping[str, Any]) -> Any:
        """The default, given the parsed values of the keys declared above this one."""
        if callable(self.default):
            return self.default(values)
        return self.default

    def expected(self) -> str:
        """What a valid value looks like, as in "expected an integer >= 0"."""
        if self.kind == "int":
            text = "an integer"
            if self.min is not None and self.max is not None:
                text += f" between {self.min} and {self.max}"
            elif self.min is not None:
                text += f" >= {self.min}"
            elif self.max is not None:
                text += f" <= {self.max}"
            if self.also:
                text += " or " + " or ".join(str(n) for n in self.also)
            if self.auto is not None:
                text += f" or {self.auto[0]!r}"
            return text
        if self.kind == "float":
            return f"a number between {self.min} and {self.max}"
        if self.kind == "bool":
            return "true or false"
        if self.kind == "enum":
            return "one of " + ", ".join(repr(c) for c in self.choices)
        if self.kind == "callable":
            return "'module:attr' naming a callable"
        if self.kind == "serde":
            return f"a serde: one of {sorted(BUILTIN)} or 'module:attr'"
        if self.kind == "partitioner":
            return (
                "'module:attr' naming an object with static_partition(topic, key, num_partitions)"
            )
        if self.pattern is not None:
            return f"a string matching {self.pattern}"
        return "a non-empty string"

    def parse(self, value: Any) -> Any:
        """Coerce and validate one value (typed, or a string as from env/--set).

        Raises `_Invalid`; the caller turns it into a `ConfigError` naming the key.
        """
        if value is None and self.nullable:
            return None
        if self.off_words and isinstance(value, str) and value.strip().lower() in self.off_words:
            return ""
        return _PARSERS.get(self.kind, ConfigKey._parse_str)(self, value)

    def _bad(self, value: Any, hint: str = "") -> _Invalid:
        return _Invalid(f"expected {self.expected()}, got {show_value(value)}{hint}")

    def _parse_int(self, value: Any) -> int:
        if isinstance(value, bool):
            raise self._bad(value)
        if self.auto is not None and isinstance(value, str):
            word, compute = self.auto
            if value.strip().lower() == word:
                return compute()
        if isinstance(value, int):
            number = value
        elif isinstance(value, str) and INT_TEXT.fullmatch(value.strip()):
            text = value.strip()
            sign = "-" if text.startswith("-") else ""
            digits = text.lstrip("+-").lstrip("0") or "0"
            # Refuse absurd lengths before int() (Python stops at 4300 digits,
            # leading zeros included, with its own ValueError; every key's
            # range ends far below that).
            if len(digits) > MAX_INT_DIGITS:
                raise self._bad(value)
            number = int(sign + digits)
        else:
            raise self._bad(value)
        in_range = (self.min is None or number >= self.min) and (
            self.max is None or number <= self.max
        )
        if not in_range and number not in self.also:
            raise self._bad(value)
        if self.clamp is not None:
            number = min(number, self.clamp)
        return number

    def _parse_float(self, value: Any) -> float:
        """A finite number within [min, max] (both set for float keys)."""
        if isinstance(value, bool):
            raise self._bad(value)
        if isinstance(value, int) and value.bit_length() > 64:
            raise self._bad(value)  # float() of a huge int overflows
        if isinstance(value, int | float):
            number = float(value)
        elif (
            isinstance(value, str)
            and len(value) <= MAX_INT_DIGITS
            and FLOAT_TEXT.fullmatch(value.strip())
        ):
            number = float(value.strip())
        else:
            raise self._bad(value)
        if not (self.min is not None and self.max is not None and self.min <= number <= self.max):
            raise self._bad(value)
        return number

    def _resolve_named(self, value: str, resolve: Callable[[str], Any], what: str = "") -> Any:
        """A `module:attr` name imported by `resolve` (serdes, partitioners,
        callables). Its own ValueError says what is wrong with the name;
        anything else the user's module raised on import or construction is
        named, SystemExit too (an import must not end the process with exit 0)."""
        if len(value) > MAX_SERDE_CHARS:
            raise self._bad(value)
        try:
            return resolve(value)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None
        except (Exception, SystemExit) as exc:
            raise _Invalid(
                f"cannot resolve {what}{show_value(value)}: {type(exc).__name__}: {exc}"
            ) from None

    def _parse_callable(self, value: Any) -> Any:
        """`module:attr` (imported by `resolve`) or, from code, the object itself."""
        assert self.resolve is not None and self.check_object is not None
        if isinstance(value, str):
            return self._resolve_named(value, self.resolve)
        try:
            return self.check_object(value)
        except ValueError as exc:
            raise _Invalid(str(exc)) from None

    def _parse_bool(self, value: Any) -> bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str):
            text = value.strip().lower()
            if text in _TRUE:
                return True
            if text in _FALSE:
                return False
        raise self._bad(value)

    def _parse_enum(self, value: Any) -> str:
        if not isinstance(value, str):
            raise self._bad(value)
        text = value.strip().lower()
        if text in self.choices:
            return text
        close = close_match(text, self.choices)
        raise self._bad(value, f" (did you mean {close!r}?)" if close else "")

    def _parse_serde(self, value: Any) -> Serde:
        if isinstance(value, str):
            serde: Serde = self._resolve_named(value, serde_from_name, "serde ")
            return serde
        if isinstance(value, type):
            raise _Invalid(f"expected a serde object or name, got the class {value.__name__}")
        if isinstance(value, Serde):
            return value
        raise self._bad(value)

    def _parse_partitioner(self, value: Any) -> Any:
        """`module:attr` (imported; a class is made with no arguments) or, from
        code, the object itself."""
        if isinstance(value, str):
            return self._resolve_named(value, static_partitioner_from_name)
        if isinstance(value, (int, float, bytes, list, dict, type)) or value is None:
            raise self._bad(value)
        try:
            return check_static_partitioner(value, show_value(value))
        except ValueError as exc:
            raise _Invalid(str(exc)) from None

    def _parse_str(self, value: Any) -> str:
        if not isinstance(value, str) or not value.strip():
            raise self._bad(value)
        if len(value) > self.max_length:
            raise _Invalid(f"longer than {self.max_length} characters ({len(value)})")
        if "\x00" in value:
            raise _Invalid(f"contains a NUL character: {show_value(value)}")
        if self.pattern is not None and not re.fullmatch(self.pattern, value):
            raise self._bad(value)
        if self.check is not None:
            self.check(value)
        return value

    # README rendering

    def type_doc(self) -> str:
        if self.kind == "int":
            return self.expected().removeprefix("an ")
        if self.kind == "bool":
            return "boolean"
        if self.kind == "enum":
            return "one of " + ", ".join(f"`{c}`" for c in self.choices)
        if self.kind == "serde":
            return "serde: " + ", ".join(f"`{n}`" for n in BUILTIN) + " or `module:attr`"
        if self.kind == "partitioner":
            return "`module:attr` or unset"
        if self.kind == "float":
            return f"number between {self.min} and {self.max}"
        if self.kind == "callable":
            return "`module:attr` or unset"
        text = "string"
        if self.pattern is not None:
            text += f" matching `{self.pattern}`"
        if self.nullable:
            text += " or unset"
        return text

    def default_doc_text(self) -> str:
        if self.required:
            return "required"
        if self.default_doc is not None:
            return self.default_doc
        if self.default is None:
            return "unset"
        return f"`{self.default}`"


# How `ConfigKey.parse` reads a value of each kind (a string key: `_parse_str`).
_PARSERS: dict[str, Callable[[ConfigKey, Any], Any]] = {
    "int": ConfigKey._parse_int,
    "float": ConfigKey._parse_float,
    "callable": ConfigKey._parse_callable,
    "bool": ConfigKey._parse_bool,
    "enum": ConfigKey._parse_enum,
    "serde": ConfigKey._parse_serde,
    "partitioner": ConfigKey._parse_partitioner,
}

KEY_FIELD = "runtime.config.key"
PREFIX_FIELD = "runtime.config.prefix"


def setting(name: str, kind: Kind, default: Default, doc: str, **validation: Any) -> Any:
    """Declare a `StreamsConfig` field as the known key `name` (see `ConfigKey`)."""
    return field(metadata={KEY_FIELD: ConfigKey(name, kind, default, doc, **validation)})


def passthrough(prefix: str, doc: str) -> Any:
    """Declare a `StreamsConfig` field collecting the unknown keys under `prefix`."""
    return field(default_factory=dict, metadata={PREFIX_FIELD: (prefix, doc)})
