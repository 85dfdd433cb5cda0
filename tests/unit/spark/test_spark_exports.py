"""`runtime.spark` loads its names on use: each of them must resolve (a moved
name otherwise fails only when someone first uses it)."""

from __future__ import annotations

import runtime.spark


def test_every_exported_name_resolves() -> None:
    for name in runtime.spark.__all__:
        assert getattr(runtime.spark, name) is not None, name
