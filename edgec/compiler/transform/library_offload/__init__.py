"""Send a Relax program's convolutions and matmuls to a CPU library through edgec's native shims.

TVM's default CPU build applies no schedules, so its convolutions and matmuls run as naive loops
(60-80x slower than onnxruntime, TVM_NOTES.md). :func:`dispatch_to_dnnl` rewrites them, with the
ops around them that the library can fuse, into ``call_dps_packed`` calls of the functions in
``edgec/native/dnnl_shim.cc`` (oneDNN, x86) or ``edgec/native/xnnpack_shim.cc`` (XNNPACK, Arm),
as ``DispatchRules.library`` says; everything else stays with TVM. The codegen links the shim
into the model library (``edgec.compiler.native``).

The oneDNN shim's functions and their arguments (``out`` is the destination TVM allocates); the
XNNPACK shim's are ``edgec_xnn_conv2d``, ``edgec_xnn_conv2d_add`` and ``edgec_xnn_dense`` with the
same arguments, its activations NCHW or NHWC as [N, 1, H, W, C] only::

    edgec_dnnl_conv2d(x, w, b, sh, sw, pt, pl, pb, pr, dh, dw, groups, flags, wid, out)
    edgec_dnnl_conv2d_add(x, w, b, r, sh, sw, pt, pl, pb, pr, dh, dw, groups, flags, wid, out)
        out = act(conv2d(x, w) + b [+ r]); x, r, out NCHW [N, C, H, W] or blocked
        [N, C/k, H, W, k] (k = 8, 16, or C for NHWC); w OIHW, b [O]
    edgec_dnnl_dense(x[..., K], w[K, N], b[N], flags, wid, out[..., N])
        out = act(x @ w + b)

``flags``: FLAG_RELU applies relu last. ``wid`` identifies a constant weight by its content:
the shim repacks each weight once per id and layout, so ids are content hashes.

What the pass does, per Relax function (``main``, the ``spec_*`` and ``generic`` copies of shape
dispatch, ``If`` branches included):

1. Canonical forms: simple computations on constants are folded in numpy (the importer writes
   weights as ``broadcast_to``, Gemm's transposed weight, batch-norm parameters); inference batch
   norms become a multiply and an add; ``sum(stack([a, b]))`` (ONNX Sum) becomes ``a + b``;
   ``broadcast_to`` a tensor's own shape and inference dropout disappear.
2. Library calls: a conv2d with a constant weight takes the per-channel affine ops after it
   (folded into weight and bias), then a residual add and a relu; a matmul with a constant
   weight takes its bias and relu. Every conv and dense matmul goes to oneDNN: TVM's untuned
   kernels lose by 60x and more, even on a 64x64 matmul (measured). Matmuls of two computed
   tensors (attention) stay with TVM, where they cost little at the sizes seen.
3. Library layout (``DispatchRules.block``): activations stay in the library's layout between
   its calls (oneDNN: blocked NCHW{b}c; XNNPACK: NHWC), and the TVM ops between them run in that
   layout too (see :func:`_block_layout`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import tvm
from tvm import relax, tirx

FLAG_RELU = 1

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


LIBRARIES = ("dnnl", "xnn")  # the shims: edgec/native/dnnl_shim.cc, edgec/native/xnnpack_shim.cc


@dataclass(frozen=True)
class DispatchRules:
    """Which ops go to the library, and how activations are laid out between its calls.

    ``library``: ``"dnnl"`` (oneDNN, x86) or ``"xnn"`` (XNNPACK, Arm): whose shim the calls name,
    and the layout activations keep between them.
    ``dense_min_weight``: a matmul with a constant [K, N] weight goes to oneDNN when K*N is at
    least this. 0: on the 2-core machine of this project even the 64x64 matmuls of a small
    transformer ran 4x faster in oneDNN than in TVM's untuned kernel.
    ``dense_min_macs``: a matmul whose every dim is static and whose M*K*N is below this stays
    a TVM kernel: a library call costs about a microsecond however small its work (primitive
    lookup, memory objects), more than a tiny matmul takes. Measured on scan_rnn, whose Scan
    body multiplies [1, 16] by [16, 32] and [1, 32] by [32, 32] each step: 122 -> 88 us a call.
    Quantized builds set it to 0 (codegen): their int8 layers exist only as library calls.
    ``block``: activations between library convolutions stay in oneDNN's blocked layout
    NCHW{block}c (16 suits AVX-512 kernels, 8 AVX2 ones; tensors whose channels 16 does not
    divide use 8), and the TVM ops between them that can run blocked (elementwise, pooling,
    channel concat, spatial mean) do; 0 keeps every tensor NCHW.
    With ``library="xnn"`` any nonzero ``block`` means NHWC ([N, 1, H, W, C], one block of all
    channels): XNNPACK's operators take NHWC only, no blocked layouts.
    Grouped convolutions stay grouped here: whether one runs ungrouped (zero weights between
    groups) is the shim's decision on the machine that runs it (AVX2 machines lack a direct kernel
    for groups that are not whole blocks; AVX-512 ones have one).
    """

    library: str = "dnnl"
    conv2d: bool = True
    dense: bool = True
    dense_min_weight: int = 0
    dense_min_macs: int = 4096
    block: int = 16

    def __post_init__(self) -> None:
        if self.library not in LIBRARIES:
            raise ValueError(f"DispatchRules.library '{self.library}' unknown; known: "
                             f"{', '.join(LIBRARIES)}")

    def symbol(self, function: str) -> str:
        """The shim's exported name for ``function`` (``conv2d``, ``conv2d_add``, ``dense``)."""
        return f"edgec_{self.library}_{function}"

    @property
    def nhwc(self) -> bool:
        """Whether activations between library calls are NHWC rather than blocked."""
        return self.library == "xnn"


