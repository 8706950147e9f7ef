"""The VM's shape functions in one order and with one set of names, so a build is reproducible.

TVM's ``VMShapeLower`` (0.27) emits the symbolic-shape computations of a function (``H[k] = ...``
into the shape heap ``H``) in the iteration order of a map keyed by variable addresses, and
lowers the module's Relax functions in the order of another such map, naming the shape functions
it makes ``shape_func``, ``shape_func1``... as it goes: the same model built twice gets the same
statements in another order and the same functions under other names, so LLVM emits other code
and the libraries' bytes (and sha256) differ. ``OrderShapeFunctions`` runs right after it:
- it sorts each run of consecutive heap stores by the slot they write, keeping every store after
  the stores of the slots it reads (each slot is written once, so those are the only orderings
  that matter);
- it merges the functions that are then equal, and names them in the order the Relax
  functions, taken by name, first call them.
"""

from __future__ import annotations

import heapq
import itertools

import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.ir import expr as ir
from tvm.relax.expr import _update_type
from tvm.relax.expr_functor import PyExprMutator, mutator

# PrimExpr fields that hold operands; anything else in a shape expression makes the run kept as is.
_OPERAND_FIELDS = ("a", "b", "value", "condition", "true_value", "false_value")


def _slot(indices) -> int | None:
    if len(indices) == 1 and isinstance(indices[0], tirx.IntImm):
        return int(indices[0].value)
    return None


def _reads(expr, heap, slots: set[int]) -> bool:
    """Adds the heap slots ``expr`` reads to ``slots``; False when ``expr`` is not understood."""
    if isinstance(expr, (tirx.IntImm, tirx.FloatImm, tirx.Var)):
        return True
    if isinstance(expr, ir.TensorLoad):  # TVM 0.27's BufferLoad
        slot = _slot(expr.indices)
        if not expr.source.same_as(heap) or slot is None:
            return False
        slots.add(slot)
        return True
    if isinstance(expr, ir.Call):
        return all(_reads(arg, heap, slots) for arg in expr.args)
    operands = [getattr(expr, name) for name in _OPERAND_FIELDS if hasattr(expr, name)]
    return bool(operands) and all(_reads(op, heap, slots) for op in operands)


def _ordered_run(stores: list[tirx.BufferStore]) -> list[tirx.BufferStore]:
    """``stores`` topologically sorted, the lowest written slot first among the ready ones;
    ``stores`` unchanged unless each is a store of one expression into a slot of one buffer."""
    if not stores:
        return stores
    heap = stores[0].buffer
    writes, reads = [], []
    for store in stores:
        slot, read = _slot(store.indices), set()
        if not store.buffer.same_as(heap) or slot is None or not _reads(store.value, heap, read):
            return stores
        writes.append(slot)
        reads.append(read)
    if len(set(writes)) != len(writes):
        return stores
    writer = {slot: index for index, slot in enumerate(writes)}
    waiting = [sum(1 for s in read if s in writer) for read in reads]
    readers: dict[int, list[int]] = {}
    for index, read in enumerate(reads):
        for slot in read:
            if slot in writer:
                readers.setdefault(writer[slot], []).append(index)
    ready = [(writes[i], i) for i, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, index = heapq.heappop(ready)
        order.append(index)
        for reader in readers.get(index, []):
            waiting[reader] -= 1
            if waiting[reader] == 0:
                heapq.heappush(ready, (writes[reader], reader))
    return stores if len(order) != len(stores) else [stores[i] for i in order]


def _ordered(stmt):
    if not isinstance(stmt, tirx.SeqStmt):
        return stmt
    result, run = [], []
    for child in stmt.seq:
        if isinstance(child, tirx.BufferStore):
            run.append(child)
            continue
        result += _ordered_run(run)
        run = []
        result.append(_ordered(child))
    result += _ordered_run(run)
    return tirx.SeqStmt(result)


def _is_shape_function(func) -> bool:
    return (isinstance(func, tirx.PrimFunc) and func.attrs is not None
            and bool(func.attrs.get("tirx.is_host_func", False)))


@mutator
class _Rename(PyExprMutator):
    def __init__(self, names: dict) -> None:
        super().__init__()
        self.names = names

    def visit_global_var_(self, op: relax.GlobalVar) -> relax.Expr:
        return self.names.get(op, op)


def _canonical(mod: tvm.IRModule) -> tuple[dict, dict]:
    """Each shape function's GlobalVar -> the GlobalVar of its canonical copy, and those copies
    -> their functions: statements ordered, equal functions merged (TVM merges the ones equal in
    its order), named by first use (Relax functions by name, each in post order; uncalled ones
    after them, by name)."""
    # Compared and kept without a global_symbol, set anew where there was one: TVM attaches it
    # after this pass, a module written in TVMScript before.
    sorted_functions = {g: f.with_body(_ordered(f.body)).without_attr("global_symbol")
                        for g, f in mod.functions.items() if _is_shape_function(f)}
    named = any("global_symbol" in f.attrs for g, f in mod.functions.items()
                if g in sorted_functions)
    uses: list = []

    def note(expr) -> None:
        if isinstance(expr, relax.Call) and expr.op in sorted_functions and expr.op not in uses:
            uses.append(expr.op)

    relax_functions = [(g.name_hint, f) for g, f in mod.functions.items()
                       if isinstance(f, relax.Function)]
    for _, func in sorted(relax_functions, key=lambda item: item[0]):
        relax.analysis.post_order_visit(func, note)
    uses += sorted((g for g in sorted_functions if g not in uses), key=lambda g: g.name_hint)
    taken = {g.name_hint for g in mod.functions if g not in sorted_functions}
    fresh = (name for name in (f"shape_func{k or ''}" for k in itertools.count())
             if name not in taken)  # a kernel may be named so too (NMS's shape_func)
    names: dict = {}
    copies: dict = {}
    for gvar in uses:
        func = sorted_functions[gvar]
        same = next((g for g, f in copies.items()
                     if tvm_ffi.structural_equal(f, func, map_free_vars=True)), None)
        if same is None:
            same = relax.GlobalVar(next(fresh))
            _update_type(same, gvar.ty)
            copies[same] = func
        names[gvar] = same
    if named:
        copies = {g: f.with_attr("global_symbol", g.name_hint) for g, f in copies.items()}
    return names, copies


@tvm.transform.module_pass(opt_level=0, name="edgec.OrderShapeFunctions")
def OrderShapeFunctions(mod: tvm.IRModule, _ctx) -> tvm.IRModule:  # noqa: N802
    """The VM's shape functions with their statements in one order, merged where equal and
    renamed in one order (see the module's docstring); to run right after
    ``relax.transform.VMShapeLower``."""
    names, copies = _canonical(mod)
    rename = _Rename(names)
    functions = dict(copies)
    for gvar, func in mod.functions.items():
        if isinstance(func, relax.Function):
            functions[gvar] = rename.visit_expr(func)
        elif gvar not in names:
            functions[gvar] = func
    return tvm.IRModule(functions, attrs=mod.attrs, global_infos=mod.global_infos)
