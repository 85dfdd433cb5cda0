"""Value checks behind the config key table (`runtime.config`), and wait limits.

Each check raises `Invalid` with the reason; `runtime.config` adds the key
and turns it into a `ConfigError`. Pure functions (no I/O but `os.path`), so
any thread may call them. `clamp_wait_s` is for the runtime's own waits.
"""

from __future__ import annotations

import difflib
import ipaddress
import math
import os
import re
import reprlib
import unicodedata
from collections.abc import Sequence
from typing import Any

JAVA_INT_MAX = 2**31 - 1
JAVA_LONG_MAX = 2**63 - 1
"""Kafka's customary "infinite" for a duration in ms (Long.MAX_VALUE)."""

MAX_WAIT_MS = JAVA_INT_MAX
"""Durations that the runtime waits for are clamped to this (about 24.8 days).

Why this number: it is the longest wait every layer accepts. librdkafka takes
timeouts as a C int of milliseconds (a bigger one wraps, and then a flush or
a poll may return at once), and Python's waits raise OverflowError beyond
`threading.TIMEOUT_MAX` (about 292 years here, less on some platforms). So
Kafka's "infinite", 9223372036854775807, is accepted and means this.
"""


def clamp_wait_s(seconds: float) -> float:
    """`seconds` as a wait Python and librdkafka can take: 0 to MAX_WAIT_MS / 1000.

    Any thread. Waits with a user-given or configured timeout go through this,
    so no value reaches `Event.wait` or `Thread.join` that would raise
    OverflowError there (and leave a shutdown half done). NaN is refused.
    """
    if math.isnan(seconds):
        raise ValueError("a timeout cannot be NaN")
    return min(max(0.0, float(seconds)), MAX_WAIT_MS / 1000.0)


THREADS_CEILING = 1024
"""The highest `processing.threads.limit` allowed (one OS thread each)."""

MAX_INT_DIGITS = len(str(JAVA_LONG_MAX))  # 19: no key takes more, checked before int()
MAX_STR_CHARS = 4096  # no string key needs more (PATH_MAX on Linux)
UNIX_SOCKET_PATH_MAX = 107  # sun_path is 108 bytes, NUL included

MAX_CONFIG_FILE_BYTES = 4 * 1024 * 1024
"""The largest `--config` file read. A real one is a few kilobytes; without a
bound, `--config /dev/zero` (or a multi-gigabyte mistake) grew memory until the
machine gave out instead of failing (issue 31)."""

MAX_CONFIG_NESTING = 32
"""The deepest nesting of tables and arrays a `--config` file may have. Dotted
keys are a few levels deep (`[consumer.ssl]`: 2); tomllib parses nesting by
recursion, and 600 levels of `[[[...]]]` ended in a RecursionError traceback."""


