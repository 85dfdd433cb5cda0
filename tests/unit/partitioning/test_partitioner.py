"""Keyed output lands where the Java client's default partitioner puts it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.partitioning.default import (
    _hash_partition,
    default_partition,
    murmur2_python,
    partition_python,
    uses_librdkafka,
)

# Values of org.apache.kafka.common.utils.Utils.murmur2 (Kafka's UtilsTest).
JAVA_MURMUR2 = {
    b"21": -973932308,
    b"foobar": -790332482,
    b"a-little-bit-long-string": -985981536,
    b"a-little-bit-longer-string": -1486304829,
    b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
    b"abc": 479470107,
}


@pytest.mark.parametrize(("key", "expected"), sorted(JAVA_MURMUR2.items()))
def test_python_murmur2_equals_java(key: bytes, expected: int) -> None:
    assert murmur2_python(key) == expected


def test_librdkafka_partitioner_is_used() -> None:
    assert uses_librdkafka


@given(st.binary(max_size=64), st.integers(1, 1000))
def test_native_cached_and_python_agree(key: bytes, partitions: int) -> None:
    expected = partition_python(key, partitions)
    assert _hash_partition(key, partitions) == expected
    assert default_partition(key, partitions) == expected
    assert default_partition(key, partitions) == expected  # cached answer
    assert 0 <= expected < partitions
