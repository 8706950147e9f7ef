"""Backends: one module per kind of target, each a ``Backend`` (``base.py``) whose attributes say
what the pipeline may run for it. Target files pick one by their ``kind`` field."""

from __future__ import annotations

from edgec.compiler.backends.base import Backend, CompiledLibrary
from edgec.compiler.backends.cuda import CUDABackend
from edgec.compiler.backends.llvm import LLVMBackend
from edgec.core.targets import Target
from edgec.errors import CompileError

BACKENDS: dict[str, Backend] = {backend.kind: backend for backend in (LLVMBackend(), CUDABackend())}

__all__ = ["BACKENDS", "Backend", "CompiledLibrary", "backend_for"]


def backend_for(target: Target) -> Backend:
    """The backend of a target's kind; unknown kinds list the known ones."""
    try:
        return BACKENDS[target.kind]
    except KeyError:
        raise CompileError(f"target '{target.name}' has kind '{target.kind}'; known kinds: "
                           f"{', '.join(BACKENDS)}") from None
