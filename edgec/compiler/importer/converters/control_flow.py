"""ONNX ``Loop`` and ``Scan`` lowered to Relax functions: the model stays one VM program.

In modules that run on the CPU (a converter's ``native_rows``) a loop is one step function,
``step(state..., free...) -> state'`` (the body inlined when its parameters are static), that
edgec's CPU kernel ``edgec_loop`` calls while the state's iteration count is under the limit and
its condition holds: no VM frame, bound check or branch per iteration beyond the step's own.
Elsewhere (a GPU module: the kernel reads the counter on the host) it is recursive. For a Loop
with carried values ``v`` and scan outputs ``s`` that lowering is::

    body(i, cond, v..., free...) -> (cond', v'..., s...)     # the body graph (subgraph.py)
    loop_L0(i, cond, v..., acc..., limit, free...):            # one iteration per call
        if i < limit and cond:
            cond', v', s = body(i, cond, v, free)
            return loop_L0(i + 1, cond', v', concat(acc, s[None]), limit, free)
        return (i, cond, v..., acc...)
    loop_L1(state, limit, free)     # runs loop_L0 in chunks of 64 iterations, recursively
    loop_L2(state, limit, free)     # runs loop_L1 in chunks of 4096 iterations, recursively
    caller: loop_L2((0, cond0, v0..., empty...), M, free...)

``free`` are outer values the body reads. The VM recurses on the C stack (about 2000 nested calls
overflowed an 8 MiB stack here), so the chunk levels keep the depth at 64 + 64 + trips / 4096.
Scan is the same loop with the trip count read from the scan inputs' shape, each iteration taking
slice ``i`` (or ``trips - 1 - i``) of every scan input, and outputs stacked forwards or backwards
along axis 0, then moved to their output axis. Scan-8 (batched) runs that loop per batch row.

Carried values may change shape between iterations (subgraph types are re-derived until they
are stable, see ``_converge``). Scan outputs (a Loop's too) go into a buffer with room for more
rows, written in place (edgec's CPU kernels ``edgec_rows_append`` and ``edgec_rows_take``, in
modules that run on the CPU: a converter's ``native_rows``); elsewhere they are grown by concatenation as above
(quadratic copying in the trip count). With no iteration, a scan output has the row shape
onnxruntime gives it (see ``Body.empty_rows``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

import onnx
import tvm
from tvm import relax, tirx
from tvm.relax.expr import _update_type
from tvm.tirx.analysis import undefined_vars

from edgec.compiler.ir import TRUSTED_PARAMS
from edgec.compiler.importer.converters.subgraph import (Body, BOOL_SCALAR, FreeValues,
                                                         INT64_SCALAR, Patterns, Session,
                                                         as_tensor, commit_module, convert_body,
                                                         convert_if, dims_of, dtype_of,
                                                         instantiate, is_static, scalar, shaped,
                                                         subgraph_importer)

_CHUNKS = (64, 4096)
NATIVE_LOOP = "edgec_loop"  # edgec's CPU kernel that iterates a loop's step function
_INT64_MAX = 2**63 - 1
class _ControlFlowConverter:
    """A converter of control flow: it converts the bodies with the import's converter table
    (``converters``, in which it is itself) and, with ``native_rows`` (modules that run on the
    CPU), appends scan outputs with edgec's native kernels (modules for a GPU concatenate)."""

    def __init__(self, converters: Mapping[str, Any], native_rows: bool) -> None:
        self.converters = converters
        self.native_rows = native_rows

    def session(self, opset: int, params: list) -> Session:
        return Session(opset, params[1], {"Loop": lower_loop, "Scan": lower_scan},
                       native_rows=self.native_rows, converters=self.converters)


