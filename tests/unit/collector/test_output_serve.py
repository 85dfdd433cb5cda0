"""`OutputChannel.serve` polls the producer at most every `_SERVE_INTERVAL_S`:
each poll releases the GIL, and taking it back from a busy processing thread
costs the polling thread up to the switch interval (see output.py)."""

from __future__ import annotations

import pytest

from runtime.collector import output as output_module
from runtime.collector.output import OutputChannel


class FakeProducer:
    def __init__(self) -> None:
        self.polls = 0

    def poll(self, timeout: float) -> int:
        assert timeout == 0, "serve() never blocks"
        self.polls += 1
        return 0


def channel(producer: FakeProducer) -> OutputChannel:
    out = OutputChannel.__new__(OutputChannel)
    out.transactions = None
    out._plain = producer  # type: ignore[assignment]
    out._next_serve = 0.0
    return out


def test_serve_polls_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    monkeypatch.setattr(output_module, "time", Clock)
    producer = FakeProducer()
    out = channel(producer)
    for _ in range(50):  # fifty loop turns within one interval
        out.serve()
    assert producer.polls == 1
    now[0] += output_module._SERVE_INTERVAL_S
    out.serve()
    out.serve()
    assert producer.polls == 2, "served again once the interval passed"
