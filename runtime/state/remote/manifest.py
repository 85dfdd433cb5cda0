"""A snapshot's manifest: which files make each store, and the offsets it covers.

JSON, written last (a snapshot whose manifest is missing does not exist).
`checksum` is the SHA-256 of the canonical JSON of every other field, so a
truncated or altered manifest is refused (`decode` raises `ValueError`), as is
an unknown format. Each file entry carries the file's size and SHA-256; the
file's key is `objects/<sha256>` (content-addressed).

`offsets` are the task's checkpoint offsets at the moment of the snapshot:
per changelog partition, the next offset the stores do not contain. Pure
data; any thread.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

FORMAT = 1
_SHA256 = re.compile(r"[0-9a-f]{64}")
_ID = re.compile(r"\d{13}-[0-9a-f]{8}")
# What a checkpoint directory holds: RocksDB's own files and rocksdict's config.
_FILE_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,200}")


@dataclass(frozen=True)
class FileEntry:
    name: str
    size: int
    sha256: str


@dataclass(frozen=True)
class StoreEntry:
    changelog: tuple[str, int]  # (topic, partition)
    files: tuple[FileEntry, ...]

    @property
    def size(self) -> int:
        return sum(f.size for f in self.files)


@dataclass(frozen=True)
class Manifest:
    snapshot_id: str
    application_id: str
    task_id: str
    created_ms: int
    offsets: dict[tuple[str, int], int]
    stores: dict[str, StoreEntry]
    instance: str = ""

    @property
    def size(self) -> int:
        return sum(s.size for s in self.stores.values())

    def body(self) -> dict[str, Any]:
        return {
            "format": FORMAT,
            "snapshot_id": self.snapshot_id,
            "application_id": self.application_id,
            "task_id": self.task_id,
            "created_ms": self.created_ms,
            "instance": self.instance,
            "offsets": [[t, p, o] for (t, p), o in sorted(self.offsets.items())],
            "stores": {
                name: {
                    "changelog": [store.changelog[0], store.changelog[1]],
                    "files": [[f.name, f.size, f.sha256] for f in store.files],
                }
                for name, store in sorted(self.stores.items())
            },
        }

    def encode(self) -> bytes:
        body = self.body()
        body["checksum"] = _checksum(body)
        return json.dumps(body, sort_keys=True, indent=1).encode("utf-8")


def _checksum(body: dict[str, Any]) -> str:
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return hashlib.sha256(canonical).hexdigest()


def decode(data: bytes) -> Manifest:
    """Parse and verify a manifest; `ValueError` says what is wrong."""
    try:
        body = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ValueError("not a JSON object")
    checksum = body.pop("checksum", None)
    if checksum != _checksum(body):
        raise ValueError("checksum mismatch (truncated or altered)")
    if body.get("format") != FORMAT:
        raise ValueError(f"unknown format {body.get('format')!r}")
    try:
        snapshot_id = _text(body["snapshot_id"])
        if not _ID.fullmatch(snapshot_id):
            raise ValueError(f"bad snapshot id {snapshot_id!r}")
        offsets: dict[tuple[str, int], int] = {}
        for topic, partition, offset in body["offsets"]:
            offsets[(_text(topic), _count(partition))] = _count(offset)
        stores: dict[str, StoreEntry] = {}
        for name, entry in body["stores"].items():
            topic, partition = entry["changelog"]
            files = []
            for file_name, size, sha in entry["files"]:
                if not isinstance(file_name, str) or not _FILE_NAME.fullmatch(file_name):
                    raise ValueError(f"bad file name {file_name!r}")
                if not isinstance(sha, str) or not _SHA256.fullmatch(sha):
                    raise ValueError(f"bad sha256 {sha!r}")
                files.append(FileEntry(file_name, _count(size), sha))
            if len({f.name for f in files}) != len(files):
                raise ValueError(f"store {name!r} names a file twice")
            changelog = (_text(topic), _count(partition))
            if changelog not in offsets:
                raise ValueError(f"store {name!r}: no offset for its changelog {changelog}")
            stores[_text(name)] = StoreEntry(changelog, tuple(files))
        return Manifest(
            snapshot_id=snapshot_id,
            application_id=_text(body["application_id"]),
            task_id=_text(body["task_id"]),
            created_ms=_count(body["created_ms"]),
            offsets=offsets,
            stores=stores,
            instance=str(body.get("instance", "")),
        )
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"malformed: {type(exc).__name__}: {exc}") from None


def _text(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise ValueError(f"expected a non-empty string, got {value!r}")
    return value


def _count(value: Any) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise ValueError(f"expected an integer >= 0, got {value!r}")
    return value
