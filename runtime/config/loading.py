"""Loading a config: base dict < TOML file < environment < `--set`.

`load_config` merges the sources, remembering where each key came from (an
error names the file, variable or `--set` string), and validates the result
once with `build_config`. A bad file is a `ConfigError` (exit 2 from the
CLI), never a traceback or a hang: the file is read bounded and non-blocking,
and nesting is limited before anything recurses. Called on the caller's
thread (the CLI, `App`).
"""

from __future__ import annotations

import os
import stat
import tomllib
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from runtime.config.keys import ConfigError
from runtime.config.settings import StreamsConfig, build_config
from runtime.config_values import MAX_CONFIG_FILE_BYTES, MAX_CONFIG_NESTING

ENV_PREFIX = "STREAMS_RUNTIME_"


def _flatten(table: Mapping[str, Any], path: str) -> dict[str, Any]:
    """The document's settings, nested tables flattened to dotted keys.

    Iterative, and no deeper than MAX_CONFIG_NESTING tables and arrays (a
    value nested deeper is refused here, before anything recurses into it:
    the validation of a key, `repr` in a message, `==`)."""
    settings: dict[str, Any] = {}
    # Depth first, in the document's order: (prefix, the table's items left).
    stack: list[tuple[str, Iterator[tuple[str, Any]]]] = [("", iter(table.items()))]
    while stack:
        prefix, items = stack[-1]
        entry = next(items, None)
        if entry is None:
            stack.pop()
            continue
        key, value = entry
        dotted = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if len(stack) >= MAX_CONFIG_NESTING:
                raise ConfigError(
                    "", f"tables nested more than {MAX_CONFIG_NESTING} deep", file=path
                )
            stack.append((dotted + ".", iter(value.items())))
            continue
        if _nesting(value) > MAX_CONFIG_NESTING:
            raise ConfigError(
                dotted, f"nested more than {MAX_CONFIG_NESTING} deep (in file {path!r})"
            )
        if dotted in settings:
            raise ConfigError(dotted, f"set twice in {path!r}")
        settings[dotted] = value
    return settings


def _nesting(value: Any) -> int:
    """How deep arrays and inline tables nest in a TOML value (iteratively)."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 0)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list | dict):
            depth += 1
            deepest = max(deepest, depth)
            if depth > MAX_CONFIG_NESTING:
                return depth
            children = item.values() if isinstance(item, dict) else item
            stack.extend((child, depth) for child in children)
    return deepest


def _read_config_file(path: str) -> bytes:
    """The bytes of the `--config` file: a regular file of at most
    MAX_CONFIG_FILE_BYTES, else a `ConfigError`.

    Opened non-blocking, so a FIFO with no writer does not hang the open, and
    refused unless `fstat` says it is a regular file: `/dev/zero`, `/dev/stdin`,
    a pipe or a directory never reach `read`. The read itself is bounded too
    (a regular file may grow, and /proc files report size 0)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", file=path) from None
    except ValueError as exc:  # an embedded NUL: no path the OS can open
        raise ConfigError("", f"cannot read: {exc}", file=path) from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            kind = "a directory" if stat.S_ISDIR(info.st_mode) else "a device, pipe or socket"
            raise ConfigError(
                "", f"is {kind}, not a regular file: give the path of a TOML file", file=path
            )
        limit = MAX_CONFIG_FILE_BYTES
        too_big = (
            f"larger than {limit // (1024 * 1024)} MiB; a config file is a few kilobytes of TOML"
        )
        if info.st_size > limit:
            raise ConfigError("", f"{too_big} ({info.st_size} bytes)", file=path)
        os.set_blocking(fd, True)
        chunks: list[bytes] = []
        size = 0
        while size <= limit:
            chunk = os.read(fd, min(1 << 20, limit + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
        if size > limit:
            raise ConfigError("", too_big, file=path)
        return b"".join(chunks)
    except OSError as exc:
        raise ConfigError("", f"cannot read: {exc.strerror or exc}", file=path) from None
    finally:
        os.close(fd)


def _read_toml(path: str) -> dict[str, Any]:
    """The file's settings, nested tables flattened to dotted keys. Any bad
    file is a `ConfigError` (exit 2), never a traceback or a hang."""
    data = _read_config_file(path)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError(
            "", f"not UTF-8 text (byte {exc.start}): TOML files are UTF-8", file=path
        ) from None
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError("", f"not valid TOML: {exc}", file=path) from None
    except RecursionError:
        # tomllib parses arrays and inline tables by recursion: about 600
        # levels of `[[[...` exhaust Python's stack.
        raise ConfigError(
            "", f"arrays or tables nested more than {MAX_CONFIG_NESTING} deep", file=path
        ) from None
    return _flatten(document, path)


def _env_settings(env: Mapping[str, str]) -> Iterator[tuple[str, str, str]]:
    """(key, value, variable) for each STREAMS_RUNTIME_<KEY> variable."""
    for variable, value in env.items():
        if variable.startswith(ENV_PREFIX) and len(variable) > len(ENV_PREFIX):
            key = variable[len(ENV_PREFIX) :].lower().replace("_", ".")
            yield key, value, variable


def _parse_set(item: str) -> tuple[str, str]:
    key, sep, value = item.partition("=")
    if not sep or not key.strip():
        raise ConfigError(item, "--set expects key=value")
    return key.strip(), value


def load_config(
    toml_path: str | None = None,
    sets: Sequence[str] = (),
    env: Mapping[str, str] | None = None,
    base: Mapping[str, Any] | None = None,
) -> StreamsConfig:
    """Merge and validate the configuration; later sources win.

    Order: `base` (e.g. the dict given to `App`), the TOML file (nested tables
    flattened: `[consumer]` holds `consumer.*` keys), `STREAMS_RUNTIME_<KEY>`
    environment variables (`_` becomes `.`; `env` defaults to `os.environ`),
    then `--set key=value` strings. Raises `ConfigError`.
    """
    merged: dict[str, Any] = dict(base or {})
    sources: dict[str, str] = {}

    def put(key: str, value: Any, where: str) -> None:
        merged[key] = value
        sources[key] = where

    if toml_path is not None:
        for key, value in _read_toml(toml_path).items():
            put(key, value, f"file {toml_path}")
    for key, value, variable in _env_settings(os.environ if env is None else env):
        put(key, value, f"environment variable {variable}")
    for item in sets:
        key, value = _parse_set(item)
        shown = item if len(item) <= 100 else f"{item[:60]}... ({len(item)} characters)"
        put(key, value, f"--set {shown}")
    return build_config(merged, sources)
