"""A fake task for scheduler tests: the task manager's view of a task, no Kafka."""

from __future__ import annotations

import threading
import time
from collections import deque


class FakeTask:
    """Records offsets in a deque; `process` logs what it took and detects sharing."""

    key_parallel = False
    threads_per_task = 1
    shareable = True
    query: str | None = None
    last_record_timestamp = -1
    yield_requested = False  # honoured per record, as StreamTask.process does

    def __init__(self, task_id: str, per_batch: int = 3, work_s: float = 0.0) -> None:
        self.id = task_id
        self.records: deque[int] = deque()
        self.timestamps: deque[int] = deque()
        self.next_wall_punctuation = float("inf")
        self.processed: list[int] = []
        self.violations: list[str] = []
        self.holder: str | None = None
        self._guard = threading.Lock()
        self._per_batch = per_batch
        self._work_s = work_s
        self.punctuations = 0

    def add(self, offset: int, timestamp: int = 0) -> None:
        self.records.append(offset)
        self.timestamps.append(timestamp)

    @property
    def buffered(self) -> int:
        return len(self.records)

    def head_timestamp(self) -> int:
        return self.timestamps[0] if self.timestamps else -1

    def process(self, deadline: float) -> int:
        me = threading.current_thread().name
        with self._guard:
            if self.holder is not None:
                self.violations.append(f"{me} entered while {self.holder} held {self.id}")
            self.holder = me
        taken = 0
        while self.records and taken < self._per_batch:
            self.processed.append(self.records.popleft())
            self.timestamps.popleft()
            taken += 1
            if self._work_s:
                time.sleep(self._work_s)
            if self.yield_requested:
                break
        if self.next_wall_punctuation <= time.monotonic():
            self.punctuations += 1
            self.next_wall_punctuation = float("inf")
        with self._guard:
            self.holder = None
        return taken

    def take_output(self) -> list[object]:
        return []
