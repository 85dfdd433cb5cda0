"""The I/O-bound workloads' remote call: a tiny threaded TCP echo server with a delay.

Server (started by the harness as its own process, so its CPU time is neither
the model's nor the harness's): ``python -m benchmarks.compare.echo --delay-ms 1``
listens on 127.0.0.1, prints its port, and for every line it receives waits
``delay`` seconds (``time.sleep``) and sends the line back; one thread per
connection (``socketserver.ThreadingTCPServer``).

Client (``echo_call``, the map function of the I/O-bound topologies): one
connection per calling thread (thread-local), a blocking ``sendall`` and
``readline``. The thread waits in ``recv`` with the GIL released, so other
threads of the model run meanwhile; each record costs about ``delay`` plus a
round trip on loopback (about 1.1 ms for ``--delay-ms 1``).
"""

from __future__ import annotations

import argparse
import contextlib
import socket
import socketserver
import sys
import threading
import time

# (host, port) of the server; set by the child process before the topology runs.
ADDRESS: tuple[str, int] | None = None

_local = threading.local()


def echo_call(value: str) -> str:
    """Send ``value`` (one line) to the echo server and return its reply."""
    conn = getattr(_local, "conn", None)
    if conn is None:
        if ADDRESS is None:
            raise RuntimeError("echo server address not set (benchmarks.compare.echo.ADDRESS)")
        sock = socket.create_connection(ADDRESS)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        conn = _local.conn = (sock, sock.makefile("rb"))
    sock, reader = conn
    sock.sendall(value.encode() + b"\n")
    reply: bytes = reader.readline()
    if not reply:
        raise ConnectionError("echo server closed the connection")
    return reply[:-1].decode()


class _Handler(socketserver.StreamRequestHandler):
    delay_s = 0.001

    def setup(self) -> None:
        super().setup()
        self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

    def handle(self) -> None:
        delay = self.delay_s
        for line in self.rfile:
            if delay > 0:
                time.sleep(delay)
            self.wfile.write(line)
            self.wfile.flush()


class _Server(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True


def serve(delay_ms: float, port: int = 0) -> None:
    handler = type("Handler", (_Handler,), {"delay_s": delay_ms / 1000.0})
    with _Server(("127.0.0.1", port), handler) as server:
        print(server.server_address[1], flush=True)
        server.serve_forever()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--delay-ms", type=float, default=1.0)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        serve(args.delay_ms, args.port)
    return 0


if __name__ == "__main__":
    sys.exit(main())
