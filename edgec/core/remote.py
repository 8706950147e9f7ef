"""Run an artifact where its target file says: locally, on a remote device through TVM's RPC
tracker, or under qemu user emulation (numerics only).

A target whose ``[run]`` section reads ``mode = "rpc"`` names a tracker (``host``, ``port``) and a
device ``key``; the device runs TVM's own RPC server registered with that tracker
(``python -m tvm.exec.rpc_server --tracker HOST:PORT --key KEY``). edgec asks the tracker for a
session, uploads the target's library from the artifact, loads it there, and drives the Relax VM
on the device: inputs go over the connection, outputs come back. No protocol of edgec's own.

Latencies measured through RPC are wall clock on this machine: they include the round trip and
the transfer of inputs and outputs.

A target with ``mode = "qemu"`` (an aarch64 board, run on an x86 machine) runs its library in
edgec's C++ host (``edgec/runtime/cpp``) cross-compiled for the target and started under qemu
user emulation, one process per call: the numerics are the device code's, the timings mean
nothing. The host is linked against the aarch64 ``libtvm_runtime.so``/``libtvm_ffi.so`` of the
pinned TVM wheels, downloaded once with pip into ``~/.cache/edgec``.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from edgec import runtime
from edgec.core.locations import CPP_RUNTIME_DIR
from edgec.core.targets import Target, load_target
from edgec.errors import ArtifactError, SamplesError, TargetError, ToolchainError, describe
from edgec.runtime.signature import TensorSpec, bind_inputs

# What each run mode's latencies are worth, as bench results record it.
TIMING = {
    "local": "wall clock per call on this machine",
    "rpc": "wall clock per call on this machine, through TVM RPC: includes the network round "
           "trip and the transfer of inputs and outputs",
    "qemu": "not meaningful: qemu user emulation on this machine, one process per call "
            "(numerics are real, timings are not)",
}


def run_mode(target: str | None) -> str:
    """How ``target`` (a target name or .toml path; None for this host) runs: local, rpc or qemu.

    A library name that is no target file runs locally.
    """
    if target is None:
        return "local"
    try:
        return load_target(target).run.get("mode", "local")
    except TargetError:
        return "local"


def load(path: str | Path, target: str | None = None, threads: int | None = None,
         require_signature: Any = None):
    """Load ``path`` to run ``target``'s library where its target file says.

    Returns an object with ``run(inputs) -> outputs``, ``manifest``, ``target``, ``inputs``,
    ``outputs`` and ``device``: :class:`edgec.runtime.Model` for local targets,
    :class:`RemoteModel` for RPC targets, :class:`edgec.qemu.QemuModel` under qemu.
    """
    mode = run_mode(target)
    if mode == "rpc":
        return load_rpc(path, load_target(target), require_signature)
    if mode == "qemu":
        return load_qemu(path, load_target(target), require_signature)
    if target is not None and target.endswith(".toml"):
        target = load_target(target).name  # libraries are named after their target
    return runtime.load(path, target=target, threads=threads, require_signature=require_signature)


@dataclass
class RemoteModel:
    """An artifact's library loaded on a device behind a TVM RPC tracker."""

    path: str
    manifest: dict[str, Any]
    target: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    device: str
    _session: Any
    _device: Any
    _main: Any

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run on the device; same contract as :meth:`edgec.runtime.Model.run`."""
        import tvm

        bind_inputs(self.inputs, inputs, f"inputs to '{Path(self.path).name}'", SamplesError)
        args = [tvm.runtime.tensor(np.require(inputs[spec.name], requirements="C"), self._device)
                for spec in self.inputs]
        values = _flatten(self._main(*args))
        if len(values) != len(self.outputs):
            raise ArtifactError(f"'{self.path}' returned {len(values)} outputs, its manifest lists "
                                f"{len(self.outputs)}")
        return {spec.name: value.numpy() for spec, value in zip(self.outputs, values)}


def _flatten(result: Any) -> list[Any]:
    if hasattr(result, "numpy"):
        return [result]
    values: list[Any] = []
    for item in result:
        values.extend(_flatten(item))
    return values


def rpc_address(target: Target) -> tuple[str, int, str]:
    """The tracker's host and port and the device key from ``target``'s ``[run]`` section."""
    run = target.run
    host, port, key = run.get("host"), run.get("port"), run.get("key")
    if not (isinstance(host, str) and isinstance(port, int) and isinstance(key, str)):
        raise TargetError(f"target '{target.name}' runs through RPC: its [run] section needs "
                          f"host (string), port (integer) and key (string) of the tracker")
    return host, port, key


def connect(target: Target, session_timeout: float = 0) -> Any:
    """A session on a free device registered with ``target``'s tracker under its key.

    Fails in one line when the tracker cannot be reached or has no device with that key (TVM's
    tracker would otherwise queue the request until one registers).
    """
    from tvm import rpc

    host, port, key = rpc_address(target)
    _check_reachable(target, host, port)
    try:
        tracker = rpc.connect_tracker(host, port)
        servers = tracker.summary()["server_info"]
    except Exception as exc:  # TVM reports socket failures as RuntimeError after its retries
        raise ToolchainError(f"cannot reach the RPC tracker {host}:{port} of target "
                             f"'{target.name}': {describe(exc)}; start it or fix [run] host/port") from None
    keys = sorted({s["key"].split(":", 1)[-1] for s in servers})
    if key not in keys:
        raise ToolchainError(f"no device with key '{key}' is registered at the RPC tracker "
                             f"{host}:{port} (it has: {', '.join(keys) or 'none'}); start "
                             f"`python -m tvm.exec.rpc_server --tracker {host}:{port} --key {key}` "
                             f"on the device")
    try:
        return tracker.request(key, priority=1, session_timeout=session_timeout)
    except Exception as exc:
        raise ToolchainError(f"the RPC tracker {host}:{port} gave no session for '{key}': "
                             f"{describe(exc)}") from None


def _check_reachable(target: Target, host: str, port: int, timeout_s: float = 3.0) -> None:
    """One TCP connect to the tracker, ``timeout_s`` at most: TVM's ``connect_tracker`` retries a
    refused connection every 5 s for 60 s, a warning line each time, and waits without limit on a
    host that drops packets."""
    import socket

    try:
        socket.create_connection((host, port), timeout=timeout_s).close()
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        where = f"'{target.source}'" if target.source else f"target '{target.name}'"
        raise ToolchainError(
            f"cannot reach the RPC tracker {host}:{port} of target '{target.name}' ({why}); start "
            f"it there (`python -m tvm.exec.rpc_tracker --host {host} --port {port}`) or fix host "
            f"and port in the [run] section of {where}") from None


def load_rpc(path: str | Path, target: Target, require_signature: Any = None) -> RemoteModel:
    """Verify the artifact here, then load ``target``'s library on the device behind its tracker."""
    from tvm import relax

    artifact = runtime.open_artifact(path, require_signature)
    manifest = artifact.manifest
    if target.name not in manifest["libraries"]:
        raise ArtifactError(f"'{path}' has no library for target '{target.name}'; it has "
                            f"{', '.join(manifest['libraries'])}")
    entry = manifest["libraries"][target.name]
    session = connect(target)
    with tempfile.TemporaryDirectory(prefix="edgec-rpc-") as tmp:
        local = Path(tmp) / "model.so"
        local.write_bytes(artifact.library(target.name))
        try:
            session.upload(str(local), f"edgec-{entry['sha256'][:16]}.so")
            library = session.load_module(f"edgec-{entry['sha256'][:16]}.so")
        except Exception as exc:  # the remote loader's failures arrive as RPC errors
            raise ArtifactError(f"the device behind target '{target.name}' cannot load the "
                                f"library of '{path}': {describe(exc)}") from None
    device_kind = entry.get("device", "cpu")
    device = session.cuda(0) if device_kind == "cuda" else session.cpu(0)
    vm = relax.VirtualMachine(library, device)
    return RemoteModel(
        path=str(path), manifest=manifest, target=target.name,
        inputs=tuple(TensorSpec.from_json(s) for s in manifest["inputs"]),
        outputs=tuple(TensorSpec.from_json(s) for s in manifest["outputs"]),
        device=device_kind, _session=session, _device=device, _main=vm["main"],
    )


