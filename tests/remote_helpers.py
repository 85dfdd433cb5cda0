"""Shared pieces of the remote state tests: a bucket per test, the config keys
that point an app at it, and looks into what the bucket holds.

Why here: the integration tests (in-process apps and daemons) and the
benchmark both need them. Threads: the test's own.
"""

from __future__ import annotations

import contextlib
import json
import socket
import struct
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from rocksdict import AccessType, Options, Rdict

from runtime.brokers.s3proxy import S3Proxy
from runtime.state.checkpoint import read_checkpoint
from runtime.state.consolidated import consolidated_directory
from runtime.state.consolidated_families import OFFSETS_CF, task_prefix
from tests.kafka_helpers import unique_name

__all__ = ["RemoteBucket", "SlowRelay", "local_checkpoint", "remote_bucket", "snapshot_offsets"]


class RemoteBucket:
    """One bucket of an S3Proxy, with the config and environment to use it."""

    def __init__(self, server: S3Proxy, name: str) -> None:
        self.server = server
        self.name = name
        server.create_bucket(name)

    def config(self, interval_ms: int = 1000, retained: int = 3) -> dict[str, object]:
        return {
            "state.remote.url": f"s3://{self.name}/snapshots",
            "state.remote.endpoint": self.server.endpoint,
            "state.remote.checkpoint.interval.ms": interval_ms,
            "state.remote.snapshots.retained": retained,
        }

    def env(self) -> dict[str, str]:
        return self.server.env()

    def keys(self, prefix: str = "") -> list[str]:
        client = self.server.client()
        keys: list[str] = []
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=self.name, Prefix=prefix
        ):
            keys.extend(item["Key"] for item in page.get("Contents", ()))
        return sorted(keys)

    def manifests(self, app_id: str, task_id: str) -> list[dict[str, Any]]:
        """The task's manifests, oldest first, as JSON."""
        prefix = f"snapshots/{app_id}/{task_id}/manifests/"
        client = self.server.client()
        found = []
        for key in self.keys(prefix):
            try:
                found.append(
                    json.loads(client.get_object(Bucket=self.name, Key=key)["Body"].read())
                )
            except client.exceptions.NoSuchKey:
                continue  # deleted by a retention pass since the listing
        return found

    def object_path(self, key: str) -> Path:
        """Where the file-system backend keeps an object (to damage it on purpose)."""
        return self.server.data_dir / self.name / key


@contextmanager
def remote_bucket(server: S3Proxy, monkeypatch: pytest.MonkeyPatch) -> Iterator[RemoteBucket]:
    """A fresh bucket; the AWS variables point in-process apps at the server."""
    for name, value in server.env().items():
        monkeypatch.setenv(name, value)
    yield RemoteBucket(server, unique_name("bucket").lower().replace("_", "-")[:60])


def snapshot_offsets(manifest: dict[str, Any]) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, p, o in manifest["offsets"]}


def local_checkpoint(
    state_dir: Path, app_id: str, task_id: str, layout: str = "per-task"
) -> dict[tuple[str, int], int]:
    """The task's local changelog positions: its `.checkpoint` file, or in the
    consolidated layout its entries of the `offsets` column family (read from
    the database opened read-only, which works while an app holds it)."""
    if layout == "per-task":
        return read_checkpoint(state_dir / app_id / task_id / ".checkpoint") or {}
    path = consolidated_directory(str(state_dir), app_id)
    if not (path / "CURRENT").exists():
        return {}
    db = Rdict(
        str(path),
        Options(raw_mode=True),
        column_families={OFFSETS_CF: Options(raw_mode=True)},
        access_type=AccessType.read_only(),
    )
    try:
        prefix = task_prefix(task_id)
        offsets = db.get_column_family(OFFSETS_CF)
        found: dict[tuple[str, int], int] = {}
        for key, value in offsets.items(from_key=prefix):
            if not key.startswith(prefix):
                break
            topic, number = key[len(prefix) :].decode().split("\x00")
            found[(topic, int(number))] = struct.unpack(">q", value)[0]
        del offsets
        return found
    finally:
        db.close()


class SlowRelay:
    """A TCP relay on loopback that slows uploads: bytes towards the server pass at
    about `rate` bytes/s (replies pass at full speed).

    Why: a snapshot upload to a server on loopback takes milliseconds; through this
    relay it takes seconds, so a test can kill the daemon while it is certainly in
    the middle of one. Threads: its own (one acceptor, two pumps per connection),
    all daemon threads, stopped by `stop()`. Only loopback addresses.
    """

    def __init__(self, target_port: int, rate: float) -> None:
        self._target = ("127.0.0.1", target_port)
        self.rate = rate  # may be changed at any time
        self._listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._listener.bind(("127.0.0.1", 0))
        self._listener.listen(16)
        self.port = int(self._listener.getsockname()[1])
        self._sockets: list[socket.socket] = []
        self._stopped = threading.Event()
        self._flowing = threading.Event()  # cleared by hold(): uploads wait
        self._flowing.set()
        threading.Thread(target=self._accept, name="slow-relay", daemon=True).start()

    def hold(self) -> None:
        """Stop passing bytes towards the server (at most one chunk already being
        sent still arrives): what the server holds is then frozen."""
        self._flowing.clear()

    def release(self) -> None:
        self._flowing.set()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                server = socket.create_connection(self._target, timeout=10)
            except OSError:
                client.close()
                continue
            self._sockets += [client, server]
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, slow: bool) -> None:
        chunk = 4096 if slow else 65536
        try:
            while not self._stopped.is_set():
                data = source.recv(chunk)
                if not data:
                    break
                if slow:
                    self._flowing.wait()
                    if self._stopped.is_set():
                        break
                sink.sendall(data)
                if slow:
                    time.sleep(len(data) / self.rate)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)

    def stop(self) -> None:
        self._stopped.set()
        self._flowing.set()  # wakes held pumps, which then drop their bytes
        self._listener.close()
        for sock in self._sockets:
            with contextlib.suppress(OSError):
                sock.close()
