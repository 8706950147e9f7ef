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

from edgec.compiler.transform.static_kernels import specialize_kernels


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


def add_shape_dispatch(mod: tvm.IRModule, specializations: list[Mapping[str, int]],
                       prefix: str = "", padding: "PadSpec | None" = None,
                       exact_dispatch: bool = False) -> tvm.IRModule:
    """Return a module whose ``main`` dispatches to one static function per specialization.

    ``specializations`` are assignments of ``main``'s symbolic dims; a dim left out stays symbolic
    in that specialization. The original ``main`` becomes ``generic``, the fallback for every other
    shape. The input module is not changed. With no specializations it is returned as is.
    ``prefix`` goes before the new functions' names (``generic``, ``spec_i``).

    ``padding`` (proved safe by ``edgec.core.padding``) adds buckets: a shape that matches no
    specialization exactly but fits one along the padded dims (every other dim equal) runs the
    smallest such one, its inputs zero-padded along ``padding.inputs``' axes and its outputs sliced
    back along ``padding.outputs``'. ``exact_dispatch`` also keeps the dispatch without buckets as
    ``{prefix}exact`` (collect times both).
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
    generic_gv = builder.add_func(generic, f"{prefix}generic")
    specialized = []
    for index, spec in enumerate(specializations):
        func = generic.bind_symbolic_vars(dict(spec))
        specialized.append((builder.add_func(func, f"{prefix}spec_{index}"), spec, func))

    attrs = {k: v for k, v in generic.attrs.items()} if generic.attrs else {}
    names = ["main"] + ([f"{prefix}exact"] if exact_dispatch and padding else [])
    for name in names:
        main = relax.utils.copy_with_new_vars(generic)
        dims = symbolic_vars(main)
        body: relax.Expr = relax.Call(generic_gv, list(main.params))
        if padding and name == "main":
            buckets = sorted(specialized, key=lambda entry: padding.volume(entry[1]))
            for gvar, spec, func in reversed(buckets):
                body = relax.If(padding.condition(dims, spec),
                                padding.branch(builder, main, dims, gvar, spec, func), body)
        for gvar, spec, func in reversed(specialized):
            condition = relax.prim_value(tirx.all(*[dims[n] == value for n, value in spec.items()]))
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
        with builder.function(name, list(main.params), attrs=dict(attrs)):
            output = builder.emit(body)
            builder.emit_func_output(output)
    # Kernels that were TIR before specialization stay symbolic: each static function gets copies
    # bound to its shapes (static_kernels.py; TVM's FuseTIR cannot fuse a symbolic kernel with
    # static neighbours).
    return specialize_kernels(builder.get(), [gvar.name_hint for gvar, _, _ in specialized])


def pad_spec(padding: Mapping | None, input_names: list[str],
             output_names: list[str]) -> "PadSpec | None":
    """The ``PadSpec`` of a plan region's ``padding`` (see ``edgec.stages.plan.Region``) for a function
    whose params and results are ``input_names`` and ``output_names``; None when it pads nothing."""
    if not padding or not padding.get("used"):
        return None
    return PadSpec(list(padding["dims"]),
                   [[(int(a), d) for a, d in padding["inputs"].get(n, [])] for n in input_names],
                   [[(int(a), d) for a, d in padding["outputs"].get(n, [])] for n in output_names])


class PadSpec:
    """Where a region pads and slices (from ``edgec.core.padding`` proofs): per padded dim, the axes
    of each input (by position) padded and of each output sliced."""

    def __init__(self, dims: list[str], inputs: list[list[tuple[int, str]]],
                 outputs: list[list[tuple[int, str]]]):
        self.dims = dims
        self.inputs = inputs
        self.outputs = outputs

    def volume(self, spec: Mapping[str, int]) -> int:
        volume = 1
        for dim in self.dims:
            volume *= int(spec.get(dim, 1))
        return volume

    def condition(self, dims: Mapping[str, tirx.Var], spec: Mapping[str, int]) -> relax.Expr:
        return relax.prim_value(tirx.all(*[
            dims[n] <= value if n in self.dims else dims[n] == value for n, value in spec.items()]))

    def branch(self, builder: relax.BlockBuilder, main: relax.Function, dims, gvar, spec, func):
        """The bindings that pad ``main``'s params to ``spec``, call ``gvar`` and slice back."""
        bindings: list[relax.Binding] = []
        counter = [0]

        def bind(expr: relax.Expr, hint: str) -> relax.Var:
            expr = builder.normalize(expr)
            var = relax.Var(f"{hint}_{counter[0]}", expr.ty)
            counter[0] += 1
            bindings.append(relax.VarBinding(var, expr))
            return var

        args = []
        for param, static_param, axes in zip(main.params, func.params, self.inputs):
            value: relax.Expr = param
            for axis, dim in axes:
                if dim not in spec:
                    continue
                shape = list(value.ty.shape.values)
                extra = list(shape)
                extra[axis] = tirx.IntImm("int64", int(spec[dim])) - dims[dim]
                zeros = bind(relax.op.zeros(relax.ShapeExpr(extra), value.ty.dtype), "pad")
                value = bind(relax.op.concat([value, zeros], axis=axis), "padded")
            cast = relax.Var(f"{param.name}_bucket", static_param.ty)
            bindings.append(relax.MatchCast(cast, value, static_param.ty))
            args.append(cast)
        result = relax.Var(f"{gvar.name_hint}_padded_out", func.ret_ty)
        bindings.append(relax.VarBinding(result, relax.Call(gvar, args)))
        single = not isinstance(func.ret_ty, relax.TupleType)
        items = [result] if single else [bind(relax.TupleGetItem(result, i), "item")
                                         for i in range(len(self.outputs))]
        sliced = []
        for item, axes in zip(items, self.outputs):
            axes = [(axis, dim) for axis, dim in axes if dim in spec]
            if axes:
                item = bind(relax.op.strided_slice(
                    item, [axis for axis, _ in axes], [0] * len(axes),
                    [dims[dim] for _, dim in axes], assume_inbound=True), "sliced")
            sliced.append(item)
        out = sliced[0] if single else bind(relax.Tuple(sliced), "outputs")
        return relax.SeqExpr([relax.BindingBlock(bindings)], out)


