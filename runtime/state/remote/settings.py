"""Remote state settings and the layout of a snapshot's keys in the bucket.

Layout, under `s3://<bucket>/<prefix>/<application.id>/<task id>/`:

    manifests/<snapshot id>.json   one per snapshot, written last
    objects/<sha256>               file contents, shared by the task's snapshots

A snapshot id is `<created ms, 13 digits>-<8 hex>`, so ids sort by age.
Immutable; any thread.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from runtime.config_values import parse_remote_url

if TYPE_CHECKING:  # the caller's config; state sits below config
    from runtime.config import StreamsConfig


@dataclass(frozen=True)
class RemoteSettings:
    bucket: str
    prefix: str
    endpoint: str | None
    application_id: str
    interval_s: float
    retained: int
    max_age_s: float

    @classmethod
    def from_config(cls, config: StreamsConfig) -> RemoteSettings | None:
        """The settings, or None when `state.remote.url` is not set."""
        if not config.state_remote_url:
            return None
        bucket, prefix = parse_remote_url(config.state_remote_url)
        return cls(
            bucket=bucket,
            prefix=prefix,
            endpoint=config.state_remote_endpoint,
            application_id=config.application_id,
            interval_s=config.state_remote_checkpoint_interval_ms / 1000.0,
            retained=config.state_remote_snapshots_retained,
            max_age_s=config.state_remote_snapshot_max_age_ms / 1000.0,
        )

    def task_prefix(self, task_id: str) -> str:
        parts = [p for p in (self.prefix, self.application_id, task_id) if p]
        return "/".join(parts) + "/"

    def manifests_prefix(self, task_id: str) -> str:
        return self.task_prefix(task_id) + "manifests/"

    def manifest_key(self, task_id: str, snapshot_id: str) -> str:
        return f"{self.manifests_prefix(task_id)}{snapshot_id}.json"

    def objects_prefix(self, task_id: str) -> str:
        return self.task_prefix(task_id) + "objects/"

    def object_key(self, task_id: str, sha256: str) -> str:
        return self.objects_prefix(task_id) + sha256

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"
