"""The structure drawn from the code's own imports (issue 33): no import
cycles outside the DSL, and no upward import from a lower layer.

Layers, bottom first (a module may import its own layer and those below):

    0  logging, config_values, error_handlers, librdkafka_properties, gc_tuning, brokers
    1  state            stores, caching, changelogging, restoration
    2  topology         the DSL, processor graph, serdes (uses state's stores)
    3  config, partitioning   typed settings (naming serdes and partitioners)
    4  collector, kafka
    5  processing       tasks, locks, the scheduler, processing threads
    6  placement, polling
    7  the app and its front ends: app (lifecycle, assembly, failure_policy,
       query_operations, store_lookup), status, metrics, queries, isolation,
       admin, commands, cli, demo, spark

Imports under `if TYPE_CHECKING:` are type names only and do not count.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

RUNTIME = Path(__file__).resolve().parents[3] / "runtime"

LAYER = {
    "logging": 0,
    "config_values": 0,
    "librdkafka_properties": 0,
    "error_handlers": 0,
    "gc_tuning": 0,
    "murmur2": 0,
    "brokers": 0,
    "state": 1,
    "topology": 2,
    "config": 3,
    "partitioning": 3,
    "collector": 4,
    "kafka": 4,
    "processing": 5,
    "placement": 6,
    "polling": 6,
}
TOP = 7
# Import cycles allowed: the DSL's fluent classes return each other.
DSL = {"builder", "kstream", "ktable", "grouped", "cogroup"}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in RUNTIME.rglob("*.py"):
        parts = path.relative_to(RUNTIME.parent).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        mods[name] = path
    return mods


def _imports(name: str, path: Path, mods: dict[str, Path]) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    type_only: set[int] = set()
    for node in ast.walk(tree):
        test = getattr(node, "test", None)
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(test or node):
            type_only.update(id(child) for child in ast.walk(node))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            for alias in node.names:
                candidate = f"{module}.{alias.name}"
                found.add(candidate if candidate in mods else module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
    return {m for m in found if m in mods and m != name}


def _graph() -> dict[str, set[str]]:
    mods = _modules()
    return {name: _imports(name, path, mods) for name, path in mods.items()}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYER.get(parts[1], TOP) if len(parts) > 1 else TOP


def test_no_upward_imports() -> None:
    upward = sorted(
        f"{a} -> {b}" for a, targets in _graph().items() for b in targets if _layer(b) > _layer(a)
    )
    assert not upward, "imports from a lower layer into a higher one:\n" + "\n".join(upward)


def test_no_import_cycles_outside_the_dsl() -> None:
    graph = _graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    outside = [
        c
        for c in cycles
        if not all(m.startswith("runtime.topology.") and m.rsplit(".", 1)[1] in DSL for m in c)
    ]
    assert not outside, f"import cycles: {outside}"


def test_every_package_says_what_it_holds() -> None:
    """Each folder's `__init__.py` says in a few lines what it owns."""
    bare = sorted(
        str(init.relative_to(RUNTIME.parent))
        for init in RUNTIME.rglob("__init__.py")
        if not (ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or "").strip()
    )
    assert not bare, f"no docstring: {bare}"


# Kept for the report of what depends on what (not a test).
def package_graph() -> dict[str, set[str]]:
    out: dict[str, set[str]] = defaultdict(set)
    for a, targets in _graph().items():
        for b in targets:
            pa, pb = a.split(".")[1], b.split(".")[1]
            if pa != pb:
                out[pa].add(pb)
    return out
