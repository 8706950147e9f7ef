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
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from edgec.errors import ArtifactError, OutputFileError, SamplesError, ToolchainError, describe
from edgec.runtime import dtypes
from edgec.runtime.artifact import Artifact
from edgec.runtime.linked import bind_linked_functions
from edgec.runtime.signature import TensorSpec, bind_inputs, flatten_inputs, group_outputs

__all__ = ["Model", "load", "host_arch", "TensorSpec"]

_KDL_CPU = 1
_KDL_CUDA = 2
_POOLED_ALLOCATOR = 2
# TVM's kernels assume tensors aligned like its own allocations and use aligned vector loads:
# a numpy array at a 16-byte boundary can crash them.
ALIGNMENT = 64
_runtime_loaded = False
_cuda_runtime_loaded = False


def _address(array: np.ndarray) -> int:
    # The data pointer: 5x cheaper than ``array.ctypes.data``, which builds a ctypes object.
    return array.__array_interface__["data"][0]


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
    if array.flags.c_contiguous and array.flags.writeable and _address(array) % ALIGNMENT == 0:
        return array
    return _aligned_copy(array)


def _aligned_copy(array: np.ndarray, address: Callable[[np.ndarray], int] = _address) -> np.ndarray:
    """A C-contiguous copy of ``array`` (not empty) at a 64-byte aligned address; ``address``
    gives an array's data pointer (a loaded runtime's DLPack import is 4x faster than numpy's)."""
    buffer = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
    offset = (-address(buffer)) % ALIGNMENT
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


# Spin iterations of an idle OpenMP thread before it sleeps (libgomp's GOMP_SPINCOUNT; its own
# default is 300000 and PASSIVE is 0): a few hundred microseconds, enough to span the gap between
# two oneDNN kernels of one call.
OMP_SPIN_COUNT = "10000"


def _ensure_runtime(threads: int, tvm_threads: int | None = None) -> Any:
    """Load libtvm_runtime once per process and return the ``tvm_ffi`` module.

    ``threads`` for oneDNN's OpenMP pool; ``tvm_threads`` (default ``threads``) for TVM's.
    """
    global _runtime_loaded
    # The VM's thread pool reads this once, when it starts; it otherwise runs one thread.
    os.environ.setdefault("TVM_NUM_THREADS", str(tvm_threads or threads))
    # Libraries with oneDNN run its kernels on OpenMP threads (read when libgomp loads, with the
    # model library). Between kernels they spin a bounded while, then sleep: spinning forever
    # (OMP_WAIT_POLICY=ACTIVE) made a small CNN 550x slower while other processes kept the 2 cores
    # busy, and sleeping at once (PASSIVE) paid a thread wake-up per kernel: shufflenet 8.6 ms
    # against 3.9 ms with this spin count, same machine, quiet (edgec.cc does the same).
    os.environ.setdefault("OMP_NUM_THREADS", str(threads))
    if "OMP_WAIT_POLICY" not in os.environ:  # PASSIVE or ACTIVE would override the spin count
        os.environ.setdefault("GOMP_SPINCOUNT", OMP_SPIN_COUNT)
    tvm_ffi = _import_tvm_ffi()

    if not _runtime_loaded:
        for library in runtime_libraries():
            ctypes.CDLL(str(library), ctypes.RTLD_GLOBAL)
        _runtime_loaded = True
    return tvm_ffi


