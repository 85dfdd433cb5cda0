"""The harness's /proc figures cover a model's whole process tree."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.compare import procfs

# A parent that starts two children which burn CPU, then waits for them.
_TREE = """
import subprocess, sys
burn = "import time\\nend = time.process_time() + 0.6\\nwhile time.process_time() < end: pass\\nimport sys; sys.stdin.read()"
kids = [subprocess.Popen([sys.executable, "-c", burn], stdin=subprocess.PIPE) for _ in range(2)]
print("started", flush=True)
sys.stdin.read()
for kid in kids:
    kid.stdin.close(); kid.wait()
"""


def test_figures_sum_over_the_process_tree() -> None:
    parent = subprocess.Popen(
        [sys.executable, "-c", _TREE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert parent.stdout is not None and parent.stdout.readline().strip() == "started"
        deadline = time.monotonic() + 30
        while procfs.process_count(parent.pid) < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        members = procfs.tree(parent.pid)
        assert members[0] == parent.pid and len(members) == 3
        # Each child burns 0.6 s of CPU; the parent alone burns next to none.
        while procfs.cpu_seconds(parent.pid) < 1.2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert procfs.cpu_seconds(parent.pid) >= 1.2
        own = procfs.memory_mb(members[1])["VmHWM"]
        assert procfs.memory_mb(parent.pid)["VmHWM"] > 2 * own * 0.9
        assert procfs.thread_count(parent.pid) >= 3
    finally:
        parent.kill()  # its children see their stdin close and exit
        parent.wait()


def test_a_single_process_is_its_own_tree() -> None:
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    try:
        assert procfs.tree(child.pid) == [child.pid]
        assert procfs.process_count(child.pid) == 1
    finally:
        child.kill()
        child.wait()


def test_a_gone_process_has_no_figures() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    assert procfs.cpu_seconds(child.pid) != procfs.cpu_seconds(child.pid)  # NaN
    assert procfs.thread_count(child.pid) == -1
