"""``--quantize fp16``: the program's matmuls and convolutions, and the ops between them, in
half precision on CUDA targets.

TVM's ``ToMixedPrecision`` casts the inputs of convolutions and matmuls (weights included, which
constant folding then stores as fp16: half the weight bytes) to fp16 and keeps the ops that follow
in fp16 where they allow it; accumulation stays fp32 (``ACCUMULATE``), as tensor cores do it, and
the program's inputs and outputs keep their dtypes. The pipeline applies it to the programs of
backends with fp16 arithmetic (CUDA) only: a CPU target in the same artifact keeps fp32 (x86
CPUs have no fast fp16 arithmetic).
"""

from __future__ import annotations

import tvm
from tvm import relax

from edgec.errors import CompileError, describe

# The accumulator of fp16 matmuls and convolutions.
ACCUMULATE = "float32"


def FP16(layer_names: list[str], found: dict[str, int], target_name: str) -> tvm.transform.Pass:  # noqa: N802
    """The pass that converts a program to fp16 (module docstring); ``found`` receives, per
    layer, 1 for each program converted."""

    @tvm.transform.module_pass(opt_level=0, name="edgec.FP16")
    def convert(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:
        try:
            mod = tvm.transform.Sequential([
                relax.transform.ConvertToDataflow(),
                relax.transform.ToMixedPrecision(out_dtype=ACCUMULATE),
            ])(mod)
        except Exception as exc:  # TVM's own errors from the pass
            raise CompileError(f"converting the program for '{target_name}' to fp16 failed: "
                               f"{describe(exc)}") from None
        for name in layer_names:
            found[name] = found.get(name, 0) + 1
        return mod

    return convert
