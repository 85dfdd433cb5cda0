"""Loading a topology from `MODULE:ATTR` (the CLI's `run`, `topics create`,
`expand`, the admin socket's `query add`, a process-isolated query's child).

Resolves the name as `import` would (or a Python file path), refuses what
must not be imported or called (the standard library, builtins, classes,
functions needing arguments), and says what to do when a name is wrong (the
closest name, where `import` looked). Called on the caller's thread; the
guard against a target that runs the CLI again is per thread.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
from typing import Any

# The factory call of `load_topology` in progress on this thread: a target
# that runs the CLI again (`run runtime.cli:main`) is refused instead of
# recursing until the stack runs out.
_loading = threading.local()


def load_topology(target: str, named: bool = False) -> Any:
    """Resolve MODULE:ATTR to a Topology (calling ATTR if it is a factory).

    ATTR may also be (or return) a mapping query name -> Topology (named
    queries): returned as it is with `named`, else composed into one Topology
    (`topics create` and `expand` see every query's topics).

    MODULE is a module name as `import` finds it from the working directory
    or PYTHONPATH, or a Python file (`wordsplit.py`, `./app/wordsplit.py`),
    imported as the module its name says with its directory first on
    sys.path (`_import_file`). A module or attribute not found is reported
    with where `import` looked and the closest name (issue 32).

    What may be imported and called (issue 31): MODULE must not be the
    standard library or the interpreter's own (`sys:exit`, `os:abort` and
    `this:x`, which prints on import, are refused before any import), and a
    callable ATTR is called only if it is a plain Python function taking no
    arguments, defined outside the standard library (a function in
    site-packages only if its module uses streams-runtime, as a topology
    module does) - never a class, a builtin or C function, or another
    callable. Raises ValueError saying what MODULE:ATTR must name. Runs on the
    caller's thread (the CLI's main thread, the admin loop's executor for
    `query.add`, a query child's main thread).
    """
    from collections.abc import Mapping

    from runtime.config_values import is_control, show_value
    from runtime.topology.named_queries import compose
    from runtime.topology.topology import Topology

    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        stem = os.path.basename(module_name).removesuffix(".py")
        example = f" (e.g. {stem}:topology)" if stem.isidentifier() and not sep else ""
        raise ValueError(f"expected MODULE:ATTR{example}, got {show_value(target)}")
    if any(is_control(c) for c in target):
        raise ValueError(f"MODULE:ATTR contains control characters: {show_value(target)}")
    try:
        cwd = os.getcwd()
    except OSError:  # the working directory was removed: nothing to add
        cwd = None
    if cwd is not None and cwd not in sys.path:
        sys.path.insert(0, cwd)
    try:
        if _is_file_path(module_name):
            # `run ./wordsplit.py:topology`, as people type it (issue 32).
            module = _import_file(module_name, attr)
            module_name = module.__name__
        else:
            _refuse_foreign_module(module_name)
            module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(
            f"cannot import {module_name!r}: {exc}{_import_hint(module_name, exc, cwd)}"
        ) from exc
    except SystemExit as exc:  # the module's own code: not the process's exit status
        raise ValueError(f"importing {module_name!r} called sys.exit({exc.code!r})") from None
    try:
        obj = getattr(module, attr)
    except AttributeError:
        raise ValueError(
            f"module {module_name!r} has no attribute {attr!r}{_attribute_hint(module, attr)}"
        ) from None
    if not isinstance(obj, Topology | Mapping) and callable(obj):
        _check_factory(obj, target)
        if getattr(_loading, "active", False):
            raise ValueError(f"{target} was loaded again while its own function ran")
        _loading.active = True
        try:
            obj = obj()
        except SystemExit as exc:
            raise ValueError(f"{target}() called sys.exit({exc.code!r})") from None
        finally:
            _loading.active = False
    if isinstance(obj, Mapping) and obj and all(isinstance(t, Topology) for t in obj.values()):
        return dict(obj) if named else compose(obj)
    if not isinstance(obj, Topology):
        raise ValueError(
            f"{target} is a {type(obj).__name__}, not a Topology (builder.build()), "
            "a mapping of query name -> Topology, or a function returning one"
        )
    return obj


def _is_file_path(module: str) -> bool:
    """Whether MODULE was written as a file (`wordsplit.py`, `./app/wordsplit`)
    rather than a module name (`wordsplit`, `app.wordsplit`)."""
    return module.endswith(".py") or os.sep in module or (os.altsep or os.sep) in module


def _import_file(path_text: str, attr: str) -> Any:
    """Import the file `path_text` (`.py` may be left out) as the module its
    name says, its directory first on sys.path, so that its own imports of
    modules beside it work as they would with `python wordsplit.py`.

    A stdlib module of that name, or another module of that name already
    imported, would be what `import` returns: refused, saying so. Runs on the
    caller's thread (see `load_topology`)."""
    from runtime.config_values import show_value

    path = os.path.abspath(path_text if path_text.endswith(".py") else path_text + ".py")
    name = os.path.basename(path)[: -len(".py")]
    if not os.path.isfile(path):
        hint = f", e.g. {name}:{attr}" if name.isidentifier() else ""
        raise ValueError(
            f"no such file {show_value(path_text)}; MODULE:ATTR takes a Python file or a module "
            f"name (as `import` would find it from the working directory or PYTHONPATH{hint})"
        )
    if not name.isidentifier():
        raise ValueError(
            f"{show_value(path_text)} cannot be imported: {name!r} is not a Python module name "
            "(letters, digits and '_'): rename the file"
        )
    directory = os.path.dirname(path)
    if directory in sys.path:
        sys.path.remove(directory)
    sys.path.insert(0, directory)
    try:
        _refuse_foreign_module(name)
    except ValueError:
        raise ValueError(
            f"{show_value(path_text)} would be imported as {name!r}, a module of the standard "
            "library or the interpreter, which wins: rename the file"
        ) from None
    loaded = sys.modules.get(name)
    if loaded is not None:
        where = getattr(loaded, "__file__", None)
        if where is not None and os.path.realpath(where) == os.path.realpath(path):
            return loaded
        raise ValueError(
            f"{show_value(path_text)} would be imported as {name!r}, but a module of that name "
            f"is already loaded from {show_value(where or 'elsewhere')}: rename the file"
        )
    return importlib.import_module(name)


