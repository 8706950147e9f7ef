"""Where each variable of a Relax function is bound and used, rewriting groups of bindings, and
the small IR helpers the library offload's steps share (op handles, static shapes, constants, the
content hash that identifies a constant weight)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable

import numpy as np
import tvm
from tvm import relax



_CONV1D = tvm.ir.Op.get("relax.nn.conv1d")
_CONV2D = tvm.ir.Op.get("relax.nn.conv2d")
_BATCH_NORM = tvm.ir.Op.get("relax.nn.batch_norm")
_ADD = tvm.ir.Op.get("relax.add")
_SUBTRACT = tvm.ir.Op.get("relax.subtract")
_MULTIPLY = tvm.ir.Op.get("relax.multiply")
_DIVIDE = tvm.ir.Op.get("relax.divide")
_RELU = tvm.ir.Op.get("relax.nn.relu")
_MATMUL = tvm.ir.Op.get("relax.matmul")
_STACK = tvm.ir.Op.get("relax.stack")
_SUM = tvm.ir.Op.get("relax.sum")
_BROADCAST_TO = tvm.ir.Op.get("relax.broadcast_to")
_DROPOUT = tvm.ir.Op.get("relax.nn.dropout")
_STRIDED_SLICE = tvm.ir.Op.get("relax.strided_slice")
_SOFTMAX = tvm.ir.Op.get("relax.nn.softmax")
_LAYER_NORM = tvm.ir.Op.get("relax.nn.layer_norm")
_MEAN = tvm.ir.Op.get("relax.mean")
_VARIANCE = tvm.ir.Op.get("relax.variance")
_SQRT = tvm.ir.Op.get("relax.sqrt")
_POWER = tvm.ir.Op.get("relax.power")


# ---------------------------------------------------------------------------------------------
# Analysis: where each variable is bound and used, walking nested If branches.


@dataclass
class _Binding:
    var: relax.Var
    value: relax.Expr
    block: int


class _Analysis:
    """Bindings, use counts and direct consumers of every variable of one function."""

    def __init__(self, func: relax.Function) -> None:
        self.bindings: dict[relax.Var, _Binding] = {}
        self.uses: dict[relax.Var, int] = {}
        self.consumers: dict[relax.Var, list[relax.Var]] = {}
        self.used_outside: set[relax.Var] = set()  # used outside the block that binds them
        self._blocks = 0
        self._block = 0
        self._expr(func.body)

    def _seq(self, seq: relax.SeqExpr) -> None:
        for block in seq.blocks:
            self._blocks += 1
            for binding in block.bindings:
                self._block = self._blocks
                self.bindings[binding.var] = _Binding(binding.var, binding.value, self._blocks)
                for var in _direct_vars(binding.value):
                    self.consumers.setdefault(var, []).append(binding.var)
                self._expr(binding.value)
        self._blocks += 1
        self._block = self._blocks  # the body belongs to no block
        self._expr(seq.body)

    def _expr(self, expr: relax.Expr) -> None:
        if isinstance(expr, relax.Var):
            self.uses[expr] = self.uses.get(expr, 0) + 1
            binding = self.bindings.get(expr)
            if binding is not None and binding.block != self._block:
                self.used_outside.add(expr)
        elif isinstance(expr, relax.SeqExpr):
            self._seq(expr)
        elif isinstance(expr, relax.Call):
            for arg in expr.args:
                self._expr(arg)
        elif isinstance(expr, relax.Tuple):
            for field_ in expr.fields:
                self._expr(field_)
        elif isinstance(expr, relax.TupleGetItem):
            self._expr(expr.tuple_value)
        elif isinstance(expr, relax.If):
            self._expr(expr.cond)
            self._expr(expr.true_branch)
            self._expr(expr.false_branch)
        elif isinstance(expr, relax.Function):
            self._expr(expr.body)

    def value(self, var: relax.Expr) -> relax.Expr | None:
        binding = self.bindings.get(var) if isinstance(var, relax.Var) else None
        return binding.value if binding is not None else None

    def sole_consumer(self, var: relax.Var) -> _Binding | None:
        """The binding that is ``var``'s only use, in the same block; else None."""
        consumers = self.consumers.get(var, [])
        if self.uses.get(var, 0) != 1 or len(consumers) != 1:
            return None
        consumer = self.bindings[consumers[0]]
        home = self.bindings.get(var)  # None for a function parameter: it is in no block
        return consumer if home is not None and consumer.block == home.block else None


def _direct_vars(expr: relax.Expr) -> list[relax.Var]:
    if isinstance(expr, relax.Call):
        found = []
        for arg in expr.args:
            if isinstance(arg, relax.Var):
                found.append(arg)
            elif isinstance(arg, relax.Tuple):
                found += [f for f in arg.fields if isinstance(f, relax.Var)]
        return found
    if isinstance(expr, relax.TupleGetItem) and isinstance(expr.tuple_value, relax.Var):
        return [expr.tuple_value]
    if isinstance(expr, relax.Var):
        return [expr]
    return []


