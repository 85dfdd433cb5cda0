"""The claim book of `FirstSeenPartitioner`: key -> partition, first claim in log order wins.

Why a log decides, not the first thread: two instances (or two threads) can
see a new key at the same moment, each with its own view of the partition
count (one has accepted an expansion, the other not yet). If each used its
own answer, the key's records would land on two partitions and its state
would split. So nobody uses a partition for a new key until the key's
*claim* came back from one shared, totally ordered log (partition 0 of the
partitioner topic): every reader applies the claims in offset order and
keeps the first one per key, so every reader, now or after a restart, ends
with the same answer.

Claims must never disappear or reorder, even though the topic is compacted
(no time-based deletion; the broker keeps the newest record per record key).
So each claim's record key is a fresh random claim id followed by the key's
bytes: no two claims share a record key, the cleaner removes none of them,
and "the first claim for a key" is the same record forever. (Keyed by the
key alone, two racing claims A then B would compact to B, and a reader
starting after the cleaner ran would disagree with one that read A.)

Pure: no Kafka, no threads of its own. `ClaimBook` is thread-safe: any
thread may `get`, `reserve`, `wait`; the log reader (one thread) `apply`s.
"""

from __future__ import annotations

import os
import struct
import threading
import time
from collections.abc import Callable

__all__ = [
    "CLAIM_ID_BYTES",
    "ClaimBook",
    "ClaimError",
    "claim_topic_count",
    "decode_claim",
    "encode_claim",
]

CLAIM_ID_BYTES = 16
# format version, partition, the partition count of `topic` its decider had
# accepted; then the topic's name (UTF-8): the sink topic the key was met on.
_VALUE = struct.Struct(">bii")
_VERSION = 1


class ClaimError(RuntimeError):
    """A new key's partition could not be settled (log unreachable, closed, timed out)."""


def encode_claim(
    key: bytes, partition: int, num_partitions: int, topic: str = ""
) -> tuple[bytes, bytes]:
    """(record key, value) of a claim: a fresh claim id + the key; the partition,
    and the count of `topic` it was decided with."""
    value = _VALUE.pack(_VERSION, partition, num_partitions) + topic.encode("utf-8")
    return os.urandom(CLAIM_ID_BYTES) + key, value


def decode_claim(record_key: bytes | None, value: bytes | None) -> tuple[bytes, int] | None:
    """(key, partition) of a claim record, or None for anything else (a
    tombstone, a record of another format): readers skip those."""
    if record_key is None or value is None or len(record_key) < CLAIM_ID_BYTES:
        return None
    if len(value) < _VALUE.size:
        return None
    version, partition, _count = _VALUE.unpack_from(value)
    if version != _VERSION or partition < 0:
        return None
    return record_key[CLAIM_ID_BYTES:], partition


def claim_topic_count(value: bytes) -> tuple[str, int]:
    """(topic, partition count) a claim's decider had accepted: proof that the
    topic has at least that many partitions (Kafka never removes any)."""
    _version, _partition, count = _VALUE.unpack_from(value)
    return value[_VALUE.size :].decode("utf-8", "replace"), count


class ClaimBook:
    """Settled partitions per key bytes, and the keys this process claimed.

    `get` is a plain dict read (no lock) and is the hot path: a key settled
    once is never changed (`apply` keeps the first claim), so a racy read is
    either None (not settled yet: take the slow path) or the final answer.
    """

    def __init__(self) -> None:
        self._settled: dict[bytes, int] = {}
        self._claimed: set[bytes] = set()  # claims sent by this process, not read back yet
        self._failed: dict[bytes, str] = {}
        self._changed = threading.Condition()
        self._closed: str | None = None
        # topic -> the highest partition count a claim's decider had
        # accepted for it (read racily by sinks; only grows).
        self.known_counts: dict[str, int] = {}
        # Figures (read racily).
        self.claims_sent = 0
        self.claims_lost = 0  # our claim came back after another's: we took theirs

    def __len__(self) -> int:
        return len(self._settled)

    def get(self, key: bytes) -> int | None:
        """The settled partition of `key`, or None. Any thread; no lock."""
        return self._settled.get(key)

    def reserve(self, key: bytes) -> bool:
        """True if the caller must send a claim for `key` (not settled, and
        no claim of this process is on its way); it then must call `sent` or
        `failed`. A process sends at most one claim per key at a time."""
        with self._changed:
            if key in self._settled or key in self._claimed:
                return False
            self._claimed.add(key)
            self._failed.pop(key, None)
            self.claims_sent += 1
            return True

    def failed(self, key: bytes, reason: str) -> None:
        """The claim for `key` did not reach the log: waiters give up; a later
        call may claim again (with a new claim id, so a claim that did land
        after all is harmless: the first one still wins)."""
        with self._changed:
            self._claimed.discard(key)
            if key not in self._settled:
                self._failed[key] = reason
            self._changed.notify_all()

    def read(self, record_key: bytes | None, value: bytes | None, ours: bool = False) -> bool:
        """A record read from the log, in offset order (the reader only):
        `apply` if it is a claim; whether it was."""
        claim = decode_claim(record_key, value)
        if claim is None:
            return False
        assert value is not None
        topic, count = claim_topic_count(value)
        if topic and count > self.known_counts.get(topic, 0):
            self.known_counts[topic] = count
        self.apply(claim[0], claim[1], ours)
        return True

    def apply(self, key: bytes, partition: int, ours: bool | None = None) -> None:
        """A claim read from the log, in offset order (the reader thread only).
        The first claim per key settles it; later ones change nothing."""
        with self._changed:
            if key in self._settled:
                if ours:
                    self.claims_lost += 1
                return
            self._settled[key] = partition
            self._claimed.discard(key)
            self._failed.pop(key, None)
            self._changed.notify_all()

    def close(self, reason: str) -> None:
        """Wake every waiter with ClaimError(reason); later waits fail at once."""
        with self._changed:
            self._closed = reason
            self._changed.notify_all()

    def wait(self, key: bytes, timeout: float, stop: Callable[[], bool] = lambda: False) -> int:
        """Block until `key` is settled; its partition. Raises ClaimError when
        its claim failed, the book was closed, or `timeout` s passed."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                partition = self._settled.get(key)
                if partition is not None:
                    return partition
                if key in self._failed:
                    raise ClaimError(f"the claim for a new key failed: {self._failed[key]}")
                if self._closed is not None:
                    raise ClaimError(self._closed)
                remaining = deadline - time.monotonic()
                if remaining <= 0 or stop():
                    raise ClaimError(
                        f"a new key's claim did not come back from the partitioner topic "
                        f"within {timeout:g} s"
                    )
                self._changed.wait(min(remaining, 0.5))
