"""`OutputChannel.serve` polls the producer at most every `_SERVE_INTERVAL_S`:
each poll releases the GIL, and taking it back from a busy processing thread
costs the polling thread up to the switch interval (see output.py)."""

from __future__ import annotations

import pytest

from runtime.collector import output as output_module
from runtime.collector.collector import RecordCollector
from runtime.collector.output import OutputChannel
from runtime.config import StreamsConfig


class FakeProducer:
    def __init__(self, _settings: object = None) -> None:
        self.polls = 0

    def poll(self, timeout: float) -> int:
        assert timeout == 0, "serve() never blocks"
        self.polls += 1
        return 0

    def __len__(self) -> int:
        return 0


def channel(producer: FakeProducer, monkeypatch: pytest.MonkeyPatch) -> OutputChannel:
    monkeypatch.setattr(output_module, "Producer", lambda _settings: producer)
    config = StreamsConfig.from_dict({"application.id": "app", "bootstrap.servers": "127.0.0.1:1"})
    return OutputChannel(config, RecordCollector(), None, lambda _e: None, lambda _n: None)


def test_serve_polls_once_per_interval(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]

    class Clock:
        @staticmethod
        def monotonic() -> float:
            return now[0]

    producer = FakeProducer()
    out = channel(producer, monkeypatch)
    monkeypatch.setattr(output_module, "time", Clock)
    for _ in range(50):  # fifty loop turns within one interval
        out.serve()
    assert producer.polls == 1
    now[0] += output_module._SERVE_INTERVAL_S
    out.serve()
    out.serve()
    assert producer.polls == 2, "served again once the interval passed"
