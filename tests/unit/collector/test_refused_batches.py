"""Refused batches: only the record refused for itself reaches the handler (pure logic).

`classify`, `InFlight` and `Verdicts` directly; the output channel's settling
under at_least_once through a fake producer that behaves as librdkafka 2.16
does against Kafka 4 (measured; see runtime/collector/refusals.py): a batch
over the topic's limit fails as a whole with MSG_SIZE_TOO_LARGE, one invalid
record fails its batch with INVALID_TIMESTAMP, two or more are named
(INVALID_RECORD) and their batch-mates get `_INVALID_DIFFERENT_RECORD`; with
the gap-less guarantee the producer then fails fatally and purges its queue,
and a failed record's report has no timestamp.
"""

from __future__ import annotations

import time
from collections import defaultdict
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from runtime.collector import output as output_module
from runtime.collector import refused_batches as refused_batches_module
from runtime.collector.collector import OutputRecord, RecordCollector
from runtime.collector.output import OutputChannel
from runtime.collector.production_errors import ProductionFailed
from runtime.collector.refusals import (
    CULPRIT,
    RESEND,
    SUSPECT,
    InFlight,
    Refusal,
    Verdicts,
    classify,
)
from runtime.config import StreamsConfig

NOW = int(time.time() * 1000)
FUTURE = NOW + 86_400_000


def err(code: int) -> KafkaError:
    return KafkaError(code)


def out(offset: int, value: bytes = b"v", *, partition: int = 0, ts: int = NOW) -> OutputRecord:
    return ("out", partition, f"k{offset}".encode(), value, ts, None, "in", 0, offset)


def refusal(record: OutputRecord, code: int) -> Refusal:
    # What a delivery report carries: no timestamp for a failed record.
    return Refusal(err(code), record[0], record[1], record[2], record[3], -1, None)


# --- classify -----------------------------------------------------------------


def test_named_culprits_and_their_batch_mates() -> None:
    records = [out(i) for i in range(4)]
    pairs = [
        (records[0], refusal(records[0], KafkaError._INVALID_DIFFERENT_RECORD)),
        (records[1], refusal(records[1], KafkaError.INVALID_RECORD)),
        (records[2], refusal(records[2], KafkaError.INVALID_RECORD)),
        (records[3], refusal(records[3], KafkaError._PURGE_QUEUE)),
    ]
    assert classify(pairs, False) == [RESEND, CULPRIT, CULPRIT, RESEND]


def test_a_whole_batch_error_makes_every_record_a_suspect() -> None:
    records = [out(i) for i in range(3)]
    for code in (KafkaError.INVALID_TIMESTAMP, KafkaError.INVALID_RECORD):
        pairs = [(r, refusal(r, code)) for r in records]
        assert classify(pairs, False) == [SUSPECT] * 3


def test_size_refusals_are_resent_once_the_producer_limit_is_lowered() -> None:
    records = [out(i) for i in range(2)]
    pairs = [(r, refusal(r, KafkaError.MSG_SIZE_TOO_LARGE)) for r in records]
    assert classify(pairs, False) == [SUSPECT, SUSPECT]
    assert classify(pairs, True) == [RESEND, RESEND]


def test_a_record_produced_alone_is_refused_for_itself() -> None:
    record = out(1)
    pairs = [(record, refusal(record, KafkaError.INVALID_TIMESTAMP))]
    assert classify(pairs, False, known_alone=lambda r: r is record) == [CULPRIT]


def test_equal_records_with_different_errors_are_suspects_not_culprits() -> None:
    """Reports carry no timestamp: two records equal but for their timestamp
    cannot be told apart, so neither may be skipped on the report's word."""
    valid, future = out(1), out(1, ts=FUTURE)
    mate = out(2)
    pairs = [
        (valid, refusal(valid, KafkaError.INVALID_RECORD)),
        (future, refusal(future, KafkaError._INVALID_DIFFERENT_RECORD)),
        (mate, refusal(mate, KafkaError._INVALID_DIFFERENT_RECORD)),
    ]
    assert classify(pairs, False) == [SUSPECT, RESEND, RESEND]


