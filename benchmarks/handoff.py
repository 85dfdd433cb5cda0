"""CPU cost of handing record bytes to a worker process and its output back (issue 36).

Design (b) of [multi-process](../docs/multi-process.md) keeps the one consumer
and the one producer in one process and runs tasks in K processing processes;
every consumed record's bytes go to a worker and every output record's bytes
come back. This measures what that costs, in CPU microseconds per record
summed over both processes (``time.process_time`` of each: user + system,
all threads), best of ``--repeats``; wall-clock figures are left out on
purpose (the development machines share their 2 cores with other jobs, so
only CPU time is comparable between runs).

The record: key of 10 bytes, value of 100 bytes; no topic, partition,
offset, timestamp or headers (the real frame carries them: a few more
fixed-size fields per record). The worker unpacks each batch and packs its
records back as the output (one output record per input record, same sizes,
no processing: that cost is `benchmarks.micro`'s).

Transports, each with batches of ``--batches`` records per hand-off and one
batch in flight at a time (the client process sends a batch and waits for
its output: the worst case for wake-ups, every batch finds the peer asleep):

- ``shm``: two single-producer single-consumer byte rings in
  ``multiprocessing.shared_memory`` (in and out), written with
  ``memoryview`` slices and ``struct``; a wake-up is one ``os.eventfd``
  write per batch, the sleeper blocks in ``os.eventfd_read`` (no futex,
  no lock: the counters are 8-byte words each written by one side only).
- ``pipe``: ``multiprocessing.Pipe`` with ``send_bytes``/``recv_bytes`` of
  the same packed batch.

Also measured in one process (no hand-off): the Python cost of packing a
batch (``pack``: records -> bytes) and of unpacking it (``unpack``: bytes ->
records), per record.

Run: ``python -m benchmarks.handoff`` (``--help`` for sizes); ``--json``
prints one object per line.
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import struct
import time
from collections.abc import Callable, Sequence
from itertools import accumulate
from multiprocessing.connection import Connection
from multiprocessing.shared_memory import SharedMemory
from typing import Any

Records = list[tuple[bytes, bytes]]

KEY_BYTES = 10
VALUE_BYTES = 100
TRANSPORTS = ("shm", "pipe")

_COUNT = struct.Struct("<I")


# --- the frame: u32 count, 2*count u32 lengths, then the bytes -------------


def pack(records: Records) -> bytes:
    """One batch as bytes: the count, every key's and value's length, the bytes."""
    parts = [part for record in records for part in record]
    return struct.pack(f"<I{len(parts)}I", len(records), *map(len, parts)) + b"".join(parts)


def unpack(frame: bytes) -> Records:
    """The records of a frame made by `pack` (slices of `frame`: one copy each)."""
    (count,) = _COUNT.unpack_from(frame, 0)
    start = 4 + 8 * count
    ends = list(accumulate(struct.unpack_from(f"<{2 * count}I", frame, 4), initial=start))
    parts = [frame[a:b] for a, b in zip(ends, ends[1:], strict=False)]
    return list(zip(parts[::2], parts[1::2], strict=True))


# --- a single-producer single-consumer ring in shared memory ----------------


class Ring:
    """A byte ring for one writer process and one reader process.

    Layout: word 0 is the bytes ever written (only the writer stores it),
    word 1 the bytes ever read (only the reader stores it), then `capacity`
    bytes of data. A message is a u32 length and its bytes, padded to 8 so a
    length never straddles the end; a message may wrap (two copies).
    The writer copies the data before it stores word 0, and the reader reads
    the data only after it loaded word 0: CPython does not reorder the
    stores, and x86-64 keeps stores in order (TSO); the eventfd syscall that
    follows each batch is a full barrier on every architecture.

    The two words are read and written through a native `Q` memoryview:
    one aligned 8-byte load or store each (memoryview packs a native item
    with one memcpy of its size). Not `struct.pack_into("<Q")`: standard
    sizes are written byte by byte, and the first version of this ring read
    a half-written counter (a torn read) and took garbage for a message.
    """

    HEADER = 16

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity - capacity % 8
        self.shm = SharedMemory(create=True, size=self.HEADER + self.capacity)
        buf = self.shm.buf
        assert buf is not None
        self.words = buf[: self.HEADER].cast("Q")
        self.data = buf[self.HEADER : self.HEADER + self.capacity]

    def put(self, payload: bytes) -> bool:
        """Append one message; False (nothing written) when it does not fit."""
        size = len(payload)
        need = 4 + size + (-(4 + size) % 8)
        words = self.words
        written = words[0]
        read = words[1]
        if need > self.capacity - (written - read):
            return False
        cap = self.capacity
        at = written % cap
        _COUNT.pack_into(self.data, at, size)
        at = (at + 4) % cap
        first = min(size, cap - at)
        self.data[at : at + first] = payload[:first]
        if first < size:
            self.data[0 : size - first] = payload[first:]
        words[0] = written + need
        return True

    def get(self) -> bytes | None:
        """The oldest message (a copy), or None when the ring is empty."""
        words = self.words
        read = words[1]
        if read == words[0]:
            return None
        cap = self.capacity
        at = read % cap
        (size,) = _COUNT.unpack_from(self.data, at)
        at = (at + 4) % cap
        first = min(size, cap - at)
        payload = bytes(self.data[at : at + first])
        if first < size:
            payload += bytes(self.data[0 : size - first])
        words[1] = read + 4 + size + (-(4 + size) % 8)
        return payload

    def close(self) -> None:
        self.words.release()
        self.data.release()
        self.shm.close()


def _ring_get(ring: Ring, wakeup: int) -> bytes:
    """The next message, sleeping on the eventfd while the ring is empty."""
    while True:
        payload = ring.get()
        if payload is not None:
            return payload
        os.eventfd_read(wakeup)  # an eventfd is a counter: no lost wake-up


def _ring_put(ring: Ring, wakeup: int, payload: bytes) -> None:
    if not ring.put(payload):
        raise RuntimeError("ring full: one batch in flight must fit")
    os.eventfd_write(wakeup, 1)


# --- the worker: unpack each batch, send its records back as the output ----


def _shm_worker(
    rings: tuple[Ring, Ring], fds: tuple[int, int], batches: int, result: Connection
) -> None:
    ring_in, ring_out = rings
    wake_in, wake_out = fds
    gc.disable()
    started = time.process_time()
    for _ in range(batches):
        out = unpack(_ring_get(ring_in, wake_in))
        _ring_put(ring_out, wake_out, pack(out))
    result.send(time.process_time() - started)


def _pipe_worker(conn: Connection, batches: int, result: Connection) -> None:
    gc.disable()
    started = time.process_time()
    for _ in range(batches):
        conn.send_bytes(pack(unpack(conn.recv_bytes())))
    result.send(time.process_time() - started)


def make_records(count: int) -> Records:
    return [
        (f"key-{i:06d}".encode(), (f"{i:08d}" * 13)[:VALUE_BYTES].encode()) for i in range(count)
    ]


def run_handoff(
    transport: str, batch: int, batches: int, verify: bool = False
) -> tuple[float, float, Records]:
    """One exchange of `batches` batches; returns (client CPU s, worker CPU s,
    the last batch's output). `verify`: check every batch's output (tests)."""
    ctx = multiprocessing.get_context("fork")
    data = make_records(batch)
    result_r, result_w = ctx.Pipe(duplex=False)
    frame_bytes = len(pack(data)) + 16
    out: Records = []
    if transport == "shm":
        capacity = max(4096, 2 * frame_bytes)
        rings = (Ring(capacity), Ring(capacity))
        fds = (os.eventfd(0), os.eventfd(0))
        worker = ctx.Process(target=_shm_worker, args=(rings, fds, batches, result_w))
        worker.start()
        ring_in, ring_out = rings
        wake_in, wake_out = fds
        gc.disable()
        started = time.process_time()
        for _ in range(batches):
            _ring_put(ring_in, wake_in, pack(data))
            out = unpack(_ring_get(ring_out, wake_out))
            if verify and out != data:
                raise AssertionError("the worker's output differs from its input")
        client = time.process_time() - started
    elif transport == "pipe":
        conn, child = ctx.Pipe(duplex=True)
        worker = ctx.Process(target=_pipe_worker, args=(child, batches, result_w))
        worker.start()
        gc.disable()
        started = time.process_time()
        for _ in range(batches):
            conn.send_bytes(pack(data))
            out = unpack(conn.recv_bytes())
            if verify and out != data:
                raise AssertionError("the worker's output differs from its input")
        client = time.process_time() - started
    else:
        raise ValueError(f"unknown transport {transport!r}")
    gc.enable()
    worker_cpu = float(result_r.recv())
    worker.join(10)
    if transport == "shm":
        for ring in rings:
            ring.close()
            ring.shm.unlink()
        for fd in fds:
            os.close(fd)
    else:
        conn.close()
        child.close()
    return client, worker_cpu, out


def run_codec(batch: int, batches: int) -> tuple[float, float]:
    """CPU seconds to pack and to unpack `batches` batches in this process."""
    data = make_records(batch)
    frame = pack(data)
    gc.disable()
    started = time.process_time()
    for _ in range(batches):
        pack(data)
    packed = time.process_time() - started
    started = time.process_time()
    for _ in range(batches):
        unpack(frame)
    unpacked = time.process_time() - started
    gc.enable()
    return packed, unpacked


def measure(
    batch: int, records: int, repeats: int, transports: Sequence[str]
) -> list[dict[str, Any]]:
    """Best-of-`repeats` CPU microseconds per record for one batch size."""
    batches = max(1, records // batch)
    n = batches * batch
    rows: list[dict[str, Any]] = []
    codec = [run_codec(batch, batches) for _ in range(repeats)]
    rows.append(
        {
            "transport": "codec",
            "batch": batch,
            "records": n,
            "pack_us": round(min(c[0] for c in codec) / n * 1e6, 3),
            "unpack_us": round(min(c[1] for c in codec) / n * 1e6, 3),
        }
    )
    for transport in transports:
        runs = [run_handoff(transport, batch, batches)[:2] for _ in range(repeats)]
        client, worker = min(runs, key=sum)
        rows.append(
            {
                "transport": transport,
                "batch": batch,
                "records": n,
                "client_us": round(client / n * 1e6, 3),
                "worker_us": round(worker / n * 1e6, 3),
                "total_us": round((client + worker) / n * 1e6, 3),
            }
        )
    return rows


def _line(row: dict[str, Any]) -> str:
    if row["transport"] == "codec":
        return (
            f"batch {row['batch']:5d}  codec  pack {row['pack_us']:7.3f}  "
            f"unpack {row['unpack_us']:7.3f} us CPU/record"
        )
    return (
        f"batch {row['batch']:5d}  {row['transport']:5s}  client {row['client_us']:7.3f}  "
        f"worker {row['worker_us']:7.3f}  total {row['total_us']:7.3f} us CPU/record"
    )


def main(argv: Sequence[str] | None = None, out: Callable[[str], None] = print) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.handoff", description=__doc__)
    parser.add_argument("--batches", default="1,10,100,1000", help="records per hand-off")
    parser.add_argument(
        "--records",
        type=int,
        default=200_000,
        help="records per run (batch size 1 runs a tenth of them: each is a round trip)",
    )
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--transports", default=",".join(TRANSPORTS))
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    args = parser.parse_args(argv)
    sizes = [int(b) for b in args.batches.split(",") if b.strip()]
    transports = [t.strip() for t in args.transports.split(",") if t.strip()]
    for name in transports:
        if name not in TRANSPORTS:
            parser.error(f"unknown transport {name!r} (choose from {', '.join(TRANSPORTS)})")
    for batch in sizes:
        records = args.records // 10 if batch == 1 else args.records
        for row in measure(batch, max(records, batch), args.repeats, transports):
            out(json.dumps(row) if args.json else _line(row))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
