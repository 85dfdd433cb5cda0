"""Remote state manifests and URLs: what is refused, and the round trip."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runtime.config_values import Invalid, parse_remote_url
from runtime.state.remote.manifest import FileEntry, Manifest, StoreEntry, decode

SHA = "ab" * 32

names = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._-]{0,20}", fullmatch=True)
topics = st.from_regex(r"[a-z][a-z0-9._-]{0,30}", fullmatch=True)


@st.composite
def manifests(draw: st.DrawFn) -> Manifest:
    stores = {}
    offsets = {}
    for index, name in enumerate(draw(st.lists(names, min_size=1, max_size=3, unique=True))):
        changelog = (draw(topics) + f"-{index}", draw(st.integers(0, 1000)))
        offsets[changelog] = draw(st.integers(0, 2**62))
        files = draw(st.lists(names, max_size=5, unique=True))
        stores[name] = StoreEntry(
            changelog,
            tuple(
                FileEntry(
                    f,
                    draw(st.integers(0, 2**40)),
                    draw(st.from_regex(r"[0-9a-f]{64}", fullmatch=True)),
                )
                for f in files
            ),
        )
    return Manifest(
        snapshot_id=f"{draw(st.integers(0, 10**13 - 1)):013d}-{draw(st.from_regex(r'[0-9a-f]{8}', fullmatch=True))}",
        application_id=draw(names),
        task_id=f"{draw(st.integers(0, 99))}_{draw(st.integers(0, 999))}",
        created_ms=draw(st.integers(0, 2**45)),
        offsets=offsets,
        stores=stores,
        instance=draw(names),
    )


@given(manifests())
def test_a_manifest_survives_encoding(manifest: Manifest) -> None:
    assert decode(manifest.encode()) == manifest


@given(manifests(), st.data())
def test_any_truncation_or_changed_byte_is_refused(manifest: Manifest, data: st.DataObject) -> None:
    encoded = manifest.encode()
    cut = data.draw(st.integers(0, len(encoded) - 1))
    with pytest.raises(ValueError):
        decode(encoded[:cut])
    index = data.draw(st.integers(0, len(encoded) - 1))
    changed = bytearray(encoded)
    changed[index] = (changed[index] + data.draw(st.integers(1, 255))) % 256
    try:
        decoded = decode(bytes(changed))
    except ValueError:
        return
    # Only a change JSON ignores (whitespace between tokens) may pass, and then
    # nothing that matters changed.
    assert decoded == manifest


def test_a_file_name_that_could_escape_its_directory_is_refused() -> None:
    manifest = Manifest(
        "0000000000001-0123abcd",
        "app",
        "0_0",
        1,
        {("t", 0): 5},
        {"s": StoreEntry(("t", 0), (FileEntry("../x", 1, SHA),))},
    )
    with pytest.raises(ValueError, match="bad file name"):
        decode(manifest.encode())


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("s3://bucket", ("bucket", "")),
        ("s3://my.bucket-1/a/b/", ("my.bucket-1", "a/b")),
        ("S3://bucket/x", ("bucket", "x")),
    ],
)
def test_remote_urls(url: str, expected: tuple[str, str]) -> None:
    assert parse_remote_url(url) == expected


@pytest.mark.parametrize(
    "url", ["bucket/x", "s3://", "s3://UPPER/x", "s3://b/x", "s3://bucket/a/../b", "gs://bucket"]
)
def test_bad_remote_urls(url: str) -> None:
    with pytest.raises(Invalid):
        parse_remote_url(url)
