"""Small questions and rewrites over Relax modules that several compiler phases share."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax, tirx

# A Relax function attribute: only edgec's own kernels call this function, with values of its
# parameter types (a loop's step); its VM argument checks go (transform/trusted_params.py).
TRUSTED_PARAMS = "edgec.trusted_params"


def constant(value) -> relax.Constant:
    """A Relax constant of ``value`` in its own dtype: ``relax.const`` alone makes an int64 or
    float64 numpy value int32 or float32, and the int64 ops around it then fail type inference."""
    array = np.asarray(value)
    return relax.const(array, str(array.dtype))


def rewrite_functions(mutator: relax.PyExprMutator, mod: tvm.IRModule) -> tvm.IRModule:
    """Apply ``mutator`` (built over ``mod``) to every Relax function of ``mod``; a new module."""
    for gvar, func in list(mod.functions.items()):
        if isinstance(func, relax.Function):
            mutator.builder_.update_func(gvar, mutator.visit_expr(func))
    return mutator.builder_.get()


def extern_symbols(mod: tvm.IRModule) -> set[str]:
    """The external functions (``call_dps_packed`` and friends) the Relax functions of ``mod``
    call, by symbol."""
    found: set[str] = set()

    def visit(expr: relax.Expr) -> None:
        if isinstance(expr, relax.ExternFunc):
            found.add(str(expr.global_symbol))

    for func in mod.functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return found


def vm_instructions(mod: tvm.IRModule) -> dict[str, int]:
    """Bindings per Relax function of ``mod``, If branches included: after the ``lower`` phase,
    the VM instructions each function becomes."""
    counts: dict[str, int] = {}
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            total = 0

            def visit(expr: relax.Expr) -> None:
                nonlocal total
                if isinstance(expr, relax.SeqExpr):
                    total += sum(len(block.bindings) for block in expr.blocks)

            relax.analysis.post_order_visit(func, visit)
            counts[gvar.name_hint] = total
    return counts


def prim_funcs(mod: tvm.IRModule) -> dict[str, tvm.tirx.PrimFunc]:
    """``mod``'s TIR kernels by name."""
    return {gvar.name_hint: func for gvar, func in mod.functions.items()
            if isinstance(func, tvm.tirx.PrimFunc)}


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The dims of a tensor expression when all are known numbers, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)
