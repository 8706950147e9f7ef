"""Ed25519 signatures on artifacts: establish who built one, not only that it is intact.

The signature covers the manifest's bytes exactly as stored in the artifact, and the manifest
holds every library's sha256, so it covers every library too. It is stored as the artifact member
``manifest.sig`` (JSON: algorithm, signer's public key, signature, all hex). The public key stored
there only names the signer in error messages; verification uses the key the caller trusts.

Needs the ``cryptography`` package, imported only when a key is used: the runtime loads unsigned
artifacts without it. Keys are files, PEM (PKCS#8 private, SubjectPublicKeyInfo public, as
``edgec keygen`` or ``openssl genpkey -algorithm ed25519`` writes them) or 32 raw bytes.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from edgec.errors import ArtifactError, InputFileError, ToolchainError
from edgec.fileio import atomic_write
from edgec.runtime.artifact import Artifact

ALGORITHM = "ed25519"
# Prefixed to the manifest before signing, so a signature made for something else (another tool
# using the same key) can never pass for an artifact's.
CONTEXT = b"edgec artifact manifest v1\n"
CRYPTOGRAPHY_PIN = "cryptography==50.0.2"


def _ed25519() -> Any:
    try:
        from cryptography.hazmat.primitives.asymmetric import ed25519
    except ImportError:
        raise ToolchainError(
            f"signatures need the 'cryptography' package; install it (pip install "
            f"'{CRYPTOGRAPHY_PIN}', or edgec-runtime[signing] on a device)"
        ) from None
    return ed25519


def _read_key_file(path: str | Path, kind: str) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise InputFileError(f"{kind} key '{path}' does not exist; make a key pair with `edgec keygen`")
    try:
        return path.read_bytes()
    except OSError as exc:
        raise InputFileError(f"cannot read {kind} key '{path}': {exc.strerror}") from None


def load_private_key(path: str | Path) -> Any:
    """The Ed25519 private key in ``path`` (PEM, unencrypted, or 32 raw bytes)."""
    ed25519 = _ed25519()
    data = _read_key_file(path, "private")
    if len(data) == 32 and not data.startswith(b"-----"):
        return ed25519.Ed25519PrivateKey.from_private_bytes(data)
    from cryptography.hazmat.primitives.serialization import load_pem_private_key

    try:
        key = load_pem_private_key(data, password=None)
    except TypeError:  # cryptography's way of saying the key is encrypted
        raise InputFileError(f"private key '{path}' is encrypted; use an unencrypted one "
                             f"(keep it in a protected file instead)") from None
    except ValueError:
        raise InputFileError(f"'{path}' is not a private key (PEM or 32 raw bytes); make one "
                             f"with `edgec keygen`") from None
    if not isinstance(key, ed25519.Ed25519PrivateKey):
        raise InputFileError(f"'{path}' is a {type(key).__name__.lstrip('_')}, not an Ed25519 key; "
                             f"make one with `edgec keygen`")
    return key


def load_public_key(source: Any) -> Any:
    """An Ed25519 public key from a key object, PEM or 32 raw bytes, or a file holding either."""
    ed25519 = _ed25519()
    if isinstance(source, ed25519.Ed25519PublicKey):
        return source
    where = "the public key"
    if isinstance(source, (str, Path)):
        where = f"'{source}'"
        source = _read_key_file(source, "public")
    if not isinstance(source, bytes):
        raise TypeError(f"a public key must be a path, bytes or Ed25519PublicKey, not {type(source).__name__}")
    if len(source) == 32 and not source.startswith(b"-----"):
        return ed25519.Ed25519PublicKey.from_public_bytes(source)
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    try:
        key = load_pem_public_key(source)
    except ValueError:
        raise InputFileError(f"{where} is not a public key (PEM or 32 raw bytes); pass the .pub "
                             f"file `edgec keygen` wrote") from None
    if not isinstance(key, ed25519.Ed25519PublicKey):
        raise InputFileError(f"{where} is a {type(key).__name__.lstrip('_')}, not an Ed25519 key")
    return key


def _raw_public(key: Any) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def fingerprint(key: Any) -> str:
    """A short name for a public key: the first 16 hex digits of its raw bytes."""
    return _raw_public(key).hex()[:16]


def sign_artifact(artifact: "Artifact", private_key: Any) -> "Artifact":
    """``artifact`` with a signature over its manifest (as :meth:`Artifact.to_bytes` stores it)."""
    signature = private_key.sign(CONTEXT + artifact.manifest_bytes())
    document = {"algorithm": ALGORITHM, "public_key": _raw_public(private_key.public_key()).hex(),
                "signature": signature.hex()}
    return replace(artifact, signature=json.dumps(document, indent=1).encode())


def verify_artifact(artifact: "Artifact", public_key: Any, where: str) -> None:
    """Raise ArtifactError unless ``artifact`` carries a valid signature by ``public_key``."""
    key = load_public_key(public_key)  # first: it names the package when cryptography is missing
    from cryptography.exceptions import InvalidSignature

    if artifact.signature is None:
        raise ArtifactError(f"'{where}' is not signed, and a signature by key {fingerprint(key)} is "
                            f"required; rebuild it with `edgec compile --sign KEY`")
    try:
        document = json.loads(artifact.signature)
        if document["algorithm"] != ALGORITHM:
            raise ArtifactError(f"'{where}' is signed with '{document['algorithm']}', this edgec "
                                f"verifies only {ALGORITHM}")
        signature = bytes.fromhex(document["signature"])
        signer = str(document.get("public_key", ""))[:16]
    except ArtifactError:
        raise
    except Exception:  # any malformed signature document: refuse it the same way
        raise ArtifactError(f"'{where}' has a malformed signature; the artifact was modified, "
                            f"rebuild and sign it again") from None
    try:
        key.verify(signature, CONTEXT + artifact.stored_manifest)
    except InvalidSignature:
        if signer and signer != fingerprint(key):
            raise ArtifactError(f"'{where}' is signed by key {signer}, not by the required key "
                                f"{fingerprint(key)}; refusing it") from None
        raise ArtifactError(f"'{where}' has an invalid signature for key {fingerprint(key)}: its "
                            f"manifest was modified after signing; refusing it") from None


def generate_keypair(private_path: str | Path) -> tuple[Path, Path]:
    """Write a new Ed25519 key pair: ``private_path`` (PEM, mode 0600) and ``<private_path>.pub``."""
    from cryptography.hazmat.primitives import serialization


    ed25519 = _ed25519()
    private_path = Path(private_path)
    public_path = private_path.with_name(private_path.name + ".pub")
    if private_path.exists():
        raise InputFileError(f"'{private_path}' exists; refusing to overwrite a key (remove it first)")
    key = ed25519.Ed25519PrivateKey.generate()
    private_pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                    serialization.NoEncryption())
    public_pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                               serialization.PublicFormat.SubjectPublicKeyInfo)

    # atomic_write's temporary file is created 0600, so the private key is never readable by others.
    atomic_write(private_path, lambda tmp: tmp.write_bytes(private_pem), mode=0o600)
    atomic_write(public_path, lambda tmp: tmp.write_bytes(public_pem), mode=0o644)
    return private_path, public_path