def default_threads() -> int:
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
    # Where tensors live: "cpu", or "cuda" for a CUDA target's library (inputs are copied to
    # GPU 0 and outputs back to host memory around each call).
    device: str = "cpu"

    def __post_init__(self) -> None:
        self._where = f"inputs to '{Path(self.path).name}'"  # built once: calls are microseconds
        # Per output, whether numpy holds its dtype (read off the manifest once: a tensor's
        # str(dtype) costs 0.7 us a call).
        self._native_outputs = tuple(spec.dtype in dtypes.NUMPY_NATIVE for spec in self.outputs)
        # Per input name, an aligned copy and its tensor that ``run`` refills when a call's array
        # is misaligned (numpy aligns small arrays to 16 bytes only, .npz members not at all):
        # refilling one instead of allocating and importing a fresh copy each call took 2-3% off
        # the calls of the zoo's token_tagger, prompt_encoder and cnn_batch (interleaved rounds).
        # One call at a time uses them (a concurrent one copies afresh); an output that shares
        # memory with one takes it over.
        self._staging: dict[str, tuple[np.ndarray, Any]] = {}
        self._staging_lock = threading.Lock()

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Run the model on ``inputs`` (keyed by input name); return outputs keyed by output name.

        Inputs are checked against the manifest first: names, dtypes, ranks, fixed dims, and
        symbolic dims shared between inputs.
        """
        boundary = self.manifest.get("boundary")
        if boundary is not None:  # sequences and optionals: lists and Nones over tensor inputs
            inputs = flatten_inputs(boundary, inputs, self._where, SamplesError)
        bind_inputs(self.inputs, inputs, self._where, SamplesError)
        if self.device == "cpu" and self._staging_lock.acquire(blocking=False):
            try:
                values = _flatten(self._main(*(self._host_tensor(inputs[spec.name], spec.name)
                                               for spec in self.inputs)))
                if self._staging:
                    self._release_staging(values)
            finally:
                self._staging_lock.release()
        else:
            values = _flatten(self._main(*self.to_device_args(inputs)))
        if len(values) != len(self.outputs):
            raise ArtifactError(
                f"'{self.path}' returned {len(values)} outputs, its manifest lists {len(self.outputs)}"
            )
        if self.device != "cpu":
            values = [_copy_to(self._ffi, value, self._ffi.device("cpu", 0)) for value in values]
        outputs = {spec.name: _to_numpy(self._ffi, value, native)
                   for spec, value, native in zip(self.outputs, values, self._native_outputs)}
        return outputs if boundary is None else group_outputs(boundary, outputs)

    def raw_call(self, args: list[Any]) -> Any:
        """Call the VM's ``main`` on already-converted ``tvm_ffi`` tensors (for overhead measurement)."""
        return self._main(*args)

    def to_device_args(self, inputs: Mapping[str, np.ndarray]) -> list[Any]:
        """The inputs as ``tvm_ffi`` tensors over aligned memory (copied to the GPU for a CUDA
        library), in the order ``main`` takes them."""
        host = [self._host_tensor(inputs[spec.name]) for spec in self.inputs]
        if self.device == "cpu":
            return host
        device = self._ffi.device(self.device, 0)
        return [_copy_to(self._ffi, tensor, device) for tensor in host]


    def _release_staging(self, outputs: list[Any]) -> None:
        """Give up the staging copies an output's memory lies in: the caller now holds them."""
        for name, (copy, tensor) in list(self._staging.items()):
            start = tensor.data_ptr()  # the copy's address, without another DLPack import
            if any(start <= value.data_ptr() < start + copy.nbytes for value in outputs):
                del self._staging[name]

    def _address(self, array: np.ndarray) -> int:
        return self._ffi.from_dlpack(array).data_ptr()

    def _host_tensor(self, array: np.ndarray, staging: str | None = None) -> Any:
        """``array`` as a ``tvm_ffi`` tensor over the same memory when TVM's kernels can read it
        there (C-contiguous, writeable, 64-byte aligned), else over an aligned copy: input
        ``staging``'s staging copy where given (see ``__post_init__``). The common case costs
        one DLPack import (model calls of tens of microseconds feel every step)."""
        if (array.size and array.flags.c_contiguous and array.flags.writeable
                and array.dtype.isnative and not dtypes.is_extended(array.dtype)):
            tensor = self._ffi.from_dlpack(array)
            if tensor.data_ptr() % ALIGNMENT == 0:
                return tensor
            if staging is not None:
                staged = self._staging.get(staging)
                if (staged is None or staged[0].shape != array.shape
                        or staged[0].dtype != array.dtype):
                    copy = _aligned_copy(array, self._address)
                    staged = self._staging[staging] = (
                        copy, self._ffi.from_dlpack(copy, require_alignment=ALIGNMENT))
                else:
                    np.copyto(staged[0], array)
                return staged[1]
            array = _aligned_copy(array, self._address)  # known misaligned: copy it
        else:
            array = aligned(array)
        if dtypes.is_extended(array.dtype):
            return dtypes.to_tensor(self._ffi, array)
        return self._ffi.from_dlpack(array, require_alignment=ALIGNMENT if array.size else 0)


