"""Kernels that read symbolic dims into a tensor (``shape_to_tensor`` of a var) kept out of fusion.

TVM 0.27 legalizes ``shape_to_tensor([n])`` to a ``call_tir`` taking the var ``n`` itself as an
argument. Fused with its consumers, ``n`` can become both a parameter of the fused function and a
var of its ``R.Shape`` parameter, and FuseTIR stops (``VarRemapGet(source) == nullptr``): seen on
detectors, where the index a Gather normalizes is read from a NonZero count. Marked opaque, the
read stays one tiny kernel of its own (a few ns); its consumers still fuse with each other.
"""

from __future__ import annotations

import tvm

_OPAQUE = 8  # TVM's OpPatternKind kOpaque; AnnotateTIROpPattern keeps a pattern already set


@tvm.transform.module_pass(opt_level=0, name="edgec.UnfusedShapeReads")
def UnfusedShapeReads(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """``mod`` with every legalized ``shape_to_tensor`` of symbolic dims marked opaque."""
    for gv, func in list(mod.functions.items()):
        if (isinstance(func, tvm.tirx.PrimFunc) and gv.name_hint.startswith("shape_to_tensor")
                and any(isinstance(param.ty, tvm.ir.PrimType) for param in func.params)):
            mod[gv] = func.with_attr("op_pattern", _OPAQUE)
    return mod
