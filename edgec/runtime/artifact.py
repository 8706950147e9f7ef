"""The ``.edgec`` artifact format: one zip file holding a manifest and one library per target.

Layout (format version 1; the full spec, which both readers follow, is ``docs/artifact-format.md``)::

    manifest.json          format_version, model, inputs, outputs, plan, quantization,
                           libraries {target: {file, sha256, bytes, arch, kind, functions}}, versions
    lib/<target>.so        a TVM VM executable exported as a shared library
    manifest.sig           optional: an Ed25519 signature over manifest.json (edgec/signing.py)

Reading checks the format version, that every member name stays inside the archive and is a plain
file, and every library's sha256, before anything is handed to native code.
"""

from __future__ import annotations

import hashlib
import io
import json
import stat
import zipfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from edgec.errors import ArtifactError, InputFileError, describe
from edgec.fileio import write_bytes

FORMAT_VERSION = 1
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
_REQUIRED_KEYS = ("format_version", "model", "inputs", "outputs", "libraries")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass(frozen=True)
class Artifact:
    """An artifact in memory: its manifest and the bytes of each library, keyed by member path."""

    manifest: dict[str, Any]
    files: dict[str, bytes]
    # The SIGNATURE_NAME member, if signed; and the manifest's bytes as read, which it signs.
    signature: bytes | None = None
    stored_manifest: bytes = field(default=b"", compare=False, repr=False)

    def manifest_bytes(self) -> bytes:
        """The manifest as :meth:`to_bytes` stores it (what a signature made now covers)."""
        return json.dumps(self.manifest, indent=1).encode()

    def library(self, target: str) -> bytes:
        return self.files[self.manifest["libraries"][target]["file"]]

    def to_bytes(self) -> bytes:
        """Serialize deterministically: members sorted, fixed timestamps."""
        buffer = io.BytesIO()
        with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
            members = {MANIFEST_NAME: self.manifest_bytes(), **self.files}
            if self.signature is not None:
                members[SIGNATURE_NAME] = self.signature
            for name in sorted(members):
                info = zipfile.ZipInfo(name, date_time=(2020, 1, 1, 0, 0, 0))
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = (stat.S_IFREG | 0o644) << 16
                archive.writestr(info, members[name])
        return buffer.getvalue()

    @classmethod
    def from_bytes(cls, data: bytes, where: str = "artifact") -> "Artifact":
        """Parse and verify an artifact; raises ArtifactError naming what is wrong."""
        try:
            archive = zipfile.ZipFile(io.BytesIO(data))
        except Exception:  # zipfile raises many unrelated types on malformed input
            raise ArtifactError(f"'{where}' is not an edgec artifact (not a zip archive); rebuild it") from None
        with archive:
            infos = archive.infolist()
            for info in infos:
                _check_member(info, where)
            names = {info.filename for info in infos}
            if len(names) != len(infos):
                raise ArtifactError(f"'{where}' holds duplicate member names; the file was tampered with")
            if MANIFEST_NAME not in names:
                raise ArtifactError(f"'{where}' has no {MANIFEST_NAME}; it is not an edgec artifact")
            try:
                stored_manifest = archive.read(MANIFEST_NAME)
                manifest = json.loads(stored_manifest)
                signature = archive.read(SIGNATURE_NAME) if SIGNATURE_NAME in names else None
                files = {n: archive.read(n) for n in sorted(names - {MANIFEST_NAME, SIGNATURE_NAME})}
            except Exception as exc:  # as above: any failure to parse means a corrupt file
                raise ArtifactError(f"'{where}' is corrupt ({describe(exc)}); rebuild it") from None
        check_manifest(manifest, files, where)
        return cls(manifest, files, signature, stored_manifest)

    def save(self, path: str | Path) -> Path:
        return write_bytes(path, self.to_bytes())

    @classmethod
    def load(cls, path: str | Path) -> "Artifact":
        path = Path(path)
        if not path.is_file():
            raise InputFileError(f"artifact '{path}' does not exist; build one with `edgec compile`")
        return cls.from_bytes(path.read_bytes(), str(path))


def _check_member(info: zipfile.ZipInfo, where: str) -> None:
    name = info.filename
    pure = PurePosixPath(name)
    if name.startswith(("/", "\\")) or pure.is_absolute() or ".." in pure.parts or "\\" in name \
            or (len(name) > 1 and name[1] == ":"):
        raise ArtifactError(f"'{where}' has member '{name}' whose path escapes the archive; refusing it")
    file_type = stat.S_IFMT(info.external_attr >> 16)
    if file_type and file_type != stat.S_IFREG:
        raise ArtifactError(f"'{where}' has member '{name}' that is not a plain file; refusing it")


def check_manifest(manifest: Any, files: dict[str, bytes], where: str) -> None:
    """Check the manifest's version and fields and every library's presence and checksum."""
    if not isinstance(manifest, dict) or any(k not in manifest for k in _REQUIRED_KEYS):
        raise ArtifactError(f"'{where}' has an incomplete manifest; rebuild it")
    version = manifest["format_version"]
    if not isinstance(version, int):
        raise ArtifactError(f"'{where}' has an invalid format_version {version!r}; rebuild it")
    if version > FORMAT_VERSION:
        raise ArtifactError(
            f"'{where}' is artifact format {version}, this runtime reads up to {FORMAT_VERSION}; "
            f"upgrade edgec"
        )
    if version < 1:
        raise ArtifactError(f"'{where}' has an invalid format_version {version}; rebuild it")
    if not isinstance(manifest["model"], dict):
        raise ArtifactError(f"'{where}' has an invalid model entry in its manifest; rebuild it")
    for kind in ("inputs", "outputs"):
        specs = manifest[kind]
        if not isinstance(specs, list) or not all(_valid_spec(spec) for spec in specs):
            raise ArtifactError(f"'{where}' has invalid {kind} in its manifest; rebuild it")
    libraries = manifest["libraries"]
    if not isinstance(libraries, dict) or not libraries:
        raise ArtifactError(f"'{where}' lists no libraries; rebuild it")
    listed = set()
    for target, entry in libraries.items():
        file = entry.get("file") if isinstance(entry, dict) else None
        if not file or file not in files:
            raise ArtifactError(f"'{where}': the library for target '{target}' is missing; rebuild it")
        if sha256_hex(files[file]) != entry.get("sha256"):
            raise ArtifactError(
                f"'{where}': checksum mismatch for '{file}' (target '{target}'); the artifact is "
                f"corrupt or was modified, rebuild it"
            )
        listed.add(file)
    unlisted = sorted(set(files) - listed)
    if unlisted:
        raise ArtifactError(f"'{where}' holds members the manifest does not list: {', '.join(unlisted)}")


def _valid_spec(spec: Any) -> bool:
    """A tensor spec the runtime can check inputs against: name, dtype name, dims, bounds."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        return False
    dims = spec.get("dims")
    if not isinstance(spec.get("dtype"), str) or not isinstance(dims, list):
        return False
    if not all((isinstance(d, int) and not isinstance(d, bool) and d >= 0) or isinstance(d, str) for d in dims):
        return False
    bounds = spec.get("bounds")
    return bounds is None or (isinstance(bounds, list) and len(bounds) == 2
                              and all(isinstance(b, int) and not isinstance(b, bool) for b in bounds))
