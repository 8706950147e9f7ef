"""Value specialization: ``main`` compiled for fixed values of shape-like inputs, with the general
program as the fallback when a call passes other values.

    main(x, axes)  ->  if all(axes == [1]): fixed_main(x, axes)     # axes folded in as [1]
                       else:                general(x, axes)        # TVM's symbolic path

Used when the general program imports too; when it does not, the build compiles the fixed one
alone and the runtimes refuse other values (see ``TensorSpec.fixed_value``).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import tvm
from tvm import relax


@relax.expr_functor.mutator
class _Renamer(relax.PyExprMutator):
    """Points references to one module's functions at their renamed copies."""

    def __init__(self, mod: tvm.IRModule, mapping: dict[str, relax.GlobalVar]) -> None:
        super().__init__(mod)
        self.mapping = mapping

    def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:
        return self.mapping.get(op.name_hint, op)


def add_value_dispatch(fixed: tvm.IRModule, general: tvm.IRModule,
                       values: Mapping[str, np.ndarray]) -> tvm.IRModule:
    """One module whose ``main`` runs ``fixed``'s main when every input named in ``values`` holds
    its value, else ``general``'s main. Neither input module is changed."""
    fixed_main = fixed["main"].without_attr("global_symbol")
    builder = relax.BlockBuilder(tvm.IRModule(
        {gvar: func for gvar, func in fixed.functions.items() if gvar.name_hint != "main"},
        attrs=fixed.attrs))
    fixed_gv = builder.add_func(fixed_main, "fixed_main")
    # The general program's functions under fresh names (typed GlobalVars come from add_func),
    # then their bodies re-pointed at those names: its loops and kernels call each other.
    mapping: dict[str, relax.GlobalVar] = {}
    for gvar, func in general.functions.items():
        name = "general" if gvar.name_hint == "main" else f"general_{gvar.name_hint}"
        if gvar.name_hint == "main" and isinstance(func, relax.Function):
            func = func.without_attr("global_symbol")
        elif func.attrs is not None and "global_symbol" in func.attrs:  # kernels: unique symbols
            func = func.with_attr("global_symbol", name)
        mapping[gvar.name_hint] = builder.add_func(func, name)
    renamer = _Renamer(general, mapping)
    for old, func in general.functions.items():
        if isinstance(func, relax.Function):
            new_func = renamer.visit_expr(func)
            if old.name_hint == "main":
                new_func = new_func.without_attr("global_symbol")
            builder.update_func(mapping[old.name_hint], new_func)
    renamed = builder.get()
    general_gv = mapping["main"]

    main = relax.utils.copy_with_new_vars(general["main"])
    params = {param.name: param for param in main.params}
    builder = relax.BlockBuilder(renamed)
    attrs = {k: v for k, v in general["main"].attrs.items()} if general["main"].attrs else {}
    with builder.function("main", list(main.params), attrs=attrs):
        condition = None
        for name, value in values.items():
            differing = relax.op.sum(relax.op.astype(
                relax.op.not_equal(params[name], relax.const(value)), "int64"))
            same = builder.emit(relax.op.equal(differing, relax.const(0, "int64")))
            condition = same if condition is None else builder.emit(relax.op.logical_and(condition, same))
        branches = []
        for gvar in (fixed_gv, general_gv):
            result = relax.Var(f"{gvar.name_hint}_out", renamed[gvar].ret_ty)
            branches.append(relax.SeqExpr(
                [relax.BindingBlock([relax.VarBinding(result, relax.Call(gvar, list(main.params)))])],
                result))
        output = builder.emit(relax.If(condition, *branches))
        builder.emit_func_output(output)
    return builder.get()
