"""Stateless pipelines on the real broker: exact output with several threads."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from runtime import App, AppState, StreamsBuilder, serdes
from tests.configs import app_config
from tests.kafka_helpers import consume_all, create_topic, produce, unique_name, wait_until

pytestmark = pytest.mark.integration


def base_config(bootstrap: str, app_id: str, tmp_path: Path, **extra: object) -> dict[str, object]:
    return app_config(bootstrap, app_id, tmp_path, threads=3, commit_ms=500, **extra)


def test_map_filter_split_flat_map_over_four_partitions(bootstrap: str, tmp_path: Path) -> None:
    source, evens, odds, words = (unique_name(n) for n in ("in", "evens", "odds", "words"))
    for topic in (source, evens, odds, words):
        create_topic(bootstrap, topic, 4)
    n = 4000
    produce(
        bootstrap,
        source,
        ((f"k{i % 97}", json.dumps({"n": i, "text": f"w{i % 3} x{i % 5}"})) for i in range(n)),
        key_serializer=str.encode,
        value_serializer=str.encode,
    )

    builder = StreamsBuilder()
    stream = builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.JSON)
    parsed = stream.filter(lambda k, v: v["n"] % 10 != 0).map(lambda k, v: (f"n{v['n']}", v))
    branches = (
        parsed.split(name="p-")
        .branch(lambda k, v: v["n"] % 2 == 0, name="even")
        .default_branch(name="odd")
    )
    branches["p-even"].map_values(lambda v: v["n"]).to(
        evens, key_serde=serdes.STRING, value_serde=serdes.INT64
    )
    branches["p-odd"].map_values(lambda v: v["n"]).to(
        odds, key_serde=serdes.STRING, value_serde=serdes.INT64
    )
    stream.flat_map_values(lambda v: v["text"].split()).to(words, value_serde=serdes.STRING)

    app = App(builder.build(), base_config(bootstrap, unique_name("pipe"), tmp_path))
    app.start()
    try:
        expected_evens = {i for i in range(n) if i % 10 != 0 and i % 2 == 0}
        expected_odds = {i for i in range(n) if i % 2 == 1}
        got_evens = consume_all(bootstrap, evens, expected=len(expected_evens), timeout=60)
        got_odds = consume_all(bootstrap, odds, expected=len(expected_odds), timeout=60)
        got_words = consume_all(bootstrap, words, expected=2 * n, timeout=60)
        assert app.state is AppState.RUNNING
    finally:
        assert app.close(30)
    assert app.state is AppState.NOT_RUNNING

    def ints(msgs: list) -> list[int]:
        return [serdes.INT64.deserialize(m.value) for m in msgs]

    assert sorted(ints(got_evens)) == sorted(expected_evens)
    assert sorted(ints(got_odds)) == sorted(expected_odds)
    # map() re-keys: each output sits in the partition its new key hashes to
    # (murmur2, as the Java client), so a Java consumer finds it where expected.
    from runtime.partitioning.default import partition_python

    for m in got_evens + got_odds:
        assert m.partition == partition_python(m.key, 4)
    assert Counter(m.value.decode() for m in got_words) == Counter(
        w for i in range(n) for w in f"w{i % 3} x{i % 5}".split()
    )
    # Per input key, the order of outputs follows the input order.
    by_key: dict[bytes, list[str]] = {}
    for m in sorted(got_words, key=lambda m: (m.partition, m.offset)):
        by_key.setdefault(m.key, []).append(m.value.decode())
    for key, values in by_key.items():
        i0 = int(key.decode()[1:])
        expected_seq = [w for i in range(n) if i % 97 == i0 for w in f"w{i % 3} x{i % 5}".split()]
        assert values == expected_seq


def test_missing_source_topic_fails_at_start_naming_it(bootstrap: str, tmp_path: Path) -> None:
    from runtime import TopicError

    missing = unique_name("missing")
    out = unique_name("out")
    create_topic(bootstrap, out, 1)
    builder = StreamsBuilder()
    builder.stream(missing).to(out)
    app = App(builder.build(), base_config(bootstrap, unique_name("miss"), tmp_path))
    with pytest.raises(TopicError, match=missing):
        app.start()
    assert app.state is AppState.CREATED


def test_wait_until_app_running(bootstrap: str, tmp_path: Path) -> None:
    source, out = unique_name("in"), unique_name("out")
    create_topic(bootstrap, source, 2)
    create_topic(bootstrap, out, 2)
    builder = StreamsBuilder()
    builder.stream(source).to(out)
    app = App(builder.build(), base_config(bootstrap, unique_name("run"), tmp_path))
    app.start()
    try:
        wait_until(lambda: app.state is AppState.RUNNING, 30, message="app never RUNNING")
        assert len(app.processing_threads) == 3
        assert sorted(t["id"] for t in app.status()["tasks"]) == ["0_0", "0_1"]
    finally:
        app.close(30)


def test_select_key_then_to_table_through_the_repartition_topic(
    bootstrap: str, tmp_path: Path
) -> None:
    """Records re-keyed by a field of their value meet in one task through the
    repartition topic; the table keeps the latest value per new key and sends
    every update downstream (unmaterialized), in input order per key."""
    source, sink = unique_name("tt-in"), unique_name("tt-out")
    for topic in (source, sink):
        create_topic(bootstrap, topic, 4)
    n = 2000
    # Input keys spread over the partitions; the new key (the user) is in the value.
    produce(
        bootstrap,
        source,
        ((f"k{i}", json.dumps({"user": f"u{i % 7}", "seq": i})) for i in range(n)),
        key_serializer=str.encode,
        value_serializer=str.encode,
    )
    builder = StreamsBuilder()
    (
        builder.stream(source, key_serde=serdes.STRING, value_serde=serdes.JSON)
        .select_key(lambda k, v: v["user"])
        .to_table(key_serde=serdes.STRING, name="by-user")
        .to_stream()
        .map_values(lambda v: v["seq"])
        .to(sink, value_serde=serdes.INT64)
    )
    app_id = unique_name("totable")
    app = App(builder.build(), base_config(bootstrap, app_id, tmp_path))
    app.start()
    try:
        got = consume_all(bootstrap, sink, expected=n, timeout=90)
        assert app.state is AppState.RUNNING
    finally:
        assert app.close(30)
    per_user: dict[str, list[int]] = {}
    for m in sorted(got, key=lambda m: (m.partition, m.offset)):
        per_user.setdefault(m.key.decode(), []).append(serdes.INT64.deserialize(m.value))
    assert sorted(per_user) == [f"u{u}" for u in range(7)]
    from runtime.partitioning.default import partition_python

    # Every update once; and in input order per input partition (records of
    # different input partitions interleave in the repartition topic).
    for user, seqs in per_user.items():
        assert sorted(seqs) == [i for i in range(n) if f"u{i % 7}" == user]
        for p in range(4):
            from_p = [i for i in seqs if partition_python(f"k{i}".encode(), 4) == p]
            assert from_p == sorted(from_p), (user, p)
    assert len(got) == n
