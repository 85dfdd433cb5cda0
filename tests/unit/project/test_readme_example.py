"""The README's example must build: users copy it first."""

from __future__ import annotations

import re
from pathlib import Path

from runtime import Topology

README = Path(__file__).resolve().parents[3] / "README.md"


def test_readme_example_builds_a_topology() -> None:
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    example = next(b for b in blocks if "builder.build()" in b)
    assert len(example.splitlines()) <= 40
    namespace: dict[str, object] = {}
    exec(compile(example, "README-example", "exec"), namespace)
    topology = namespace["topology"]
    assert isinstance(topology, Topology)
    sinks = {spec.name for sub in topology.subtopologies for spec in sub.sinks}
    assert sinks == {"long-words", "word-lengths", "lines-with-heartbeats"}
