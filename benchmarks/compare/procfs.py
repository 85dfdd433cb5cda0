"""Figures of another process read from /proc: CPU seconds, RSS, broker connections.

The harness samples the child running a model from outside, so the sampling
costs the measured process nothing. Linux only.

Every figure covers the process and its descendants (`tree`): a model that
runs in several processes (the runtime with `processes` > 1: a supervisor and
its workers) is measured whole, and a model in one process is unchanged (its
tree is itself). Peak RSS of a tree is the sum of each process's own peak
(VmHWM): an upper bound of the tree's peak, since the peaks need not coincide.
"""

from __future__ import annotations

import contextlib
import os

_TCP_ESTABLISHED = "01"


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat after the command name (field 3 on), or None if gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def tree(pid: int) -> list[int]:
    """`pid` and every live descendant (one scan of /proc), `pid` first."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        fields = _stat_fields(int(name))
        if fields is not None:
            children.setdefault(int(fields[1]), []).append(int(name))
    found = [pid]
    i = 0
    while i < len(found):
        found.extend(children.get(found[i], ()))
        i += 1
    return found


def cpu_seconds(pid: int) -> float:
    """User+system CPU seconds of a process tree (all threads) from /proc/<pid>/stat.

    A descendant that exited meanwhile takes its CPU along: measure while
    the model runs (the harness does)."""
    fields = _stat_fields(pid)
    if fields is None:
        return float("nan")
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for member in tree(pid):
        member_fields = fields if member == pid else _stat_fields(member)
        if member_fields is not None:
            total += int(member_fields[11]) + int(member_fields[12])
    return total / ticks


def memory_mb(pid: int, members: list[int] | None = None) -> dict[str, float]:
    """VmRSS (current) and VmHWM (peak) of a process tree in MiB (sums);
    `members`: the tree, if the caller has it already."""
    out: dict[str, float] = {}
    for member in members if members is not None else tree(pid):
        with contextlib.suppress(OSError), open(f"/proc/{member}/status") as f:
            for line in f:
                if line.startswith(("VmRSS:", "VmHWM:")):
                    name = line.split(":")[0]
                    out[name] = out.get(name, 0.0) + int(line.split()[1]) / 1024.0
    return out


def process_count(pid: int) -> int:
    """Processes in the tree (1 for a single-process model)."""
    return len(tree(pid))


def thread_count(pid: int, members: list[int] | None = None) -> int:
    """OS threads of the tree; -1 if `pid` is gone."""
    total = -1
    for member in members if members is not None else tree(pid):
        with contextlib.suppress(OSError):
            total = max(total, 0) + len(os.listdir(f"/proc/{member}/task"))
    return total


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


def broker_connections(pid: int, broker_port: int, members: list[int] | None = None) -> int:
    """ESTABLISHED TCP connections the process tree holds to ``broker_port``.

    /proc/<pid>/net/tcp{,6} list every socket of the network namespace; the
    ones whose inode is among the tree's open file descriptors are its own.
    """
    inodes: set[str] = set()
    for member in members if members is not None else tree(pid):
        inodes |= _socket_inodes(member)
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
