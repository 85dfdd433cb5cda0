"""FirstSeenPartitioner: a key never changes partition once seen; new keys
spread over every partition after an expansion; racing deciders agree.

No Kafka here: the log is modelled (the claim rules of
`runtime.partitioning.claims`) or in memory; `tests/integration/
test_first_seen_partitioner.py` runs it on Apache Kafka.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runtime import FirstSeenPartitioner, StreamsBuilder, VirtualPartitioner, serdes
from runtime.config import StreamsConfig
from runtime.partitioning.claims import ClaimBook, ClaimError, decode_claim, encode_claim
from runtime.partitioning.default import default_partition
from runtime.partitioning.first_seen import LocalClaimLog
from runtime.partitioning.static import open_static_partitioner
from runtime.topology.testing import RecordingTaskContext

KEYS = [f"key-{i}".encode() for i in range(6)]


def local() -> FirstSeenPartitioner:
    partitioner = FirstSeenPartitioner()
    partitioner.attach(LocalClaimLog)
    return partitioner


# --- the log's rule, modelled: instances, claims in flight, readers behind ----------

actions = st.lists(
    st.one_of(
        # an instance meets a key with its partition count in force
        st.tuples(
            st.just("meet"), st.integers(0, 2), st.sampled_from(KEYS), st.sampled_from([3, 4, 8])
        ),
        # a claim in flight reaches the log (in any order across writers)
        st.tuples(st.just("land"), st.integers(0, 50)),
        # an instance's reader takes the next record
        st.tuples(st.just("read"), st.integers(0, 2)),
    ),
    max_size=80,
)


def compact(records: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """What Kafka's log cleaner leaves: the newest record per record key, in order."""
    newest = {key: i for i, (key, _) in enumerate(records)}
    return [r for i, r in enumerate(records) if newest[r[0]] == i]


def read_all(records: list[tuple[bytes, bytes]]) -> dict[bytes, int]:
    """What a reader starting at the log's beginning settles."""
    book = ClaimBook()
    seen: set[bytes] = set()
    for record_key, value in records:
        claim = decode_claim(record_key, value)
        assert claim is not None
        book.apply(*claim)
        seen.add(claim[0])
    return {k: p for k in seen if (p := book.get(k)) is not None}


@settings(max_examples=300, deadline=None)
@given(steps=actions)
def test_racing_instances_agree_and_a_settled_key_never_moves(steps: list[tuple[Any, ...]]) -> None:
    books = [ClaimBook() for _ in range(3)]
    positions = [0, 0, 0]
    in_flight: list[tuple[bytes, bytes]] = []
    log: list[tuple[bytes, bytes]] = []
    answered: dict[tuple[int, bytes], int] = {}  # what an instance ever used for a key

    def read(i: int) -> None:
        record_key, value = log[positions[i]]
        positions[i] += 1
        claim = decode_claim(record_key, value)
        assert claim is not None
        books[i].apply(*claim)

    def check_answers() -> None:
        for i, book in enumerate(books):
            for key in KEYS:
                settled = book.get(key)
                if settled is not None:
                    assert answered.setdefault((i, key), settled) == settled, "a key moved"

    for step in steps:
        if step[0] == "meet":
            _, i, key, count = step
            if books[i].get(key) is None and books[i].reserve(key):
                in_flight.append(encode_claim(key, default_partition(key, count), count))
        elif step[0] == "land" and in_flight:
            log.append(in_flight.pop(step[1] % len(in_flight)))
        elif step[0] == "read" and positions[step[1]] < len(log):
            read(step[1])
        check_answers()
    log.extend(in_flight)
    for i in range(3):
        while positions[i] < len(log):
            read(i)
    check_answers()
    final = read_all(log)
    for book in books:
        assert {k: p for k in KEYS if (p := book.get(k)) is not None} == final
    # The first claim per key in log order is the answer, and a reader that
    # starts after the cleaner ran (claim ids make every record key unique)
    # reads the same map.
    first: dict[bytes, int] = {}
    for record_key, value in log:
        claim = decode_claim(record_key, value)
        assert claim is not None
        first.setdefault(*claim)
    assert final == first
    assert read_all(compact(log)) == final


def test_keyed_by_the_key_alone_compaction_would_change_the_answer() -> None:
    """Why claims carry a claim id: two racing claims for one key, the
    cleaner keeps only the newer; readers before and after would disagree."""
    a = encode_claim(b"k", 1, 4)
    b = encode_claim(b"k", 5, 8)
    naive = [(b"k", a[1]), (b"k", b[1])]
    assert compact(naive) == [(b"k", b[1])]  # the first claim (1) is gone
    assert read_all(compact([a, b])) == {b"k": 1}  # with claim ids it stays


