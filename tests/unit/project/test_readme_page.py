"""README.md is the front page (issue 33): short, its links work, and what it
states about the suite and the settings is true."""

from __future__ import annotations

import re
import subprocess
import sys
import unicodedata
from pathlib import Path

from runtime.config import KEYS

REPO = Path(__file__).resolve().parents[3]
README = REPO / "README.md"
MAX_LINES = 350
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc extension (MkDocs) gives a heading."""
    text = re.sub(r"`", "", heading)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def _anchors(page: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", page.read_text(encoding="utf-8"), flags=re.S)
    return {_slug(h) for h in re.findall(r"^#{1,6} (.+)$", text, flags=re.M)}


def test_readme_is_a_front_page() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= MAX_LINES, f"README.md has {len(lines)} lines; the rest goes to docs/"


def test_every_relative_link_in_the_readme_exists() -> None:
    text = README.read_text(encoding="utf-8")
    links = [t for t in LINK.findall(text) if not re.match(r"[a-z]+:", t)]
    assert links
    broken = []
    for target in links:
        path, _, anchor = target.partition("#")
        file = README if not path else (REPO / path)
        checks_anchor = bool(anchor) and file.suffix == ".md"
        if not file.exists() or (checks_anchor and anchor not in _anchors(file)):
            broken.append(target)
    assert not broken, f"README.md links to what does not exist: {broken}"


def test_the_stated_test_count_is_true() -> None:
    """README.md (and docs/) say "more than N tests": true, and not far below
    the count (within 15%), so the figure is raised as the suite grows."""
    collected = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=240,
    )
    found = re.search(r"^(\d+) tests? collected", collected.stdout, flags=re.M)
    assert found, collected.stdout[-2000:] + collected.stderr[-2000:]
    count = int(found.group(1))
    pages = [README, *sorted((REPO / "docs").glob("*.md"))]
    stated = {
        (page.name, int(n.replace(",", "")))
        for page in pages
        for n in re.findall(r"more than ([\d,]+) tests", page.read_text(encoding="utf-8"))
    }
    assert any(name == "README.md" for name, _ in stated), "README.md states no test count"
    for name, n in stated:
        assert n < count <= n * 1.15, f"{name} says more than {n:,} tests; there are {count:,}"


def test_the_readme_settings_table_matches_the_config() -> None:
    """Each row of "Settings most people need" names a key and its default as
    the configuration reference (generated from runtime/config/) does."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Settings most people need") :]
    section = section[: section.index("\n## ")]
    rows = re.findall(r"^\| `([a-z.]+)` \| (.+?) \| .+ \|$", section, flags=re.M)
    assert 8 <= len(rows) <= 15
    for key, default in rows:
        assert key in KEYS, f"README.md lists unknown key {key!r}"
        assert default == KEYS[key].default_doc_text(), f"README.md: default of {key!r}"


def test_the_readme_example_is_the_getting_started_example() -> None:
    """The example's code blocks are the same on both pages."""
    guide = (REPO / "docs" / "getting-started.md").read_text(encoding="utf-8")
    text = README.read_text(encoding="utf-8")
    example = text[text.index("## Example") :]
    example = example[: example.index("\n## ")]
    blocks = re.findall(r"```[a-z]*\n.*?```", example, flags=re.S)
    assert len(blocks) >= 3
    for block in blocks:
        assert block in guide, f"not in docs/getting-started.md: {block.splitlines()[1]}"
