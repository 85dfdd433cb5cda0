"""The suite's own layout: pytest imports test files by basename (the test
folders have no `__init__.py`), so two files of one name in different folders
break collection of the whole suite, which running one folder never shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_no_two_test_files_share_a_basename() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    clashes = sorted(name for name, count in names.items() if count > 1)
    assert not clashes, f"rename one of each: {clashes}"
