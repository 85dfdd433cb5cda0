"""Issue 20, install size: `./dev demo` installs the runtime alone; the Spark
extra comes with `./dev test` (through the dev extra) or on demand."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
HEAVY = ("pyspark", "pyarrow", "pandas", "matplotlib", "pytest", "hypothesis", "boto3", "botocore")


def _names(requirements: list[str]) -> set[str]:
    return {re.split(r"[\[<>=!~; ]", r, maxsplit=1)[0].lower() for r in requirements}


def test_the_runtime_alone_needs_none_of_the_extras() -> None:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    assert not _names(project["dependencies"]) & set(HEAVY)
    extras = project["optional-dependencies"]
    assert "streams-runtime[spark]" in extras["dev"]  # ./dev test brings PySpark
    assert {"pyspark", "pyarrow", "pandas"} <= _names(extras["spark"])
    assert "streams-runtime[remote]" in extras["dev"]  # and the remote state tests boto3
    assert _names(extras["remote"]) == {"boto3"}


def test_demo_and_cli_import_without_the_extras() -> None:
    """What `streams-runtime demo` and `run` import, with every extra's package
    made unimportable."""
    blocked = "; ".join(f"sys.modules[{name!r}] = None" for name in HEAVY)
    code = f"import sys; {blocked}; import runtime.cli, runtime.demo, runtime.admin.daemon"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr


def _dev_functions() -> str:
    """`has_extras` and `union_extras` from the dev script, to run in bash."""
    script = (REPO / "dev").read_text()
    return "\n".join(
        re.search(rf"^{name}\(\) {{\n.*?^}}$", script, flags=re.S | re.M).group(0)  # type: ignore[union-attr]
        for name in ("has_extras", "union_extras")
    )


def _bash(body: str, tmp_path: Path) -> str:
    result = subprocess.run(
        ["bash", "-c", _dev_functions() + "\n" + body],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_dev_installs_what_each_command_needs_and_never_less(tmp_path: Path) -> None:
    out = _bash(
        """
        s=stamp
        has_extras $s "" || echo "none: install"
        echo "" > $s
        has_extras $s "" && echo "demo: ok"
        has_extras $s dev || echo "test: install $(union_extras $s dev)"
        echo dev > $s
        has_extras $s dev && echo "test: ok"
        has_extras $s "" && echo "demo after test: ok"
        has_extras $s dev,bench || echo "bench: install $(union_extras $s dev,bench)"
        echo bench,dev > $s
        has_extras $s dev && has_extras $s dev,bench && echo "all: ok"
        """,
        tmp_path,
    )
    assert out.split("\n")[:-1] == [
        "none: install",
        "demo: ok",
        "test: install dev",
        "test: ok",
        "demo after test: ok",
        "bench: install bench,dev",
        "all: ok",
    ]
    script = (REPO / "dev").read_text()
    assert re.search(r'^demo\)\n    ensure_venv ""$', script, flags=re.M)
    assert re.search(r"^test\)\n    ensure_venv dev$", script, flags=re.M)
    assert re.search(r"^bench\)\n    ensure_venv dev,bench$", script, flags=re.M)


def test_dev_union_extras_survives_pipefail_with_nothing_to_install() -> None:
    """Issue 32: on a fresh clone `./dev demo` needs no extras; `grep -v '^$'` on
    empty input exited 1 and pipefail ended the script without a word."""
    dev = (REPO / "dev").read_text()
    start = dev.index("union_extras() {")
    function = dev[start : dev.index("\n}\n", start) + 3]
    script = f"set -euo pipefail\n{function}\necho \"[$(union_extras /nonexistent '')]\"\n"
    script += "echo \"[$(union_extras /nonexistent 'dev,bench')]\"\n"
    result = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[]", "[bench,dev]"]
