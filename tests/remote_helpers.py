"""Shared pieces of the remote state tests: a bucket per test, the config keys
that point an app at it, and looks into what the bucket holds.

Why here: the integration tests (in-process apps and daemons) and the
benchmark both need them. Threads: the test's own.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from runtime.brokers.s3proxy import S3Proxy
from runtime.state.checkpoint import read_checkpoint
from tests.kafka_helpers import unique_name

__all__ = ["RemoteBucket", "remote_bucket"]


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
        return [
            json.loads(client.get_object(Bucket=self.name, Key=key)["Body"].read())
            for key in self.keys(prefix)
        ]

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


def local_checkpoint(state_dir: Path, app_id: str, task_id: str) -> dict[tuple[str, int], int]:
    return read_checkpoint(state_dir / app_id / task_id / ".checkpoint") or {}
