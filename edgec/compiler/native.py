"""Native code linked into model libraries: edgec's C++ shims, compiled once per content hash.

A shim is a C++ file under ``edgec/native/`` whose functions the Relax program calls by name
(``call_dps_packed``). It is compiled ``-fPIC`` against tvm_ffi's headers into an object file kept
in a cache directory (``$XDG_CACHE_HOME/edgec/native``, else ``~/.cache/edgec/native``), keyed by
the hash of its source, the compiler's version and the flags, and linked into the exported model
library with the libraries it needs.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable

from edgec.core.locations import NATIVE_DIR
from edgec.errors import ToolchainError

DNNL_INSTALL_HINT = "install libdnnl-dev: apt-get install libdnnl-dev"
# Debian's XNNPACK (2022) and pthreadpool for arm64, next to the cross compiler: the headers land
# in /usr/include, the libraries in /usr/lib/aarch64-linux-gnu, both on its search paths.
XNNPACK_PACKAGES = {"xnnpack.h": "libxnnpack-dev:arm64", "XNNPACK": "libxnnpack-dev:arm64",
                    "pthreadpool.h": "libpthreadpool-dev:arm64",
                    "pthreadpool": "libpthreadpool-dev:arm64"}
XNNPACK_INSTALL = ("dpkg --add-architecture arm64 && apt-get update && apt-get install "
                   "libxnnpack-dev:arm64 libpthreadpool-dev:arm64 "
                   "(or scripts/install-system-deps.sh cross)")
# The shared libraries a device needs for each library route (a target file's [libraries]
# key): what its shim links, and what a plan's --max-runtime-mb counts. Debian's oneDNN runs on
# OpenMP threads (libgomp).
ROUTE_DEPENDENCIES = {"dnnl": ("libdnnl.so.2", "libgomp.so.1"),
                      "xnnpack": ("libXNNPACK.so.0", "libpthreadpool.so.0")}
# -fno-trapping-math: edgec never unmasks floating-point exceptions, and without it GCC keeps the
# clamps of the recurrent gates' exp as branches, so their loops ran one element at a time
# (sigmoid and tanh took as long as the recurrent matmul).
_CXX_FLAGS = ["-std=c++17", "-O2", "-fno-trapping-math", "-fPIC", "-DNDEBUG"]
# Options for linking a model library. TVM's LLVM code generator writes DWARF for every kernel
# (the zoo transformer's library: 300 KB of .debug_* sections of 1.48 MB, 67 KB of its 780 KB
# deflated) that nothing on a device reads; the symbol table stays, for perf and backtraces.
LINK_OPTIONS = ("-Wl,--strip-debug",)


@dataclass(frozen=True)
class NativeAddon:
    """A compiled shim: objects and flags for the model library's link, and its run-time needs.

    ``link_args`` go after the model's own objects (``export_library(addons=...)``);
    ``runtime_libraries`` are the shared libraries the model library then needs on the device.
    """

    name: str
    objects: tuple[str, ...]
    link_args: tuple[str, ...]
    runtime_libraries: tuple[str, ...]

    @property
    def addons(self) -> list[str]:
        """A fresh list for ``export_library(addons=...)``, which mutates what it is given."""
        return [*self.objects, *self.link_args]


def cache_dir() -> Path:
    """Where compiled shims are kept; never inside the repository."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgec" / "native"


def only_exports(functions: Iterable[str] | None) -> tuple[str, ...]:
    """The defines that compile a shim with only ``functions`` exported (None: every one)."""
    if functions is None:
        return ()
    return ("EDGEC_ONLY_LISTED", *(f"EDGEC_EXPORT_{name}" for name in sorted(set(functions))))


def dnnl_shim(compiler: str = "g++", functions: Iterable[str] | None = None) -> NativeAddon:
    """The oneDNN shim (``edgec/native/dnnl_shim.cc``) compiled for the host with ``compiler``,
    exporting ``functions`` (default: all; a model library links those its program calls).

    Raises ToolchainError, in one line, when the compiler, oneDNN's headers or its library are
    missing. The first call per source version compiles (a few seconds); later calls hit the cache.
    """
    obj = _compile_object(
        NATIVE_DIR / "dnnl_shim.cc", compiler, missing_header_hint=DNNL_INSTALL_HINT,
        header="dnnl.hpp", flags=("-fopenmp",), defines=only_exports(functions),
    )
    _check_library(compiler, "dnnl", DNNL_INSTALL_HINT)
    # -fopenmp: its own loops (pooling) share out their rows over oneDNN's OpenMP threads.
    return NativeAddon("dnnl", (str(obj),), ("-ldnnl", "-fopenmp"), ROUTE_DEPENDENCIES["dnnl"])


