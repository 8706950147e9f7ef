"""CUDA targets: the whole model as GPU kernels, with control flow and shape dispatch on the host.

TVM's CUDA pipeline (legalize, fuse, dlight's GPU schedule rules) turns every kernel into CUDA C;
the Relax VM program that calls them, ``If``/``Loop`` and the shape dispatch included, is host code
compiled by LLVM for the target's ``host`` (x86-64, or aarch64 on a Jetson) and linked by the host's
or the cross C++ compiler. Without a GPU driver TVM keeps the kernels as CUDA C in the library,
which only TVM's Python compiler could turn into device code at load time; edgec compiles them
here with ``nvcc`` (no GPU needed) into a fatbinary holding SASS for the target's ``arch`` plus
its PTX (so newer GPUs JIT it) and links that into the library instead, so edgec's runtime and a
C++ host load it with ``libtvm_runtime_cuda`` and the driver alone.

Placement: every kernel runs on the GPU; only the VM's control flow (branch conditions, loop
counters, shape dispatch) runs on the CPU. The manifest records it per library (``placement``).

edgec's native kernels (NonZero, Unique) and oneDNN take host pointers: a model that needs them
is refused for CUDA targets with a one-line error instead of crashing on the device.
"""

from __future__ import annotations

import os
import shutil
import struct
import subprocess
import tempfile
from pathlib import Path

import tvm

from edgec.compiler.backends.base import Backend
from edgec.core.targets import Target
from edgec.errors import CompileError, ToolchainError, describe


def find_nvcc() -> str:
    """The ``nvcc`` that compiles device code: ``$CUDA_PATH/bin/nvcc``, else the one on PATH."""
    candidates = []
    if os.environ.get("CUDA_PATH"):
        candidates.append(str(Path(os.environ["CUDA_PATH"]) / "bin" / "nvcc"))
    candidates += [shutil.which("nvcc") or "", "/usr/local/cuda/bin/nvcc"]
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise ToolchainError(
        "nvcc not found; CUDA targets compile device code with it: install the CUDA toolkit "
        "(or the nvidia-cuda-nvcc wheels) and put nvcc on PATH or set CUDA_PATH"
    )


def _sm(arch: str) -> str:
    """``sm_87`` -> ``87``; names the target file field when it is not of that form."""
    if not (arch.startswith("sm_") and arch[3:].isdigit()):
        raise CompileError(f"CUDA arch '{arch}' is not of the form sm_NN (e.g. sm_87)")
    return arch[3:]


def compile_device_code(source: str, arch: str, nvcc: str) -> bytes:
    """CUDA C -> a fatbinary with SASS for ``arch`` and its PTX (which newer GPUs JIT-compile)."""
    number = _sm(arch)
    with tempfile.TemporaryDirectory(prefix="edgec-cuda-") as tmp:
        src, out = Path(tmp) / "kernels.cu", Path(tmp) / "kernels.fatbin"
        src.write_text(source, encoding="utf-8")
        command = [nvcc, "--fatbin", "-O3", "-w", "--expt-relaxed-constexpr",
                   "-gencode", f"arch=compute_{number},code=sm_{number}",
                   "-gencode", f"arch=compute_{number},code=compute_{number}",
                   "-o", str(out), str(src)]
        result = subprocess.run(command, capture_output=True, text=True)
        if result.returncode != 0 or not out.is_file():
            raise CompileError(f"nvcc failed on the generated kernels for {arch}: "
                               f"{result.stderr.strip()[-500:]}")
        return out.read_bytes()


def _cuda_sources(module) -> list[str]:
    """The CUDA C of every CUDA module in ``module``'s import tree (TVM keeps source there)."""
    found = [module.inspect_source("")] if module.kind == "cuda" else []
    for child in module.imports:
        found += _cuda_sources(child)
    return found


def _u64(value: int) -> bytes:
    return struct.pack("<Q", value)


