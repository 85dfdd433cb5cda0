"""Key partitioning identical to the Java client's default partitioner.

Kafka's default partitioner hashes the serialized key with murmur2 and takes
`(hash & 0x7fffffff) % partitions`. librdkafka implements the same function
(`rd_kafka_msg_partitioner_murmur2`, exported by the library confluent-kafka
bundles), so we call it through ctypes rather than re-implement it; the pure
Python version below is the fallback and the cross-check in tests.

Called by processing threads (sink nodes) and the polling thread; stateless.
"""

from __future__ import annotations

import ctypes
import glob
import os
from collections.abc import Callable
from typing import Any


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


def _load_librdkafka_partitioner() -> Callable[[bytes, int], int] | None:
    try:
        import confluent_kafka
    except ImportError:  # pragma: no cover - confluent-kafka is a hard dependency
        return None
    package_dir = os.path.dirname(confluent_kafka.__file__)
    candidates = glob.glob(
        os.path.join(package_dir, os.pardir, "confluent_kafka.libs", "librdkafka*")
    )
    candidates += glob.glob(os.path.join(package_dir, ".dylibs", "librdkafka*"))
    for path in candidates:
        try:
            # PyDLL keeps the GIL across the call: the hash takes nanoseconds,
            # while dropping and re-taking the GIL (what CDLL does) costs
            # microseconds and invites a thread switch per record.
            lib = ctypes.PyDLL(path)
            fn = lib.rd_kafka_msg_partitioner_murmur2
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int32
        fn.argtypes = [
            ctypes.c_void_p,
            ctypes.c_char_p,
            ctypes.c_size_t,
            ctypes.c_int32,
            ctypes.c_void_p,
            ctypes.c_void_p,
        ]

        def partition(key: bytes, partitions: int, _fn: Any = fn) -> int:
            result: int = _fn(None, key, len(key), partitions, None, None)
            return result

        return partition
    return None


_native = _load_librdkafka_partitioner()
_hash_partition: Callable[[bytes, int], int] = _native or partition_python

# Keys repeat (per user, per word, per device): remember recent answers.
# Racy use from several threads is harmless: entries are pure functions of
# their key, and a clear() only costs recomputation.
_CACHE_LIMIT = 65536
_cache: dict[tuple[bytes, int], int] = {}


def default_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition for a serialized key."""
    cache_key = (key, partitions)
    partition = _cache.get(cache_key)
    if partition is None:
        partition = _hash_partition(key, partitions)
        if len(_cache) >= _CACHE_LIMIT:
            _cache.clear()
        _cache[cache_key] = partition
    return partition


uses_librdkafka = _native is not None