class Invalid(Exception):
    """A value failed validation; the caller adds the key (internal)."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# Containers are shown a few levels deep: repr() of a list nested 2,000 deep
# (a TOML array, an App dict) raises RecursionError, and one of a million
# items is unreadable.
_SHORT_REPR = reprlib.Repr()
_SHORT_REPR.maxlevel = 3
_SHORT_REPR.maxstring = 40
_SHORT_REPR.maxother = 40


def show_value(value: Any, limit: int = 80) -> str:
    """A short, one-line repr for error messages: a config value may be
    megabytes long, nested thousands deep, or an object whose repr raises."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 128:
        # repr() of a huge int raises beyond 4300 digits; it is unreadable long before.
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"an integer of about {digits} digits"
    if isinstance(value, str) and len(value) > limit:
        return f"{repr(value[:limit])[:limit]}... ({len(value)} characters)"
    try:
        if isinstance(value, list | tuple | dict | set | frozenset):
            text = _SHORT_REPR.repr(value)
        else:
            text = repr(value)
    except Exception:  # a user object's __repr__ (an App dict takes anything)
        text = f"<{type(value).__name__} object>"
    text = one_line(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def is_control(char: str) -> bool:
    """C0/C1 controls (newline, escape, NEL ...) and the Unicode line and
    paragraph separators: characters that break a message or a name onto
    another line or change how a terminal shows what follows."""
    return unicodedata.category(char) in ("Cc", "Zl", "Zp")


def one_line(text: str) -> str:
    """`text` with control characters escaped as Python writes them (`\\n`):
    an error message is one line whatever value or path it quotes."""
    if not any(is_control(c) for c in text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii") if is_control(c) else c for c in text)


def close_match(text: str, choices: Sequence[str]) -> str | None:
    """The choice closest to `text`, for "did you mean"; None for long input."""
    if len(text) > 200:
        return None
    close = difflib.get_close_matches(text, list(choices), n=1)
    return close[0] if close else None


# String validators (ConfigKey.check): each raises Invalid saying what is wrong.

_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?", re.ASCII)
_PORT = re.compile(r"[0-9]{1,5}", re.ASCII)
_SECURITY_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")


def check_host(host: str) -> None:
    """An IPv4/IPv6 address or a DNS name (labels of 1-63 characters, IDNA-encodable)."""
    if not host:
        raise Invalid("empty host")
    try:
        ipaddress.ip_address(host)
        return
    except ValueError:
        pass
    try:
        encoded = host.encode("idna").decode("ascii")
    except UnicodeError as exc:  # a label longer than 63, an empty label, ...
        raise Invalid(f"{show_value(host)} is not a valid host name: {exc}") from None
    name = encoded[:-1] if encoded.endswith(".") else encoded
    if not name or len(name) > 253:
        raise Invalid(f"{show_value(host)} is not a valid host name (1 to 253 characters)")
    labels = name.split(".")
    for label in labels:
        if not _HOST_LABEL.fullmatch(label):
            raise Invalid(
                f"{show_value(host)} is not a valid host name or IP address "
                f"(label {show_value(label)}: letters, digits, '-', '_', 1 to 63 characters)"
            )
    if all(label.isdigit() for label in labels):
        raise Invalid(f"{show_value(host)} is not a valid IPv4 address")


def check_port(text: str, what: str) -> int:
    """A TCP port 1..65535 written in ASCII digits."""
    if not _PORT.fullmatch(text) or not 1 <= int(text) <= 65535:
        raise Invalid(f"{what}: the port must be 1 to 65535, got {show_value(text)}")
    return int(text)


def check_bootstrap_servers(value: str) -> None:
    """`host:port[,host:port...]`; IPv6 as `[addr]:port`; an optional `PROTOCOL://`."""
    for raw in value.split(","):
        entry = raw.strip()
        if not entry:
            raise Invalid(f"empty entry in {show_value(value)}: expected host:port,host:port")
        scheme, sep, rest = entry.partition("://")
        if sep:
            if scheme.upper() not in _SECURITY_PROTOCOLS:
                raise Invalid(
                    f"{show_value(entry)}: unknown protocol {show_value(scheme)} "
                    f"(one of {', '.join(_SECURITY_PROTOCOLS)})"
                )
            entry = rest
        if entry.startswith("["):
            host, bracket, port = entry[1:].partition("]")
            if not bracket or not port.startswith(":"):
                raise Invalid(f"{show_value(entry)}: expected [IPv6 address]:port")
            try:
                ipaddress.IPv6Address(host)
            except ValueError:
                raise Invalid(f"{show_value(entry)}: not an IPv6 address in brackets") from None
            check_port(port[1:], show_value(entry))
            continue
        host, colon, port = entry.rpartition(":")
        if not colon:
            raise Invalid(f"{show_value(entry)}: expected host:port (no port given)")
        if ":" in host:
            raise Invalid(f"{show_value(entry)}: write an IPv6 address as [address]:port")
        check_port(port, show_value(entry))
        check_host(host)


def check_name(value: str) -> None:
    """Names that become topic-name and directory parts: not "." or ".."."""
    if value in (".", ".."):
        raise Invalid(f"{value!r} is not allowed (it is a directory name, not a topic)")


def check_no_controls(value: str) -> None:
    """No control characters (`is_control`): names and paths end up in log
    lines, error messages, topic names and file names, where a newline or an
    escape sequence forges or hides output."""
    if any(is_control(c) for c in value):
        raise Invalid(f"contains control characters: {show_value(value)}")


def check_socket_path(value: str) -> None:
    check_no_controls(value)
    try:
        length = len(os.fsencode(os.path.abspath(value)))
    except (UnicodeError, ValueError) as exc:
        raise Invalid(f"not a usable path: {exc}") from None
    if length > UNIX_SOCKET_PATH_MAX:
        raise Invalid(
            f"too long for a Unix socket ({length} bytes as an absolute path, "
            f"at most {UNIX_SOCKET_PATH_MAX})"
        )


def check_path(value: str) -> None:
    check_no_controls(value)
    try:
        os.fsencode(value)
    except UnicodeError as exc:
        raise Invalid(f"not a usable path: {exc}") from None


MAX_SERDE_CHARS = 1000


# S3's bucket naming rules (3-63 characters: lower-case letters, digits, dots,
# hyphens; a letter or digit at each end).
_BUCKET = re.compile(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", re.ASCII)


def parse_remote_url(value: str) -> tuple[str, str]:
    """`s3://bucket/prefix` -> (bucket, prefix without slashes at its ends).

    The prefix may be empty; its parts must not be empty, "." or "..".
    Raises `Invalid`.
    """
    check_no_controls(value)
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() != "s3":
        raise Invalid(f"expected s3://bucket/prefix, got {show_value(value)}")
    bucket, _, prefix = rest.partition("/")
    if not _BUCKET.fullmatch(bucket):
        raise Invalid(
            f"{show_value(bucket)} is not an S3 bucket name (3-63 characters: a-z, 0-9, "
            "'.', '-', starting and ending with a letter or digit)"
        )
    prefix = prefix.strip("/")
    if prefix and any(part in ("", ".", "..") for part in prefix.split("/")):
        raise Invalid(f"the prefix {show_value(prefix)} has an empty, '.' or '..' part")
    return bucket, prefix


def check_remote_url(value: str) -> None:
    parse_remote_url(value)


def check_http_url(value: str) -> None:
    """An endpoint URL: http(s)://host[:port][/path]."""
    check_no_controls(value)
    scheme, sep, rest = value.partition("://")
    if not sep or scheme.lower() not in ("http", "https"):
        raise Invalid(f"expected http://host:port or https://host:port, got {show_value(value)}")
    hostport = rest.split("/", 1)[0]
    if not hostport:
        raise Invalid(f"no host in {show_value(value)}")
    host, port = hostport, ""
    if hostport.startswith("["):
        host, _, tail = hostport[1:].partition("]")
        port = tail[1:] if tail.startswith(":") else ""
    elif ":" in hostport:
        host, _, port = hostport.rpartition(":")
    check_host(host)
    if port:
        check_port(port, show_value(hostport))