# ---------------------------------------------------------------------------------------------
# Regions: one Relax function per region, each with its own shape dispatch, called by ``main``.


def _rename_main(mod: tvm.IRModule, name: str) -> tvm.IRModule:
    """``mod`` with ``main`` renamed ``name`` (its other functions keep their GlobalVars)."""
    builder = relax.BlockBuilder(
        tvm.IRModule({gv: f for gv, f in mod.functions.items() if gv.name_hint != "main"},
                     attrs=mod.attrs))
    builder.add_func(mod["main"].with_attr("global_symbol", name), name)
    return builder.get()


def lower_regions(model, regions: list[dict], modules: list[tvm.IRModule]) -> tvm.IRModule:
    """One module whose ``main`` calls one function per region in order.

    Each entry of ``regions`` has ``name``, ``inputs``, ``outputs`` and ``specializations``
    (assignments of that region's symbolic dims), and optionally ``padding`` (a plan Region's)
    and ``exact_dispatch`` (see ``add_shape_dispatch``); ``modules`` are the regions imported
    alone, in the same order. A region with specializations becomes ``NAME`` dispatching to
    ``NAME__spec_i`` or ``NAME__generic``; without them ``NAME`` is its one symbolic function.
    Every function stays callable by name, so a region can be timed alone. ``model`` gives
    ``main`` its inputs and outputs.
    """
    functions: dict[relax.GlobalVar, relax.Function] = {}
    attrs = None
    region_gvs = []
    for region, sub in zip(regions, modules):
        sub = add_shape_dispatch(sub, region.get("specializations", []), prefix=f"{region['name']}__",
                                 padding=pad_spec(region.get("padding"), region["inputs"],
                                                  region["outputs"]),
                                 exact_dispatch=region.get("exact_dispatch", False))
        sub = _rename_main(sub, region["name"])
        attrs = attrs or sub.attrs
        for gv, func in sub.functions.items():
            if any(existing.name_hint == gv.name_hint for existing in functions):
                raise ValueError(f"two regions define a function '{gv.name_hint}'")
            functions[gv] = func
            if gv.name_hint == region["name"]:
                region_gvs.append(gv)

    builder = relax.BlockBuilder(tvm.IRModule(functions, attrs=attrs))
    dims: dict[str, tirx.Var] = {}
    params = []
    for spec in model.inputs:
        shape = [d if isinstance(d, int) else dims.setdefault(d, tirx.Var(d, "int64")) for d in spec.dims]
        params.append(relax.Var(spec.name, relax.TensorType(shape, spec.dtype)))
    env: dict[str, relax.Expr] = {spec.name: p for spec, p in zip(model.inputs, params)}
    with builder.function("main", params):
        for region, gv in zip(regions, region_gvs):
            result = builder.emit(relax.Call(gv, [env[name] for name in region["inputs"]]))
            if len(region["outputs"]) == 1:
                env[region["outputs"][0]] = result
            else:
                for index, name in enumerate(region["outputs"]):
                    env[name] = builder.emit(relax.TupleGetItem(result, index))
        outputs = [env[o.name] for o in model.outputs]
        builder.emit_func_output(outputs[0] if len(outputs) == 1 else relax.Tuple(outputs))
    return builder.get()


def region_functions(regions) -> list[dict]:
    """The VM functions ``lower_regions`` creates for ``regions`` (plan Regions), by region."""
    functions = []
    for region in regions:
        kind = {"static": "static", "symbolic": "symbolic"}.get(region.mode, "dispatch")
        entry = {"name": region.name, "kind": kind, "region": region.name}
        if region.padding.get("used") and region.specializations:
            entry["pads"] = list(region.padding["dims"])
        functions.append(entry)
        for i, spec in enumerate(region.specializations):
            functions.append({"name": f"{region.name}__spec_{i}", "kind": "specialized",
                              "region": region.name, "dims": spec["dims"], "share": spec["share"]})
        if region.specializations:
            functions.append({"name": f"{region.name}__generic", "kind": "symbolic fallback",
                              "region": region.name})
    return functions
