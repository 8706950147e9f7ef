"""What a kind of target is to the compiler: its capabilities as attributes, its TVM target and
how its compiled program becomes one shared library.

A backend lists no passes: ``edgec.compiler.pipeline`` reads these attributes to say which passes
run for it. Adding a kind of target is one module here with a ``Backend`` subclass, registered in
``edgec.compiler.backends.BACKENDS``.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import tvm

from edgec.compiler.native import LINK_OPTIONS, NativeAddon
from edgec.core.targets import Target
from edgec.errors import CompileError, ToolchainError, describe


@dataclass(frozen=True)
class CompiledLibrary:
    """A target's model library and the shared libraries it needs at run time besides TVM's."""

    data: bytes
    native_dependencies: list[str] = field(default_factory=list)
    # Which tuning database was applied and how many of TVM's kernels took schedules from it.
    tuning: dict = field(default_factory=dict)
    # False when TVM's kernels were compiled serial (a library's threads own the cores): the
    # runtimes then start TVM's thread pool with one thread, which only TOPI's built-in parallel
    # loops (scatter_nd...) would wake on every call, for no gain (moe: 0.16 -> 0.11 ms).
    tvm_kernels_parallel: bool = True
    # How the VM runs the Relax functions: "bytecode" (interpreted) or "compiled" (native code),
    # and, for compiled ones, the functions linked into the library that the runtime must bind.
    vm_exec_mode: str = "bytecode"
    linked_functions: list[str] = field(default_factory=list)


class Backend:
    """A kind of target (a target file's ``kind``). Subclasses set the attributes and implement
    ``tvm_target``; the defaults link host code with the host's or the cross C++ compiler.

    Capabilities the pipeline reads:

    - ``device``: where kernels run ("cpu", "cuda"); the VM's control flow always runs on the CPU.
    - ``lowering``: which lowering the pipeline runs after the Relax rewrites ("cpu": fusion,
      tuning database, edgec's CPU schedules; "gpu": TVM's GPU pipeline with dlight's rules).
    - ``native_kernels``: edgec's CPU kernels (``edgec/native/runtime_kernels.cc``: the recurrent
      time loop, rows appended in place by Loop/Scan, NonZero, Unique) may be called; also where
      the importer may use them.
    - ``library_routes``: the ``[libraries]`` a target file of this kind may enable.
    - ``int8``: quantized layers lower to int8 library calls; ``fp16``: the program may be
      converted to half precision.
    - ``fast_math``: erf and softmax as vectorizable approximations (``transform.fast_math``).
    - ``kernel_asserts``: keep TIR's per-kernel argument checks (the VM checks inputs anyway).
    """

    kind = ""
    device = "cpu"
    lowering = "cpu"
    native_kernels = False
    library_routes: tuple[str, ...] = ()
    int8 = False
    fp16 = False
    fast_math = False
    kernel_asserts = True

    def tvm_target(self, target: Target) -> tvm.target.Target:
        """The TVM target for ``target``'s ``[tvm]`` table."""
        raise NotImplementedError

    def library_rules(self, target: Target):
        """The library route ``target`` enables (``library_offload.DispatchRules``), or None.
        Raises CompileError when it enables a library this kind cannot call."""
        for library in ("dnnl", "xnnpack"):
            if target.libraries.get(library, False) and library not in self.library_routes:
                raise CompileError(f"target '{target.name}': [libraries] {library} is for CPU "
                                   f"targets; remove it from the target file")
        return None

    def vm_exec_mode(self, target: Target,  # noqa: ARG002 - a subclass may differ per target
                     lowered: tvm.IRModule) -> str:  # noqa: ARG002
        """How the library runs the Relax functions of ``lowered`` (the module after the
        ``lower`` phase): "bytecode" or "compiled"."""
        return "bytecode"

    def check_toolchain(self, target: Target) -> None:
        """Fail before minutes of compiling when linking is bound to fail."""
        if target.cross_compiler and shutil.which(target.cross_compiler) is None:
            raise ToolchainError(
                f"cross compiler '{target.cross_compiler}' for target '{target.name}' is not "
                f"installed; install it ({debian_cross_package(target.cross_compiler)})")

    def export_options(self, target: Target) -> dict[str, Any]:
        """Keyword arguments of ``export_library`` beyond the linked objects."""
        options: dict[str, Any] = {"options": list(LINK_OPTIONS)}
        if target.cross_compiler:
            options["fcompile"] = tvm.support.cc.cross_compiler(target.cross_compiler)
        return options

    def link(self, executable, target: Target, addons: list[NativeAddon]) -> bytes:
        """The shared library of ``executable`` (``relax.build``'s) with ``addons`` linked in."""
        options = self.export_options(target)
        if addons:
            # addons, not options: options land before the objects and the linker drops them.
            options["addons"] = [arg for addon in addons for arg in addon.addons]
        with tempfile.TemporaryDirectory(prefix="edgec-build-") as tmp:
            path = Path(tmp) / "model.so"
            try:
                executable.export_library(str(path), **options)
            except CompileError:  # a hook's own (nvcc's, CUDA)
                raise
            except Exception as exc:  # the linker's failure surfaces as a RuntimeError
                raise CompileError(f"linking the library for '{target.name}' failed: "
                                   f"{describe(exc)}") from None
            return path.read_bytes()


def debian_cross_package(compiler: str) -> str:
    """How to install a GNU cross compiler on Debian, from its name (``<triple>-g++`` is in
    package ``g++-<triple>``)."""
    match = re.fullmatch(r"(?:.*/)?([a-z0-9_]+-[a-z0-9_-]+?)-(g\+\+|gcc)(?:-\d+)?", compiler)
    if not match:
        return "from your toolchain vendor, or set build.cross_compiler to one on PATH"
    return f"Debian: apt-get install {match.group(2)}-{match.group(1)}"
