"""The edgec runtime: load an ``.edgec`` artifact and run it, with no compiler installed.

Needs numpy, ``tvm_ffi`` and ``libtvm_runtime.so``; it never imports ``tvm`` (the compiler) nor
anything from the compiler side of edgec::

    model = edgec.runtime.load("model.edgec")
    outputs = model.run({"input_ids": ids, "attention_mask": mask})
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import platform
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import numpy as np

from ..errors import ArtifactError, SamplesError, ToolchainError, describe
from . import dtypes
from .artifact import Artifact
from .signature import TensorSpec, bind_inputs

__all__ = ["Model", "load", "host_arch", "TensorSpec"]

_KDL_CPU = 1
_POOLED_ALLOCATOR = 2
# TVM's kernels assume tensors aligned like its own allocations and use aligned vector loads:
# a numpy array at a 16-byte boundary can crash them.
ALIGNMENT = 64
_runtime_loaded = False


def aligned(array: np.ndarray) -> np.ndarray:
    """``array`` itself when C-contiguous, writeable (DLPack cannot export read-only memory) and
    64-byte aligned, else an aligned contiguous copy."""
    if array.size == 0:  # no data to read, but numpy's strides (all 0) are not compact for TVM
        strides, step = [], array.itemsize
        for dim in reversed(array.shape):
            strides.append(step)
            step *= dim
        strides = tuple(reversed(strides))
        if not dtypes.is_extended(array.dtype):
            return np.lib.stride_tricks.as_strided(np.empty(1, array.dtype), array.shape, strides)
        # as_strided cannot build ml_dtypes arrays: build unsigned ones and re-type them.
        raw = np.empty(1, f"u{array.itemsize}")
        return np.lib.stride_tricks.as_strided(raw, array.shape, strides).view(array.dtype)
    if array.flags.c_contiguous and array.flags.writeable and array.ctypes.data % ALIGNMENT == 0:
        return array
    buffer = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-buffer.ctypes.data) % ALIGNMENT
    copy = buffer[offset: offset + array.nbytes].view(array.dtype).reshape(array.shape)
    copy[...] = array
    return copy


def host_arch() -> str:
    """The architecture name artifacts use for this machine (``x86_64`` or ``aarch64``)."""
    machine = platform.machine().lower()
    return {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)


def _runtime_library() -> Path:
    """Locate ``libtvm_runtime.so``: ``EDGEC_TVM_RUNTIME``, edgec's bundled copy, or the tvm wheel's.

    ``importlib.util.find_spec`` finds the tvm package without executing it, so the compiler is
    never imported.
    """
    candidates = []
    if os.environ.get("EDGEC_TVM_RUNTIME"):
        candidates.append(Path(os.environ["EDGEC_TVM_RUNTIME"]))
    candidates.append(Path(__file__).resolve().parent / "lib" / "libtvm_runtime.so")
    spec = importlib.util.find_spec("tvm")
    if spec is not None and spec.origin:
        candidates.append(Path(spec.origin).parent / "lib" / "libtvm_runtime.so")
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    raise ToolchainError(
        "libtvm_runtime.so not found; install edgec-runtime (built from runtime-dist/) or "
        "apache-tvm, or set EDGEC_TVM_RUNTIME to its path"
    )


def runtime_libraries() -> list[Path]:
    """The TVM runtime libraries to load, in order: libtvm_runtime.so, then, when it sits beside
    it, libtvm_runtime_extra.so (1.3 MB), which holds the sort/top-k and random kernels that
    compiled TopK, ArgSort and random ops call."""
    main = _runtime_library()
    extra = main.with_name("libtvm_runtime_extra.so")
    return [main, extra] if extra.is_file() else [main]


def _import_tvm_ffi() -> Any:
    """Import ``tvm_ffi`` without letting it import torch.

    tvm_ffi imports torch eagerly when it is installed (for DLPack exchange with torch tensors,
    which the runtime never passes); that would add seconds and hundreds of MB to every load. A
    ``None`` entry in ``sys.modules`` makes its ``import torch`` fail as if torch were absent. If the
    application already imported torch, it is left alone.
    """
    if "tvm_ffi" in sys.modules or "torch" in sys.modules:
        import tvm_ffi

        return tvm_ffi
    sys.modules["torch"] = None  # type: ignore[assignment]
    try:
        import tvm_ffi
    finally:
        del sys.modules["torch"]
    return tvm_ffi


def _ensure_runtime(threads: int) -> Any:
    """Load libtvm_runtime once per process and return the ``tvm_ffi`` module."""
    global _runtime_loaded
    # The VM's thread pool reads this once, when it starts; it otherwise runs one thread.
    os.environ.setdefault("TVM_NUM_THREADS", str(threads))
    tvm_ffi = _import_tvm_ffi()

    if not _runtime_loaded:
        for library in runtime_libraries():
            ctypes.CDLL(str(library), ctypes.RTLD_GLOBAL)
        _runtime_loaded = True
    return tvm_ffi


def _default_threads() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@dataclass
class Model:
    """A loaded artifact, ready to run on this machine."""

    path: str
    manifest: dict[str, Any]
    target: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    _vm: Any
    _main: Any
    _ffi: Any

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` (keyed by input name); return outputs keyed by output name.

        Inputs are checked against the manifest first: names, dtypes, ranks, fixed dims, and
        symbolic dims shared between inputs.
        """
        bind_inputs(self.inputs, inputs, f"inputs to '{Path(self.path).name}'", SamplesError)
        result = self._main(*self.to_device_args(inputs))
        values = _flatten(result)
        if len(values) != len(self.outputs):
            raise ArtifactError(
                f"'{self.path}' returned {len(values)} outputs, its manifest lists {len(self.outputs)}"
            )
        return {spec.name: _to_numpy(self._ffi, value) for spec, value in zip(self.outputs, values)}

    def raw_call(self, args: list[Any]) -> Any:
        """Call the VM's ``main`` on already-converted ``tvm_ffi`` tensors (for overhead measurement)."""
        return self._main(*args)

    def to_device_args(self, inputs: Mapping[str, np.ndarray]) -> list[Any]:
        """The inputs as ``tvm_ffi`` tensors over aligned memory, in the order ``main`` takes them."""
        return [
            dtypes.to_tensor(self._ffi, array) if dtypes.is_extended(array.dtype) else
            self._ffi.from_dlpack(array, require_alignment=ALIGNMENT if array.size else 0)
            for array in (aligned(inputs[spec.name]) for spec in self.inputs)
        ]


