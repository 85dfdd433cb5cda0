"""The object store behind remote state: an S3 bucket through boto3.

boto3 is an optional dependency (the `remote` extra), imported when an
`ObjectStore` is made. Every failure of a request (network, refusal, missing
key) is raised as `RemoteStoreError`, so callers handle one type.

Settings that matter for S3-compatible servers: path-style addressing when an
endpoint is given (`http://127.0.0.1:9000/bucket/key`: a bucket sub-domain of
an IP address does not resolve), and checksums only where S3 requires them
(botocore 1.36 started sending CRC32 trailers with aws-chunked bodies, which
several S3-compatible servers refuse). Integrity does not depend on them: each
file's SHA-256 is in the manifest and checked after download.

Threads: a boto3 client is thread-safe, but the project's rule is simpler:
the restoration thread uses it (and the caller of `App.start`, once, for
`check_bucket`, before the threads start).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from runtime.state.remote.settings import RemoteSettings

_CHUNK = 1 << 20


class RemoteStoreError(RuntimeError):
    """A request to the object store failed; `missing` when the key does not exist."""

    def __init__(self, message: str, *, missing: bool = False, code: str = "") -> None:
        super().__init__(message)
        self.missing = missing
        self.code = code


def _client(settings: RemoteSettings, connect_timeout: float, read_timeout: float) -> Any:
    try:
        import boto3
        from botocore.config import Config
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise RemoteStoreError(
            "remote state needs boto3: pip install 'streams-runtime[remote]'", code="NoBoto3"
        ) from exc
    options: dict[str, Any] = {
        "connect_timeout": connect_timeout,
        "read_timeout": read_timeout,
        "retries": {"max_attempts": 3, "mode": "standard"},
    }
    if settings.endpoint:
        options["s3"] = {"addressing_style": "path"}
    try:
        config = Config(
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
            **options,
        )
    except TypeError:  # botocore before 1.36 has neither option (nor the trailers)
        config = Config(**options)
    session = boto3.session.Session()
    return session.client("s3", endpoint_url=settings.endpoint or None, config=config)


def _error(exc: Exception, what: str) -> RemoteStoreError:
    code = ""
    response = getattr(exc, "response", None)
    if isinstance(response, dict):
        code = str(response.get("Error", {}).get("Code", ""))
    missing = code in ("404", "NoSuchKey", "NotFound")
    detail = f"{type(exc).__name__}: {exc}"
    return RemoteStoreError(f"{what}: {detail}", missing=missing, code=code)


class ObjectStore:
    """One bucket. Keys are full keys (see `RemoteSettings` for the layout)."""

    def __init__(
        self, settings: RemoteSettings, connect_timeout: float = 5.0, read_timeout: float = 30.0
    ) -> None:
        self.settings = settings
        self.bucket = settings.bucket
        self._s3 = _client(settings, connect_timeout, read_timeout)
        self._bulk_delete = True

    def check_bucket(self) -> None:
        """Raise `RemoteStoreError` unless the bucket exists and answers us."""
        try:
            self._s3.head_bucket(Bucket=self.bucket)
        except Exception as exc:
            raise _error(exc, f"bucket {self.bucket!r}") from None

    def put_file(self, key: str, path: str | os.PathLike[str]) -> int:
        """Upload a file; returns its size."""
        size = os.path.getsize(path)
        try:
            with open(path, "rb") as body:
                self._s3.put_object(Bucket=self.bucket, Key=key, Body=body, ContentLength=size)
        except OSError:
            raise
        except Exception as exc:
            raise _error(exc, f"put {key}") from None
        return size

    def put_bytes(self, key: str, data: bytes) -> None:
        try:
            self._s3.put_object(Bucket=self.bucket, Key=key, Body=data)
        except Exception as exc:
            raise _error(exc, f"put {key}") from None

    def get_bytes(self, key: str, limit: int = 64 << 20) -> bytes:
        try:
            response = self._s3.get_object(Bucket=self.bucket, Key=key)
            body = response["Body"]
            try:
                data: bytes = body.read(limit + 1)
            finally:
                body.close()
        except Exception as exc:
            raise _error(exc, f"get {key}") from None
        if len(data) > limit:
            raise RemoteStoreError(f"get {key}: larger than {limit} bytes")
        return data

    def download(self, key: str, path: str | os.PathLike[str]) -> tuple[int, str]:
        """Stream an object into `path` (created); returns (size, sha256 hex)."""
        digest = hashlib.sha256()
        size = 0
        try:
            response = self._s3.get_object(Bucket=self.bucket, Key=key)
            body = response["Body"]
            try:
                with open(path, "wb") as out:
                    for chunk in iter(lambda: body.read(_CHUNK), b""):
                        out.write(chunk)
                        digest.update(chunk)
                        size += len(chunk)
            finally:
                body.close()
        except OSError:
            raise
        except Exception as exc:
            raise _error(exc, f"get {key}") from None
        return size, digest.hexdigest()

    def list_keys(self, prefix: str) -> Iterator[tuple[str, int]]:
        """(key, size) of every object under `prefix`, in key order (lazily,
        a page of up to 1000 keys per request)."""
        try:
            paginator = self._s3.get_paginator("list_objects_v2")
            for page in paginator.paginate(Bucket=self.bucket, Prefix=prefix):
                for item in page.get("Contents", ()):
                    yield str(item["Key"]), int(item.get("Size", 0))
        except Exception as exc:
            raise _error(exc, f"list {prefix}") from None

    def delete_keys(self, keys: list[str]) -> None:
        """Delete keys (a missing one is no error): 1000 per DeleteObjects
        request, or one by one on servers that do not implement it as botocore
        sends it (newer botocore signs it with a CRC32 header instead of
        Content-MD5, which some S3-compatible servers refuse)."""
        for start in range(0, len(keys), 1000):
            batch = keys[start : start + 1000]
            if self._bulk_delete:
                try:
                    self._delete_batch(batch)
                    continue
                except RemoteStoreError as exc:
                    if exc.code != "NotImplemented":
                        raise
                    self._bulk_delete = False
            for key in batch:
                try:
                    self._s3.delete_object(Bucket=self.bucket, Key=key)
                except Exception as exc:
                    error = _error(exc, f"delete {key}")
                    if not error.missing:
                        raise error from None

    def _delete_batch(self, keys: list[str]) -> None:
        try:
            response = self._s3.delete_objects(
                Bucket=self.bucket, Delete={"Objects": [{"Key": k} for k in keys], "Quiet": True}
            )
        except Exception as exc:
            raise _error(exc, f"delete {len(keys)} keys") from None
        errors = response.get("Errors") or []
        if errors:
            first = errors[0]
            raise RemoteStoreError(
                f"delete {first.get('Key')}: {first.get('Code')} {first.get('Message')}"
            )


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for chunk in iter(lambda: handle.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()
