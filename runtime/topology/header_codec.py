"""Record headers as bytes, for stores that keep a record's context (suppression).

Kafka Streams' suppression buffer keeps each buffered update's record
context, headers included, and the emitted record carries them. Here a
buffer entry's value holds the headers in this layout:

    count (4 bytes) + per header: name length (2) + UTF-8 name
                                 + value length (4; -1: None) + value

Big-endian, like the stores' other fixed-width fields. Only this runtime
reads it (changelogs of internal stores), so it need not match Kafka's own
layout. Pure functions: any thread.
"""

from __future__ import annotations

import struct

from runtime.topology.record import Headers

_COUNT = struct.Struct(">I")
_NAME = struct.Struct(">H")
_VALUE = struct.Struct(">i")


def encode_headers(headers: Headers) -> bytes:
    """`headers` (a list of (name, bytes or None)) in the layout above."""
    parts = [_COUNT.pack(len(headers))]
    for name, value in headers:
        raw = name.encode()
        parts.append(_NAME.pack(len(raw)))
        parts.append(raw)
        if value is None:
            parts.append(_VALUE.pack(-1))
        else:
            data = bytes(value)
            parts.append(_VALUE.pack(len(data)))
            parts.append(data)
    return b"".join(parts)


def decode_headers(data: bytes, offset: int = 0) -> tuple[Headers, int]:
    """The headers encoded at `offset` of `data`, and the offset just after them."""
    (count,) = _COUNT.unpack_from(data, offset)
    offset += _COUNT.size
    headers: Headers = []
    for _ in range(count):
        (size,) = _NAME.unpack_from(data, offset)
        offset += _NAME.size
        name = data[offset : offset + size].decode()
        offset += size
        (size,) = _VALUE.unpack_from(data, offset)
        offset += _VALUE.size
        if size < 0:
            headers.append((name, None))
        else:
            headers.append((name, data[offset : offset + size]))
            offset += size
    return headers, offset