def _to_numpy(ffi: Any, value: Any) -> np.ndarray:
    """An output as numpy; bfloat16/float8/int4... go through ``dtypes`` (DLPack refuses them)."""
    if str(value.dtype) in dtypes.NUMPY_NATIVE:
        return np.from_dlpack(value)
    return dtypes.from_tensor(ffi, value)


def _flatten(result: Any) -> list[Any]:
    """The VM returns a tensor, or a (nested) array of them for several outputs."""
    if hasattr(result, "__dlpack__"):
        return [result]
    values: list[Any] = []
    for item in result:
        values.extend(_flatten(item))
    return values


def host_cpu_features() -> set[str]:
    """This CPU's feature flags as /proc/cpuinfo lists them (``flags`` on x86, ``Features`` on Arm)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            return set(value.split())
    return set()


def _missing_features(entry: dict[str, Any]) -> list[str]:
    needed = entry.get("cpu_features", [])
    if not needed or entry.get("arch") != host_arch():
        return []
    have = host_cpu_features()
    return [feature for feature in needed if feature not in have]


def select_target(manifest: dict[str, Any], target: str | None, where: str) -> str:
    """The library to run: the one named, else the first built for this CPU's arch and features.

    A library needing CPU features this machine lacks would die on an illegal instruction: it is
    refused with the features named.
    """
    libraries = manifest["libraries"]
    if target is not None:
        if target not in libraries:
            raise ArtifactError(f"'{where}' has no library for target '{target}'; it has {', '.join(libraries)}")
        missing = _missing_features(libraries[target])
        if missing:
            raise ArtifactError(
                f"'{where}': the '{target}' library needs CPU features this CPU lacks: "
                f"{', '.join(missing)}; pick another target"
            )
        return target
    arch = host_arch()
    for name, entry in libraries.items():
        if entry.get("arch") == arch and entry.get("device", "cpu") == "cpu" and not _missing_features(entry):
            return name
    available = ", ".join(f"{n} ({e.get('arch')})" for n, e in libraries.items())
    raise ArtifactError(
        f"'{where}' has no library for this machine ({arch}); it has {available}; rebuild with a "
        f"target for {arch}"
    )


def load(path: str | Path, target: str | None = None, threads: int | None = None) -> Model:
    """Verify and load an artifact; pick the library for this host unless ``target`` names one.

    Every check (format version, member paths, checksums) runs before native code is loaded.
    ``threads`` sets the VM's thread pool (default: every core available to the process) and only
    takes effect for the first model loaded in a process.
    """
    artifact = Artifact.load(path)
    manifest = artifact.manifest
    chosen = select_target(manifest, target, str(path))
    tvm_ffi = _ensure_runtime(threads or _default_threads())
    with tempfile.TemporaryDirectory(prefix="edgec-") as tmp:
        lib_path = Path(tmp) / "model.so"  # not the manifest's name: it must not steer the path
        lib_path.write_bytes(artifact.library(chosen))
        try:
            module = tvm_ffi.load_module(str(lib_path))
        except Exception as exc:  # the loader reports dlopen failures with its own types
            raise ArtifactError(f"cannot load the '{chosen}' library of '{path}': {describe(exc)}") from None
    vm = module["vm_load_executable"]()
    vm["vm_initialization"](_KDL_CPU, 0, _POOLED_ALLOCATOR)
    return Model(
        path=str(path), manifest=manifest, target=chosen,
        inputs=tuple(TensorSpec.from_json(s) for s in manifest["inputs"]),
        outputs=tuple(TensorSpec.from_json(s) for s in manifest["outputs"]),
        _vm=vm, _main=vm["main"], _ffi=tvm_ffi,
    )
