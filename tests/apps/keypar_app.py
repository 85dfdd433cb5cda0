"""Key-parallel test app: a slow (~1 ms) pass-through and a per-key count.

`$STREAMS_TEST_INPUT` (value = sequence number) is copied, after a ~1 ms wait
per record (the GIL released, as an I/O call would), to
`$STREAMS_TEST_OUTPUT`, and counted per key into `$STREAMS_TEST_COUNTS`. Run
with `num.threads.per.task` > 1 it exercises key-parallel processing.
"""

from __future__ import annotations

import os
import threading
import time

from runtime import StreamsBuilder, Topology, serdes


class Overlap:
    """How many `slow_copy` calls ran at the same moment, at most (in-process tests
    read it: proof that records of one task were processed on several threads)."""

    lock = threading.Lock()
    running = 0
    most = 0

    @classmethod
    def reset(cls) -> None:
        with cls.lock:
            cls.running = cls.most = 0


def slow_copy(value: str) -> str:
    with Overlap.lock:
        Overlap.running += 1
        Overlap.most = max(Overlap.most, Overlap.running)
    try:
        time.sleep(0.001)
    finally:
        with Overlap.lock:
            Overlap.running -= 1
    return value


def build(input_topic: str, output_topic: str, counts_topic: str) -> Topology:
    builder = StreamsBuilder()
    stream = builder.stream(input_topic, key_serde=serdes.STRING, value_serde=serdes.STRING)
    stream.map_values(slow_copy).to(
        output_topic, key_serde=serdes.STRING, value_serde=serdes.STRING
    )
    (
        stream.group_by_key()
        .count(store="keypar-counts")
        .to_stream()
        .to(counts_topic, value_serde=serdes.INT64)
    )
    return builder.build()


def topology() -> Topology:
    return build(
        os.environ["STREAMS_TEST_INPUT"],
        os.environ["STREAMS_TEST_OUTPUT"],
        os.environ["STREAMS_TEST_COUNTS"],
    )