class Loop(_ControlFlowConverter):
    """ONNX Loop (opset 1-21) over tensors, lowered as the module docstring shows."""

    def get_converter(self, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            return lower_loop(bb, inputs, attrs, self.session(opset, params), params[0])
        return convert


class Scan(_ControlFlowConverter):
    """ONNX Scan (opset 8-21; opset 8 with a static batch and no sequence_lens)."""

    def get_converter(self, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            return lower_scan(bb, inputs, attrs, self.session(opset, params), params[0])
        return convert


class LazyIf(_ControlFlowConverter):
    """A top-level ONNX ``If`` whose branches run only when taken.

    TVM's importer emits both branches' nodes before the ``relax.If`` (so both always run); the
    importer renames top-level ``If`` nodes to ``LAZY_IF`` so that they come here instead, where
    each branch is converted into its own block inside the ``relax.If``, as in loop bodies.
    """

    def get_converter(self, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            session = self.session(opset, params)
            # The outer importer is not handed to converters; one sharing its builder and its
            # name table (params[0] is that very dict) converts the branches in place.
            importer = subgraph_importer(session)
            importer.bb = bb
            importer._nodes = params[0]  # pylint: disable=protected-access
            return convert_if(importer, session, inputs[0], attrs)
        return convert


LAZY_IF = "EdgecLazyIf"


# ---------------------------------------------------------------------------------------------
# The loop functions


@dataclasses.dataclass
class _LoopSpec:
    """A loop over a state tuple; ``state[0]`` counts iterations, ``state[1]`` is the condition
    when ``has_cond``. ``loose`` slots change shape between iterations and are returned with only
    their rank known. ``step(bb, state, invariants)`` emits one iteration, returns the next state.
    """

    name: str
    state: list[relax.TensorType]
    loose: list[bool]
    invariants: list[relax.TensorType]
    has_cond: bool
    step: Callable[[relax.BlockBuilder, list[relax.Var], list[relax.Var]], list[relax.Expr]]


def _build_loop(bb: relax.BlockBuilder, session: Session, spec: _LoopSpec) -> relax.GlobalVar:
    """Add the loop's functions to ``bb``'s module; return the outermost, called as
    ``f(state..., limit, invariants...) -> (state...)``."""
    if session.native_rows:
        return _build_native_loop(bb, session, spec)
    lower = None
    for level in range(len(_CHUNKS) + 1):
        lower = _build_level(bb, session, spec, level, lower)
    return lower


def _signature(spec: _LoopSpec, with_limit: bool):
    """Fresh parameters for a loop function (state, [limit,] invariants; symbolic dims renamed)
    and its return type (loose state slots with only their rank)."""
    copies: dict[tirx.Var, tirx.Var] = {}
    state = [relax.Var(f"s{k}", instantiate(ty, copies)) for k, ty in enumerate(spec.state)]
    limit = [relax.Var("limit", INT64_SCALAR)] if with_limit else []
    invariants = [relax.Var(f"c{k}", instantiate(ty, copies))
                  for k, ty in enumerate(spec.invariants)]
    ret = relax.TupleType([relax.TensorType(ndim=var.ty.ndim, dtype=dtype_of(var.ty))
                           if loose else var.ty for var, loose in zip(state, spec.loose)])
    return state, limit, invariants, ret


def _add_function(bb: relax.BlockBuilder, fbb: relax.BlockBuilder, name: str,
                  ret: relax.TupleType, force_pure: bool = False) -> relax.GlobalVar:
    """Move the function ``fbb`` built (and what it added) into ``bb``'s module, returning
    ``ret`` (the state's declared types, not the step's narrower ones). ``force_pure``: it is
    pure though it makes an impure call."""
    module = fbb.get()
    func = module[name]
    func = relax.Function(func.params, func.body, ret, is_pure=True, attrs=func.attrs)
    if force_pure:
        func = func.with_attr("relax.force_pure", True)
    commit_module(bb, module, skip=name)
    return bb.add_func(func, name)


def _build_native_loop(bb: relax.BlockBuilder, session: Session,
                       spec: _LoopSpec) -> relax.GlobalVar:
    """The loop as one step function iterated by edgec's CPU kernel ``edgec_loop``, which the
    VM calls with itself as context so the kernel can call the step back: per iteration, only
    the step's own work (see the C++ side in ``edgec/native/runtime_kernels.cc``)."""
    step_name = session.unique_name(bb, f"{spec.name}_step")
    state, _, invariants, ret = _signature(spec, with_limit=False)
    fbb = relax.BlockBuilder()
    with fbb.function(step_name, state + invariants, private=True):
        new = spec.step(fbb, state, invariants)
        fbb.emit_func_output(fbb.emit(relax.Tuple(new)))
    step = _add_function(bb, fbb, step_name, ret)
    # edgec_loop calls the step, from outside Relax: public, so that no pass rewrites its
    # signature (fusion drops a private function's unused parameters, a Loop body's condition
    # among them). It calls it with what the step returned (transform/trusted_params.py).
    bb.update_func(step, _inline_callees(bb.get(), step).with_attr(TRUSTED_PARAMS, True))

    name = session.unique_name(bb, spec.name)
    state, limit, invariants, ret = _signature(spec, with_limit=True)
    fbb = relax.BlockBuilder()
    with fbb.function(name, state + limit + invariants, private=True):
        args = [step, limit[0], relax.prim_value(int(spec.has_cond)),
                relax.prim_value(len(state))] + state + invariants
        result = fbb.emit(relax.op.call_builtin_with_ctx(
            relax.ExternFunc(NATIVE_LOOP), relax.Tuple(args), ty_args=[ret]))
        fbb.emit_func_output(result)
    # A call with the VM as context is impure to Relax; iterating a pure step is pure.
    return _add_function(bb, fbb, name, ret, force_pure=True)


def _inline_callees(mod: tvm.IRModule, gv: relax.GlobalVar) -> relax.Function:
    """``mod[gv]``, made public, with the private functions it calls directly (the loop body)
    inlined where their parameters have static shapes: a VM function call costs about 0.3 us
    (frame, argument checks), per iteration. Other calls stay (``_static_params``)."""
    step = mod[gv]
    calls: list[relax.Call] = []
    relax.analysis.post_order_visit(step, lambda e: calls.append(e) if isinstance(
        e, relax.Call) and isinstance(e.op, relax.GlobalVar) else None)
    inline, keep = set(), set()
    for call in calls:
        if isinstance(mod[call.op.name_hint], relax.Function):
            target = inline if _static_params(mod[call.op.name_hint]) else keep
            target.add(call.op.name_hint)
    inline -= keep
    # The pass inlines every private function of the module it gets, and needs every function
    # they name: it gets the module with only the callees to inline private.
    functions = {}
    for g, func in mod.functions.items():
        if isinstance(func, relax.Function) and g.name_hint not in inline:
            func = func.with_attr("global_symbol", g.name_hint)
        functions[g] = func
    inlined = relax.transform.InlinePrivateFunctions()(tvm.IRModule(functions))
    return inlined[gv.name_hint]


def _static_params(callee: relax.Function) -> bool:
    """Whether every parameter of ``callee`` is a tensor of known, static shape: TVM's inliner
    (0.27) leaves symbolic dims of the callee undefined in the caller ('has not been
    computed'), so only such callees are inlined."""
    return all(isinstance(p.ty, relax.TensorType) and p.ty.shape is not None
               and all(is_static(d) for d in dims_of(p.ty)) for p in callee.params)


def _build_level(bb: relax.BlockBuilder, session: Session, spec: _LoopSpec, level: int,
                 lower: relax.GlobalVar | None) -> relax.GlobalVar:
    name = session.unique_name(bb, f"{spec.name}_L{level}")
    state, (limit,), invariants, ret = _signature(spec, with_limit=True)
    params = state + [limit] + invariants
    # The function calls itself: its GlobalVar needs its type before the body exists.
    gv = relax.GlobalVar(name)
    _update_type(gv, relax.FuncType([p.ty for p in params], ret))

    fbb = relax.BlockBuilder()
    with fbb.function(name, params, private=True):
        go = fbb.emit(relax.op.less(state[0], limit))
        if spec.has_cond:
            go = fbb.emit(relax.op.logical_and(go, state[1]))
        fbb._begin_binding_block()
        if lower is None:
            new = spec.step(fbb, state, invariants)
        else:
            chunk = relax.const(_CHUNKS[level - 1], "int64")
            chunk_end = fbb.emit(relax.op.minimum(limit, relax.op.add(state[0], chunk)))
            part = fbb.emit(relax.Call(lower, state + [chunk_end] + invariants))
            new = [fbb.emit(relax.TupleGetItem(part, k)) for k in range(len(state))]
        again = fbb.emit(relax.Call(gv, list(new) + [limit] + invariants))
        then = relax.SeqExpr([fbb._end_block()], again)
        result = fbb.emit(relax.If(go, then, relax.SeqExpr([], relax.Tuple(state))))
        fbb.emit_func_output(result)
    module = fbb.get()
    func = module[name]
    func = relax.Function(func.params, func.body, ret, is_pure=True, attrs=func.attrs)
    commit_module(bb, module, skip=name)
    bb.update_func(gv, func)
    return gv


def _append_native(bb: relax.BlockBuilder, acc: relax.Expr, value: relax.Expr, index: relax.Expr,
                   capacity: relax.Expr) -> relax.Expr:
    """``acc`` with ``value`` as its row ``index``, written in place while ``acc`` has room
    (``edgec_rows_append``; ``capacity``: the rows a new buffer gets, 0 to double them). The rows
    past the last iteration's are cut off after the loop (``_used_rows``)."""
    return bb.emit(relax.op.call_pure_packed("edgec_rows_append", acc, shaped(bb, value, "r"),
                                             index, capacity, ty_args=[acc.ty]))


def _used_rows(bb: relax.BlockBuilder, rows: relax.Expr, count: relax.Expr) -> relax.Expr:
    """The first ``count`` rows of a buffer ``_append_native`` filled (a view, no copy)."""
    return bb.emit(relax.op.call_pure_packed("edgec_rows_take", rows, count,
                                             ty_args=[relax.TensorType(ndim=rows.ty.ndim,
                                                                       dtype=dtype_of(rows.ty))]))


def _append(bb: relax.BlockBuilder, acc: relax.Expr, value: relax.Expr, prepend: bool,
            first: relax.Expr | None) -> relax.Expr:
    """``acc`` with ``value`` added as a new row 0 (``prepend``) or last row.

    With ``first`` (a bool scalar), the row alone when it is true: used when the rows' shape is
    not known before the loop, so the empty initial ``acc`` could not be given the right one.
    """
    row = bb.emit(relax.op.expand_dims(shaped(bb, value, "r"), 0))
    if first is not None:
        bb._begin_binding_block()
    # ``acc`` comes in with only its rank known: the cast gives it the row's dims (checked at
    # run time) and a fresh row count, so concat's result shape is known. A cast from a
    # rank-only type defines vars, so canonicalization cannot drop it.
    acc_cast = bb.match_cast(acc, relax.TensorType(
        [tirx.Var("rows", "int64")] + list(row.ty.shape.values)[1:], dtype_of(acc.ty)))
    joined = bb.emit(relax.op.concat([row, acc_cast] if prepend else [acc_cast, row], axis=0))
    if first is None:
        return joined
    otherwise = relax.SeqExpr([bb._end_block()], joined)
    return bb.emit(relax.If(first, relax.SeqExpr([], row), otherwise))


# ---------------------------------------------------------------------------------------------
# Bodies whose carried values may change shape


def _same_dim(a: tirx.PrimExpr, b: tirx.PrimExpr) -> bool:
    if is_static(a) and is_static(b):
        return int(a) == int(b)
    return a.same_as(b) or tvm.sym.Analyzer().can_prove_equal(a, b)


def _widen(pattern: relax.TensorType, param: relax.TensorType, out: relax.TensorType,
           body_vars: set[tirx.Var], widened: set[tirx.Var], trust_data: bool,
           what: str) -> relax.TensorType:
    """``pattern`` with a fresh var (added to ``widened``) for each dim the body may change; the
    same object when there is no new such dim.

    ``out`` is the body's result type before erasure, ``body_vars`` the body's parameter vars.
    A result dim not provably the input dim may change, except, with ``trust_data``, one that
    only data inside the body decides (a slice with computed bounds): that one is assumed not to.
    """
    if dtype_of(out) != dtype_of(param):
        raise ValueError(f"{what} enters the body as {dtype_of(param)} but leaves it as "
                         f"{dtype_of(out)}")
    if out.ndim != param.ndim:
        raise NotImplementedError(f"{what} changes rank inside the loop ({param.ndim} -> "
                                  f"{out.ndim})")
    dims, changed = [], False
    for k, (p_dim, b_dim, o_dim) in enumerate(zip(pattern.shape.values, param.shape.values,
                                                   dims_of(out))):
        if isinstance(p_dim, tirx.Var) and p_dim in widened:
            keep = True
        elif o_dim is None:
            keep = trust_data
        elif _same_dim(b_dim, o_dim):
            keep = True
        elif trust_data and not is_static(o_dim):
            keep = not any(var in body_vars for var in undefined_vars(o_dim))
        else:
            keep = False
        if keep:
            dims.append(p_dim)
        else:
            dims.append(tirx.Var(f"w{k}", "int64"))
            widened.add(dims[-1])
            changed = True
    return relax.TensorType(dims, dtype_of(pattern)) if changed else pattern


def _converge(bb: relax.BlockBuilder, session: Session, graph: onnx.GraphProto, name: str,
              carried: list[relax.TensorType],
              inputs_for: Callable[[list[relax.TensorType]], list[relax.TensorType]],
              param_offset: int, out_offset: int, free: FreeValues
              ) -> tuple[Body, list[relax.TensorType]]:
    """Convert a body until the carried values' types are the same going in and coming out.

    ``carried`` are the initial values' patterns; ``inputs_for(carried)`` gives all the body's
    input patterns; the carried values are inputs from ``param_offset`` and outputs from
    ``out_offset``. Each dim that may change is widened to a fresh var and the body converted
    again. Returns the body (not yet committed) and the final patterns.

    A dim only data decides is first taken to change too, which is always right, but can leave
    ops without a known result shape (a broadcasting Add of two unrelated dims does not
    legalize). Then the body is converted once more, assuming such dims do not change; the VM
    checks that on every iteration (the next call's parameter types) and stops with a shape
    error where it is wrong.
    """
    initial = carried
    for trust_data in (False, True):
        carried = initial
        widened: set[tirx.Var] = set()
        taken = set(session.names)
        for _ in range(1 + sum(ty.ndim for ty in carried)):
            body = convert_body(session, graph, session.unique_name(bb, name),
                                inputs_for(carried), free)
            body_vars = set(body.to_pattern)
            wider = [
                _widen(pattern, body.params[param_offset + k], body.inner_types[out_offset + k],
                       body_vars, widened, trust_data,
                       f"loop-carried value '{graph.input[param_offset + k].name}'")
                for k, pattern in enumerate(carried)]
            if all(new is old for new, old in zip(wider, carried)):
                break
            carried = wider
            session.names = set(taken)
        else:
            raise AssertionError("widening the carried types did not converge")
        if trust_data or not widened or _legalizes(body.module):
            return body, carried
        session.names = taken
    raise AssertionError("unreachable")


def _legalizes(module: tvm.IRModule) -> bool:
    """Whether LegalizeOps lowers every operator in ``module`` that it has a rule for (one it
    leaves behind lacks a known result shape, and the VM cannot run it)."""
    left: list[str] = []

    def visit(expr: relax.Expr) -> None:
        if (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
                and expr.op.get_attr("FLegalize") is not None):
            left.append(expr.op.name)

    for func in relax.transform.LegalizeOps()(module).functions.values():
        if isinstance(func, relax.Function):
            relax.analysis.post_order_visit(func, visit)
    return not left


def _results(bb: relax.BlockBuilder, result: relax.Expr, start: int, patterns: Patterns,
             initial: list[relax.TensorType], final: list[relax.TensorType]) -> list[relax.Expr]:
    """The loop's final carried values, with shapes: exact where the type did not change,
    else match-cast to what is known outside (static dims, dims that never change)."""
    values = []
    for k, (first, last) in enumerate(zip(initial, final)):
        value = bb.emit(relax.TupleGetItem(result, start + k))
        if last is not first:
            dims = [d if is_static(d) else patterns.outer.get(d, tirx.Var(f"v{j}", "int64"))
                    for j, d in enumerate(last.shape.values)]
            value = bb.match_cast(value, relax.TensorType(dims, dtype_of(last)))
        values.append(value)
    return values


def _stacked(bb: relax.BlockBuilder, value: relax.Expr, trips: tirx.PrimExpr,
             rows: tuple[list[int], list[bool]], dtype: str,
             outer: list[tirx.PrimExpr | None] | None = None) -> relax.Expr:
    """A stacked scan output with its shape: the exact row dims, the dims ``outer`` knows from
    outside the loop (a row shaped like a loop state), fresh vars for the others."""
    outer = outer or [None] * len(rows[0])
    dims = [trips] + [d if exact else known if known is not None else tirx.Var(f"e{j}", "int64")
                      for j, (d, exact, known) in enumerate(zip(*rows, outer))]
    return bb.match_cast(value, relax.TensorType(dims, dtype))


def _empty(rows: tuple[list[int], list[bool]], dtype: str) -> relax.Expr:
    return relax.op.zeros(relax.ShapeExpr([0] + rows[0]), dtype)


def _base_name(attrs: dict, kind: str) -> str:
    node = attrs.get("tvm_custom", {}).get("name") or ""
    return f"{kind}_{node}" if node else kind


# ---------------------------------------------------------------------------------------------
# Loop


def lower_loop(bb: relax.BlockBuilder, inputs: list, attrs: dict, session: Session,
               nodes: dict[str, relax.Expr]) -> relax.Expr:
    """Emit a Loop node into ``bb``: the final carried values, then the scan outputs.

    ``nodes`` are the values in scope by ONNX name (free values of the body come from there).
    """
    graph = attrs["body"]
    name = _base_name(attrs, "loop")
    n_carried = len(inputs) - 2
    n_scan = len(graph.output) - 1 - n_carried
    if len(graph.input) != 2 + n_carried or n_scan < 0:
        raise ValueError(f"Loop body takes {len(graph.input)} inputs and gives "
                         f"{len(graph.output)} outputs for {n_carried} carried values")
    limit = (scalar(bb, inputs[0], "int64") if inputs[0] is not None
             else relax.const(_INT64_MAX, "int64"))
    # Without a cond input the spec ignores the body's cond_out; onnxruntime and ONNX's reference
    # still stop on it. edgec follows onnxruntime, its reference for every model.
    cond0 = (scalar(bb, inputs[1], "bool") if inputs[1] is not None
             else relax.const(True, "bool"))
    carried0 = [shaped(bb, as_tensor(bb, value), "v") for value in inputs[2:]]

    patterns = Patterns()
    free = FreeValues.collect(bb, graph, nodes, patterns)
    initial = [patterns.of(value.ty, "v") for value in carried0]
    body, carried = _converge(bb, session, graph, f"{name}_body", initial,
                              lambda c: [INT64_SCALAR, BOOL_SCALAR] + c, 2, 1, free)
    body.commit(bb)

    elems = [body.empty_rows(k) for k in range(1 + n_carried, len(graph.output))]
    dtypes = [dtype_of(ty) for ty in body.out_types[1 + n_carried:]]
    native = session.native_rows
    unknown_rows = [not all(exact) and not native for _, exact in elems]

    def step(fbb: relax.BlockBuilder, state: list[relax.Var], invariants: list[relax.Var]):
        i, cond, values = state[0], state[1], state[2:2 + n_carried]
        out = fbb.emit(relax.Call(body.gv, [i, cond] + values + invariants))
        new = [fbb.emit(relax.op.add(i, relax.const(1, "int64"))),
               scalar(fbb, fbb.emit(relax.TupleGetItem(out, 0)), "bool")]
        new += [fbb.emit(relax.TupleGetItem(out, 1 + k)) for k in range(n_carried)]
        first = None
        if any(unknown_rows):
            first = fbb.emit(relax.op.equal(i, relax.const(0, "int64")))
        for j, acc in enumerate(state[2 + n_carried:]):
            row = fbb.emit(relax.TupleGetItem(out, 1 + n_carried + j))
            if native:  # the trip count is not known before the loop: buffers double
                new.append(_append_native(fbb, acc, row, i, relax.const(0, "int64")))
            else:
                new.append(_append(fbb, acc, row, False, first if unknown_rows[j] else None))
        return new

    spec = _LoopSpec(
        name=name,
        state=[INT64_SCALAR, BOOL_SCALAR] + carried
        + [relax.TensorType(ndim=len(elem[0]) + 1, dtype=dtype)
           for elem, dtype in zip(elems, dtypes)],
        loose=[False, False] + [c is not i for c, i in zip(carried, initial)] + [True] * n_scan,
        invariants=free.types, has_cond=True, step=step)
    top = _build_loop(bb, session, spec)
    state0 = ([relax.const(0, "int64"), cond0] + carried0
              + [_empty(elem, dtype) for elem, dtype in zip(elems, dtypes)])
    result = bb.emit(relax.Call(top, state0 + [limit] + free.args))

    outputs = _results(bb, result, 2, patterns, initial, carried)
    trips = tirx.Var("trips", "int64")
    for j, (elem, dtype) in enumerate(zip(elems, dtypes)):
        value = bb.emit(relax.TupleGetItem(result, 2 + n_carried + j))
        if native:
            value = _used_rows(bb, value, bb.emit(relax.TupleGetItem(result, 0)))
        outputs.append(_stacked(bb, value, trips, elem, dtype))
    return outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)


# ---------------------------------------------------------------------------------------------
# Scan


def _axis(axis: int, ndim: int, what: str) -> int:
    if not -ndim <= axis < ndim:
        raise ValueError(f"{what} axis {axis} is out of range for rank {ndim}")
    return axis % ndim


@dataclasses.dataclass
class _ScanPlan:
    """A Scan's functions, built once for given input types and callable many times."""

    top: relax.GlobalVar
    patterns: Patterns
    initial: list[relax.TensorType]
    carried: list[relax.TensorType]
    elems: list[tuple[list[int], list[bool]]]
    dtypes: list[str]
    free: FreeValues
    in_axes: list[int]
    row_outer: list[list[tirx.PrimExpr | None]]
    native: bool  # outputs appended by edgec's native kernels (``_append_native``)

    @classmethod
    def build(cls, bb: relax.BlockBuilder, session: Session, nodes: dict, attrs: dict,
              states: list[relax.Expr], xs: list[relax.Expr], in_axes: list[int],
              in_reverse: list[bool], out_reverse: list[bool]) -> "_ScanPlan":
        graph = attrs["body"]
        name = _base_name(attrs, "scan")
        n_state, n_in = len(states), len(xs)
        n_out = len(graph.output) - n_state
        if len(graph.input) != n_state + n_in or n_out < 0:
            raise ValueError(f"Scan body takes {len(graph.input)} inputs and gives "
                             f"{len(graph.output)} outputs for {n_state} states and {n_in} "
                             "scan inputs")
        patterns = Patterns()
        free = FreeValues.collect(bb, graph, nodes, patterns)
        x_types = [patterns.of(x.ty, "x") for x in xs]
        x_elems = [relax.TensorType([d for k, d in enumerate(ty.shape.values) if k != axis],
                                    dtype_of(ty)) for ty, axis in zip(x_types, in_axes)]
        initial = [patterns.of(s.ty, "v") for s in states]
        body, carried = _converge(bb, session, graph, f"{name}_body", initial,
                                  lambda c: c + x_elems, 0, 0, free)
        body.commit(bb)
        elems = [body.empty_rows(k) for k in range(n_state, len(graph.output))]
        # Row dims that are a state's or a scan input's dims (the state's shape never changes):
        # the stacked output gets the outer value's dim, so it combines with other values.
        stable = {d for ty in [c for c, i in zip(carried, initial) if c is i] + x_elems
                  for d in dims_of(ty) if isinstance(d, tirx.Var)}
        row_outer = [[patterns.outer.get(body.to_pattern.get(d)) if isinstance(d, tirx.Var)
                      and body.to_pattern.get(d) in stable else None
                      for d in dims_of(body.out_types[k])]
                     for k in range(n_state, len(graph.output))]
        dtypes = [dtype_of(ty) for ty in body.out_types[n_state:]]
        native = session.native_rows
        unknown_rows = [not all(exact) and not native for _, exact in elems]

        def step(fbb: relax.BlockBuilder, state: list[relax.Var], invariants: list[relax.Var]):
            i, trips = state[0], invariants[0]
            x_values, free_values = invariants[1:1 + n_in], invariants[1 + n_in:]
            back = None
            if any(in_reverse) or (native and any(out_reverse)):
                last = fbb.emit(relax.op.subtract(trips, relax.const(1, "int64")))
                back = fbb.emit(relax.op.subtract(last, i))
            # "clip": a scan input shorter than the first (an invalid model) reads its last
            # slice again instead of memory past its end.
            slices = [fbb.emit(relax.op.take(x, back if rev else i, axis=axis, mode="clip"))
                      for x, axis, rev in zip(x_values, in_axes, in_reverse)]
            out = fbb.emit(relax.Call(body.gv, state[1:1 + n_state] + slices + free_values))
            new = [fbb.emit(relax.op.add(i, relax.const(1, "int64")))]
            new += [fbb.emit(relax.TupleGetItem(out, k)) for k in range(n_state)]
            first = None
            if any(unknown_rows):
                first = fbb.emit(relax.op.equal(i, relax.const(0, "int64")))
            for j, acc in enumerate(state[1 + n_state:]):
                row = fbb.emit(relax.TupleGetItem(out, n_state + j))
                if native:  # rows at their final places, in one buffer of `trips` rows
                    new.append(_append_native(fbb, acc, row, back if out_reverse[j] else i, trips))
                else:
                    new.append(_append(fbb, acc, row, out_reverse[j],
                                       first if unknown_rows[j] else None))
            return new

        spec = _LoopSpec(
            name=name,
            state=[INT64_SCALAR] + carried
            + [relax.TensorType(ndim=len(elem[0]) + 1, dtype=dtype)
               for elem, dtype in zip(elems, dtypes)],
            loose=[False] + [c is not i for c, i in zip(carried, initial)] + [True] * n_out,
            invariants=[INT64_SCALAR] + x_types + free.types, has_cond=False, step=step)
        top = _build_loop(bb, session, spec)
        return cls(top, patterns, initial, carried, elems, dtypes, free, in_axes, row_outer,
                   native)

    def emit(self, bb: relax.BlockBuilder, states: list[relax.Expr], xs: list[relax.Expr]
             ) -> tuple[list[relax.Expr], list[relax.Expr]]:
        """Call the scan: its final states and its outputs stacked along axis 0."""
        trips = xs[0].ty.shape.values[self.in_axes[0]]
        trips_tensor = (relax.const(int(trips), "int64") if is_static(trips)
                        else scalar(bb, relax.ShapeExpr([trips]), "int64"))
        state0 = ([relax.const(0, "int64")] + states
                  + [_empty(elem, dtype) for elem, dtype in zip(self.elems, self.dtypes)])
        result = bb.emit(relax.Call(self.top, state0 + [trips_tensor, trips_tensor] + xs
                                    + self.free.args))
        finals = _results(bb, result, 1, self.patterns, self.initial, self.carried)
        outs = []
        for j, (elem, dtype) in enumerate(zip(self.elems, self.dtypes)):
            value = bb.emit(relax.TupleGetItem(result, 1 + len(states) + j))
            if self.native:
                value = _used_rows(bb, value, trips_tensor)
            outs.append(_stacked(bb, value, trips, elem, dtype, self.row_outer[j]))
        return finals, outs


def lower_scan(bb: relax.BlockBuilder, inputs: list, attrs: dict, session: Session,
               nodes: dict[str, relax.Expr]) -> relax.Expr:
    """Emit a Scan node into ``bb``: the final states, then the scan outputs."""
    if session.opset < 9:
        return _lower_scan8(bb, inputs, attrs, session, nodes)
    n_in = attrs["num_scan_inputs"]
    values = [shaped(bb, as_tensor(bb, value), "v") for value in inputs]
    states, xs = values[:len(values) - n_in], values[len(values) - n_in:]
    n_out = len(attrs["body"].output) - len(states)
    in_axes = [_axis(a, x.ty.ndim, "scan input")
               for a, x in zip(attrs.get("scan_input_axes", [0] * n_in), xs)]
    in_reverse = [bool(d) for d in attrs.get("scan_input_directions", [0] * n_in)]
    out_axes = list(attrs.get("scan_output_axes", [0] * n_out))
    out_reverse = [bool(d) for d in attrs.get("scan_output_directions", [0] * n_out)]
    plan = _ScanPlan.build(bb, session, nodes, attrs, states, xs, in_axes, in_reverse,
                           out_reverse)
    finals, outs = plan.emit(bb, states, xs)
    for j, axis in enumerate(out_axes):
        ndim = outs[j].ty.ndim
        axis = _axis(axis, ndim, "scan output")
        if axis:
            order = list(range(1, ndim))
            order.insert(axis, 0)
            outs[j] = bb.emit(relax.op.permute_dims(outs[j], order))
    outputs = finals + outs
    return outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)


def _lower_scan8(bb: relax.BlockBuilder, inputs: list, attrs: dict, session: Session,
                 nodes: dict[str, relax.Expr]) -> relax.Expr:
    """Scan-8: axis 0 of every input is a batch, each row scanned on its own (unrolled)."""
    if inputs[0] is not None:
        raise NotImplementedError("Scan-8 with sequence_lens is not supported; re-export the "
                                  "model with opset 9 or later")
    n_in = attrs["num_scan_inputs"]
    values = [shaped(bb, as_tensor(bb, value), "v") for value in inputs[1:]]
    states, xs = values[:len(values) - n_in], values[len(values) - n_in:]
    batch = values[0].ty.shape.values[0]
    if not is_static(batch):
        raise NotImplementedError("Scan-8 needs a static batch size; re-export the model with "
                                  "opset 9 or later")
    in_reverse = [bool(d) for d in attrs.get("directions", [0] * n_in)]
    n_out = len(attrs["body"].output) - len(states)

    def row(value: relax.Expr, b: int) -> relax.Expr:
        return bb.emit(relax.op.take(value, relax.const(b, "int64"), axis=0))

    plan = None
    per_row = []
    for b in range(int(batch)):
        states_b = [row(s, b) for s in states]
        xs_b = [row(x, b) for x in xs]
        if plan is None:
            plan = _ScanPlan.build(bb, session, nodes, attrs, states_b, xs_b, [0] * n_in,
                                   in_reverse, [False] * n_out)
        finals, outs = plan.emit(bb, states_b, xs_b)
        per_row.append(finals + outs)
    if not per_row:
        raise NotImplementedError("Scan-8 with an empty batch")
    outputs = [bb.emit(relax.op.concat([bb.emit(relax.op.expand_dims(r[k], 0))
                                        for r in per_row], axis=0))
               for k in range(len(per_row[0]))]
    return outputs[0] if len(outputs) == 1 else relax.Tuple(outputs)
