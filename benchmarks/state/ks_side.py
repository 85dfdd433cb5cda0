"""The Kafka Streams side of the state benchmark: one JVM per run (``peers.StateBench``).

The peer's jar comes from ``benchmarks.peers.build`` (built once per source
hash); ``StateBench.java`` beside the other peer classes runs the open,
process and restore phases in one JVM and writes its figures to a result
file. Called by the harness's main thread.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def run(jar: Path, spec: dict[str, Any], log_path: str, timeout: float) -> dict[str, Any]:
    """Run one Kafka Streams side; its figures, or RuntimeError naming the log."""
    fd, result_path = tempfile.mkstemp(prefix="bench-state-ks-", suffix=".json")
    os.close(fd)
    os.makedirs(os.path.dirname(log_path) or ".", exist_ok=True)
    command = [
        "java",
        "-cp",
        str(jar),
        "peers.StateBench",
        json.dumps(dict(spec, result_path=result_path)),
    ]
    started = time.monotonic()
    try:
        with open(log_path, "wb") as log:
            try:
                proc = subprocess.run(
                    command, stdout=log, stderr=subprocess.STDOUT, timeout=timeout, check=False
                )
            except subprocess.TimeoutExpired as exc:
                raise RuntimeError(
                    f"did not finish within {timeout:.0f} s (log: {log_path})"
                ) from exc
        result: dict[str, Any] = {}
        with contextlib.suppress(OSError, ValueError), open(result_path) as f:
            result = json.load(f)
        if proc.returncode != 0 or not result.get("ok"):
            error = result.get("error") or f"the JVM exited with code {proc.returncode}"
            raise RuntimeError(f"{error} (log: {log_path})")
        result["child_wall_s"] = time.monotonic() - started
        return result
    finally:
        with contextlib.suppress(OSError):
            os.unlink(result_path)
