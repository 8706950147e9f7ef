"""Ed25519 artifact signatures: keygen, signing, and loads that require a signature refusing
unsigned, wrong-key and tampered artifacts before any native code is loaded."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from edgec import runtime
from edgec.cli import main
from edgec.errors import ArtifactError, InputFileError
from edgec.runtime.artifact import SIGNATURE_NAME, Artifact
from edgec.signing import (fingerprint, generate_keypair, load_private_key, load_public_key,
                           sign_artifact, verify_artifact)

REPO = Path(__file__).resolve().parents[2]
X = {"x": np.ones((1, 8, 16), np.float32)}


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    folder = tmp_path_factory.mktemp("keys")
    return generate_keypair(folder / "builder"), generate_keypair(folder / "stranger")


@pytest.fixture(scope="module")
def signed(mlp_artifact, keys, tmp_path_factory):
    (private, _public), _ = keys
    artifact = sign_artifact(Artifact.load(mlp_artifact), load_private_key(private))
    return artifact.save(tmp_path_factory.mktemp("signed") / "signed.edgec")


def _no_native_code(monkeypatch):
    """Make loading the TVM runtime fail loudly: a refusal must come before it."""
    def forbidden(*_args):
        raise AssertionError("native code loaded before the signature was checked")
    monkeypatch.setattr(runtime, "_ensure_runtime", forbidden)


def test_keygen_writes_a_private_key_only_its_owner_reads(tmp_path, capsys):
    assert main(["keygen", "-o", str(tmp_path / "k")]) == 0
    assert stat.S_IMODE((tmp_path / "k").stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "k.pub").stat().st_mode) == 0o644
    assert (tmp_path / "k").read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    key = load_public_key(tmp_path / "k.pub")
    assert fingerprint(key) in capsys.readouterr().out
    assert fingerprint(load_private_key(tmp_path / "k").public_key()) == fingerprint(key)
    assert main(["keygen", "-o", str(tmp_path / "k")]) == InputFileError.exit_code  # never overwrites


def test_signed_artifact_loads_and_runs_with_the_right_key(signed, keys):
    (_private, public), _ = keys
    stored = Artifact.load(signed)
    assert stored.signature is not None and json.loads(stored.signature)["algorithm"] == "ed25519"
    for key in (public, public.read_bytes(), load_public_key(public)):  # path, PEM bytes, key object
        model = runtime.load(signed, require_signature=key)
        assert model.run(X)["y"].shape == (1, 8, 8)
    runtime.load(signed)  # a signature is checked only when required


def test_unsigned_artifact_is_refused_when_a_signature_is_required(mlp_artifact, keys, monkeypatch):
    (_private, public), _ = keys
    _no_native_code(monkeypatch)
    with pytest.raises(ArtifactError, match="is not signed, and a signature by key .* is required"):
        runtime.load(mlp_artifact, require_signature=public)


def test_wrong_key_is_refused(signed, keys, monkeypatch):
    (_private, public), (_other_private, other_public) = keys
    _no_native_code(monkeypatch)
    with pytest.raises(ArtifactError, match=f"signed by key {fingerprint(load_public_key(public))}, "
                                            f"not by the required key"):
        runtime.load(signed, require_signature=other_public)


def test_tampering_is_refused(signed, keys, tmp_path, monkeypatch):
    (_private, public), (other_private, _) = keys
    _no_native_code(monkeypatch)
    original = Artifact.load(signed)
    # The manifest changed (here: the declared inputs), the signature kept.
    manifest = json.loads(json.dumps(original.manifest))
    manifest["inputs"][0]["dims"][2] = 32
    path = dataclasses.replace(original, manifest=manifest).save(tmp_path / "manifest.edgec")
    with pytest.raises(ArtifactError, match="invalid signature .* manifest was modified after signing"):
        runtime.load(path, require_signature=public)
    # A library replaced, manifest and signature kept: its checksum no longer matches.
    (name,) = original.files
    library = bytearray(original.files[name])
    library[100] ^= 1
    path = dataclasses.replace(original, files={name: bytes(library)}).save(tmp_path / "library.edgec")
    with pytest.raises(ArtifactError, match="checksum mismatch"):
        runtime.load(path, require_signature=public)
    # Re-signed by someone else, who also stored their own public key in the signature.
    path = sign_artifact(original, load_private_key(other_private)).save(tmp_path / "resigned.edgec")
    with pytest.raises(ArtifactError, match="not by the required key"):
        runtime.load(path, require_signature=public)
    # A garbled signature member.
    path = dataclasses.replace(original, signature=b"{not json").save(tmp_path / "garbled.edgec")
    with pytest.raises(ArtifactError, match="malformed signature"):
        runtime.load(path, require_signature=public)


def test_raw_and_openssl_keys_are_accepted(mlp_artifact, tmp_path):
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(bytes(range(32)))
    (tmp_path / "raw").write_bytes(key.private_bytes_raw())
    (tmp_path / "raw.pub").write_bytes(key.public_key().public_bytes_raw())
    path = sign_artifact(Artifact.load(mlp_artifact), load_private_key(tmp_path / "raw")).save(tmp_path / "a.edgec")
    verify_artifact(Artifact.load(path), tmp_path / "raw.pub", str(path))
    if shutil.which("openssl") is None:
        return
    subprocess.run(["openssl", "genpkey", "-algorithm", "ed25519", "-out", str(tmp_path / "o.pem")], check=True)
    subprocess.run(["openssl", "pkey", "-in", str(tmp_path / "o.pem"), "-pubout", "-out",
                    str(tmp_path / "o.pub")], check=True)
    path = sign_artifact(Artifact.load(mlp_artifact), load_private_key(tmp_path / "o.pem")).save(tmp_path / "o.edgec")
    verify_artifact(Artifact.load(path), tmp_path / "o.pub", str(path))
    assert load_public_key(tmp_path / "o.pub").public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw) != key.public_key().public_bytes_raw()


def test_bad_key_files_are_named(tmp_path):
    (tmp_path / "junk").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnope\n")
    with pytest.raises(InputFileError, match="is not a private key"):
        load_private_key(tmp_path / "junk")
    with pytest.raises(InputFileError, match="does not exist; make a key pair with `edgec keygen`"):
        load_public_key(tmp_path / "missing.pub")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    rsa_like = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    (tmp_path / "ec.pem").write_bytes(rsa_like)
    with pytest.raises(InputFileError, match="not an Ed25519 key"):
        load_private_key(tmp_path / "ec.pem")


def _edgec(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("EDGEC_DEBUG", None)
    return subprocess.run([sys.executable, "-m", "edgec", *map(str, args)], capture_output=True,
                          text=True, cwd=REPO, env=env)


def test_cli_run_and_bench_require_signature(signed, mlp_artifact, mlp_dir, keys, tmp_path):
    (_private, public), (_, other_public) = keys
    sample = mlp_dir / "samples" / "sample_000.npz"
    ok = _edgec("run", signed, "--inputs", sample, "--require-signature", public, "-o", tmp_path / "y.npz")
    assert ok.returncode == 0, ok.stderr
    for artifact, key, message in [(mlp_artifact, public, "is not signed"),
                                   (signed, other_public, "not by the required key")]:
        refused = _edgec("run", artifact, "--inputs", sample, "--require-signature", key, "-o", tmp_path / "z.npz")
        assert refused.returncode == ArtifactError.exit_code and message in refused.stderr
        assert refused.stderr.count("\n") == 1 and "Traceback" not in refused.stderr
    assert not (tmp_path / "z.npz").exists()
    refused = _edgec("bench", mlp_artifact, "--samples", mlp_dir / "samples", "--model", mlp_dir / "model.onnx",
                     "--require-signature", public, "-o", tmp_path / "r.json")
    assert refused.returncode == ArtifactError.exit_code and "is not signed" in refused.stderr
    assert not (tmp_path / "r.json").exists()


def test_compile_with_a_missing_key_fails_before_compiling(mlp_dir, tmp_path):
    result = _edgec("compile", mlp_dir / "model.onnx", "--samples", mlp_dir / "samples", "--target",
                    "x86_64", "--sign", tmp_path / "nokey", "-o", tmp_path / "a.edgec")
    assert result.returncode == InputFileError.exit_code and "private key" in result.stderr
    assert "region" not in result.stdout and not (tmp_path / "a.edgec").exists()


@pytest.mark.slow  # a compile: ~10 s
def test_compile_sign_then_run_require_signature(mlp_dir, keys, tmp_path):
    (private, public), _ = keys
    out = tmp_path / "signed.edgec"
    built = _edgec("compile", mlp_dir / "model.onnx", "--samples", mlp_dir / "samples", "--target",
                   "x86_64", "--sign", private, "-o", out)
    assert built.returncode == 0, built.stderr
    import zipfile

    with zipfile.ZipFile(out) as archive:
        assert SIGNATURE_NAME in archive.namelist()
    assert runtime.load(out, require_signature=public).run(X)["y"].shape == (1, 8, 8)


def test_cpp_host_runs_signed_artifacts(signed, tmp_path):
    """A signed artifact runs in the C++ host without a key asked for (verification with one:
    tests/runtime/test_cpp_host.py)."""
    from runtime.test_cpp_host import build_host, missing_tools, run_host

    if missing_tools("g++", "make"):
        pytest.skip("needs g++ and make")
    outputs = run_host(build_host(), signed, X, tmp_path)
    np.testing.assert_allclose(outputs["y"], runtime.load(signed).run(X)["y"], rtol=1e-6)
