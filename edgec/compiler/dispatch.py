"""Shape specialization: static copies of ``main`` for hot shapes, chosen at run time by a dispatch.

The result keeps one program per target (see TVM_NOTES.md, Control flow)::

    main(x: (n, s))  ->  if n == 1 and s == 32: spec_0(match_cast(x, (1, 32)))
                         elif ...:               spec_1(...)
                         else:                   generic(x)
"""

from __future__ import annotations

from typing import Mapping

import tvm
from tvm import relax, tirx


def symbolic_vars(func: relax.Function) -> dict[str, tirx.Var]:
    """The symbolic dims defined by a function's tensor parameters, by name."""
    found: dict[str, tirx.Var] = {}
    for param in func.params:
        ty = param.ty
        if isinstance(ty, relax.TensorType) and ty.shape is not None:
            for dim in ty.shape.values:
                if isinstance(dim, tirx.Var):
                    found.setdefault(dim.name, dim)
    return found


def add_shape_dispatch(mod: tvm.IRModule, specializations: list[Mapping[str, int]]) -> tvm.IRModule:
    """Return a module whose ``main`` dispatches to one static function per specialization.

    ``specializations`` are assignments of ``main``'s symbolic dims; a dim left out stays symbolic
    in that specialization. The original ``main`` becomes ``generic``, the fallback for every other
    shape. The input module is not changed. With no specializations it is returned as is.
    """
    if not specializations:
        return mod
    generic = mod["main"].without_attr("global_symbol")
    known = symbolic_vars(generic)
    for spec in specializations:
        unknown = sorted(set(spec) - set(known))
        if unknown:
            raise ValueError(f"specialization names dims {unknown} that main does not have {sorted(known)}")

    # Start from the other functions under their own GlobalVars: loop functions call themselves
    # through them, and a re-added copy would get a new one.
    builder = relax.BlockBuilder(
        tvm.IRModule({gvar: func for gvar, func in mod.functions.items() if gvar.name_hint != "main"},
                     attrs=mod.attrs))
    generic_gv = builder.add_func(generic, "generic")
    specialized = []
    for index, spec in enumerate(specializations):
        func = generic.bind_symbolic_vars(dict(spec))
        specialized.append((builder.add_func(func, f"spec_{index}"), spec, func))

    main = relax.utils.copy_with_new_vars(generic)
    dims = symbolic_vars(main)
    body: relax.Expr = relax.Call(generic_gv, list(main.params))
    for gvar, spec, func in reversed(specialized):
        condition = relax.prim_value(tirx.all(*[dims[name] == value for name, value in spec.items()]))
        bindings: list[relax.Binding] = []
        args = []
        for param, static_param in zip(main.params, func.params):
            cast = relax.Var(f"{param.name}_static", static_param.ty)
            bindings.append(relax.MatchCast(cast, param, static_param.ty))
            args.append(cast)
        result = relax.Var(f"{gvar.name_hint}_out", func.ret_ty)
        bindings.append(relax.VarBinding(result, relax.Call(gvar, args)))
        then_branch = relax.SeqExpr([relax.BindingBlock(bindings)], result)
        body = relax.If(condition, then_branch, body)

    attrs = {k: v for k, v in generic.attrs.items()} if generic.attrs else {}
    with builder.function("main", list(main.params), attrs=attrs):
        output = builder.emit(body)
        builder.emit_func_output(output)
    return builder.get()
