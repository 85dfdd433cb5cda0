"""`OutputChannel.serve` polls the producer at most every `_SERVE_INTERVAL_S`:
each poll releases the GIL, and taking it back from a busy processing thread
costs the polling thread up to the switch interval (see output.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import KafkaError, KafkaException

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


class DyingProducer:
    """A producer whose first flush raises the gap-less fatal error while two
    reports still wait; the next flush serves them (as librdkafka does)."""

    def __init__(self) -> None:
        self.waiting = 2
        self.flushes = 0
        self.served: list[int] = []

    def flush(self, timeout: float) -> int:
        self.flushes += 1
        if self.flushes == 1:
            raise KafkaException(KafkaError(KafkaError._GAPLESS_GUARANTEE))
        while self.waiting:
            self.served.append(self.waiting)
            self.waiting -= 1
        return 0

    def __len__(self) -> int:
        return self.waiting


def test_settling_a_dead_producer_serves_every_report_it_owes(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    out = channel(FakeProducer(), monkeypatch)
    dying = DyingProducer()
    out._settle(dying)  # type: ignore[arg-type]
    assert dying.served == [2, 1], "reports left unserved would lose their records"
    assert out._dead is not None and out._dead.code() == KafkaError._GAPLESS_GUARANTEE