@dataclass
class DispatchStats:
    """What one run of the pass sent to the library, per shim function."""

    calls: dict[str, int] = field(default_factory=dict)

    def add(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1


def dispatch_to_dnnl(mod: tvm.IRModule, rules: DispatchRules = DispatchRules()) -> tvm.IRModule:
    """Return ``mod`` with its matching ops rewritten into calls of ``rules.library``'s shim
    (oneDNN by default).

    Every Relax function is rewritten (``main``, the ``spec_*`` and ``generic`` copies that shape
    dispatch adds, and bindings inside ``If`` branches). Simple computations on constants are
    folded first (in numpy), so weights the importer writes as computations become constants.
    The input module is not changed.
    """
    return dispatch_with_stats(mod, rules)[0]


def dispatch_with_stats(
    mod: tvm.IRModule, rules: DispatchRules = DispatchRules()
) -> tuple[tvm.IRModule, DispatchStats]:
    """:func:`dispatch_to_dnnl`, also returning how many ops went to each shim function."""
    stats = DispatchStats()
    updates = {}
    for gvar, func in mod.functions.items():
        if not isinstance(func, relax.Function):
            continue
        func = _rewrite_function(func, _canonical_groups, mod)
        func = _rewrite_function(func, lambda a: _library_groups(a, rules, stats), mod)
        if rules.block:
            func = _block_layout(func, None if rules.nhwc else rules.block, mod)
        updates[gvar] = func
    result = tvm.IRModule(dict(mod.functions), attrs=mod.attrs, global_infos=mod.global_infos)
    for gvar, func in updates.items():
        result[gvar] = func
    return result, stats


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
# Canonical forms the library patterns rely on.


def static_shape(expr: relax.Expr) -> tuple[int, ...] | None:
    """The dims of a tensor expression when all are known numbers, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None)
    if values is None or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)


def _same_shape(a: relax.Expr, b: relax.Expr) -> bool:
    sa, sb = a.ty, b.ty
    if not (isinstance(sa, relax.TensorType) and isinstance(sb, relax.TensorType)):
        return False
    if sa.shape is None or sb.shape is None or sa.dtype != sb.dtype:
        return False
    va, vb = getattr(sa.shape, "values", None), getattr(sb.shape, "values", None)
    if va is None or vb is None or len(va) != len(vb):
        return False
    analyzer = tvm.sym.Analyzer()
    return all(analyzer.can_prove_equal(x, y) for x, y in zip(va, vb))


def _is_call(expr: relax.Expr | None, op: tvm.ir.Op) -> bool:
    return isinstance(expr, relax.Call) and expr.op.same_as(op)


def _canonical_groups(analysis: _Analysis) -> list[_Group]:
    groups = []
    folded: dict[relax.Var, np.ndarray] = {}

    def lookup(expr: relax.Expr) -> np.ndarray | None:
        return folded.get(expr) if isinstance(expr, relax.Var) else _constant(expr)

    for var, binding in analysis.bindings.items():
        value = binding.value
        array = _fold(value, lookup, var)
        if array is not None:
            folded[var] = array
            groups.append(_Group(tail=var, drop=set(), alias=relax.const(array)))
            continue
        bn_group = _batch_norm_group(analysis, var, value, lookup)
        if bn_group is not None:
            groups.append(bn_group)
        elif var in analysis.used_outside:  # an alias would leave its block's scope: keep it
            pass
        elif (isinstance(value, relax.TupleGetItem) and int(value.index) == 0
                and _is_call(analysis.value(value.tuple_value), _DROPOUT)
                and analysis.sole_consumer(value.tuple_value) is not None):
            # Inference dropout is the identity; its mask output is unused.
            dropout = analysis.value(value.tuple_value)
            groups.append(_Group(tail=var, drop={value.tuple_value}, alias=dropout.args[0]))
        elif _is_call(value, _BROADCAST_TO) and _same_shape(value.args[0], var):
            groups.append(_Group(tail=var, drop=set(), alias=value.args[0]))
        if _is_call(value, _SUM) and isinstance(value.args[0], relax.Var):
            stacked = analysis.value(value.args[0])
            consumer = analysis.sole_consumer(value.args[0])
            if not (_is_call(stacked, _STACK) and consumer is not None):
                continue
            axes = value.attrs.axis
            if (stacked.attrs.axis is None or int(stacked.attrs.axis) != 0 or axes is None
                    or [int(a) for a in axes] != [0] or value.attrs.keepdims):
                continue
            items = list(stacked.args[0].fields)
            # One item (ONNX Sum of one input) is not a chain of adds: it stays as TVM has it.
            if len(items) < 2 or not all(_same_shape(item, var) for item in items):
                continue

            def build(visit, emit, items=items):
                total = visit(items[0])
                for item in items[1:-1]:
                    total = emit(relax.op.add(total, visit(item)))
                return relax.op.add(total, visit(items[-1]))

            groups.append(_Group(tail=var, drop={value.args[0]}, build=build))
    return groups


_FOLD_LIMIT = 1 << 26  # elements: larger results stay computations


def _fold(value: relax.Expr, lookup, var: relax.Var) -> np.ndarray | None:
    """Evaluate, in numpy, a call of a simple op whose tensor arguments are all constants.

    The importer writes weights as such calls (``broadcast_to`` of a scalar, Gemm's transposed
    weight, ``expand_dims`` of batch-norm parameters); TVM's FoldConstant would compile each one
    with LLVM, seconds for a model.
    """
    if not isinstance(value, relax.Call) or not isinstance(value.op, tvm.ir.Op):
        return None
    ty = var.ty
    if not isinstance(ty, relax.TensorType) or static_shape(var) is None:
        return None
    shape = static_shape(var)
    if int(np.prod(shape)) > _FOLD_LIMIT:
        return None
    arrays = []
    for arg in value.args:
        if isinstance(arg, relax.ShapeExpr):
            continue
        array = lookup(arg)
        if array is None:
            return None
        arrays.append(array)
    name = value.op.name
    attrs = value.attrs
    if name in ("relax.broadcast_to", "relax.reshape"):
        result = np.broadcast_to(arrays[0], shape) if name == "relax.broadcast_to" else arrays[0]
    elif name == "relax.expand_dims":
        rank = arrays[0].ndim + len(attrs.axis)
        result = np.expand_dims(arrays[0], tuple(int(a) % rank for a in attrs.axis))
    elif name == "relax.permute_dims":
        axes = None if attrs.axes is None else [int(a) for a in attrs.axes]
        result = np.transpose(arrays[0], axes)
    elif name == "relax.squeeze":
        result = arrays[0]
    elif str(ty.dtype).startswith("float") and name in _NUMPY_BINARY and len(arrays) == 2:
        result = _NUMPY_BINARY[name](arrays[0].astype(np.float64), arrays[1].astype(np.float64))
    elif str(ty.dtype).startswith("float") and name in _NUMPY_UNARY and len(arrays) == 1:
        result = _NUMPY_UNARY[name](arrays[0].astype(np.float64))
    else:  # integer arithmetic keeps TVM's semantics: TVM folds it later
        return None
    result = np.asarray(result)
    if result.size != int(np.prod(shape)):
        return None
    # np.require, not np.ascontiguousarray, which makes a 0-d result 1-d.
    return np.require(result.reshape(shape).astype(str(ty.dtype)), requirements="C")


_NUMPY_BINARY = {"relax.add": np.add, "relax.subtract": np.subtract,
                 "relax.multiply": np.multiply, "relax.divide": np.divide}
_NUMPY_UNARY = {"relax.sqrt": np.sqrt, "relax.negative": np.negative}


def _batch_norm_group(analysis: _Analysis, var: relax.Var, value: relax.Expr,
                      lookup) -> _Group | None:
    """An inference batch norm with constant parameters as ``x * scale + shift``.

    ``var`` binds the batch norm's tuple; the group replaces the binding of its element 0 (the
    other elements must be unused).
    """
    if not _is_call(value, _BATCH_NORM) or value.attrs.training:
        return None
    params = [lookup(arg) for arg in value.args[1:5]]
    x = value.args[0]
    if any(p is None for p in params) or not _float32(x) or x.ty.ndim is None or x.ty.ndim < 2:
        return None
    getters = [analysis.bindings[c] for c in analysis.consumers.get(var, [])]
    if analysis.uses.get(var, 0) != len(getters) or not all(
            isinstance(g.value, relax.TupleGetItem) for g in getters):
        return None
    first = [g for g in getters if int(g.value.index) == 0]
    rest = [g for g in getters if int(g.value.index) != 0]
    if len(first) != 1 or any(analysis.uses.get(g.var, 0) for g in rest):
        return None
    attrs = value.attrs
    gamma, beta, mean, variance = (p.astype(np.float64).reshape(-1) for p in params)
    if not attrs.scale:
        gamma = np.ones_like(gamma)
    if not attrs.center:
        beta = np.zeros_like(beta)
    factor = gamma / np.sqrt(variance + float(attrs.epsilon))
    rank = x.ty.ndim
    axis = int(attrs.axis) % rank
    shape = [1] * rank
    shape[axis] = factor.size
    scale = factor.reshape(shape).astype(np.float32)
    shift = (beta - mean * factor).reshape(shape).astype(np.float32)

    def build(visit, emit):
        return relax.op.add(emit(relax.op.multiply(visit(x), relax.const(scale))),
                            relax.const(shift))

    return _Group(tail=first[0].var, drop={var} | {g.var for g in rest}, build=build)


# ---------------------------------------------------------------------------------------------
# Library patterns.


def _weight_id(*arrays: np.ndarray) -> int:
    digest = hashlib.sha256()
    for array in arrays:
        digest.update(str(array.shape).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return int.from_bytes(digest.digest()[:8], "little") & 0x7FFF_FFFF_FFFF_FFFF


def _constant(expr: relax.Expr) -> np.ndarray | None:
    """The value of a tensor constant (``tvm.ir.GenericConst`` holding a tensor), else None."""
    if isinstance(expr, tvm.ir.expr.GenericConst) and isinstance(expr.ty, relax.TensorType):
        value = expr.value
        if hasattr(value, "numpy"):
            return value.numpy()
    return None


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


@dataclass
class _Epilogue:
    """What follows a conv or matmul and fuses into its call."""

    tail: relax.Var
    drop: set[relax.Var]
    scale: np.ndarray
    shift: np.ndarray
    residual: relax.Expr | None = None
    relu: bool = False


def _epilogue(analysis: _Analysis, head: relax.Var, channels: int, rank: int, axis: int,
              residual: bool, taken: set[relax.Var]) -> _Epilogue:
    """Follow ``head``'s chain of sole consumers: per-channel affine ops, residual add, relu.

    ``axis`` is the channel axis of the rank-``rank`` output; bindings in ``taken`` belong to
    another group and end the chain.
    """
    ep = _Epilogue(head, {head}, np.ones(channels, np.float32), np.zeros(channels, np.float32))
    affine = True
    while True:
        consumer = analysis.sole_consumer(ep.tail)
        if consumer is None or consumer.var in taken:
            return ep
        value, var = consumer.value, consumer.var
        if _is_call(value, _RELU):
            ep.relu = True
            ep.tail = var
            ep.drop.add(var)
            return ep
        if any(_is_call(value, op) for op in (_ADD, _SUBTRACT, _MULTIPLY, _DIVIDE)):
            first = value.args[0].same_as(ep.tail)
            other = value.args[1] if first else value.args[0]
            constant = _constant(other)
            if constant is not None:
                vector = _per_channel(constant, channels, rank, axis)
                if vector is None or not affine:
                    return ep
                if _is_call(value, _ADD):
                    ep.shift = ep.shift + vector
                elif _is_call(value, _SUBTRACT):
                    if not first:  # c - x: not an affine map of x with scale 1
                        return ep
                    ep.shift = ep.shift - vector
                elif _is_call(value, _MULTIPLY):
                    ep.scale, ep.shift = ep.scale * vector, ep.shift * vector
                else:
                    if not first or np.any(vector == 0):
                        return ep
                    ep.scale, ep.shift = ep.scale / vector, ep.shift / vector
            elif (_is_call(value, _ADD) and residual and ep.residual is None
                  and _same_shape(other, var) and _same_shape(ep.tail, var) and _float32(other)):
                ep.residual = other
                affine = False
            else:
                return ep
            ep.tail = var
            ep.drop.add(var)
            continue
        return ep


def _conv_group(analysis: _Analysis, binding: _Binding, rules: DispatchRules,
                taken: set[relax.Var], stats: DispatchStats) -> _Group | None:
    call = binding.value
    attrs = call.attrs
    data, weight = call.args
    w = _constant(weight)
    if (w is None or w.dtype != np.float32 or w.ndim != 4 or not _float32(data)
            or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW"
            or attrs.out_layout != "NCHW" or attrs.out_dtype not in (None, "", "float32")
            or data.ty.ndim != 4):
        return None
    out_channels = w.shape[0]
    ep = _epilogue(analysis, binding.var, out_channels, 4, 1, residual=True, taken=taken)
    weight_folded = (w * ep.scale.reshape(-1, 1, 1, 1)).astype(np.float32)
    bias = ep.shift.astype(np.float32)
    groups = int(attrs.groups)
    weight_id = _weight_id(weight_folded)
    ints = [*attrs.strides, *attrs.padding, *attrs.dilation, groups,
            FLAG_RELU if ep.relu else 0, weight_id]
    name = rules.symbol("conv2d_add" if ep.residual is not None else "conv2d")
    out_ty = ep.tail.ty
    stats.add(name)

    def build(visit, emit, residual=ep.residual):
        args = [visit(data), relax.const(weight_folded), relax.const(bias)]
        if residual is not None:
            args.append(visit(residual))
        args += [relax.prim_value(int(v)) for v in ints]
        return relax.call_dps_packed(name, args, out_ty)

    return _Group(tail=ep.tail, drop=ep.drop, build=build)


def _dense_group(analysis: _Analysis, binding: _Binding, rules: DispatchRules,
                 taken: set[relax.Var], stats: DispatchStats) -> _Group | None:
    call = binding.value
    data, weight = call.args
    w = _constant(weight)
    if (w is None or w.dtype != np.float32 or w.ndim != 2 or not _float32(data)
            or data.ty.ndim < 1 or call.attrs.out_dtype not in (None, "", "float32")):
        return None
    if w.shape[0] * w.shape[1] < rules.dense_min_weight:
        return None
    rows = static_shape(data)
    if rows is not None and int(np.prod(rows)) * w.shape[1] < rules.dense_min_macs:
        return None
    rank = binding.var.ty.ndim
    n = w.shape[1]
    ep = _epilogue(analysis, binding.var, n, rank, rank - 1, residual=False, taken=taken)
    weight_folded = (w * ep.scale.reshape(1, -1)).astype(np.float32)
    bias = ep.shift.astype(np.float32)
    flags = FLAG_RELU if ep.relu else 0
    weight_id = _weight_id(weight_folded)
    out_ty = ep.tail.ty
    name = rules.symbol("dense")
    stats.add(name)

    def build(visit, emit):
        args = [visit(data), relax.const(weight_folded), relax.const(bias),
                relax.prim_value(flags), relax.prim_value(weight_id)]
        return relax.call_dps_packed(name, args, out_ty)

    return _Group(tail=ep.tail, drop=ep.drop, build=build)


def _library_groups(analysis: _Analysis, rules: DispatchRules,
                    stats: DispatchStats) -> list[_Group]:
    groups: list[_Group] = []
    taken: set[relax.Var] = set()
    for var, binding in analysis.bindings.items():
        if var in taken:
            continue
        group = None
        if rules.conv2d and _is_call(binding.value, _CONV2D):
            group = _conv_group(analysis, binding, rules, taken, stats)
        elif rules.dense and _is_call(binding.value, _MATMUL):
            group = _dense_group(analysis, binding, rules, taken, stats)
        if group is not None:
            groups.append(group)
            taken |= group.drop
    return groups


# ---------------------------------------------------------------------------------------------
# Blocked layout: keep activations in NCHW{b}c between library convolutions.

_CONV_FUNCTIONS = tuple(DispatchRules(library=lib).symbol(f)
                        for lib in LIBRARIES for f in ("conv2d", "conv2d_add"))
_CALL_DPS_PACKED = tvm.ir.Op.get("relax.call_dps_packed")
_UNARY = tuple(tvm.ir.Op.get(f"relax.{name}") for name in (
    "nn.relu", "sigmoid", "tanh", "clip", "nn.silu", "nn.gelu", "nn.gelu_tanh", "exp", "sqrt",
    "negative", "abs",
))
_BINARY = tuple(tvm.ir.Op.get(f"relax.{name}") for name in (
    "add", "subtract", "multiply", "divide", "maximum", "minimum",
))
_POOLS = (tvm.ir.Op.get("relax.nn.max_pool2d"), tvm.ir.Op.get("relax.nn.avg_pool2d"))
_MEAN = tvm.ir.Op.get("relax.mean")
_CONCAT = tvm.ir.Op.get("relax.concat")


def _channels(expr: relax.Expr) -> int | None:
    """The static channel count of a rank-4 float32 tensor, else None."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.ndim != 4 or ty.dtype != "float32":
        return None
    values = getattr(ty.shape, "values", None) if ty.shape is not None else None
    if values is None or not isinstance(values[1], tirx.IntImm):
        return None
    return int(values[1])


