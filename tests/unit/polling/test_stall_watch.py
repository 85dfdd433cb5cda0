"""The input-partition watchdog (runtime.polling.stall_watch), on a fake clock."""

from __future__ import annotations

from runtime.polling.stall_watch import StallWatch

P0, P1 = ("in", 0), ("in", 1)


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def watch() -> tuple[StallWatch, Clock]:
    clock = Clock()
    return StallWatch(after_s=60.0, clock=clock), clock


def test_a_position_that_does_not_move_with_records_to_fetch_is_a_stall_once() -> None:
    stalls, clock = watch()
    assert stalls.observe({P0: 10, P1: 5}, {P0: 100, P1: 3}, paused=[]) == []
    clock.now = 59.0
    assert stalls.observe({P0: 10, P1: 8}, {P0: 100, P1: 0}, paused=[]) == []
    clock.now = 60.0
    assert stalls.observe({P0: 10, P1: 8}, {P0: 100, P1: 0}, paused=[]) == [P0]
    assert set(stalls.stalled) == {P0}
    clock.now = 61.0  # still stalled: not reported again
    assert stalls.observe({P0: 10, P1: 8}, {P0: 100, P1: 0}, paused=[]) == []
    assert stalls.stalls_total == 1
    clock.now = 62.0  # it moved: no longer stalled
    assert stalls.observe({P0: 11, P1: 8}, {P0: 99, P1: 0}, paused=[]) == []
    assert stalls.stalled == {}


def test_partitions_the_runtime_paused_or_with_nothing_to_fetch_never_stall() -> None:
    stalls, clock = watch()
    for second in range(0, 300, 10):
        clock.now = float(second)
        assert stalls.observe({P0: 10, P1: 7}, {P0: 500, P1: 0}, paused=[P0]) == []
    assert stalls.stalls_total == 0


def test_the_clock_starts_again_when_a_paused_partition_is_resumed() -> None:
    stalls, clock = watch()
    stalls.observe({P0: 10}, {P0: 500}, paused=[P0])
    clock.now = 100.0
    assert stalls.observe({P0: 10}, {P0: 500}, paused=[]) == []
    clock.now = 159.0
    assert stalls.observe({P0: 10}, {P0: 500}, paused=[]) == []
    clock.now = 160.0
    assert stalls.observe({P0: 10}, {P0: 500}, paused=[]) == [P0]


def test_nothing_fetched_yet_counts_as_a_position() -> None:
    """A partition that came back paused in librdkafka never fetches: its
    position stays invalid (negative) while its lag waits."""
    stalls, clock = watch()
    stalls.observe({P0: -1001}, {P0: 40}, paused=[])
    clock.now = 60.0
    assert stalls.observe({P0: -1001}, {P0: 40}, paused=[]) == [P0]


def test_a_revoked_partition_is_forgotten() -> None:
    stalls, clock = watch()
    stalls.observe({P0: 1}, {P0: 9}, paused=[])
    clock.now = 60.0
    assert stalls.observe({P0: 1}, {P0: 9}, paused=[]) == [P0]
    clock.now = 61.0
    assert stalls.observe({}, {}, paused=[]) == []
    assert stalls.stalled == {}
