import io
import json
import stat
import zipfile

import pytest

from edgec.errors import ArtifactError, InputFileError
from edgec.runtime.artifact import FORMAT_VERSION, MANIFEST_NAME, Artifact, sha256_hex

LIB = b"\x7fELF pretend library bytes" * 50


def _artifact(**manifest_changes) -> Artifact:
    manifest = {
        "format_version": FORMAT_VERSION, "model": {"name": "m", "sha256": "0" * 64},
        "inputs": [], "outputs": [],
        "libraries": {"x86_64": {"file": "lib/x86_64.so", "sha256": sha256_hex(LIB), "arch": "x86_64"}},
        **manifest_changes,
    }
    return Artifact(manifest, {"lib/x86_64.so": LIB})


def _zip(members: dict[str, bytes], symlink: str | None = None) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, data in members.items():
            info = zipfile.ZipInfo(name)
            if name == symlink:
                info.external_attr = (stat.S_IFLNK | 0o777) << 16
            archive.writestr(info, data)
    return buffer.getvalue()


def test_round_trip_is_deterministic(tmp_path):
    art = _artifact()
    path = art.save(tmp_path / "a.edgec")
    assert Artifact.load(path) == art
    assert art.to_bytes() == _artifact().to_bytes()


def test_flipped_and_truncated_bytes_are_refused():
    data = bytearray(_artifact().to_bytes())
    for position in (len(data) // 3, len(data) // 2):
        corrupt = bytearray(data)
        corrupt[position] ^= 0xFF
        with pytest.raises(ArtifactError):
            Artifact.from_bytes(bytes(corrupt))
    with pytest.raises(ArtifactError):
        Artifact.from_bytes(bytes(data[: len(data) // 2]))
    with pytest.raises(ArtifactError, match="not a zip archive"):
        Artifact.from_bytes(b"hello")


def test_checksum_mismatch_is_named():
    art = _artifact()
    tampered = Artifact(art.manifest, {"lib/x86_64.so": LIB + b"!"})
    with pytest.raises(ArtifactError, match="checksum mismatch for 'lib/x86_64.so'"):
        Artifact.from_bytes(tampered.to_bytes())


def test_newer_format_version_asks_for_an_upgrade():
    with pytest.raises(ArtifactError, match="upgrade edgec"):
        Artifact.from_bytes(_artifact(format_version=FORMAT_VERSION + 1).to_bytes())


@pytest.mark.parametrize("name", ["../evil.so", "/abs/evil.so", "lib/../../evil.so", "C:/evil.so"])
def test_member_paths_escaping_the_archive_are_refused(name):
    manifest = json.dumps(_artifact().manifest).encode()
    data = _zip({MANIFEST_NAME: manifest, "lib/x86_64.so": LIB, name: b"x"})
    with pytest.raises(ArtifactError, match="escapes the archive"):
        Artifact.from_bytes(data)


def test_symlink_members_and_unlisted_members_are_refused():
    manifest = json.dumps(_artifact().manifest).encode()
    with pytest.raises(ArtifactError, match="not a plain file"):
        Artifact.from_bytes(_zip({MANIFEST_NAME: manifest, "lib/x86_64.so": LIB, "link": b"/etc"}, "link"))
    with pytest.raises(ArtifactError, match="does not list: extra.bin"):
        Artifact.from_bytes(_zip({MANIFEST_NAME: manifest, "lib/x86_64.so": LIB, "extra.bin": b"x"}))
    with pytest.raises(ArtifactError, match="no manifest.json"):
        Artifact.from_bytes(_zip({"lib/x86_64.so": LIB}))


def test_missing_artifact_file(tmp_path):
    with pytest.raises(InputFileError, match="does not exist"):
        Artifact.load(tmp_path / "none.edgec")