def cache_dir() -> Path:
    """Where built hosts and downloaded wheels are kept (``$XDG_CACHE_HOME/edgec``)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgec"


def _pinned_wheels() -> dict[str, str]:
    """The installed (pinned) TVM versions: the device's runtime must be the same release."""
    return {name: metadata.version(name) for name in ("apache-tvm", "apache-tvm-ffi")}


def aarch64_runtime_libraries() -> tuple[Path, Path]:
    """Directories of the aarch64 ``libtvm_runtime.so`` (+ ``_extra``) and ``libtvm_ffi.so`` at the
    installed TVM versions, from their manylinux aarch64 wheels (pip download once, then cached)."""
    wheels_wanted = _pinned_wheels()
    root = cache_dir() / "aarch64" / "-".join(f"{k}-{v}" for k, v in wheels_wanted.items())
    tvm_dir, ffi_dir = root / "tvm" / "lib", root / "tvm_ffi" / "lib"
    members = [("apache_tvm-", "tvm/lib/libtvm_runtime.so", tvm_dir),
               ("apache_tvm-", "tvm/lib/libtvm_runtime_extra.so", tvm_dir),
               ("apache_tvm_ffi-", "tvm_ffi/lib/libtvm_ffi.so", ffi_dir)]
    if all((into / Path(member).name).is_file() for _, member, into in members):
        return tvm_dir, ffi_dir
    wheels = root / "wheels"
    command = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
               "--no-deps", "--only-binary=:all:", "--python-version", "3.11",
               "--platform", "manylinux_2_28_aarch64", "--platform", "manylinux_2_24_aarch64",
               "-d", str(wheels), *(f"{k}=={v}" for k, v in wheels_wanted.items())]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        raise ToolchainError(f"cannot download the aarch64 TVM wheels for qemu: "
                             f"{result.stderr.strip()[-300:]}")
    for prefix, member, into in members:
        (wheel,) = [p for p in wheels.glob("*.whl") if p.name.startswith(prefix)]
        into.mkdir(parents=True, exist_ok=True)
        with zipfile.ZipFile(wheel) as archive:
            data = archive.read(member)
        tmp = into / f".{Path(member).name}.tmp"
        tmp.write_bytes(data)
        tmp.replace(into / Path(member).name)  # atomic: a concurrent download may race
    return tvm_dir, ffi_dir


