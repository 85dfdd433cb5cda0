"""The suite's own layout: pytest imports test files by basename (the test
folders have no `__init__.py`), so two files of one name in different folders
break collection of the whole suite, which running one folder never shows."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parents[2]


def test_no_two_test_files_share_a_basename() -> None:
    names = Counter(path.name for path in TESTS.rglob("test_*.py"))
    clashes = sorted(name for name, count in names.items() if count > 1)
    assert not clashes, f"rename one of each: {clashes}"


def test_unit_tests_mirror_the_package() -> None:
    """Issue 33: a unit test lives in `tests/unit/<package>/`, the package of
    `runtime/` it tests (`app` and `config` for the top-level modules, `project` for the
    repository itself, `benchmarks` for the benchmark harness)."""
    runtime = TESTS.parent / "runtime"
    packages = {p.name for p in runtime.iterdir() if (p / "__init__.py").exists()}
    allowed = packages | {"app", "config", "project", "benchmarks"}
    unit = TESTS / "unit"
    loose = sorted(p.name for p in unit.glob("test_*.py"))
    assert not loose, f"move into tests/unit/<package>/: {loose}"
    folders = sorted(p.name for p in unit.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert set(folders) <= allowed, f"not a package of runtime/: {set(folders) - allowed}"
