"""The docs site (issue 33): `mkdocs build --strict` passes (a broken link or
anchor fails it), and the API reference covers every name `runtime` exports."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

import runtime

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site, built once per session into a temporary directory."""
    if importlib.util.find_spec("mkdocs") is None:
        pytest.skip("mkdocs is not installed (the docs extra: pip install -e '.[docs]')")
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    built = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-5000:]
    return out


def test_the_site_builds_strictly(site: Path) -> None:
    pages = {p.parent.name for p in site.glob("*/index.html")}
    nav = (REPO / "mkdocs.yml").read_text()
    listed = set(re.findall(r"^  - [^:]+: ([\w-]+)\.md$", nav, flags=re.M)) - {"index"}
    assert listed, "no pages in mkdocs.yml's nav"
    assert listed <= pages
    on_disk = {p.stem for p in (REPO / "docs").glob("*.md")} - {"index"}
    assert on_disk == listed, "every page in docs/ is in the nav, and only those"


def test_the_api_reference_covers_every_exported_name(site: Path) -> None:
    page = (site / "api" / "index.html").read_text(encoding="utf-8")
    missing = [name for name in runtime.__all__ if f'id="runtime.{name}"' not in page]
    assert not missing, f"not in docs/api.md's output: {missing}"


def _expand(pattern: str) -> list[str]:
    """`a-{x,y}.md` -> `a-x.md`, `a-y.md` (shell brace expansion, as the pages write it)."""
    found = re.search(r"\{([^}]*)\}", pattern)
    if not found:
        return [pattern]
    head, tail = pattern[: found.start()], pattern[found.end() :]
    return [name for alt in found.group(1).split(",") for name in _expand(head + alt + tail)]


def test_every_quoted_result_file_exists() -> None:
    """A `results/...` file the README or a docs page quotes is committed
    (benchmarks/results/ is pruned now and then)."""
    results = REPO / "benchmarks" / "results"
    pages = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    quoted = {
        (page.name, name)
        for page in pages
        for pattern in re.findall(
            r"results/([\w./{},*-]+\.(?:md|json|png))", page.read_text(encoding="utf-8")
        )
        for name in _expand(pattern)
        if not name.startswith("local/")
    }
    assert quoted
    missing = sorted((page, name) for page, name in quoted if not list(results.glob(name)))
    assert not missing, f"quoted but not in benchmarks/results/: {missing}"
