"""How long the polling thread waits for input, and how much it takes at once.

The polling thread blocks in the consumer only when nothing else needs it
soon: with nothing in flight it waits up to `poll.ms` (in slices that end on
a stop, a commit request, output or buffered work appearing); while a
processing thread makes output it waits at most `OUTPUT_WAIT_S`, in slices of
`OUTPUT_SLICE_S` that end once output was handed over. The consumer's own
wait cannot be woken from Python: in one 5 ms wait, output handed over
meanwhile waited 4 ms (p50) to be produced, half of a light query's
end-to-end latency alone (queries benchmark, stage stamps). A slice, never
zero, even with output already buffered: under a steady backlog output is
always buffered, and a loop that never waits would spin for the GIL.

It also applies the refill rule for the named queries running now
(`query_shares.input_refill`): the batch size here, the resume threshold in
the input buffers.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from confluent_kafka import Consumer, Message

from runtime.collector.collector import RecordCollector
from runtime.config import StreamsConfig
from runtime.kafka.clients import consume_until
from runtime.logging import get_logger
from runtime.polling.input_buffers import InputBuffers
from runtime.processing.query_shares import input_refill
from runtime.processing.task_manager import TaskManager

log = get_logger("runtime.polling")

OUTPUT_WAIT_S = 0.005
OUTPUT_SLICE_S = 0.001


class InputWait:
    """The polling thread's wait for input. `next_records` on the polling
    thread only; `tune` from any thread (two int writes read at the next
    batch and resume check)."""

    def __init__(
        self,
        config: StreamsConfig,
        buffers: InputBuffers,
        collector: RecordCollector,
        task_manager: TaskManager,
        requested: Callable[[], bool],
    ) -> None:
        self._config = config
        self._buffers = buffers
        self._collector = collector
        self._task_manager = task_manager
        self._requested = requested  # a stop or a commit was asked for
        self.max_poll_records = config.max_poll_records

    def next_records(self, consumer: Consumer) -> list[Message]:
        """Consume what is there, waiting as long as nothing else needs the thread.

        Paused partitions alone are no reason for short waits: they resume
        once their tasks' buffers drain, and a buffer drains only while its
        task is processable (then work is in flight, which is checked). A
        query or task paused by the user over a backlog kept this thread in
        1 ms slices for nothing: 5% of a core, against 1.2% idle.
        """
        if self._collector.buffered > 0 or self._task_manager.has_work_in_flight():
            return consume_until(
                consumer, self.max_poll_records, OUTPUT_WAIT_S, self._output, OUTPUT_SLICE_S
            )
        return consume_until(
            consumer, self.max_poll_records, self._config.poll_ms / 1000.0, self._other_work
        )

    def _output(self) -> bool:
        """Output to drain, or a stop or commit request: the loop has work now."""
        return self._requested() or self._collector.buffered > 0

    def _other_work(self) -> bool:
        return self._output() or self._task_manager.has_work_in_flight()

    def tune(self, query_priorities: Iterable[int]) -> None:
        """Refill input buffers for the named queries running now (`query_shares.input_refill`)."""
        refill = input_refill(
            self._config.buffered_records_per_partition,
            self._config.max_poll_records,
            "max.poll.records" in self._config.raw,
            query_priorities,
        )
        if (refill.resume_below, refill.max_poll_records) != (
            self._buffers.resume_below,
            self.max_poll_records,
        ):
            self._buffers.resume_below = refill.resume_below
            self.max_poll_records = refill.max_poll_records
            log.info(
                "input_refill_set",
                resume_below=refill.resume_below,
                max_poll_records=refill.max_poll_records,
            )
