"""Compile a Relax module for a target and export its library, one small class per kind of target.

Adding a kind of target (CUDA, say) is adding a class to ``CODEGENS``; target files pick it by
their ``kind`` field.
"""

from __future__ import annotations

import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import tvm

from ..errors import CompileError, ToolchainError, describe
from ..targets import Target


@dataclass(frozen=True)
class CompiledLibrary:
    """A target's model library and the shared libraries it needs at run time besides TVM's."""

    data: bytes
    native_dependencies: list[str] = field(default_factory=list)


class LLVMCodegen:
    """CPU code through LLVM, linked into a shared library by the host or a cross C++ compiler."""

    device = "cpu"

    def tvm_target(self, target: Target) -> tvm.target.Target:
        try:
            return tvm.target.Target(dict(target.tvm))
        except Exception as exc:  # TVM validates target attributes with its own error types
            raise CompileError(f"target '{target.name}' has an invalid [tvm] table: {describe(exc)}") from None

    def compile(self, mod: tvm.IRModule, target: Target) -> CompiledLibrary:
        tvm_target = self.tvm_target(target)
        try:
            executable = tvm.compile(mod, tvm_target)
        except Exception as exc:  # lowering errors arrive as TVM's InternalError and friends
            raise CompileError(f"compiling for '{target.name}' failed: {describe(exc)}") from None
        export_kwargs = {}
        if target.cross_compiler:
            if shutil.which(target.cross_compiler) is None:
                raise ToolchainError(
                    f"cross compiler '{target.cross_compiler}' for target '{target.name}' is not "
                    f"installed; install it (Debian: apt-get install g++-aarch64-linux-gnu)"
                )
            export_kwargs["fcompile"] = tvm.support.cc.cross_compiler(target.cross_compiler)
        with tempfile.TemporaryDirectory(prefix="edgec-build-") as tmp:
            path = Path(tmp) / "model.so"
            try:
                executable.export_library(str(path), **export_kwargs)
            except Exception as exc:  # the linker's failure surfaces as a RuntimeError
                raise CompileError(f"linking the library for '{target.name}' failed: {describe(exc)}") from None
            return CompiledLibrary(path.read_bytes())


CODEGENS = {"llvm": LLVMCodegen()}


def codegen_for(target: Target) -> LLVMCodegen:
    """The code generator for a target's kind; unknown kinds list the known ones."""
    try:
        return CODEGENS[target.kind]
    except KeyError:
        raise CompileError(
            f"target '{target.name}' has kind '{target.kind}'; known kinds: {', '.join(CODEGENS)}"
        ) from None
