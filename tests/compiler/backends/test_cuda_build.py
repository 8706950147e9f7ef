"""CUDA targets compile here without a GPU (``edgec.compiler.backends.cuda``): the library carries the
kernels as a fatbinary for the target's arch (not CUDA C that only TVM's Python compiler could
build), the VM's control flow stays host code, and the manifest records where things run.

Needs ``nvcc`` (the CUDA toolkit on this project's machines); no GPU, no driver.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from edgec import runtime
from edgec.compiler.backends import cuda as codegen_cuda
from edgec.errors import CompileError, ToolchainError
from edgec.runtime.artifact import Artifact
from edgec.core.targets import load_target
from runtime.test_cpp_host import zoo_artifact

FATBIN_MAGIC = struct.pack("<I", 0xBA55ED50)
ELF_MACHINE = {"x86_64": 62, "aarch64": 183}

try:
    codegen_cuda.find_nvcc()
    _NVCC = ""
except ToolchainError as exc:
    _NVCC = str(exc)
needs_nvcc = pytest.mark.skipif(bool(_NVCC), reason=_NVCC)

# Loads a library with the full TVM, standing in for libtvm_runtime_cuda's loader (which needs
# the GPU driver) to see what the CUDA module deserializes to: format, then the code's size.
_PROBE = r"""
import json, struct, sys, tvm, tvm_ffi
from tvm.runtime import _ffi_api
seen = []
@tvm_ffi.register_global_func("ffi.Module.load_from_bytes.cuda", override=True)
def _load(data):
    seen.append(bytes(data))
    return _ffi_api.SourceModuleCreate("", "cuda")
module = tvm_ffi.load_module(sys.argv[1])
(n,) = struct.unpack_from("<Q", seen[0], 0)
fmt = seen[0][8:8 + n].decode()
print(json.dumps({"kind": module.kind, "modules": len(seen), "fmt": fmt,
                  "code_head": seen[0][-int(sys.argv[2]):][:4].hex()}))
"""


def cuda_module_of(library: Path, fatbin_size: int) -> dict:
    result = subprocess.run([sys.executable, "-c", _PROBE, str(library), str(fatbin_size)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def fatbin_size(data: bytes) -> int:
    """Size of the one fatbinary in ``data``: header (u32 magic, u16 version, u16 header size,
    u64 body size)."""
    at = data.find(FATBIN_MAGIC)
    assert at >= 0 and data.find(FATBIN_MAGIC, at + 1) < 0
    _, _, header, body = struct.unpack_from("<IHHQ", data, at)
    return header + body


@needs_nvcc
@pytest.mark.slow
@pytest.mark.parametrize("name,targets", [
    ("cnn", ["x86_64", "cuda-sm90", "jetson-orin"]),
    ("early_exit", ["x86_64", "cuda-sm89"]),
])
def test_cuda_library_holds_device_code(tmp_path, name, targets):
    path, _ = zoo_artifact(name, targets, tmp_path)
    manifest = Artifact.load(path).manifest
    for target_name in targets:
        target = load_target(target_name)
        entry = manifest["libraries"][target_name]
        assert entry["device"] == ("cuda" if target.kind == "cuda" else "cpu")
        assert entry["placement"] == {"kernels": entry["device"], "control_flow": "cpu"}
        with zipfile.ZipFile(path) as archive:
            data = archive.read(entry["file"])
        # Host code for the target's host CPU: the VM program, dispatch and control flow.
        assert data[18] == ELF_MACHINE[target.arch]
        if target.kind != "cuda":
            assert FATBIN_MAGIC not in data
            continue
        assert b"__CUDACC_RTC__" not in data  # no CUDA C left for a compiler at load time
        size = fatbin_size(data)
        if target.arch == "x86_64":  # a library this machine can dlopen
            module = cuda_module_of(_extract(path, entry["file"], tmp_path / f"{target_name}.so"),
                                    size)
            assert module == {"kind": "relax.VMExecutable", "modules": 1, "fmt": "fatbin",
                              "code_head": FATBIN_MAGIC.hex()}
            if isinstance(runtime._cuda_capability(), str):  # tests/compiler/backends/test_gpu.py runs it on a GPU
                with pytest.raises(ToolchainError, match="runs on an NVIDIA GPU, but"):
                    runtime.load(path, target=target_name)
    assert runtime.load(path).device == "cpu"  # the host's CPU library unless told otherwise


def _extract(artifact: Path, member: str, into: Path) -> Path:
    with zipfile.ZipFile(artifact) as archive:
        into.write_bytes(archive.read(member))
    return into


def test_device_binary_replaces_the_source_in_the_import_blob():
    function_table = b"\x01\x02\x03"
    source = "extern \"C\" __global__ void k() {}"
    payload = (struct.pack("<Q", 4) + b"cuda" + function_table
               + struct.pack("<Q", len(source)) + source.encode())
    before = b"\x07" * 9
    body = before + struct.pack("<Q", 4) + b"cuda" + struct.pack("<Q", len(payload)) + payload
    blob = struct.pack("<Q", len(body)) + body
    binary = FATBIN_MAGIC + b"sass"
    patched = codegen_cuda.with_device_binaries(blob, {source: binary})
    new_payload = (struct.pack("<Q", 6) + b"fatbin" + function_table
                   + struct.pack("<Q", len(binary)) + binary)
    expected = before + struct.pack("<Q", 4) + b"cuda" + struct.pack("<Q", len(new_payload)) + new_payload
    assert patched == struct.pack("<Q", len(expected)) + expected
    with pytest.raises(CompileError, match="CUDA modules"):
        codegen_cuda.with_device_binaries(blob, {"other source": binary})


def test_copy_to_another_device_keeps_values():
    ffi = runtime._ensure_runtime(1)
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    copy = runtime._copy_to(ffi, ffi.from_dlpack(x), ffi.device("cpu", 0))
    x[0, 0] = 100.0  # a copy, not a view
    assert np.from_dlpack(copy).tolist() == np.arange(12, dtype=np.float32).reshape(3, 4).tolist()


def test_cuda_targets_parse_and_name_their_gpu():
    for name, arch, sm in [("jetson-orin", "aarch64", "sm_87"), ("cuda-sm89", "x86_64", "sm_89"),
                           ("cuda-sm90", "x86_64", "sm_90")]:
        target = load_target(name)
        assert (target.kind, target.arch, target.tvm["arch"]) == ("cuda", arch, sm)
        tvm_target = codegen_cuda.CUDABackend().tvm_target(target)
        assert tvm_target.kind.name == "cuda" and str(tvm_target.attrs["arch"]) == sm
        assert tvm_target.host.kind.name == "llvm"


def test_bad_cuda_arch_is_one_line_error():
    with pytest.raises(CompileError, match="sm_NN"):
        codegen_cuda.compile_device_code("", "compute_87", "nvcc")


def test_cuda_target_without_host_table_is_refused():
    from edgec.core.targets import parse_target

    target = parse_target({"name": "g", "kind": "cuda", "arch": "x86_64",
                           "tvm": {"kind": "cuda", "arch": "sm_90"}}, "g.toml")
    with pytest.raises(CompileError, match="tvm.host"):
        codegen_cuda.CUDABackend().tvm_target(target)
