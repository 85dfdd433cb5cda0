"""quixstreams in several processes of one consumer group (model ``quixstreams-p2``).

quixstreams scales by processes: a user who wants a second core runs the same
app twice in one consumer group. This is that, as one measured child of the
harness: ``<quix venv>/bin/python -m benchmarks.peers.quix_group SPEC_JSON``
starts ``spec["processes"]`` workers (``benchmarks.peers.quix_child`` with
``role=worker``: their loops keep polling with the input paused until ``go``)
and speaks the harness protocol (``benchmarks/compare/child_protocol.py``) for
all of them:

- ``ready`` once the workers' assignments cover every input partition, each
  partition once, unchanged for ``settle_s`` (join_s: the last change);
- ``go`` forwarded to every worker, answered once each of them resumed;
- ``processed_all`` once their processed counts add up to the backlog;
- ``stop`` forwarded; ``result`` with the summed count, the slowest close.

This process only relays (it imports neither quixstreams nor the runtime); its
few MB and milliseconds of CPU are inside the harness's process-tree figures.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import subprocess
import sys
import threading
import time
from typing import Any

from benchmarks.compare.child_protocol import Commands, Events, run_and_exit


class _Worker:
    """One quixstreams process and its event stream (read on its own thread)."""

    def __init__(self, index: int, spec: dict[str, Any], inbox: queue.SimpleQueue[Any]) -> None:
        read_fd, write_fd = os.pipe()
        worker_spec = dict(spec, event_fd=write_fd, role="worker", processes=1)
        self.index = index
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.peers.quix_child", json.dumps(worker_spec)],
            stdin=subprocess.PIPE,
            pass_fds=(write_fd,),
        )
        os.close(write_fd)
        self.partitions: list[int] = []
        self.processed = 0
        self.finished = False  # its result arrived
        self._reader = threading.Thread(
            target=self._read, args=(read_fd, inbox), name=f"quix-worker-{index}", daemon=True
        )
        self._reader.start()

    def _read(self, fd: int, inbox: queue.SimpleQueue[Any]) -> None:
        with os.fdopen(fd, "r") as stream:
            for line in stream:
                with contextlib.suppress(ValueError):
                    inbox.put((self.index, json.loads(line)))
        inbox.put((self.index, {"event": "eof"}))

    def send(self, command: str) -> None:
        assert self.proc.stdin is not None
        with contextlib.suppress(BrokenPipeError, OSError):
            self.proc.stdin.write(command.encode() + b"\n")
            self.proc.stdin.flush()

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)


class _Group:
    """The workers' events folded into the harness protocol (main thread)."""

    def __init__(self, spec: dict[str, Any], events: Events, commands: Commands) -> None:
        self.spec = spec
        self.events = events
        self.commands = commands
        self.inbox: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.workers = [_Worker(i, spec, self.inbox) for i in range(int(spec.get("processes", 2)))]
        self.started = time.monotonic()

    def _next(self, timeout: float) -> tuple[int, dict[str, Any]] | None:
        try:
            index, event = self.inbox.get(timeout=timeout)
        except queue.Empty:
            return None
        worker = self.workers[index]
        if event["event"] == "eof" and worker.finished:
            return index, event  # it sent its result and exited
        if event["event"] in ("failed", "eof"):
            raise RuntimeError(
                f"quixstreams worker {index} {event['event']}: {event.get('error', '')}"
            )
        if event["event"] == "assignment":
            worker.partitions = list(event["partitions"])
        elif event["event"] == "progress":
            worker.processed = int(event["processed"])
        return index, event

    def _balanced(self) -> tuple[int, ...] | None:
        owned = sorted(p for w in self.workers for p in w.partitions)
        if owned != list(range(int(self.spec["partitions"]))):
            return None
        return tuple(len(w.partitions) for w in self.workers)

    def wait_ready(self) -> None:
        settle_s = float(self.spec.get("settle_s", 0.5))
        deadline = self.started + float(self.spec.get("ready_timeout_s", 120))
        last: Any = None
        since = time.monotonic()
        while True:
            self._next(0.05)
            now = time.monotonic()
            signature = self._balanced()
            if signature != last:
                last, since = signature, now
            elif signature is not None and now - since >= settle_s:
                break
            if now > deadline:
                raise TimeoutError(
                    f"quixstreams workers not balanced after {deadline - self.started:.0f} s"
                )
        self.events.emit(
            "ready", join_s=since - self.started, ready_s=time.monotonic() - self.started
        )

    def go(self) -> None:
        self.commands.go.wait()
        for worker in self.workers:
            worker.send("go")
        answered: set[int] = set()
        while len(answered) < len(self.workers):
            got = self._next(30)
            if got is None:
                raise TimeoutError("a quixstreams worker did not answer go")
            if got[1]["event"] == "go":
                answered.add(got[0])
        self.events.emit("go", processed_at_go={})

    def until_stop(self) -> None:
        backlog = int(self.spec.get("backlog", 0))
        sent = backlog <= 0
        while not self.commands.stop.is_set():
            self._next(0.05)
            if not sent and sum(w.processed for w in self.workers) >= backlog:
                sent = True
                self.events.emit("processed_all")

    def stop(self) -> dict[str, Any]:
        for worker in self.workers:
            worker.send("stop")
        results: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 90
        while len(results) < len(self.workers) and time.monotonic() < deadline:
            got = self._next(1.0)
            if got is not None and got[1]["event"] == "result":
                results[got[0]] = got[1]
                self.workers[got[0]].finished = True
        if len(results) < len(self.workers):
            raise TimeoutError("a quixstreams worker sent no result")
        for worker in self.workers:
            worker.proc.wait(30)
        return {
            "close_s": max(float(r.get("close_s") or 0.0) for r in results.values()),
            "closed_cleanly": all(r.get("closed_cleanly") for r in results.values()),
            "status": {
                "processed": sum(int(r["status"]["processed"]) for r in results.values()),
                "processes": [r["status"] for r in results.values()],
            },
        }

    def kill(self) -> None:
        for worker in self.workers:
            worker.kill()


def main(argv: list[str]) -> int:
    spec: dict[str, Any] = json.loads(argv[0])
    events = Events(int(spec["event_fd"]))
    commands = Commands()
    commands.start()
    groups: list[_Group] = []

    def body() -> dict[str, Any]:
        if int(spec["threads"]) != 1:
            raise ValueError("quixstreams is single-threaded: threads must be 1")
        groups.append(_Group(spec, events, commands))
        group = groups[0]
        group.wait_ready()
        group.go()
        group.until_stop()
        return group.stop()

    def kill_workers() -> None:
        for group in groups:
            group.kill()

    run_and_exit(events, body, kill_workers)


if __name__ == "__main__":
    main(sys.argv[1:])