def _import_hint(module_name: str, exc: ImportError, cwd: str | None) -> str:
    """Where `import` looked and a close module name, when MODULE itself (or
    a package of its name) was not found; what to do when a module MODULE
    imports is missing."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is None:
        return ""
    if not (module_name == missing or module_name.startswith(missing + ".")):
        return (
            f" (imported by {module_name!r}: install it into this Python, {sys.executable}, "
            "or fix that import)"
        )
    parent, _, leaf = missing.rpartition(".")
    package = sys.modules.get(parent) if parent else None
    places = list(getattr(package, "__path__", ())) if parent else ([cwd] if cwd else [])
    pythonpath = os.environ.get("PYTHONPATH")
    looked = (
        f"looked in {parent!r}"
        if parent
        else f"looked in the working directory {cwd or '(gone)'} and "
        + (
            f"PYTHONPATH={pythonpath}"
            if pythonpath
            else "the installed packages (PYTHONPATH unset)"
        )
    )
    close = _close_module(leaf, places)
    if close is None:
        return f" ({looked}; a file works too: run path/to/{leaf}.py:ATTR)"
    suggestion = f"{parent}.{close}" if parent else close
    return f" ({looked}; did you mean {suggestion!r}?)"


def _close_module(name: str, directories: list[str]) -> str | None:
    """The module in `directories` (a .py file or a package) closest to `name`."""
    import difflib

    found: set[str] = set()
    for directory in directories:
        try:
            entries = os.listdir(directory)
        except OSError:
            continue
        for entry in entries:
            stem, ext = os.path.splitext(entry)
            if ext == ".py" and stem.isidentifier():
                found.add(stem)
            elif not ext and os.path.isfile(os.path.join(directory, entry, "__init__.py")):
                found.add(entry)
    close = difflib.get_close_matches(name, sorted(found), n=1)
    return close[0] if close else None


def _attribute_hint(module: Any, attr: str) -> str:
    """`(did you mean 'topology'?)` over the module's public names, as config
    keys have; else the names that could be targets (topologies, mappings of
    them, the module's own functions)."""
    import types
    from collections.abc import Mapping

    from runtime.config_values import close_match
    from runtime.topology.topology import Topology

    names = [n for n in dir(module) if not n.startswith("_")]
    close = close_match(attr, names)
    if close is not None:
        return f" (did you mean {close!r}?)"

    def could_be_target(value: Any) -> bool:
        if isinstance(value, Topology):
            return True
        if isinstance(value, Mapping):
            return bool(value) and all(isinstance(v, Topology) for v in value.values())
        return isinstance(value, types.FunctionType) and value.__module__ == module.__name__

    targets = [n for n in names if could_be_target(getattr(module, n, None))]
    return f" (it has: {', '.join(targets[:8])})" if targets else ""


_WHAT_TARGET_NAMES = (
    "MODULE:ATTR must name, in your own module, a Topology (builder.build()), a mapping of "
    "query name -> Topology, or a plain function with no arguments returning one"
)


def _refuse_foreign_module(module_name: str) -> None:
    """Refuse, before importing it, a MODULE of the standard library or the
    interpreter: nothing there builds a topology, and importing or calling
    its attributes can end the process (`sys:exit` exited 0 silently,
    `os:abort` aborted) or print (`this`). Checked by where the module would
    be loaded from, so a user's own `code.py` in the working directory is
    still the user's; `sys.stdlib_module_names` decides when that cannot be
    told."""
    import importlib.util

    top = module_name.split(".")[0]
    if top in ("__main__", "builtins") or top in sys.builtin_module_names:
        raise ValueError(f"{module_name!r} is the interpreter's own module: {_WHAT_TARGET_NAMES}")
    try:
        spec = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        spec = None
    if spec is None:
        if top in sys.stdlib_module_names:
            raise ValueError(f"{module_name!r} is a standard-library module: {_WHAT_TARGET_NAMES}")
        return  # not found: the import below says so
    if _stdlib_location(spec.origin, spec.submodule_search_locations):
        raise ValueError(f"{module_name!r} is a standard-library module: {_WHAT_TARGET_NAMES}")


def _stdlib_location(origin: str | None, locations: Any = None) -> bool:
    """Whether a module loaded from `origin` (or, for a namespace package,
    `locations`) is the standard library: built in, frozen, or a file under
    the stdlib directories outside site-packages (which lives inside them in
    some layouts, /usr/local/lib/python3.11/site-packages)."""
    import sysconfig

    if origin in ("built-in", "frozen"):
        return True
    paths = [origin] if origin else list(locations or ())
    if not paths:
        return False
    roots = {
        os.path.realpath(p)
        for p in (sysconfig.get_paths().get("stdlib"), sysconfig.get_paths().get("platstdlib"))
        if p
    }
    for path in paths:
        real = os.path.realpath(path)
        parts = real.split(os.sep)
        if "site-packages" in parts or "dist-packages" in parts:
            return False
        if any(real.startswith(root + os.sep) for root in roots):
            return True
    return False


def _site_packages(path: str | None) -> bool:
    if not path:
        return False
    parts = os.path.realpath(path).split(os.sep)
    return "site-packages" in parts or "dist-packages" in parts


def _uses_runtime(module: Any) -> bool:
    """Whether `module` is streams-runtime's or imports anything of it (a
    topology module imports StreamsBuilder, serdes or the package)."""
    import types

    if module.__name__ == "runtime" or module.__name__.startswith("runtime."):
        return True
    for value in vars(module).values():
        if isinstance(value, types.ModuleType):
            name = value.__name__
        elif isinstance(value, type | types.FunctionType):
            name = str(value.__module__)
        else:
            continue
        if name == "runtime" or name.startswith("runtime."):
            return True
    return False


def _check_factory(obj: Any, target: str) -> None:
    """Refuse calling `obj` unless it is a plain Python function with no
    required arguments defined in a user's module (see `load_topology`)."""
    import inspect
    import types

    if isinstance(obj, type):
        raise ValueError(f"{target} is the class {obj.__qualname__}: {_WHAT_TARGET_NAMES}")
    if not isinstance(obj, types.FunctionType):
        raise ValueError(
            f"{target} is a {type(obj).__name__} (a builtin, C function, method or other "
            f"callable, which is never called): {_WHAT_TARGET_NAMES}"
        )
    defined_in = sys.modules.get(obj.__module__) if obj.__module__ else None
    if defined_in is None:
        raise ValueError(f"{target} is a function of no importable module: {_WHAT_TARGET_NAMES}")
    spec = getattr(defined_in, "__spec__", None)
    origin = getattr(spec, "origin", None) or getattr(defined_in, "__file__", None)
    if _stdlib_location(origin) or obj.__module__.split(".")[0] in ("builtins", "__main__"):
        raise ValueError(
            f"{target} is {obj.__module__}.{obj.__qualname__}, a standard-library function: "
            f"{_WHAT_TARGET_NAMES}"
        )
    if _site_packages(origin) and not _uses_runtime(defined_in):
        raise ValueError(
            f"{target} is {obj.__module__}.{obj.__qualname__}, an installed package's function "
            f"that does not use streams-runtime: {_WHAT_TARGET_NAMES}"
        )
    try:
        required = [
            p.name
            for p in inspect.signature(obj).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
        ]
    except (TypeError, ValueError):
        required = []
    if required:
        raise ValueError(
            f"{target} takes arguments ({', '.join(required)}); it is called with none: "
            f"{_WHAT_TARGET_NAMES}"
        )
