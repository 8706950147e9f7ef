"""Gathers that clamp their indices: every ``relax.take`` in mode ``fast`` becomes mode ``clip``.

TVM's ONNX and torch importers (and ``relax.op.take`` by default) emit ``take`` in mode ``fast``,
which reads out of bounds on an index past the axis (ONNX calls such an index invalid;
onnxruntime refuses it), and whose legalization logs "Fast mode segfaults when there are
out-of-bounds indices" once per kernel: 8 times for the zoo's transformer, which serves four
functions with two embedding gathers each. In mode ``clip`` an index in range reads the same
element, and one out of range reads the nearest row instead of memory past the tensor, which
matters where the ids come from outside (a device's users). The cost is a min and a max per index.
"""

from __future__ import annotations

import tvm
from tvm import relax

_TAKE = tvm.ir.Op.get("relax.take")


@relax.expr_functor.mutator
class _ClipTakes(relax.PyExprMutator):
    def visit_call_(self, call: relax.Call) -> relax.Expr:  # noqa: D401 - the mutator's hook
        call = super().visit_call_(call)
        if call.op.same_as(_TAKE) and call.attrs.mode == "fast":
            return relax.op.take(call.args[0], call.args[1], call.attrs.axis, mode="clip")
        return call


@tvm.transform.module_pass(opt_level=0, name="edgec.ClipTakes")
def ClipTakes(mod: tvm.IRModule, _ctx: tvm.transform.PassContext) -> tvm.IRModule:  # noqa: N802
    """``mod`` with every ``take`` in mode ``fast`` in mode ``clip``; nothing else changes."""
    for gv, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mod[gv] = _ClipTakes(mod).visit_expr(func)
    return mod
