"""The Processor API: user processors and the context they see.

A `Processor` is user code plugged into the graph with `KStream.process`. Each
task gets its own instance, created from the supplier given to `process` (the
class itself, or any zero-argument callable returning a new instance), so a
processor may keep per-task state in attributes.

Threads: a processor and its `ProcessorContext` are called only by the
processing thread that holds the task's lock (punctuation callbacks included).
In key-parallel mode (`num.threads.per.task` > 1) threads holding different
keys call `process` at once (punctuations still run alone); a processor whose
attributes are shared across keys opts out with `process(..., key_parallel=False)`.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from runtime.topology.context import Cancellable, PunctuationType, TaskContext
from runtime.topology.record import Record

if TYPE_CHECKING:
    from runtime.topology.nodes import ProcessorNode

__all__ = ["Processor", "ProcessorContext", "PunctuationType"]


class Processor:
    """Base class for Processor API processors; override `process`.

    `init(context)` is called once before the first record (keep the context
    to forward, schedule punctuations or reach state stores), `close()` once
    when the task closes.
    """

    def init(self, context: ProcessorContext) -> None:
        """Called once per task before any record; the default does nothing."""

    def process(self, record: Record) -> None:
        """Handle one record; forward results with `context.forward`."""
        raise NotImplementedError(f"{type(self).__name__} must implement process(record)")

    def close(self) -> None:
        """Called once when the task closes; the default does nothing."""


class ProcessorContext:
    """What a `Processor` may do: forward, schedule, commit, reach its stores.

    An adapter over the task's `TaskContext`, one per processor node per task.
    """

    __slots__ = ("_task", "_node")

    def __init__(self, task: TaskContext, node: ProcessorNode) -> None:
        self._task = task
        self._node = node

    @property
    def task_id(self) -> str:
        return self._task.task_id

    @property
    def application_id(self) -> str:
        return self._task.application_id

    @property
    def processor_name(self) -> str:
        """The name of the node this processor runs in."""
        return self._node.name

    def forward(self, record: Record, to: str | None = None) -> None:
        """Pass `record` to every downstream node, or only to the one named `to`."""
        self._node.forward(record, to)

    def schedule(
        self,
        interval: int | timedelta,
        punctuation_type: PunctuationType,
        callback: Callable[[int], None],
    ) -> Cancellable:
        """Call `callback(timestamp)` every `interval` (ms, or a timedelta).

        `punctuation_type` says whether stream time or wall-clock time drives it.
        Returns a handle whose `cancel()` stops the punctuation.
        """
        if isinstance(interval, timedelta):
            interval_ms = interval // timedelta(milliseconds=1)
        elif isinstance(interval, int) and not isinstance(interval, bool):
            interval_ms = interval
        else:
            raise TypeError(f"schedule interval must be int ms or timedelta, got {interval!r}")
        if interval_ms < 1:
            raise ValueError(f"schedule interval must be at least 1 ms, got {interval!r}")
        if not isinstance(punctuation_type, PunctuationType):
            raise TypeError(f"punctuation_type must be a PunctuationType, got {punctuation_type!r}")
        return self._task.schedule(interval_ms, punctuation_type, callback)

    def commit(self) -> None:
        """Ask the runtime to commit soon (it commits at its next opportunity)."""
        self._task.request_commit()

    def state_store(self, name: str) -> Any:
        """The named state store; the processor must have been connected to it."""
        if name not in self._node.store_names:
            connected = sorted(self._node.store_names) or "none"
            raise ValueError(
                f"processor {self._node.name!r} has no access to state store {name!r}: "
                f"pass it to KStream.process(..., {name!r}) (connected stores: {connected})"
            )
        return self._task.state_store(name)