def _block_of(channels: int | None, preferred: int | None) -> int | None:
    """The channel block for a tensor: ``preferred`` if it divides the channels, else all of them
    (``preferred`` None: always all of them).

    A block of all channels, [N, 1, H, W, C], is NHWC: XNNPACK's layout, and oneDNN's for grouped
    and depthwise convolutions and for channel counts its blocked kernels do not take.
    """
    if channels is None:
        return None
    return preferred if preferred is not None and channels % preferred == 0 else channels


def _to_blocked(x: relax.Expr, block: int) -> relax.Expr:
    return relax.op.layout_transform(
        x, index_map=lambda n, c, h, w: (n, c // block, h, w, c % block))


def _to_plain(x: relax.Expr, block: int) -> relax.Expr:
    return relax.op.layout_transform(x, index_map=lambda n, cb, h, w, c: (n, cb * block + c, h, w))


def _reblock(x: relax.Expr, old: int, new: int) -> relax.Expr:
    return relax.op.layout_transform(
        x, index_map=lambda n, cb, h, w, c: (n, (cb * old + c) // new, h, w, (cb * old + c) % new))


def _blocked_type(ty: relax.TensorType, block: int) -> relax.TensorType:
    n, c, h, w = ty.shape.values
    return relax.TensorType([n, int(c) // block, h, w, block], ty.dtype)


def _blocked_constant(array: np.ndarray, channels: int, block: int) -> np.ndarray | None:
    """A constant operand of a rank-4 op, rewritten for the blocked layout, else None."""
    if array.size == 1:
        return array.reshape(()) if array.ndim else array
    vector = _per_channel(array, channels, 4, 1)
    if vector is None:
        return None
    return vector.reshape(1, channels // block, 1, 1, block)


_RESHAPE = tvm.ir.Op.get("relax.reshape")
_PERMUTE_DIMS = tvm.ir.Op.get("relax.permute_dims")
_SHUFFLE_LIMIT = 1 << 22  # elements simulated to recognize a shuffle


def _batch_dim(expr: relax.Expr) -> tirx.Var | None:
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = getattr(ty.shape, "values", None) or []
    return values[0] if values and isinstance(values[0], tirx.Var) else None


def _shape_with_batch(expr: relax.Expr, batch: tirx.Var | None) -> tuple[int, ...] | None:
    """``expr``'s static shape, with a leading symbolic ``batch`` dim taken as 1."""
    ty = expr.ty
    if not isinstance(ty, relax.TensorType) or ty.shape is None:
        return None
    values = list(getattr(ty.shape, "values", None) or [])
    if values and batch is not None and values[0].same_as(batch):
        values[0] = tirx.IntImm("int64", 1)
    if not values or not all(isinstance(v, tirx.IntImm) for v in values):
        return None
    return tuple(int(v) for v in values)


def _channel_shuffles(analysis: _Analysis) -> dict[relax.Var, tuple]:
    """``reshape -> permute_dims -> reshape`` chains that only permute channels (ShuffleNet).

    Maps the last variable of each to (its NCHW input, the two intermediate variables, the
    channel permutation as int64 indices). The chain is simulated on an index tensor of the
    input's static shape, so only true channel permutations match.
    """
    found = {}
    for var, binding in analysis.bindings.items():
        last = binding.value
        if not _is_call(last, _RESHAPE) or not isinstance(last.args[0], relax.Var):
            continue
        middle_var = last.args[0]
        middle = analysis.value(middle_var)
        if not _is_call(middle, _PERMUTE_DIMS) or not isinstance(middle.args[0], relax.Var):
            continue
        first_var = middle.args[0]
        first = analysis.value(first_var)
        if not _is_call(first, _RESHAPE) or analysis.sole_consumer(first_var) is None:
            continue
        if analysis.sole_consumer(middle_var) is None or first_var in analysis.used_outside:
            continue
        source = first.args[0]
        batch = _batch_dim(source)
        shape = _shape_with_batch(source, batch) if _channels(source) is not None else None
        inner = _shape_with_batch(first_var, batch)
        if shape is None or inner is None or _shape_with_batch(var, batch) != shape:
            continue
        if int(np.prod(shape)) > _SHUFFLE_LIMIT or middle.attrs.axes is None:
            continue
        index = np.arange(int(np.prod(shape))).reshape(shape)
        moved = index.reshape(inner).transpose([int(a) for a in middle.attrs.axes]).reshape(shape)
        n, c, h, w = np.unravel_index(moved, shape)
        grid = np.indices(shape)
        if not ((n == grid[0]).all() and (h == grid[2]).all() and (w == grid[3]).all()):
            continue
        permutation = c[0, :, 0, 0]
        if not (c == permutation.reshape(1, -1, 1, 1)).all():
            continue
        found[var] = (source, (first_var, middle_var), permutation.astype(np.int64))
    return found


def _block_layout(func: relax.Function, preferred: int | None,
                  mod: tvm.IRModule) -> relax.Function:
    """Rewrite ``func`` so tensors flow between library convolutions in a blocked layout.

    A library convolution writes NCHW{b}c, with b ``preferred`` where it divides the output
    channels, else all channels (NHWC as [N, 1, H, W, C]; ``preferred`` None: always NHWC,
    XNNPACK's layout). Ops that can run on blocked tensors of one block
    (elementwise with per-channel or scalar constants, 2-D pooling, channel concat, spatial mean)
    then run blocked in TVM. Any other use of a blocked tensor gets a ``layout_transform`` back
    to NCHW before its first such use, or right after its binding when it is used outside its
    block, so the NCHW variable keeps its name and scope.
    """
    analysis = _Analysis(func)
    shuffles = _channel_shuffles(analysis)
    shuffle_steps = {v for _, steps, _ in shuffles.values() for v in steps}

    @relax.expr_functor.mutator
    class Blocker(relax.PyExprMutator):
        def __init__(self, mod: tvm.IRModule) -> None:
            super().__init__(mod)
            self.blocked: dict[relax.Var, tuple[relax.Var, int]] = {}
            self.plain: dict[relax.Var, relax.Var] = {}
            self.deferred: dict[relax.Var, relax.VarBinding] = {}

        def _plain(self, var: relax.Var) -> relax.Var:
            if var not in self.plain:
                blocked, block = self.blocked[var]
                self.plain[var] = self.builder_.emit(_to_plain(blocked, block), f"{var.name}_nchw")
            return self.plain[var]

        def visit_var_(self, var: relax.Var) -> relax.Expr:
            return self._plain(var) if var in self.blocked else super().visit_var_(var)

        def visit_dataflow_var_(self, var: relax.Var) -> relax.Expr:
            return self._plain(var) if var in self.blocked else super().visit_dataflow_var_(var)

        def _block(self, expr: relax.Expr) -> int | None:
            if isinstance(expr, relax.Var) and expr in self.blocked:
                return self.blocked[expr][1]
            return None

        def _blocked_arg(self, expr: relax.Expr, block: int) -> relax.Expr:
            """``expr`` in NCHW{block}c, converted from NCHW or another block if need be."""
            current = self._block(expr)
            if current == block:
                return self.blocked[expr][0]
            if current is not None:
                return _reblock(self.blocked[expr][0], current, block)
            return _to_blocked(self.visit_expr(expr), block)

        def visit_var_binding_(self, binding: relax.VarBinding) -> None:
            var = binding.var
            if var in shuffle_steps:  # decided at the shuffle's last step
                self.deferred[var] = binding
                return
            if var in shuffles:
                source, steps, permutation = shuffles[var]
                if self._block(source) is None:  # an NCHW input: the shuffle stays as written
                    for step in steps:
                        super().visit_var_binding_(self.deferred.pop(step))
                    super().visit_var_binding_(binding)
                    return
                channels = _channels(source)
                nhwc = self._blocked_arg(source, channels)
                value = relax.op.take(nhwc, relax.const(permutation), axis=4)
                self.blocked[var] = (self.builder_.emit(value, f"{var.name}_nhwc"), channels)
                if var in analysis.used_outside:
                    plain = self.builder_.normalize(_to_plain(self.blocked[var][0], channels))
                    self.builder_.emit_normalized(relax.VarBinding(var, plain))
                    self.plain[var] = var
                return
            preferred_block = _block_of(_channels(var), preferred)
            found = (self._blocked_value(var, binding.value, preferred_block)
                     if preferred_block else None)
            if found is None:
                super().visit_var_binding_(binding)
                return
            value, block = found
            self.blocked[var] = (self.builder_.emit(value, f"{var.name}_nc{block}c"), block)
            if var in analysis.used_outside:
                plain = self.builder_.normalize(_to_plain(self.blocked[var][0], block))
                self.builder_.emit_normalized(relax.VarBinding(var, plain))
                self.plain[var] = var

        def _blocked_value(self, var: relax.Var, value: relax.Expr,
                           preferred_block: int) -> tuple[relax.Expr, int] | None:
            """``value`` computed in a blocked layout, and its block; None to keep it NCHW.

            Ops other than convolutions go blocked only when an input already is: converting
            their NCHW inputs would add copies, not remove them.
            """
            if not isinstance(value, relax.Call):
                return None
            op, args = value.op, value.args
            if op.same_as(_CALL_DPS_PACKED):
                return self._conv(var, value, preferred_block)
            blocks = [self._block(arg) for arg in args]
            block = next((b for b in blocks if b is not None), None)
            if block is None and op.same_as(_CONCAT) and isinstance(args[0], relax.Tuple):
                blocks = [self._block(f) for f in args[0].fields]
                block = next((b for b in blocks if b is not None), None)
            if block is None:
                return None
            if op.same_as(_CONCAT):
                return self._concat(var, value)
            first = self.blocked[args[0]][0] if blocks[0] == block else None
            if any(op.same_as(unary) for unary in _UNARY) and first is not None:
                return relax.Call(op, [first, *args[1:]], value.attrs), block
            if any(op.same_as(binary) for binary in _BINARY):
                new_args = []
                for arg in args:
                    constant = _constant(arg)
                    if constant is not None:
                        folded = _blocked_constant(constant, _channels(var), block)
                        if folded is None:
                            return None
                        new_args.append(relax.const(folded.astype(constant.dtype)))
                    elif _same_shape(arg, var):
                        new_args.append(self._blocked_arg(arg, block))
                    else:
                        return None
                return relax.Call(op, new_args, value.attrs), block
            if any(op.same_as(pool) for pool in _POOLS) and first is not None:
                attrs = value.attrs
                if attrs.layout != "NCHW" or attrs.out_layout != "NCHW":
                    return None
                make = relax.op.nn.max_pool2d if op.same_as(_POOLS[0]) else relax.op.nn.avg_pool2d
                return make(first, attrs.pool_size, attrs.strides, attrs.padding, attrs.dilation,
                            attrs.ceil_mode, attrs.count_include_pad, f"NCHW{block}c",
                            f"NCHW{block}c"), block
            if op.same_as(_MEAN) and first is not None:
                axes = sorted(int(a) % 4 for a in value.attrs.axis) if value.attrs.axis else []
                if axes != [2, 3] or not value.attrs.keepdims:
                    return None
                return relax.op.mean(first, axis=[2, 3], keepdims=True), block
            return None

        def _concat(self, var: relax.Var, value: relax.Call) -> tuple[relax.Expr, int] | None:
            """A channel concat: along the block axis when every input divides into the output's
            blocks, else in NHWC ([N, 1, H, W, C]) along the channel axis."""
            fields = list(value.args[0].fields)
            if value.attrs.axis is None or int(value.attrs.axis) % 4 != 1:
                return None
            channels = [_channels(f) for f in fields]
            if any(c is None for c in channels):
                return None
            block = _block_of(_channels(var), preferred)
            if block != _channels(var) and all(c % block == 0 for c in channels):
                return relax.op.concat([self._blocked_arg(f, block) for f in fields], axis=1), block
            nhwc = [self._blocked_arg(f, c) for f, c in zip(fields, channels)]
            return relax.op.concat(nhwc, axis=4), _channels(var)

        def _conv(self, var: relax.Var, value: relax.Call,
                  block: int) -> tuple[relax.Expr, int] | None:
            func, args = value.args
            if not (isinstance(func, relax.ExternFunc) and func.global_symbol in _CONV_FUNCTIONS):
                return None
            residual = str(func.global_symbol).endswith("_conv2d_add")
            nhwc_only = str(func.global_symbol).startswith("edgec_xnn_")
            fields = list(args.fields)
            weight = _constant(fields[1])
            groups = int(fields[12 if residual else 11].value)
            if (weight is not None and groups > 1 and weight.shape[1] > 1
                    and (weight.shape[1] % block or weight.shape[0] // groups % block)):
                # oneDNN's blocked kernels take groups of whole blocks; the others run NHWC.
                block = _channels(var)
            new_args = []
            for index, arg in enumerate(fields):
                if (index == 0 and self._block(arg) is not None and nhwc_only
                        and self._block(arg) != _channels(arg)):  # XNNPACK reads NHWC only
                    new_args.append(self._blocked_arg(arg, _channels(arg)))
                elif index == 0 and self._block(arg) is not None:  # oneDNN reads any block
                    new_args.append(self.blocked[arg][0])
                elif index == 3 and residual:  # the residual takes the output's layout
                    new_args.append(self._blocked_arg(arg, block))
                else:  # weights, attributes, and an NCHW input (the image) the shim reorders
                    new_args.append(self.visit_expr(arg))
            out_ty = _blocked_type(var.ty, block)
            return relax.call_dps_packed(func.global_symbol, new_args, out_ty), block

    return Blocker(mod).visit_expr(func)
