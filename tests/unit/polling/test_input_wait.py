"""How long the polling thread blocks for input (pure logic, with fakes)."""

from __future__ import annotations

from typing import Any

from runtime.config import StreamsConfig
from runtime.polling.input_wait import OUTPUT_SLICE_S, InputWait


class RecordingConsumer:
    """Nothing to consume; remembers every `poll` timeout."""

    def __init__(self) -> None:
        self.poll_timeouts: list[float] = []

    def consume(self, _n: int, _timeout: float) -> list[Any]:
        return []

    def poll(self, timeout: float) -> None:
        self.poll_timeouts.append(timeout)


class Fakes:
    def __init__(self, paused: bool, buffered_output: int, in_flight: bool) -> None:
        self.any_paused, self.buffered, self.in_flight = paused, buffered_output, in_flight
        self.resume_below = 0

    def has_work_in_flight(self) -> bool:
        return self.in_flight


def waits(paused: bool, buffered_output: int, in_flight: bool) -> list[float]:
    fakes = Fakes(paused, buffered_output, in_flight)
    config = StreamsConfig.from_dict(
        {"application.id": "a", "bootstrap.servers": "x:1", "poll.ms": 20}
    )
    wait = InputWait(config, fakes, fakes, fakes, requested=lambda: False)  # type: ignore[arg-type]
    consumer = RecordingConsumer()
    wait.next_records(consumer)  # type: ignore[arg-type]
    return consumer.poll_timeouts


def test_paused_partitions_alone_do_not_keep_the_thread_in_short_slices() -> None:
    """A query paused over a backlog: its partitions stay paused, nothing is in
    flight; the thread may block as long as poll.ms (in its usual slices)."""
    timeouts = waits(paused=True, buffered_output=0, in_flight=False)
    assert timeouts and min(timeouts) > OUTPUT_SLICE_S
    assert abs(sum(timeouts) - 0.020) < 0.005


def test_output_or_work_in_flight_waits_in_one_millisecond_slices() -> None:
    for buffered_output, in_flight in ((1, False), (0, True)):
        timeouts = waits(paused=True, buffered_output=buffered_output, in_flight=in_flight)
        assert timeouts and max(timeouts) <= OUTPUT_SLICE_S