def xnnpack_shim(compiler: str = "aarch64-linux-gnu-g++",
                 functions: Iterable[str] | None = None) -> NativeAddon:
    """The XNNPACK shim (``edgec/native/xnnpack_shim.cc``) compiled with ``compiler`` (the
    target's cross compiler), linking the ``libXNNPACK`` and ``libpthreadpool`` it finds (Debian's
    arm64 packages, in /usr/lib/aarch64-linux-gnu on the cross compiler's search path), exporting
    ``functions`` (default: all, the weight-only int8 ones included).

    Raises ToolchainError, in one line naming the Debian package and how to install it, when
    XNNPACK's or pthreadpool's header or library is missing.
    """
    hints = {name: f"install {package}: {XNNPACK_INSTALL}"
             for name, package in XNNPACK_PACKAGES.items()}
    obj = _compile_object(NATIVE_DIR / "xnnpack_shim.cc", compiler,
                          missing_header_hint=hints["xnnpack.h"], header="xnnpack.h",
                          other_headers={"pthreadpool.h": hints["pthreadpool.h"]},
                          defines=only_exports(functions))
    for library in ("XNNPACK", "pthreadpool"):
        _check_library(compiler, library, hints[library])
    return NativeAddon("xnnpack", (str(obj),), ("-lXNNPACK", "-lpthreadpool"),
                       ROUTE_DEPENDENCIES["xnnpack"])


def runtime_kernels(compiler: str = "g++", functions: Iterable[str] | None = None) -> NativeAddon:
    """edgec's own CPU kernels (``edgec/native/runtime_kernels.cc``): NonZero and Unique, which
    TVM only provides from Python, the time loop of LSTM/GRU/RNN layers, and the stacked outputs
    of Loop and Scan; exporting ``functions`` (default: all). Needs tvm_ffi, and, with the time
    loop, GCC's OpenMP library at run time, over whose threads it shares out its steps."""
    obj = _compile_object(NATIVE_DIR / "runtime_kernels.cc", compiler,
                          missing_header_hint="reinstall apache-tvm-ffi", header="tvm/ffi/function.h",
                          flags=("-fopenmp",), defines=only_exports(functions))
    if functions is not None and "edgec_recurrent" not in functions:
        return NativeAddon("runtime_kernels", (str(obj),), (), ())
    return NativeAddon("runtime_kernels", (str(obj),), ("-fopenmp",), ("libgomp.so.1",))


def int8_addon(compiler: str = "g++", functions: tuple[str, ...] | None = None) -> NativeAddon:
    """The parts of ``edgec/native/dnnl_int8.cc`` (dense, conv) that define ``functions`` (the
    ``edgec_q8_*`` a program calls; None: all), each compiled like the fp32 shim (cached by
    content hash) into its own object with only those exports, so a library links what it
    calls.

    Like the fp32 shim, it needs ``libdnnl.so.2`` at run time (a library whose every layer is
    int8 no longer links the fp32 shim).
    """
    parts = [part for part in ("dense", "conv")
             if functions is None or any(f.startswith(f"edgec_q8_{part}") for f in functions)]
    objects = tuple(str(_compile_object(
        NATIVE_DIR / "dnnl_int8.cc", compiler, missing_header_hint=DNNL_INSTALL_HINT,
        header="dnnl.hpp",
        defines=(f"EDGEC_Q8_{part.upper()}", *only_exports(functions)))) for part in parts)
    _check_library(compiler, "dnnl", DNNL_INSTALL_HINT)
    return NativeAddon("dnnl_int8", objects, ("-ldnnl",), ROUTE_DEPENDENCIES["dnnl"])


# The prefixes of the functions each addon defines, in link order: the library shims (whose calls
# ``transform.library_offload`` and ``transform.quantized`` write), then edgec's own kernels.
_LIBRARY_PREFIXES = {"dnnl": "edgec_dnnl_", "xnnpack": "edgec_xnn_", "dnnl_int8": "edgec_q8_"}
RUNTIME_KERNELS = {"edgec_nonzero", "edgec_unique", "edgec_unique_axis", "edgec_nms", "edgec_recurrent",
                   "edgec_rows_append", "edgec_rows_take", "edgec_loop"}