# --- the partitioner on an in-memory log -----------------------------------------------

texts = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=40, unique=True)


@given(old=texts, new=texts, before=st.integers(1, 6), grow=st.integers(1, 10))
def test_a_key_keeps_its_first_partition_and_new_keys_use_the_new_count(
    old: list[str], new: list[str], before: int, grow: int
) -> None:
    partitioner = local()
    after = before + grow
    first = {k: partitioner.static_partition("t", k, before) for k in old}
    assert all(p == default_partition(k.encode(), before) for k, p in first.items())
    for key in old:  # on any topic, at any later count
        assert partitioner.static_partition("other", key, after) == first[key]
    for key in new:
        expected = first.get(key, default_partition(key.encode(), after))
        assert partitioner.static_partition("t", key, after) == expected
        assert partitioner.static_partition("t", key, before) == expected  # never moves back


def test_new_keys_land_on_every_partition_after_an_expansion() -> None:
    partitioner = local()
    for i in range(200):
        assert partitioner.static_partition("t", f"old-{i}", 4) < 4
    landed = {partitioner.static_partition("t", f"new-{i}", 8) for i in range(200)}
    assert landed == set(range(8))
    assert partitioner.figures()["keys"] == 400
    # The limit this partitioner exists for: without `place`, a virtual
    # partition count sends new hashed keys only to the old partitions.
    virtual = VirtualPartitioner(4)
    assert {virtual.static_partition("t", f"new-{i}", 8) for i in range(200)} == set(range(4))


# --- racing threads on two instances sharing one log ---------------------------------


