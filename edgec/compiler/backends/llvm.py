"""CPU targets: code through LLVM, linked into a shared library by the host or a cross C++ compiler.

With ``[libraries] dnnl = true`` in the target file, convolutions and matmuls go to oneDNN, with
``xnnpack = true`` (aarch64 targets) to XNNPACK (``transform.library_offload``); the rest gets
TVM's CPU lowering plus fusion and edgec's vectorizing schedules (``transform.schedules``): TVM's
own default CPU build neither fuses nor schedules. The pipeline (``edgec.compiler.pipeline``)
reads the capabilities below.
"""

from __future__ import annotations

import tvm

from edgec.compiler.backends.base import Backend
from edgec.compiler.ir import vm_instructions
from edgec.compiler.transform.library_offload import DispatchRules
from edgec.core.targets import Target
from edgec.errors import CompileError, describe

# Relax functions as native code instead of VM bytecode: no instruction decoding around each
# builtin call. Only edgec's runtimes bind the functions such code needs (``linked_functions``):
# targets run through TVM's own RPC server keep bytecode.
VM_EXEC_MODE = "compiled"
# LLVM's time on a compiled Relax function grows with about the square of its VM instructions
# (one function of 1250, 2500, 5000 instructions: 2.7, 17, 105 s on a Zen 3 core; an SSD's
# unrolled per-class post-processing, 10,000: over 30 minutes), while compiled code saves well
# under a microsecond per instruction over bytecode. Past this many instructions in one function,
# where the model's kernels dwarf that saving, the library keeps bytecode.
MAX_COMPILED_VM_INSTRUCTIONS = 2000


class LLVMBackend(Backend):
    """CPU code through LLVM (x86-64, aarch64)."""

    kind = "llvm"
    device = "cpu"
    lowering = "cpu"
    native_kernels = True
    library_routes = ("dnnl", "xnnpack")
    int8 = True
    fast_math = True
    kernel_asserts = False

    def tvm_target(self, target: Target) -> tvm.target.Target:
        try:
            return tvm.target.Target(dict(target.tvm))
        except Exception as exc:  # TVM validates target attributes with its own error types
            raise CompileError(f"target '{target.name}' has an invalid [tvm] table: "
                               f"{describe(exc)}") from None

    def vm_exec_mode(self, target: Target, lowered: tvm.IRModule) -> str:
        if target.run.get("mode", "local") == "rpc":
            return "bytecode"
        if max(vm_instructions(lowered).values(), default=0) > MAX_COMPILED_VM_INSTRUCTIONS:
            return "bytecode"
        return VM_EXEC_MODE

    def library_rules(self, target: Target) -> DispatchRules | None:
        """The library route ``target``'s file enables (``[libraries] dnnl`` or ``xnnpack``), with
        what goes there and in which layout; None when it enables neither.

        Raises CompileError when it enables both, or XNNPACK for another architecture than aarch64
        (the shim is built and tested against Debian's arm64 XNNPACK only).
        """
        enabled = [name for name in self.library_routes if target.libraries.get(name, False)]
        if len(enabled) > 1:
            raise CompileError(f"target '{target.name}' enables both [libraries] dnnl and "
                               f"xnnpack; keep one")
        if not enabled:
            return None
        if enabled[0] == "dnnl":
            return dnnl_rules(target)
        if target.arch != "aarch64":
            raise CompileError(f"target '{target.name}': [libraries] xnnpack is for aarch64 "
                               f"targets (this one is {target.arch}); use dnnl on x86_64")
        return xnnpack_rules(target)


def xnnpack_rules(target: Target) -> DispatchRules:  # noqa: ARG001 - one set for every Arm core
    """What goes to XNNPACK for ``target``: every convolution and dense matmul with a constant
    fp32 weight (TVM's untuned kernels lose by far more than XNNPACK's NEON ones), activations
    NHWC between its calls, XNNPACK's only layout."""
    return DispatchRules(library="xnn")


def dnnl_rules(target: Target) -> DispatchRules:
    """What goes to oneDNN for ``target``, and in which activation layout.

    oneDNN's AVX-512 kernels work on 16-channel blocks, its AVX2 ones on 8: the target's declared
    ISA picks the block (a library built for one ISA runs everywhere, with reorders where the
    machine's kernels want the other block). Other architectures keep NCHW.
    """
    mattr = [str(a) for a in target.tvm.get("mattr", [])]
    if target.arch != "x86_64":
        return DispatchRules(block=0, batch_matmul=True, softmax=True, layer_norm=True)
    return DispatchRules(block=16 if "+avx512f" in mattr else 8, batch_matmul=True, softmax=True,
                         layer_norm=True, pool2d=True, resize2d=True)