def with_device_binaries(blob: bytes, binaries: dict[str, bytes]) -> bytes:
    """The import blob of a library with each CUDA module's source replaced by its fatbinary.

    The blob is TVM's serialized import tree: a u64 size, then per module its kind and payload
    as length-prefixed bytes. A CUDA module's payload is ``fmt, function table, code``; TVM 0.27
    without a GPU driver stores ``fmt = "cuda"`` with the CUDA C as code, which the runtime could
    only compile with TVM's Python compiler. Here it becomes ``fmt = "fatbin"`` with the binary,
    which ``libtvm_runtime_cuda`` loads through the driver alone.
    """
    header = _u64(4) + b"cuda"
    out, pos, replaced = bytearray(), 8, 0
    while True:
        at = blob.find(header, pos)
        if at < 0:
            break
        size_at = at + len(header)
        (size,) = struct.unpack_from("<Q", blob, size_at)
        payload = blob[size_at + 8: size_at + 8 + size]
        source = next((s for s in binaries if payload.endswith(_u64(len(s.encode())) + s.encode())), None)
        if not payload.startswith(header) or source is None:
            pos = at + 1
            continue
        code = source.encode()
        function_table = payload[len(header): len(payload) - len(code) - 8]
        binary = binaries[source]
        new_payload = _u64(6) + b"fatbin" + function_table + _u64(len(binary)) + binary
        out += blob[pos:size_at] + _u64(len(new_payload)) + new_payload
        pos = size_at + 8 + size
        replaced += 1
    if replaced != len(binaries):
        raise CompileError(f"found {replaced} of {len(binaries)} CUDA modules in the library to "
                           f"put device code in; TVM's module format may have changed")
    out += blob[pos:]
    return _u64(len(out)) + bytes(out)


def _c_array(blob: bytes, symbol: str) -> str:
    """C source defining ``symbol`` as ``blob``, as TVM's ModulePackImportsToC writes it."""
    rows = ",\n  ".join(",".join(f"0x{b:02x}" for b in blob[i:i + 20]) for i in range(0, len(blob), 20))
    return (f"#ifdef __cplusplus\nextern \"C\" {{\n#endif\n"
            f"extern const unsigned char {symbol}[];\n"
            f"const unsigned char {symbol}[{len(blob)}] = {{\n  {rows}\n}};\n"
            f"#ifdef __cplusplus\n}}\n#endif\n")


def _pack_imports(arch: str, nvcc: str):
    """An ``export_library`` ``fpack_imports`` hook that links the imports with device code."""
    from tvm.runtime import _ffi_api

    def pack(module, is_system_lib: bool, prefix: str, workspace: str) -> str:
        binaries = {source: compile_device_code(source, arch, nvcc)
                    for source in _cuda_sources(module)}
        blob = bytes(_ffi_api.ModulePackImportsToTensor(module).numpy())
        path = Path(workspace) / f"{prefix}devc.c"
        symbol = prefix + _ffi_api.ModuleImportsBlobName()
        path.write_text(_c_array(with_device_binaries(blob, binaries), symbol), encoding="utf-8")
        return str(path)

    return pack


class CUDABackend(Backend):
    """GPU kernels through TVM's CUDA pipeline; host code through LLVM for the target's host."""

    kind = "cuda"
    device = "cuda"
    lowering = "gpu"
    fp16 = True

    def tvm_target(self, target: Target) -> tvm.target.Target:
        spec = dict(target.tvm)
        host = spec.pop("host", None)
        if not isinstance(host, dict):
            raise CompileError(f"target '{target.name}': [tvm.host] must be a table, e.g. "
                               f"{{kind = \"llvm\", mtriple = \"x86_64-pc-linux-gnu\"}}")
        try:
            return tvm.target.Target(spec, host=dict(host))
        except Exception as exc:  # TVM validates target attributes with its own error types
            raise CompileError(f"target '{target.name}' has an invalid [tvm] table: "
                               f"{describe(exc)}") from None

    def check_toolchain(self, target: Target) -> None:
        find_nvcc()
        super().check_toolchain(target)

    def export_options(self, target: Target) -> dict:
        arch = str(self.tvm_target(target).attrs["arch"])
        return {**super().export_options(target), "fpack_imports": _pack_imports(arch, find_nvcc())}
