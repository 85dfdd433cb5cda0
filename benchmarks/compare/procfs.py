"""Figures of another process read from /proc: CPU seconds, RSS, broker connections.

The harness samples the child running a model from outside, so the sampling
costs the measured process nothing. Linux only.
"""

from __future__ import annotations

import contextlib
import os

_TCP_ESTABLISHED = "01"


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process (all its threads) from /proc/<pid>/stat."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    return (int(fields[11]) + int(fields[12])) / ticks


def memory_mb(pid: int) -> dict[str, float]:
    """VmRSS (current) and VmHWM (peak) of a process in MiB."""
    out: dict[str, float] = {}
    with contextlib.suppress(OSError), open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(("VmRSS:", "VmHWM:")):
                out[line.split(":")[0]] = int(line.split()[1]) / 1024.0
    return out


def thread_count(pid: int) -> int:
    try:
        return len(os.listdir(f"/proc/{pid}/task"))
    except OSError:
        return -1


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return inodes
    for name in names:
        with contextlib.suppress(OSError):
            target = os.readlink(f"/proc/{pid}/fd/{name}")
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    return inodes


def broker_connections(pid: int, broker_port: int) -> int:
    """ESTABLISHED TCP connections the process holds to ``broker_port``.

    /proc/<pid>/net/tcp{,6} list every socket of the network namespace; the
    ones whose inode is among the process's open file descriptors are its own.
    """
    inodes = _socket_inodes(pid)
    if not inodes:
        return 0
    port_hex = f"{broker_port:04X}"
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            with open(f"/proc/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    parts = line.split()
                    if len(parts) < 10 or parts[3] != _TCP_ESTABLISHED:
                        continue
                    if parts[2].rsplit(":", 1)[1] == port_hex and parts[9] in inodes:
                        count += 1
        except OSError:
            continue
    return count
