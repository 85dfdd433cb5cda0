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

from runtime.murmur2 import murmur2_python, partition_python

__all__ = ["default_partition", "murmur2_python", "partition_python"]


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
            fn = ctypes.PyDLL(path).rd_kafka_msg_partitioner_murmur2
        except (OSError, AttributeError):
            continue
        fn.restype = ctypes.c_int32
        # No `argtypes`: converting six declared arguments cost 0.52 us a call,
        # undeclared 0.22 (measured on the development machine). The
        # signature is (topic, key, key length as size_t, partition count,
        # two opaques): None is NULL, bytes a pointer to their buffer, and an
        # int a C int, which libffi widens with its sign to the register's 64
        # bits: right for a key length below 2 GiB. The check below proves it
        # on this machine before the function is used.

        def partition(key: bytes, partitions: int, _fn: Any = fn) -> int:
            result: int = _fn(None, key, len(key), partitions, None, None)
            return result

        if all(partition(k, n) == partition_python(k, n) for k, n in _SELF_CHECK):
            return partition
    return None


# Keys of every length class murmur2 treats apart (the 4-byte body and each
# tail length), and partition counts up to a large topic.
_SELF_CHECK = [
    (bytes(range(length)) * 3, count) for length in range(0, 9) for count in (1, 7, 64, 1000)
]

_native = _load_librdkafka_partitioner()
_hash_partition: Callable[[bytes, int], int] = _native or partition_python


def default_partition(key: bytes, partitions: int) -> int:
    """The Java client's default partition for a serialized key.

    No cache in front of it: the C call costs about what a dictionary lookup
    with its key tuple does, and a bounded cache cleared when full missed on
    nearly every record once an app had more keys than it held.
    """
    return _hash_partition(key, partitions)


uses_librdkafka = _native is not None