def cpp_host(cxx: str = "g++", lib_dirs: tuple[Path, Path] | None = None) -> Path:
    """edgec's C++ host built with ``cxx`` against ``lib_dirs`` (the directories of
    ``libtvm_runtime.so`` and ``libtvm_ffi.so``; default: this Python's wheels, as the Makefile
    finds them); cached by sources and toolchain."""
    sources = CPP_RUNTIME_DIR
    key = hashlib.sha256(f"{cxx} {lib_dirs} {sys.executable}".encode())
    for source in sorted(sources.iterdir()):
        if source.is_file():
            key.update(source.read_bytes())
    host = cache_dir() / "cpp-host" / key.hexdigest()[:16] / "edgec_run"
    if host.is_file():
        return host
    missing = [tool for tool in (cxx, "make") if shutil.which(tool) is None]
    if missing:
        raise ToolchainError(f"building the C++ host needs {', '.join(missing)} "
                             f"(scripts/install-system-deps.sh cross)")
    host.parent.parent.mkdir(parents=True, exist_ok=True)
    build = Path(tempfile.mkdtemp(prefix="build-", dir=host.parent.parent))
    command = ["make", "-s", "-C", str(sources), f"BUILD_DIR={build}", f"PYTHON={sys.executable}",
               f"CXX={cxx}"]
    if lib_dirs is not None:
        command += [f"TVM_LIB_DIR={lib_dirs[0]}", f"TVM_FFI_LIB_DIR={lib_dirs[1]}"]
    result = subprocess.run(command, capture_output=True, text=True)
    if result.returncode != 0:
        shutil.rmtree(build, ignore_errors=True)
        raise ToolchainError(f"building the C++ host with {cxx} failed: {result.stderr.strip()[-300:]}")
    try:
        build.rename(host.parent)  # atomic: a concurrent build of the same key loses the race
    except OSError:
        shutil.rmtree(build, ignore_errors=True)
    return host