def test_an_unmatched_report_is_never_a_culprit_on_its_word() -> None:
    record = out(1)
    pairs: list[tuple[OutputRecord | None, Refusal]] = [
        (None, refusal(record, KafkaError.INVALID_RECORD)),
        (out(2), refusal(out(2), KafkaError._INVALID_DIFFERENT_RECORD)),
    ]
    assert classify(pairs, False)[0] == SUSPECT


# --- InFlight -----------------------------------------------------------------


def test_match_returns_records_with_their_origin_in_produce_order() -> None:
    held = InFlight()
    first = [out(0), out(1)]
    second = [out(2, partition=1), out(3, partition=1)]
    held.hold(("out", 0), first)
    held.hold(("out", 1), second)
    # Purges are reported before the failed batch (measured): order comes from holding.
    reports = [
        refusal(second[1], KafkaError._PURGE_QUEUE),
        refusal(first[1], KafkaError.INVALID_TIMESTAMP),
        refusal(first[0], KafkaError.INVALID_TIMESTAMP),
    ]
    matched = held.match(reports)
    assert [record for record, _ in matched] == [first[0], first[1], second[1]]
    assert [r.code for _, r in matched][-1] == KafkaError._PURGE_QUEUE


def test_equal_records_match_in_order_and_partition_minus_one_matches_any() -> None:
    held = InFlight()
    a, b = out(5), out(6)
    same_content = ("out", 0, a[2], a[3], FUTURE, None, "in", 0, 9)
    dead_letter = ("dlq", -1, b"k", b"copy", 0, None, "in", 0, 3)
    held.hold_mixed([a, same_content, b, dead_letter])
    reports = [
        refusal(a, KafkaError.INVALID_RECORD),
        refusal(a, KafkaError.INVALID_RECORD),
        Refusal(err(KafkaError._PURGE_QUEUE), "dlq", 2, b"k", b"copy", -1, None),
        Refusal(err(KafkaError._PURGE_QUEUE), "status", 0, None, b"s", -1, None),
    ]
    matched = held.match(reports)
    assert [record for record, _ in matched] == [a, same_content, dead_letter, None]


def test_trim_keeps_the_newest_lists_covering_what_is_pending() -> None:
    held = InFlight()
    for n in range(5):
        held.hold(("out", 0), [out(2 * n), out(2 * n + 1)])
    held.hold(("out", 1), [out(100, partition=1)])
    held.trim(3)
    assert len(held) == 4 + 1  # partition 0: the newest two lists cover 3
    held.trim(0)
    assert len(held) == 0


# --- Verdicts -----------------------------------------------------------------


def test_verdicts_know_records_by_content_and_timestamp() -> None:
    verdicts = Verdicts()
    culprit = out(1, ts=FUTURE)
    verdicts.add(culprit, CULPRIT, err(KafkaError.INVALID_TIMESTAMP))
    assert verdicts.lookup(out(1)) is None, "the same content with a valid timestamp"
    found = verdicts.lookup(("out", 1, culprit[2], culprit[3], FUTURE, None, "in", 0, 1))
    assert found is not None and found[0] == CULPRIT


def test_verdicts_met_in_a_committed_transaction_are_spent() -> None:
    verdicts = Verdicts()
    met, unmet = out(1), out(2)
    verdicts.add(met, SUSPECT, err(KafkaError.INVALID_TIMESTAMP))
    verdicts.add(unmet, SUSPECT, err(KafkaError.INVALID_TIMESTAMP))
    assert verdicts.lookup(met) is not None
    verdicts.aborted()  # met again in the replay
    assert verdicts.lookup(met) is not None
    verdicts.committed()
    assert verdicts.lookup(met) is None and verdicts.lookup(unmet) is not None
    for _ in range(60):
        verdicts.committed()
    assert not verdicts, "verdicts never met go after quiet commits"


def test_a_suspect_produced_alone_and_taken_is_acquitted() -> None:
    verdicts = Verdicts()
    record = out(1)
    verdicts.add(record, SUSPECT, err(KafkaError.INVALID_TIMESTAMP))
    verdicts.note_alone(record)
    assert verdicts.was_alone(record)
    verdicts.acquit(record)
    assert verdicts.lookup(record) is None


# --- the channel's settling under at_least_once ----------------------------------


