"""Issue 31, item 8: config and start-up edges a fuzzer found, as one generated
list of hostile cases. Each must end in a clean refusal: a `ConfigError` (or,
from the command line, exit 2) with a one-line message naming the key, the
file or what MODULE:ATTR must name; never a traceback, never a hang, never
exit 0, never output on stdout.

In-process where only the error matters; a CLI subprocess (with a timeout and
a memory cap) where the exit code does or a regression would hang, abort or
exit the test process itself (`--config /dev/zero`, `run os:abort`).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from runtime import cli
from runtime.config import ConfigError, StreamsConfig, load_config
from runtime.config_values import MAX_CONFIG_FILE_BYTES
from runtime.kafka.startup_checks import check_admin_socket_dir, check_startup
from runtime.topology.loading import load_topology

REPO = Path(__file__).resolve().parents[3]
REQUIRED = {"application.id": "app", "bootstrap.servers": "127.0.0.1:1"}
BASE_SETS = ["application.id=edges", "bootstrap.servers=127.0.0.1:1"]
CONTROLS = ["\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\u2028"]


class BadRepr:
    def __repr__(self) -> str:
        raise RuntimeError("no repr")


def deep_list(depth: int) -> Any:
    value: Any = 1
    for _ in range(depth):
        value = [value]
    return value


@dataclass(frozen=True)
class Case:
    """One hostile input.

    kind "dict": `payload` is extra keys for `StreamsConfig.from_dict`;
    "set": `--set` strings for `load_config`; "toml": the bytes of a
    `--config` file (the test writes it); "path": a `--config` path for
    `load_config`; "target": MODULE:ATTR for `load_topology` (which raises
    ValueError); "cli": argv after `run` for a subprocess; "socket": the
    `admin.socket` path for the start-up check. `{tmp}` in a path is a fresh
    directory. `names`: what the one-line message must contain (the key, or
    the reason).
    """

    id: str
    kind: str
    payload: Any
    names: str


def hostile_cases() -> Iterator[Case]:
    # Control characters in names, ids and paths: refused, and the message
    # stays one line (a two-line application.id printed a two-line error).
    keys = ["application.id", "client.id", "state.dir", "admin.socket"]
    keys += [prefix + "client.id" for prefix in ("consumer.", "producer.", "admin.")]
    keys += ["restore.consumer.client.id", "consumer.group.instance.id"]
    for key in keys:
        for n, char in enumerate(CONTROLS):
            value = f"/tmp/a{char}b" if key in ("state.dir", "admin.socket") else f"a{char}b"
            yield Case(f"control-{key}-{n}", "set", [f"{key}={value}"], f"'{key}'")
    # Values nested past any stack (typed, as an App dict gives them).
    for depth in (40, 1_000, 5_000):
        for key in ("processing.threads", "consumer.session.timeout.ms", "security.protocol"):
            yield Case(f"deep-{key}-{depth}", "dict", {key: deep_list(depth)}, f"'{key}'")
    yield Case("bad-repr", "dict", {"processing.threads": BadRepr()}, "'processing.threads'")
    # TOML files: deep arrays, inline tables and table headers, wrong bytes, too big.
    for depth in (33, 400, 600, 2_000, 20_000):
        yield Case(f"toml-array-{depth}", "toml", f"x = {'[' * depth}{']' * depth}\n", "nested")
        inline = "{a = " * depth + "1" + "}" * depth
        yield Case(f"toml-inline-{depth}", "toml", f"x = {inline}\n", "nested")
        header = ".".join(["t"] * depth)
        yield Case(f"toml-tables-{depth}", "toml", f"[{header}]\nx = 1\n", "nested")
    yield Case("toml-latin1", "toml", b'"application.id" = "caf\xe9"\n', "not UTF-8")
    yield Case("toml-nul", "toml", b"x = 1\x00\n", "not valid TOML")
    big = b"# " + b"x" * (MAX_CONFIG_FILE_BYTES + 10) + b"\n"
    yield Case("toml-too-big", "toml", big, "larger than")
    yield Case("toml-newline-key", "toml", '"a\\nb" = 1\n', "'a\\nb'")
    # --config paths that are no regular file: refused before any read (in a
    # subprocess where a regression would hang the test or fill memory).
    run = ["tests.apps.passthrough:topology"]
    for path in ("/dev/zero", "/dev/urandom", "{tmp}/fifo"):
        yield Case(f"config-{path}", "cli", [*run, "--config", path], "not a regular file")
    for path in ("{tmp}", "/dev/null"):
        yield Case(f"config-{path}", "path", path, "not a regular file")
    yield Case("config-missing", "path", "{tmp}/nope.toml", "cannot read")
    yield Case("config-nul", "path", "{tmp}/a\x00b", "cannot read")
    # MODULE:ATTR that is no topology: never imported (the standard library)
    # or never called. Those that would end or print from the test process if
    # they got through run in a subprocess, where the exit code shows.
    must = "MODULE:ATTR must name"
    for target in ("sys:exit", "builtins:exit", "builtins:quit", "os:abort", "os:_exit",
                   "this:x", "antigravity:x", "__main__:main"):  # fmt: skip
        yield Case(f"cli-{target}", "cli", [target], must)
    yield Case("cli-user-abort", "cli", ["hostile_targets:abort"], "hostile_targets")
    yield Case("cli-exits-on-import", "cli", ["exits_on_import:x"], "sys.exit(0)")
    for target in ("json:loads", "os.path:join", "collections:OrderedDict", "xml.dom:x"):
        yield Case(f"target-{target}", "target", target, must)
    for attr in ("rmtree", "Factory", "needs_argument", "print_it"):
        yield Case(f"target-user-{attr}", "target", f"hostile_targets:{attr}", "hostile_targets")
    yield Case("target-control", "target", "a\nb:c", "control characters")
    # admin.socket where no socket can be made: found before start-up goes on.
    for path in ("{tmp}/missing/dir/admin.sock", "/proc/admin.sock", "/dev/null/admin.sock"):
        yield Case(f"socket-{path}", "socket", path, "'admin.socket'")


CASES = list(hostile_cases())

USER_MODULES = {
    # A user module re-exporting what must not be called, and one that exits.
    "hostile_targets.py": """
        import builtins
        from os import abort
        from shutil import rmtree

        class Factory:
            def __init__(self):
                raise AssertionError("a class is never called")

        def needs_argument(x):
            raise AssertionError("never called")

        print_it = builtins.print
    """,
    "exits_on_import.py": """
        import sys
        sys.exit(0)
    """,
}


def _write_user_modules(tmp: Path) -> None:
    for name, text in USER_MODULES.items():
        (tmp / name).write_text(textwrap.dedent(text))


def _run_cli(argv: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    _write_user_modules(tmp)
    os.mkfifo(tmp / "fifo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("STREAMS_RUNTIME_")}
    env.update(STREAMS_TEST_INPUT="in", STREAMS_TEST_OUTPUT="out", PYTHONPATH=str(REPO))

    def cap_memory() -> None:  # a regression reading /dev/zero must not take the machine
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    sets = [arg for s in BASE_SETS for arg in ("--set", s)]
    return subprocess.run(
        [sys.executable, "-m", "runtime", "run", *argv, *sets, "--set", f"state.dir={tmp}/s"],
        cwd=tmp,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=cap_memory,
    )


def _refusal(case: Case, tmp: Path) -> Exception:
    """The error an in-process case raises (the test fails if none)."""
    attempt: Callable[[], Any]
    if case.kind == "target":
        with pytest.raises(ValueError) as refused:
            load_topology(case.payload)
        assert not isinstance(refused.value, ConfigError)
        return refused.value
    if case.kind == "dict":

        def attempt() -> Any:
            return StreamsConfig.from_dict({**REQUIRED, **case.payload})

    elif case.kind == "set":

        def attempt() -> Any:
            return load_config(sets=[*BASE_SETS, *case.payload], env={})

    elif case.kind == "toml":
        path = tmp / "app.toml"
        data = case.payload if isinstance(case.payload, bytes) else case.payload.encode()
        path.write_bytes(data)

        def attempt() -> Any:
            return load_config(str(path), sets=BASE_SETS, env={})

    elif case.kind == "path":

        def attempt() -> Any:
            return load_config(case.payload.replace("{tmp}", str(tmp)), sets=BASE_SETS, env={})

    else:
        socket = case.payload.replace("{tmp}", str(tmp))
        config = StreamsConfig.from_dict({**REQUIRED, "admin.socket": socket})

        def attempt() -> Any:
            return check_startup(config, uses_state_dir=False)

    with pytest.raises(ConfigError) as info:
        attempt()
    return info.value


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_hostile_input_is_refused_on_one_line(
    case: Case, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if case.kind == "target":
        _write_user_modules(tmp_path)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.delitem(sys.modules, "hostile_targets", raising=False)
    if case.kind == "cli":
        argv = [a.replace("{tmp}", str(tmp_path)) for a in case.payload]
        done = _run_cli(argv, tmp_path)
        assert done.returncode == 2, (done.returncode, done.stderr[-2000:])
        assert done.stdout == "", "nothing on stdout (`this` printed the Zen of Python)"
        lines = done.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("streams-runtime: "), done.stderr
        assert case.names in lines[0], lines[0]
        return
    error = _refusal(case, tmp_path)
    message = str(error)
    assert "\n" not in message and "\r" not in message, message
    assert not any(c in message for c in CONTROLS), message
    assert len(message) < 1000
    assert case.names in message, message


def test_the_list_covers_each_edge_the_fuzzer_found() -> None:
    ids = {c.id for c in CASES}
    assert {"toml-array-2000", "config-/dev/zero", "cli-sys:exit", "cli-builtins:exit"} <= ids
    assert {"cli-os:abort", "cli-this:x", "control-application.id-0"} <= ids
    assert {"control-state.dir-0", "socket-{tmp}/missing/dir/admin.sock"} <= ids


# --- what is still accepted ------------------------------------------------------------------


def test_a_nested_config_file_within_the_limit_loads(tmp_path: Path) -> None:
    path = tmp_path / "app.toml"
    path.write_text(
        '"application.id" = "a"\n"bootstrap.servers" = "b:1"\n'
        "[consumer.topic.metadata.refresh]\n'interval.ms' = 1000\n"
        "[consumer]\n'session.timeout.ms' = 6000\n"
        "[ssl.endpoint.identification]\nalgorithm = 'none'\n"
    )
    config = load_config(str(path), env={})
    assert config.consumer_overrides == {
        "topic.metadata.refresh.interval.ms": 1000,
        "session.timeout.ms": 6000,
        "ssl.endpoint.identification.algorithm": "none",  # unprefixed: every client's
    }
    assert config.admin_overrides == {"ssl.endpoint.identification.algorithm": "none"}


def test_the_admin_socket_directory_is_checked_not_created(tmp_path: Path) -> None:
    check_admin_socket_dir(str(tmp_path / "admin.sock"))
    with pytest.raises(ConfigError, match="does not exist"):
        check_admin_socket_dir(str(tmp_path / "new" / "admin.sock"))
    assert not (tmp_path / "new").exists()
    assert os.listdir(tmp_path) == [], "the write probe leaves nothing behind"


def test_a_users_topology_function_is_still_called(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "my_topology_app.py").write_text(
        textwrap.dedent(
            """
            from runtime import StreamsBuilder

            def build():
                builder = StreamsBuilder()
                builder.stream("in").to("out")
                return builder.build()

            def build_queries(prefix="q"):
                return {prefix: build()}
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    assert load_topology("my_topology_app:build").subtopologies
    assert set(load_topology("my_topology_app:build_queries", named=True)) == {"q"}