class SharedLog:
    """One ordered log, written with random delays and read by each instance
    on its own thread with random lag: the races of two processes."""

    def __init__(self, seed: int) -> None:
        self.records: list[tuple[bytes, bytes]] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._random = random.Random(seed)
        self._readers: list[threading.Thread] = []

    def attach(self, book: ClaimBook) -> SharedLog.Writer:
        reader = threading.Thread(target=self._follow, args=(book,), daemon=True)
        reader.start()
        self._readers.append(reader)
        return SharedLog.Writer(self)

    class Writer:
        def __init__(self, shared: SharedLog) -> None:
            self._shared = shared

        def append(self, record_key: bytes, value: bytes, on_failed: Callable[[str], None]) -> None:
            time.sleep(self._shared._random.random() / 1000)
            with self._shared._lock:
                self._shared.records.append((record_key, value))

        def close(self) -> None:
            pass

    def _follow(self, book: ClaimBook) -> None:
        position = 0
        while not self._stop.is_set():
            with self._lock:
                batch = self.records[position:]
            for record_key, value in batch:
                claim = decode_claim(record_key, value)
                assert claim is not None
                book.apply(*claim)
            position += len(batch)
            time.sleep(self._random.random() / 500)

    def stop(self) -> None:
        self._stop.set()
        for reader in self._readers:
            reader.join(5)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_instances_with_different_counts_agree_on_every_new_key(seed: int) -> None:
    shared = SharedLog(seed)
    instances = [FirstSeenPartitioner(claim_timeout_s=10), FirstSeenPartitioner(claim_timeout_s=10)]
    for instance in instances:
        instance.attach(shared.attach)
    keys = [f"user-{i}" for i in range(60)]
    answers: list[tuple[str, int]] = []
    lock = threading.Lock()

    def work(instance: FirstSeenPartitioner, count: int, order: int) -> None:
        mine = list(keys)
        random.Random(seed * 10 + order).shuffle(mine)
        for key in mine:
            partition = instance.static_partition("t", key, count)
            with lock:
                answers.append((key, partition))

    # Instance 0 accepted 8 partitions, instance 1 still writes with 4.
    threads = [
        threading.Thread(target=work, args=(instances[n % 2], 8 if n % 2 == 0 else 4, n))
        for n in range(6)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    shared.stop()
    assert len(answers) == 6 * len(keys)
    by_key: dict[str, set[int]] = {}
    for key, partition in answers:
        by_key.setdefault(key, set()).add(partition)
    split = {k: p for k, p in by_key.items() if len(p) > 1}
    assert not split, f"keys used on two partitions: {split}"
    first: dict[bytes, int] = {}
    for record_key, value in shared.records:
        claim = decode_claim(record_key, value)
        assert claim is not None
        first.setdefault(*claim)
    assert {k: p.pop() for k, p in by_key.items()} == {k.decode(): p for k, p in first.items()}
    lost = sum(i.figures()["claims_lost"] for i in instances)
    print(f"seed {seed}: {len(shared.records)} claims for {len(keys)} keys, {lost} lost races")


# --- failures and the app's hooks ------------------------------------------------------


class RefusingLog:
    def __init__(self, book: ClaimBook) -> None:
        pass

    def append(self, record_key: bytes, value: bytes, on_failed: Callable[[str], None]) -> None:
        on_failed("Broker: Topic authorization failed")

    def close(self) -> None:
        pass


class SilentLog(RefusingLog):
    def append(self, record_key: bytes, value: bytes, on_failed: Callable[[str], None]) -> None:
        pass  # never comes back


def test_a_failed_claim_or_a_closed_partitioner_raises_instead_of_guessing() -> None:
    with pytest.raises(ClaimError, match="not open"):
        FirstSeenPartitioner().static_partition("t", "k", 4)
    refused = FirstSeenPartitioner()
    refused.attach(RefusingLog)
    with pytest.raises(ClaimError, match="authorization"):
        refused.static_partition("t", "k", 4)
    silent = FirstSeenPartitioner(claim_timeout_s=0.2)
    silent.attach(SilentLog)
    with pytest.raises(ClaimError, match="within 0.2 s"):
        silent.static_partition("t", "k", 4)
    waiting = FirstSeenPartitioner(claim_timeout_s=30)
    waiting.attach(SilentLog)
    errors: list[BaseException] = []

    def wait() -> None:
        try:
            waiting.static_partition("t", "k", 4)
        except ClaimError as exc:
            errors.append(exc)

    thread = threading.Thread(target=wait)
    thread.start()
    time.sleep(0.05)
    waiting.close()
    thread.join(20)
    # Woken by close, not by its 30 s claim timeout: the error says "closed".
    assert not thread.is_alive()
    assert errors and "closed" in str(errors[0]), errors


def test_the_app_opens_and_closes_it_and_config_takes_it() -> None:
    calls: list[Any] = []

    class Recorder(FirstSeenPartitioner):
        def open(
            self, application_id: str, client_config: Any, replication_factor: int = -1
        ) -> None:
            calls.append(
                ("open", application_id, client_config["bootstrap.servers"], replication_factor)
            )

        def close(self) -> None:
            calls.append("close")

    partitioner = Recorder()
    config = StreamsConfig.from_dict(
        {"application.id": "a", "bootstrap.servers": "h:1", "static.partitioner": partitioner}
    )
    assert config.static_partitioner is partitioner
    close = open_static_partitioner(partitioner, "a", {"bootstrap.servers": "h:1"}, 3)
    close()
    assert calls == [("open", "a", "h:1", 3), "close"]
    open_static_partitioner(None, "a", {}, 1)()  # nothing to open


def test_sinks_partition_with_it() -> None:
    partitioner = local()
    builder = StreamsBuilder()
    builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING).to("out")
    ctx = RecordingTaskContext(static_partitioner=partitioner, partitions={"out": 4})
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "in", "old", "v")
    ctx.partitions["out"] = 8  # the expansion accepted
    for key in ("old", "new", None):
        ctx.process(graph, "in", key, "v")
    assert [s.partition for s in ctx.sent] == [
        default_partition(b"old", 4),
        default_partition(b"old", 4),
        default_partition(b"new", 8),
        None,
    ]


def test_a_partition_decided_by_an_instance_that_accepted_more_is_written_here_too() -> None:
    """During an expansion: another instance (count 8 in force) decided a key
    first; here the count in force is still 4, and the sink writes the
    decided partition anyway, since the claim proves the topic has it."""
    partitioner = local()
    key = next(f"k{i}" for i in range(100) if default_partition(f"k{i}".encode(), 8) >= 4)
    decided = partitioner.static_partition("out", key, 8)  # "the other instance"
    assert partitioner.known_partition_count("out") == 8
    builder = StreamsBuilder()
    builder.stream("in", key_serde=serdes.STRING, value_serde=serdes.STRING).to("out")
    ctx = RecordingTaskContext(static_partitioner=partitioner, partitions={"out": 4})
    graph = ctx.instantiate(builder.build().subtopologies[0])
    ctx.process(graph, "in", key, "v")
    assert [s.partition for s in ctx.sent] == [decided]
    assert partitioner.known_partition_count("elsewhere") == 0