@dataclass
class QemuModel:
    """An artifact's library run by the cross-compiled C++ host under qemu, a process per call."""

    path: str
    manifest: dict[str, Any]
    target: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    _command: list[str]
    device: str = "cpu"

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run under qemu; same contract as :meth:`edgec.runtime.Model.run`."""
        bind_inputs(self.inputs, inputs, f"inputs to '{Path(self.path).name}'", SamplesError)
        with tempfile.TemporaryDirectory(prefix="edgec-qemu-") as tmp:
            np.savez(Path(tmp) / "inputs.npz", **{s.name: inputs[s.name] for s in self.inputs})
            out = Path(tmp) / "out"
            result = subprocess.run([*self._command, "--inputs", str(Path(tmp) / "inputs.npz"),
                                     "-o", str(out)], capture_output=True, text=True)
            if result.returncode != 0:
                raise ArtifactError(f"the '{self.target}' library failed under qemu: "
                                    f"{result.stderr.strip()[-300:]}")
            return {spec.name: np.load(out / f"{_file_name(spec.name)}.npy") for spec in self.outputs}


def _file_name(name: str) -> str:
    """The C++ host's file name for an output (its ``SafeName``)."""
    safe = "".join(c if c.isascii() and (c.isalnum() or c in ".-_") else "_" for c in name)
    return "_" + safe if not safe or safe.startswith(".") else safe


def qemu_prefix(target: Target) -> list[str]:
    """The command line that starts a program built for ``target`` under qemu user emulation
    (the program and its arguments follow).

    ``-L`` points qemu at the target's sysroot for the dynamic loader and the C/C++ libraries;
    ``-E LD_LIBRARY_PATH=<sysroot>/lib`` makes the loader take them from there too. Without it,
    on a machine with Debian's arm64 ``libc6`` installed (which the arm64 XNNPACK packages bring),
    the loader follows the host's ld.so.cache to ``/usr/lib/aarch64-linux-gnu``'s C library, a
    build other than the sysroot's loader, and the program hangs or fails to load. Libraries the
    sysroot lacks (XNNPACK, pthreadpool) are still found through that cache.
    Raises ToolchainError, in one line, when qemu or the sysroot is missing.
    """
    qemu = target.run.get("qemu", "qemu-aarch64")
    sysroot = target.run.get("sysroot", "/usr/aarch64-linux-gnu")
    if shutil.which(qemu) is None or not Path(sysroot).is_dir():
        raise ToolchainError(f"target '{target.name}' runs under {qemu} with the sysroot {sysroot}: "
                             f"install them (scripts/install-system-deps.sh cross)")
    return [qemu, "-L", sysroot, "-E", f"LD_LIBRARY_PATH={Path(sysroot) / 'lib'}"]


def load_qemu(path: str | Path, target: Target, require_signature: Any = None) -> QemuModel:
    """Verify the artifact here, then prepare to run ``target``'s library under qemu."""
    manifest = runtime.open_artifact(path, require_signature).manifest
    if target.name not in manifest["libraries"]:
        raise ArtifactError(f"'{path}' has no library for target '{target.name}'; it has "
                            f"{', '.join(manifest['libraries'])}")
    prefix = qemu_prefix(target)
    host = cpp_host(target.cross_compiler or "g++", aarch64_runtime_libraries())
    command = [*prefix, str(host), str(Path(path).resolve()), "--target", target.name]
    threads = int(target.run.get("threads", 0))
    if threads:
        command += ["--threads", str(threads)]
    return QemuModel(
        path=str(path), manifest=manifest, target=target.name,
        inputs=tuple(TensorSpec.from_json(s) for s in manifest["inputs"]),
        outputs=tuple(TensorSpec.from_json(s) for s in manifest["outputs"]),
        _command=command,
    )