class FakeMessage:
    def __init__(self, msg: dict[str, Any]) -> None:
        self._msg = msg

    def topic(self) -> str:
        return str(self._msg["topic"])

    def partition(self) -> int:
        return int(self._msg["partition"])

    def key(self) -> bytes | None:
        return self._msg["key"]  # type: ignore[no-any-return]

    def value(self) -> bytes | None:
        return self._msg["value"]  # type: ignore[no-any-return]

    def timestamp(self) -> tuple[int, int]:
        return (0, -1)  # a failed record's report has none

    def headers(self) -> list[tuple[str, bytes]] | None:
        return self._msg["headers"]  # type: ignore[no-any-return]


class FakeCluster:
    """Partitions as lists of (key, value, timestamp); limits per topic."""

    def __init__(self) -> None:
        self.log: dict[tuple[str, int], list[tuple[bytes | None, bytes | None, int]]]
        self.log = defaultdict(list)
        self.max_bytes: dict[str, int] = {}
        self.max_ahead_ms: dict[str, int] = {}
        self.producers: list[FakeProducer] = []

    def written(self, topic: str = "out", partition: int = 0) -> list[bytes | None]:
        return [key for key, _, _ in self.log[(topic, partition)]]


class FakeProducer:
    """librdkafka as measured: one batch per partition per send, whole-batch
    or named refusals, gap-less fatal failure, error-only reports."""

    def __init__(self, cluster: FakeCluster, settings: dict[str, Any]) -> None:
        self.cluster = cluster
        self.settings = settings
        self.gapless = settings.get("enable.gapless.guarantee") is True
        self.on_delivery = settings["on_delivery"]
        self.queue: list[dict[str, Any]] = []
        self.reports: list[tuple[KafkaError, dict[str, Any]]] = []
        self.dead = False
        self.fatal: KafkaError | None = None
        cluster.producers.append(self)

    def produce(
        self,
        topic: str,
        value: Any = None,
        key: Any = None,
        partition: int = -1,
        callback: Any = None,
        on_delivery: Any = None,
        timestamp: int = 0,
        headers: Any = None,
    ) -> None:
        """confluent-kafka's signature, positional order included."""
        if self.dead:
            raise KafkaException(KafkaError(KafkaError._FATAL, "Local: Fatal error", fatal=True))
        size = len(key or b"") + len(value or b"")
        if size > int(self.settings.get("message.max.bytes", 1_000_000)):
            raise KafkaException(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE))
        self.queue.append(
            {
                "topic": topic,
                "partition": 0 if partition < 0 else partition,
                "key": key,
                "value": value,
                "timestamp": timestamp or NOW,
                "headers": headers,
            }
        )

    def __len__(self) -> int:
        return len(self.queue) + len(self.reports)

    def _send(self) -> None:
        # A batch per partition, up to message.max.bytes (librdkafka's
        # MessageSet limit), in produce order.
        limit = int(self.settings.get("message.max.bytes", 1_000_000))
        batches: list[tuple[tuple[str, int], list[dict[str, Any]]]] = []
        open_batch: dict[tuple[str, int], tuple[list[dict[str, Any]], list[int]]] = {}
        for msg in self.queue:
            where = (msg["topic"], msg["partition"])
            size = len(msg["key"] or b"") + len(msg["value"] or b"") + 20
            current = open_batch.get(where)
            if current is None or current[1][0] + size > limit:
                current = ([], [60])
                open_batch[where] = current
                batches.append((where, current[0]))
            current[0].append(msg)
            current[1][0] += size
        self.queue = []
        failed = False
        for (topic, partition), batch in batches:
            if failed:
                self.reports += [(err(KafkaError._PURGE_QUEUE), m) for m in batch]
                continue
            codes = self._validate(topic, batch)
            if codes is None:
                for m in batch:
                    self.cluster.log[(topic, partition)].append(
                        (m["key"], m["value"], m["timestamp"])
                    )
                continue
            self.reports += [(err(code), m) for code, m in zip(codes, batch, strict=True)]
            if self.gapless:
                failed = self.dead = True
                self.fatal = KafkaError(
                    KafkaError._GAPLESS_GUARANTEE, "gap-less guarantee", fatal=True
                )

    def _validate(self, topic: str, batch: list[dict[str, Any]]) -> list[int] | None:
        limit = self.cluster.max_bytes.get(topic)
        if limit is not None:
            size = sum(len(m["key"] or b"") + len(m["value"] or b"") + 20 for m in batch) + 60
            if size > limit:
                return [KafkaError.MSG_SIZE_TOO_LARGE] * len(batch)
        ahead = self.cluster.max_ahead_ms.get(topic)
        if ahead is not None:
            bad = [m["timestamp"] > NOW + ahead for m in batch]
            if sum(bad) == 1:
                return [KafkaError.INVALID_TIMESTAMP] * len(batch)
            if sum(bad) > 1:
                return [
                    KafkaError.INVALID_RECORD if b else KafkaError._INVALID_DIFFERENT_RECORD
                    for b in bad
                ]
        return None

    def _serve(self) -> int:
        reports, self.reports = self.reports, []
        for error, msg in reports:
            self.on_delivery(error, FakeMessage(msg))
        if self.fatal is not None:
            fatal, self.fatal = self.fatal, None
            raise KafkaException(fatal)
        return len(reports)

    def poll(self, _timeout: float) -> int:
        self._send()
        return self._serve()

    def flush(self, _timeout: float) -> int:
        self._send()
        self._serve()
        return 0

    def close(self) -> None:
        pass