def test_a_user_module_named_like_the_stdlib_is_the_users(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`sys.stdlib_module_names` alone would refuse a user's `xdrlib.py`; where the
    module is loaded from decides."""
    assert "xdrlib" in sys.stdlib_module_names
    monkeypatch.delitem(sys.modules, "xdrlib", raising=False)
    (tmp_path / "xdrlib.py").write_text(
        "from runtime import StreamsBuilder\n"
        "builder = StreamsBuilder()\n"
        "builder.stream('in').to('out')\n"
        "topology = builder.build()\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        assert load_topology("xdrlib:topology").subtopologies
    finally:
        sys.modules.pop("xdrlib", None)


def test_run_refuses_an_admin_socket_it_cannot_make_before_start_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: Any
) -> None:
    """Before issue 31 a missing socket directory stopped the daemon only after
    it had joined the group; now `run` exits 2 before contacting any broker."""
    monkeypatch.setenv("STREAMS_TEST_INPUT", "in")
    monkeypatch.setenv("STREAMS_TEST_OUTPUT", "out")
    for variable in [v for v in os.environ if v.startswith("STREAMS_RUNTIME_")]:
        monkeypatch.delenv(variable)
    argv = ["run", "tests.apps.passthrough:topology", *(a for s in BASE_SETS for a in ("--set", s))]
    argv += ["--set", f"state.dir={tmp_path}", "--set", f"admin.socket={tmp_path}/no/a.sock"]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "config key 'admin.socket'" in err, err
    assert "does not exist" in err