def _copy_to(tvm_ffi: Any, tensor: Any, device: Any) -> Any:
    """A copy of ``tensor`` in ``device``'s memory, through libtvm_runtime's allocator and copy."""
    alloc = tvm_ffi.get_global_func("runtime.TVMTensorAllocWithScope")
    result = alloc(tvm_ffi.Shape(tuple(tensor.shape)), tensor.dtype, device, None)
    tvm_ffi.get_global_func("runtime.TVMTensorCopyFromTo")(tensor, result)
    return result


def _cuda_capability() -> tuple[int, int] | str:
    """GPU 0's compute capability through the driver (``libcuda.so.1``), or why there is none."""
    try:
        driver = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return "the NVIDIA driver (libcuda.so.1) is not installed"
    count, major, minor = ctypes.c_int(0), ctypes.c_int(0), ctypes.c_int(0)
    if driver.cuInit(0) != 0 or driver.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value == 0:
        return "the NVIDIA driver finds no GPU"
    # CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75, _MINOR = 76
    driver.cuDeviceGetAttribute(ctypes.byref(major), 75, 0)
    driver.cuDeviceGetAttribute(ctypes.byref(minor), 76, 0)
    return major.value, minor.value


def _cudart_candidates() -> list[Path]:
    """Where the CUDA runtime (``libcudart.so.13``, which libtvm_runtime_cuda links) may be when
    the dynamic loader does not know it: a CUDA toolkit, or the nvidia-cuda-runtime wheel."""
    roots = [Path(os.environ["CUDA_PATH"])] if os.environ.get("CUDA_PATH") else []
    roots.append(Path("/usr/local/cuda"))
    spec = importlib.util.find_spec("nvidia")
    if spec is not None and spec.submodule_search_locations:
        roots += [Path(p) / "cu13" for p in spec.submodule_search_locations]
    return [root / sub / "libcudart.so.13" for root in roots for sub in ("lib64", "lib")
            if (root / sub / "libcudart.so.13").is_file()]


def _ensure_cuda_runtime(entry: dict[str, Any], target: str, where: str) -> None:
    """Check that this machine can run ``target``'s CUDA library; load libtvm_runtime_cuda once.

    The library holds SASS for its ``sm_XY`` and that PTX, which the driver compiles for a newer
    GPU: a GPU of a lower compute capability cannot run it.
    """
    global _cuda_runtime_loaded
    capability = _cuda_capability()
    if isinstance(capability, str):
        raise ToolchainError(
            f"'{where}': the '{target}' library runs on an NVIDIA GPU, but {capability}; "
            f"run a CPU target's library (--target) on this machine")
    arch = str(entry.get("tvm_target", {}).get("arch", "sm_0"))
    needed = int(arch[3:]) if arch[3:].isdigit() else 0
    if capability[0] * 10 + capability[1] < needed:
        raise ToolchainError(
            f"'{where}': the '{target}' library needs a GPU of compute capability {arch} or newer; "
            f"this GPU is sm_{capability[0]}{capability[1]}; build for its arch")
    if not _cuda_runtime_loaded:
        library = _runtime_library().with_name("libtvm_runtime_cuda.so")
        if not library.is_file():
            raise ToolchainError(f"libtvm_runtime_cuda.so not found beside {library.parent}; "
                                 f"install apache-tvm (it ships it) to run CUDA libraries")
        for cudart in _cudart_candidates():  # when the loader's path lacks it
            try:
                ctypes.CDLL(str(cudart), ctypes.RTLD_GLOBAL)
                break
            except OSError:
                continue
        try:
            ctypes.CDLL(str(library), ctypes.RTLD_GLOBAL)
        except OSError as exc:  # most often libcudart.so.13 missing
            raise ToolchainError(f"cannot load {library.name}: {exc}; install the CUDA runtime "
                                 f"(Debian/NVIDIA cuda-cudart, or pip nvidia-cuda-runtime)") from None
        _cuda_runtime_loaded = True


def _to_numpy(ffi: Any, value: Any, native: bool) -> np.ndarray:
    """An output as numpy, through DLPack when its dtype is numpy's own (``native``);
    bfloat16/float8/int4... go through ``dtypes`` (DLPack refuses them)."""
    if native:
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


