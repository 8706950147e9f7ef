"""Concatenations of many tensors of symbolic extent along the axis, as a tree of narrower ones.

TVM legalizes a concat into one kernel in which every output element picks its input through a
chain of ``if_then_else`` over the running offsets. With symbolic extents each offset is a sum
of all the extents before it, so the kernel grows with the square of the input count: SSDlite's
concatenations of 91 per-class NMS results (``min(300, nonzero_numbers_k)`` rows each) were
530 KB of TIR apiece, and LLVM compiled the model for more than 15 minutes without finishing.
Groups of at most ``MAX_INPUTS`` keep every kernel small; each element is copied once per tree
level (two levels for 91 inputs), on tensors as small as a detector's kept boxes. Static
extents fold into constant offsets and stay one concat.
"""

from __future__ import annotations

import tvm
from tvm import relax, tirx

from edgec.compiler.ir import rewrite_functions

MAX_INPUTS = 8
_CONCAT = tvm.ir.Op.get("relax.concat")


def _static_extent(expr: relax.Expr, axis: int) -> bool:
    ty = expr.ty
    values = getattr(ty.shape, "values", None) if isinstance(ty, relax.TensorType) else None
    return values is not None and isinstance(values[axis], tirx.IntImm)


@relax.expr_functor.mutator
class _Split(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if not (call.op.same_as(_CONCAT) and isinstance(call.args[0], relax.Tuple)
                and call.attrs.axis is not None):
            return call
        fields = list(call.args[0].fields)
        ndim = call.ty.ndim if isinstance(call.ty, relax.TensorType) else -1
        if len(fields) <= MAX_INPUTS or ndim < 1:
            return call
        axis = int(call.attrs.axis) % ndim
        if all(_static_extent(f, axis) for f in fields):
            return call
        while len(fields) > MAX_INPUTS:
            groups = [fields[i:i + MAX_INPUTS] for i in range(0, len(fields), MAX_INPUTS)]
            fields = [g[0] if len(g) == 1 else self.builder_.emit(relax.op.concat(g, axis))
                      for g in groups]
        return relax.op.concat(fields, axis)


@tvm.transform.module_pass(opt_level=0, name="edgec.SplitWideConcats")
def SplitWideConcats(mod: tvm.IRModule,  # noqa: N802
                     _ctx: tvm.transform.PassContext) -> tvm.IRModule:
    """Every concat of more than ``MAX_INPUTS`` tensors with a symbolic extent along its axis
    becomes a tree of concats of at most ``MAX_INPUTS`` (module docstring)."""
    return rewrite_functions(_Split(mod), mod)
