"""Static copies of the symbolic kernels a static shape specialization calls.

A shape specialization is ``main`` with its symbolic dims bound (``Function.bind_symbolic_vars``,
``shape_dispatch.add_shape_dispatch``). That rebinds the Relax function only: a kernel that was
already TIR before specialization (TVM's importer emits ``Clip``, ``Pad``, a Conv's
``auto_pad``/asymmetric pads, ``Tile``, ``Einsum`` and others with ``emit_te``, and so do some of
edgec's converters) stays the one symbolic ``PrimFunc`` that the generic function calls too. Its
static callers then hand it static tensors, and TVM's FuseTIR, fusing it with a neighbour that
was legalized after specialization (static buffers), maps one Relax var to a symbolic and a
static buffer: "Inconsistent buffers T_add and A mapped to the same relax var". The kernel also
misses the static shapes' scheduling.

``specialize_kernels`` points each ``call_tir`` whose arguments and result have static shapes,
in the functions named, at a copy of its kernel with the shape vars bound to those shapes
(``PrimFunc.specialize``); copies that come out the same are shared.
"""

from __future__ import annotations

from typing import Iterable

import tvm
from tvm import relax, tirx

_CALL_TIR = tvm.ir.Op.get("relax.call_tir")


def _static_dims(ty) -> list[int] | None:
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = ty.shape.values
    return [int(d) for d in dims] if all(isinstance(d, tirx.IntImm) for d in dims) else None


def _tensor_types(ty) -> list:
    return list(ty.fields) if isinstance(ty, relax.TupleType) else [ty]


def specialized_kernel(kernel: tirx.PrimFunc, shapes: list[list[int]]) -> tirx.PrimFunc | None:
    """``kernel`` with its buffer params (inputs then outputs, in order) bound to ``shapes``; None
    where it has no symbolic buffer, other params, or the shapes do not fit."""
    types = [p.ty for p in kernel.params]
    if len(types) != len(shapes) or not all(isinstance(t, tirx.BufferType) for t in types):
        return None  # scalar params (call_tir's tir_vars): left as they are
    bound: dict[str, int] = {}
    param_map = {}
    for param, ty, shape in zip(kernel.params, types, shapes):
        dims = list(ty.shape)
        if len(dims) != len(shape):
            return None
        if all(isinstance(d, tirx.IntImm) for d in dims):
            continue
        if not all(isinstance(d, (tirx.IntImm, tirx.Var)) for d in dims):
            continue  # a derived extent (n + 4): fixed by the vars the others bind
        for dim, value in zip(dims, shape):
            if isinstance(dim, tirx.Var):
                if bound.setdefault(dim.name, value) != value:
                    return None
            elif int(dim) != value:
                return None
        # PrimFunc.specialize wants every field it does not bind to be the very same object.
        param_map[param] = tirx.decl_buffer(
            [d if isinstance(d, tirx.IntImm) else tirx.IntImm(str(d.ty), v)
             for d, v in zip(dims, shape)],
            ty.dtype, param.name, strides=list(ty.strides) or None, elem_offset=ty.elem_offset,
            data_alignment=ty.data_alignment, offset_factor=ty.offset_factor)
    if not param_map:
        return None
    try:
        result = kernel.specialize(param_map)
    except Exception:  # noqa: BLE001 - a kernel TVM cannot specialize keeps its symbolic form
        return None
    analyzer = tvm.sym.Analyzer()
    for param, shape in zip(result.params, shapes):
        dims = [analyzer.simplify(d) for d in param.ty.shape]
        if not all(isinstance(d, tirx.IntImm) for d in dims) or [int(d) for d in dims] != shape:
            return None
    return result


@relax.expr_functor.mutator
class _Specialize(relax.PyExprMutator):
    def __init__(self, mod: tvm.IRModule) -> None:
        super().__init__(mod)
        self.mod = mod
        self.copies: dict[tuple, relax.GlobalVar] = {}

    def visit_call_(self, call: relax.Call) -> relax.Expr:
        call = super().visit_call_(call)
        if call.op != _CALL_TIR or len(call.args) != 2 or not isinstance(call.args[0], relax.GlobalVar):
            return call
        kernel = self.mod[call.args[0]]
        if not isinstance(kernel, tirx.PrimFunc):
            return call
        args = call.args[1].fields if isinstance(call.args[1], relax.Tuple) else [call.args[1]]
        shapes = [_static_dims(a.ty) for a in args] + [_static_dims(t) for t in
                                                      _tensor_types(call.ty_args[0])]
        if any(s is None for s in shapes):
            return call
        key = (call.args[0].name_hint, tuple(tuple(s) for s in shapes))
        if key not in self.copies:
            static = specialized_kernel(kernel, shapes)
            if static is None:
                self.copies[key] = call.args[0]
            else:
                self.copies[key] = self.builder_.add_func(static, f"{call.args[0].name_hint}_static")
        gvar = self.copies[key]
        if gvar.same_as(call.args[0]):
            return call
        return relax.Call(call.op, [gvar, *call.args[1:]], call.attrs, call.ty_args, call.span)


def specialize_kernels(mod: tvm.IRModule, functions: Iterable[str]) -> tvm.IRModule:
    """``mod`` with the static calls of its Relax ``functions`` (by name) pointed at static
    kernel copies (module docstring); a new module."""
    mutator = _Specialize(mod)
    for name in functions:
        gvar = mod.get_global_var(name)
        mutator.builder_.update_func(gvar, mutator.visit_expr(mod[gvar]))
    return mutator.builder_.get()