def best_for_host(entries: Mapping[str, dict[str, Any]]) -> str | None:
    """Of ``entries`` (name -> {"arch", "cpu_features", "device"}), the one to run on this CPU.

    It must be for this architecture, on the CPU, and need no feature this CPU lacks; of those,
    the one using the most features wins (AVX-512 code over AVX2 code), the first on a tie. Both
    the runtime (which library of an artifact) and the compiler (which target when none is
    given) pick with this rule.
    """
    arch = host_arch()
    runnable = [name for name, entry in entries.items()
                if entry.get("arch") == arch and entry.get("device", "cpu") == "cpu"
                and not _missing_features(entry)]
    if not runnable:
        return None
    return max(runnable, key=lambda name: len(entries[name].get("cpu_features", [])))


def select_target(manifest: dict[str, Any], target: str | None, where: str) -> str:
    """The library to run: the one named, else the best this CPU runs (``best_for_host``).

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
    best = best_for_host(libraries)
    if best is not None:
        return best
    available = ", ".join(f"{n} ({e.get('arch')})" for n, e in libraries.items())
    raise ArtifactError(
        f"'{where}' has no library for this machine ({arch}); it has {available}; rebuild with a "
        f"target for {arch}"
    )


def open_artifact(path: str | Path, require_signature: Any = None) -> Artifact:
    """Read and verify an artifact (format, members, checksums and, when ``require_signature``
    names a public key, its signature); nothing native is loaded."""
    artifact = Artifact.load(path)
    if require_signature is not None:
        from edgec.signing import verify_artifact  # imports cryptography, needed only here

        verify_artifact(artifact, require_signature, str(path))
    return artifact


def load(path: str | Path, target: str | None = None, threads: int | None = None,
         require_signature: Any = None) -> Model:
    """Verify and load an artifact; pick the library for this host unless ``target`` names one.

    Every check (format version, member paths, checksums and, when ``require_signature`` names a
    public key (a file, PEM or raw bytes), the artifact's Ed25519 signature by that key) runs
    before native code is loaded.
    ``threads`` sets the VM's thread pool (default: the count the plan chose, else every core
    available to the process) and only takes effect for the first model loaded in a process.
    """
    artifact = open_artifact(path, require_signature)
    manifest = artifact.manifest
    chosen = select_target(manifest, target, str(path))
    # The plan's choice (0: every core) unless the caller names a count.
    threads = threads or manifest["libraries"][chosen].get("threads") or default_threads()
    # A library whose TVM kernels were compiled serial gets a one-thread TVM pool (codegen's
    # CompiledLibrary.tvm_kernels_parallel).
    serial = manifest["libraries"][chosen].get("tvm_kernels_parallel", True) is False
    tvm_ffi = _ensure_runtime(threads, 1 if serial else threads)
    device = manifest["libraries"][chosen].get("device", "cpu")
    if device == "cuda":
        _ensure_cuda_runtime(manifest["libraries"][chosen], chosen, str(path))
    with tempfile.TemporaryDirectory(prefix="edgec-") as tmp:
        lib_path = Path(tmp) / "model.so"  # not the manifest's name: it must not steer the path
        try:
            lib_path.write_bytes(artifact.library(chosen))
        except OSError as exc:  # a full or read-only temporary folder
            raise OutputFileError(f"cannot unpack the '{chosen}' library of '{path}' into '{tmp}': "
                                  f"{exc.strerror}; free space there or point TMPDIR elsewhere") from None
        try:
            module = tvm_ffi.load_module(str(lib_path))
        except Exception as exc:  # the loader reports dlopen failures with its own types
            raise ArtifactError(f"cannot load the '{chosen}' library of '{path}': {describe(exc)}") from None
        if manifest["libraries"][chosen].get("vm_exec_mode") == "compiled":
            bind_linked_functions(tvm_ffi, str(lib_path),
                                  list(manifest["libraries"][chosen].get("linked_functions", [])),
                                  f"artifact '{path}'")
    vm = module["vm_load_executable"]()
    if device == "cuda":  # kernels on GPU 0; the VM's shape computations need the CPU too
        vm["vm_initialization"](_KDL_CUDA, 0, _POOLED_ALLOCATOR, _KDL_CPU, 0, _POOLED_ALLOCATOR)
    else:
        vm["vm_initialization"](_KDL_CPU, 0, _POOLED_ALLOCATOR)
    return Model(
        path=str(path), manifest=manifest, target=chosen,
        inputs=tuple(TensorSpec.from_json(s) for s in manifest["inputs"]),
        outputs=tuple(TensorSpec.from_json(s) for s in manifest["outputs"]),
        _vm=vm, _main=vm["main"], _ffi=tvm_ffi, device=device,
    )
