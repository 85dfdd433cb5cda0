"""Kafka's murmur2 key hash and default partition, in pure Python.

The Java client's default partitioner: `(murmur2(key bytes) & 0x7fffffff) %
partitions`. Here at the bottom layer so that the topology's sinks can
partition a key by part of its bytes (a windowed key by its inner key, as
Kafka Streams' WindowedStreamPartitioner) without depending on
`runtime.partitioning`, which re-exports these and adds the faster
librdkafka path for whole keys.

Stateless; any thread.
"""

from __future__ import annotations


def murmur2_python(data: bytes) -> int:
    """Kafka's murmur2 (seed 0x9747b28c), as a signed 32-bit int like Java's."""
    length = len(data)
    seed = 0x9747B28C
    m = 0x5BD1E995
    r = 24
    h = (seed ^ length) & 0xFFFFFFFF
    length4 = length // 4
    for i in range(length4):
        i4 = i * 4
        k = int.from_bytes(data[i4 : i4 + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> r
        k = (k * m) & 0xFFFFFFFF
        h = (h * m) & 0xFFFFFFFF
        h ^= k
    extra = length % 4
    index = length & ~3
    if extra == 3:
        h ^= data[index + 2] << 16
    if extra >= 2:
        h ^= data[index + 1] << 8
    if extra >= 1:
        h ^= data[index]
        h = (h * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def partition_python(key: bytes, partitions: int) -> int:
    return (murmur2_python(key) & 0x7FFFFFFF) % partitions