# ---------------------------------------------------------------------------------------------
# Rewriting: groups of bindings replaced by one new binding of the group's last variable.


@dataclass
class _Group:
    """Bindings ``drop`` disappear; the binding of ``tail`` gets the value ``build`` returns.

    ``build(visit, emit)`` gets the mutator's ``visit_expr``, to remap the variables it uses, and
    the block builder's ``emit``, for intermediate bindings. A group with ``alias`` set binds
    nothing: every use of ``tail`` becomes ``alias`` (a variable or a constant).
    """

    tail: relax.Var
    drop: set[relax.Var]
    build: Callable[..., relax.Expr] | None = None
    alias: relax.Expr | None = None


def _rewrite_function(func: relax.Function, find_groups, mod: tvm.IRModule) -> relax.Function:
    groups = find_groups(_Analysis(func))
    if not groups:
        return func
    tails = {g.tail: g for g in groups}
    dropped = set().union(*(g.drop for g in groups))
    constants = {g.tail: g.alias for g in groups
                 if g.alias is not None and not isinstance(g.alias, relax.Var)}

    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):
        def visit_var_(self, var: relax.Var) -> relax.Expr:
            return constants[var] if var in constants else super().visit_var_(var)

        def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:
            return constants[var] if var in constants else super().visit_dataflow_var_(var)

        def visit_var_binding_(self, binding: relax.VarBinding) -> None:
            group = tails.get(binding.var)
            if group is not None:
                if isinstance(group.alias, relax.Var):
                    self.set_var_remap(binding.var, self.visit_expr(group.alias))
                    return
                if group.alias is not None:
                    return
                value = self.builder_.normalize(group.build(self.visit_expr, self.builder_.emit))
                self.builder_.emit_normalized(relax.VarBinding(binding.var, value))
                return
            if binding.var in dropped:
                return
            super().visit_var_binding_(binding)

    return Rewriter(mod).visit_expr(func)



# ---------------------------------------------------------------------------------------------
# Small IR helpers.


def _same_shape(a: relax.Expr, b: relax.Expr) -> bool:
    sa, sb = a.ty, b.ty
    if not (isinstance(sa, relax.TensorType) and isinstance(sb, relax.TensorType)):
        return False
    if sa.shape is None or sb.shape is None or sa.dtype != sb.dtype:
        return False
    va, vb = getattr(sa.shape, "values", None), getattr(sb.shape, "values", None)
    if va is None or vb is None or len(va) != len(vb):
        return False
    return _equal_dims(va, vb)


def _equal_dims(xs, ys) -> bool:
    """Whether two lists of dims are provably equal, dim by dim (symbolic ones too)."""
    analyzer = tvm.sym.Analyzer()
    return len(xs) == len(ys) and all(analyzer.can_prove_equal(x, y) for x, y in zip(xs, ys))


def _is_call(expr: relax.Expr | None, op: tvm.ir.Op) -> bool:
    return isinstance(expr, relax.Call) and expr.op.same_as(op)



def weight_id(*arrays: np.ndarray) -> int:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return int.from_bytes(digest.digest()[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def constant_value(expr: relax.Expr) -> np.ndarray | None:
    """The value of a tensor constant (``tvm.ir.GenericConst`` holding a tensor), else None."""
    if isinstance(expr, tvm.ir.expr.GenericConst) and isinstance(expr.ty, relax.TensorType):
        value = expr.value
        if hasattr(value, "numpy"):
            return value.numpy()
    return None


def scalar_constant(expr: relax.Expr, float_only: bool = False) -> float | None:
    """The value of a one-element tensor constant (of a float dtype with ``float_only``), else
    None."""
    array = constant_value(expr)
    if array is None or array.size != 1 or (float_only and array.dtype.kind != "f"):
        return None
    return float(array.reshape(()))


def _per_channel(array: np.ndarray, channels: int, rank: int, axis: int = 1) -> np.ndarray | None:
    """``array`` as a [channels] vector if it broadcasts along ``axis`` of a rank-``rank``
    tensor, else None."""
    if array.ndim > rank:
        return None
    shape = (1,) * (rank - array.ndim) + array.shape
    if any(d != 1 for i, d in enumerate(shape) if i != axis):
        return None
    if shape[axis] not in (1, channels):
        return None
    return np.broadcast_to(array.reshape(-1), (channels,)).astype(np.float32)


def _float32(expr: relax.Expr) -> bool:
    ty = expr.ty
    return isinstance(ty, relax.TensorType) and ty.dtype == "float32"