# The shim of each library route (a target file's [libraries] key).
ROUTE_SHIMS = {"dnnl": dnnl_shim, "xnnpack": xnnpack_shim}


def is_library_function(symbol: str) -> bool:
    """Whether ``symbol`` is a function of a library shim (oneDNN, XNNPACK), whose own threads
    then run on the cores."""
    return symbol.startswith(tuple(_LIBRARY_PREFIXES.values()))


def addons_for(symbols: Iterable[str], compiler: str) -> list[NativeAddon]:
    """The compiled addons that define the edgec functions among ``symbols`` (a program's
    external calls), each exporting only those; compiled with ``compiler``."""
    symbols = set(symbols)
    builders = {"dnnl": dnnl_shim, "xnnpack": xnnpack_shim, "dnnl_int8": int8_addon}
    addons = []
    for name, prefix in _LIBRARY_PREFIXES.items():
        called = tuple(sorted(s for s in symbols if s.startswith(prefix)))
        if called:
            addons.append(builders[name](compiler, called))
    kernels = tuple(sorted(symbols & RUNTIME_KERNELS))
    if kernels:
        addons.append(runtime_kernels(compiler, kernels))
    return addons


def _compiler_version(compiler: str) -> str:
    if shutil.which(compiler) is None:
        raise ToolchainError(
            f"C++ compiler '{compiler}' not found; it builds edgec's native kernels "
            f"(Debian: apt-get install g++)"
        )
    result = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=False)
    return result.stdout.strip()


def _ffi_include() -> str:
    import tvm_ffi.libinfo

    return tvm_ffi.libinfo.find_include_path()


def _compile_object(source: Path, compiler: str, missing_header_hint: str, header: str,
                    defines: tuple[str, ...] = (), other_headers: dict[str, str] | None = None,
                    flags: tuple[str, ...] = ()) -> Path:
    """``source`` compiled to a cached object with extra ``flags``; ``defines`` (``-D`` names)
    select parts of it.

    A missing ``header`` fails with ``missing_header_hint``, a missing header of
    ``other_headers`` (header -> hint; those the library's own header includes) with its hint.
    """
    include = _ffi_include()
    flags = [*_CXX_FLAGS, *flags, *(f"-D{name}" for name in defines), f"-I{include}"]
    key = hashlib.sha256()
    key.update(source.read_bytes())
    for shared in sorted(source.parent.glob("*.h")):  # the shims' shared header(s)
        key.update(shared.read_bytes())
    key.update(_compiler_version(compiler).encode())
    key.update(" ".join(flags).encode())
    obj = cache_dir() / f"{source.stem}-{key.hexdigest()[:16]}.o"
    if obj.is_file():
        return obj
    obj.parent.mkdir(parents=True, exist_ok=True)
    # Compile to a private name, then rename: concurrent builds never see half an object.
    fd, tmp = tempfile.mkstemp(suffix=".o", dir=obj.parent)
    os.close(fd)
    try:
        result = subprocess.run(
            [compiler, *flags, "-c", str(source), "-o", tmp],
            capture_output=True, text=True, check=False,
        )
        if result.returncode != 0:
            hints = {header: missing_header_hint, **(other_headers or {})}
            for name, hint in hints.items():
                if f"{name}: No such file" in result.stderr:
                    raise ToolchainError(f"'{name}' not found while compiling {source.name}; "
                                         f"{hint}")
            first = next((line for line in result.stderr.splitlines() if "error" in line),
                         result.stderr.strip()[:300])
            raise ToolchainError(f"compiling {source.name} with '{compiler}' failed: {first}")
        os.chmod(tmp, 0o644)  # mkstemp's 0600 would lock other users out of a shared cache
        os.replace(tmp, obj)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return obj


def _check_library(compiler: str, name: str, hint: str) -> None:
    """Fail in one line unless ``compiler`` finds ``lib<name>.so`` to link (checked every build:
    a cached object outlives an uninstalled library)."""
    result = subprocess.run([compiler, f"-print-file-name=lib{name}.so"],
                            capture_output=True, text=True, check=False)
    if not os.path.isabs(result.stdout.strip()):
        raise ToolchainError(f"library 'lib{name}.so' not found by '{compiler}'; {hint}")