class Channel:
    """An at_least_once OutputChannel over a FakeCluster."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, handler: str) -> None:
        self.cluster = FakeCluster()
        # The channel builds its producer; settling builds the replacements
        # and the one that produces a suspect alone, and asks the topic limits.
        for module in (output_module, refused_batches_module):
            monkeypatch.setattr(
                module, "Producer", lambda settings: FakeProducer(self.cluster, settings)
            )
        monkeypatch.setattr(refused_batches_module, "AdminClient", lambda _settings: object())
        monkeypatch.setattr(
            refused_batches_module,
            "smallest_max_message_bytes",
            lambda _admin, topics, _timeout: min(self.cluster.max_bytes[t] for t in topics),
        )
        config = StreamsConfig.from_dict(
            {
                "application.id": "app",
                "bootstrap.servers": "127.0.0.1:1",
                "production.exception.handler": handler,
                "errors.dead.letter.queue.topic.name": "dlq",
            }
        )
        self.collector = RecordCollector()
        self.channel = OutputChannel(config, self.collector, None, self.fail, lambda _n: None)
        self.client_errors: list[KafkaError] = []

    def fail(self, error: KafkaError) -> None:
        self.client_errors.append(error)

    def run(self, *partition_lists: list[OutputRecord]) -> None:
        for records in partition_lists:
            self.collector.hand_over(records)
        self.channel.drain()
        self.channel.flush(lambda: False)


def keys(offsets: list[int]) -> list[bytes]:
    return [f"k{o}".encode() for o in offsets]


@pytest.mark.parametrize("handler", ["log_and_continue", "dead_letter_queue"])
def test_one_future_timestamp_skips_only_itself_and_keeps_order(
    monkeypatch: pytest.MonkeyPatch, handler: str
) -> None:
    env = Channel(monkeypatch, handler)
    env.cluster.max_ahead_ms["out"] = 60_000
    part0 = [out(i, ts=FUTURE if i == 3 else NOW) for i in range(8)]
    part1 = [out(10 + i, partition=1) for i in range(4)]
    env.run(part0, part1)
    assert env.cluster.written("out", 0) == keys([0, 1, 2, 4, 5, 6, 7])
    assert env.cluster.written("out", 1) == keys([10, 11, 12, 13])
    counts = env.channel.error_counts
    assert counts.skipped == 1 and counts.isolated >= 1
    if handler == "dead_letter_queue":
        [(key, _, _)] = env.cluster.log[("dlq", 0)]
        assert key == b"k3"
    assert not env.client_errors


def test_named_culprits_go_straight_to_the_handler(monkeypatch: pytest.MonkeyPatch) -> None:
    env = Channel(monkeypatch, "log_and_continue")
    env.cluster.max_ahead_ms["out"] = 60_000
    part0 = [out(i, ts=FUTURE if i in (2, 5) else NOW) for i in range(8)]
    env.run(part0)
    assert env.cluster.written() == keys([0, 1, 3, 4, 6, 7])
    counts = env.channel.error_counts
    assert counts.skipped == 2 and counts.isolated == 0, "named: nothing to find out alone"


def test_log_and_fail_names_the_culprit_not_a_batch_mate(monkeypatch: pytest.MonkeyPatch) -> None:
    env = Channel(monkeypatch, "log_and_fail")
    env.cluster.max_ahead_ms["out"] = 60_000
    part0 = [out(i, ts=FUTURE if i == 4 else NOW) for i in range(8)]
    with pytest.raises(ProductionFailed) as failed:
        env.run(part0)
    assert "in[0]@4" in str(failed.value) and "INVALID_TIMESTAMP" in str(failed.value)
    assert env.cluster.written() == keys([0, 1, 2, 3]), "nothing after the culprit"


def test_a_lowered_topic_limit_is_learnt_and_only_the_big_record_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    env = Channel(monkeypatch, "dead_letter_queue")
    env.cluster.max_bytes["out"] = 4000
    part0 = [out(i, b"x" * (6000 if i == 7 else 200)) for i in range(30)]
    env.run(part0)
    assert env.cluster.written() == keys([i for i in range(30) if i != 7])
    assert env.channel.errors.max_record_bytes == 4000 - 1024
    [(key, value, _)] = env.cluster.log[("dlq", 0)]
    assert key == b"k7" and value is not None and len(value) < 6000, "cut to fit"
    assert env.channel.error_counts.resent == 30, "the big one is refused by produce() then"


def test_a_changelog_record_refused_alone_stops_the_app(monkeypatch: pytest.MonkeyPatch) -> None:
    env = Channel(monkeypatch, "log_and_continue")
    env.cluster.max_ahead_ms["app-totals-changelog"] = 60_000
    records = [
        ("app-totals-changelog", 0, b"a", b"1", NOW, None, "in", 0, 1),
        ("app-totals-changelog", 0, b"b", b"2", FUTURE, None, "in", 0, 2),
    ]
    with pytest.raises(ProductionFailed) as failed:
        env.run(records)
    assert "changelog of store 'totals'" in str(failed.value)
    assert env.cluster.written("app-totals-changelog") == [b"a"]


def test_later_output_waits_for_the_refused_batch(monkeypatch: pytest.MonkeyPatch) -> None:
    """A drain after a refusal produces the refused batch's good records
    first (rule 2), and the held records are let go once settled."""
    env = Channel(monkeypatch, "log_and_continue")
    env.cluster.max_ahead_ms["out"] = 60_000
    env.collector.hand_over([out(i, ts=FUTURE if i == 1 else NOW) for i in range(3)])
    env.channel.drain()
    producer = env.channel.producer
    env.channel._serve_reports(lambda: producer.poll(0))  # reported: the producer is dead
    assert env.channel._dead is not None
    env.collector.hand_over([out(i) for i in range(3, 6)])
    env.channel.drain()
    env.channel.flush(lambda: False)
    assert env.cluster.written() == keys([0, 2, 3, 4, 5])
    assert len(env.channel._in_flight) == 0


def test_a_fatal_error_taken_by_a_delivery_callback_is_noted(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """confluent-kafka can call a delivery callback while the gap-less fatal
    error is pending: the first call into the library raises SystemError
    (measured); the callback notes the error and reads the report again."""
    env = Channel(monkeypatch, "log_and_continue")
    calls = {"n": 0}

    class Pending(KafkaError):
        def code(self) -> int:
            calls["n"] += 1
            if calls["n"] == 1:
                try:
                    raise KafkaException(KafkaError(KafkaError._GAPLESS_GUARANTEE, fatal=True))
                except KafkaException as fatal:
                    raise SystemError("returned a result with an exception set") from fatal
            return int(super().code())

    msg = {"topic": "out", "partition": 0, "key": b"k1", "value": b"v", "headers": None}
    env.channel._on_delivery(Pending(KafkaError.INVALID_TIMESTAMP), FakeMessage(msg))  # type: ignore[arg-type]
    assert env.channel._dead is not None
    assert env.channel._dead.code() == KafkaError._GAPLESS_GUARANTEE
    assert [r.code for r in env.channel._refusals] == [KafkaError.INVALID_TIMESTAMP]
