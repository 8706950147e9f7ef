"""Library patterns: convolutions and matmuls with constant weights, with the per-channel affine
ops, residual add and activation after them; attention's batched matmuls, softmax, layer norm and
standardization (instance and group norm, layer norm written out in elementwise ops);
rewritten into ``call_dps_packed`` calls of the shim that ``DispatchRules.library`` names."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tvm
from tvm import relax

from edgec.compiler.ir import static_shape
from edgec.compiler.transform.library_offload.analysis import (
    _ADD, _Analysis, _Binding, _CONV1D, _CONV2D, _DIVIDE, _equal_dims, _float32, _Group, _is_call,
    _LAYER_NORM, _MATMUL, _MEAN, _MULTIPLY, _per_channel, _POWER, _same_shape, _SOFTMAX, _SQRT,
    _SUBTRACT, _VARIANCE, constant_value, scalar_constant, weight_id)
from edgec.compiler.transform.library_offload.activation import find_activation
from edgec.compiler.transform.library_offload.rules import (DispatchRules, DispatchStats,
                                                             activation_flags)


@dataclass
class _Epilogue:
    """What follows a conv or matmul and fuses into its call."""

    tail: relax.Var
    drop: set[relax.Var]
    scale: np.ndarray
    shift: np.ndarray
    residual: relax.Expr | None = None
    activation: str | None = None  # rules.activation_flags's name
    upper: float = 0.0  # clip's

    @property
    def flags(self) -> int:
        return activation_flags(self.activation, self.upper)


def _epilogue(analysis: _Analysis, head: relax.Var, channels: int, rank: int, axis: int,
              residual: bool, taken: set[relax.Var], rules: DispatchRules) -> _Epilogue:
    """Follow ``head``'s chain of sole consumers: per-channel affine ops and a residual add, then
    an activation of ``rules.activations`` (``activation.find_activation``).

    ``axis`` is the channel axis of the rank-``rank`` output; bindings in ``taken`` belong to
    another group and end the chain.
    """
    ep = _Epilogue(head, {head}, np.ones(channels, np.float32), np.zeros(channels, np.float32))
    while True:
        consumer = analysis.sole_consumer(ep.tail)
        if (consumer is None or consumer.var in taken
                or not _absorb(ep, consumer, channels, rank, axis, residual)):
            break
        ep.tail = consumer.var
        ep.drop.add(consumer.var)
    found = find_activation(analysis, ep.tail, taken, rules.activations,
                            may_prescale=ep.residual is None)
    if found is not None:
        ep.activation, ep.upper = found.name, found.upper
        ep.scale, ep.shift = ep.scale * found.prescale, ep.shift * found.prescale
        ep.tail = found.tail
        ep.drop |= found.drop
    return ep


def _absorb(ep: _Epilogue, consumer: _Binding, channels: int, rank: int, axis: int,
            residual: bool) -> bool:
    """Fold ``consumer``, a per-channel affine op of ``ep.tail`` or (``residual``) the add of a
    residual, into ``ep``; False if it is neither."""
    value, var = consumer.value, consumer.var
    if not any(_is_call(value, op) for op in (_ADD, _SUBTRACT, _MULTIPLY, _DIVIDE)):
        return False
    first = value.args[0].same_as(ep.tail)
    other = value.args[1] if first else value.args[0]
    constant = constant_value(other)
    if constant is not None:
        vector = _per_channel(constant, channels, rank, axis)
        if vector is None or ep.residual is not None:  # after the residual: not affine of acc
            return False
        if _is_call(value, _ADD):
            ep.shift = ep.shift + vector
        elif _is_call(value, _SUBTRACT):
            if not first:  # c - x: not an affine map of x with scale 1
                return False
            ep.shift = ep.shift - vector
        elif _is_call(value, _MULTIPLY):
            ep.scale, ep.shift = ep.scale * vector, ep.shift * vector
        else:
            if not first or np.any(vector == 0):
                return False
            ep.scale, ep.shift = ep.scale / vector, ep.shift / vector
        return True
    if (_is_call(value, _ADD) and residual and ep.residual is None
            and _same_shape(other, var) and _same_shape(ep.tail, var) and _float32(other)):
        ep.residual = other
        return True
    return False


def _conv_group(analysis: _Analysis, binding: _Binding, rules: DispatchRules,
                taken: set[relax.Var], stats: DispatchStats) -> _Group | None:
    """A 2-D convolution, or a 1-D one (NCW) run as 2-D over [N, C, 1, W], with its epilogue."""
    call = binding.value
    attrs = call.attrs
    data, weight = call.args
    w = constant_value(weight)
    one_d = _is_call(call, _CONV1D)
    rank = 3 if one_d else 4
    layouts = ("NCW", "OIW", "NCW") if one_d else ("NCHW", "OIHW", "NCHW")
    if (w is None or w.dtype != np.float32 or w.ndim != rank or not _float32(data)
            or (attrs.data_layout, attrs.kernel_layout, attrs.out_layout) != layouts
            or attrs.out_dtype not in (None, "", "float32") or data.ty.ndim != rank):
        return None
    out_channels = w.shape[0]
    ep = _epilogue(analysis, binding.var, out_channels, rank, 1, residual=True, taken=taken,
                   rules=rules)
    weight_folded = (w * ep.scale.reshape((-1,) + (1,) * (rank - 1))).astype(np.float32)
    bias = ep.shift.astype(np.float32)
    strides, padding, dilation = ([int(v) for v in a] for a in (attrs.strides, attrs.padding,
                                                                 attrs.dilation))
    if one_d:  # H of extent 1: stride and dilation 1, no padding
        weight_folded = weight_folded[:, :, None, :]
        strides, dilation = [1, *strides], [1, *dilation]
        padding = [0, padding[0], 0, padding[1]]
    groups = int(attrs.groups)
    wid = weight_id(weight_folded)
    ints = [*strides, *padding, *dilation, groups, ep.flags, wid]
    name = rules.symbol("conv2d_add" if ep.residual is not None else "conv2d")
    out_ty = ep.tail.ty
    if one_d:
        n, c, width = out_ty.shape.values
        out_ty = relax.TensorType([n, c, 1, width], "float32")
    stats.add(name)

    def build(visit, emit, residual=ep.residual):
        def operand(x):
            return emit(relax.op.expand_dims(visit(x), [2])) if one_d else visit(x)

        args = [operand(data), relax.const(weight_folded), relax.const(bias)]
        if residual is not None:
            args.append(operand(residual))
        args += [relax.prim_value(int(v)) for v in ints]
        out = relax.call_dps_packed(name, args, out_ty)
        return relax.op.squeeze(emit(out), [2]) if one_d else out

    return _Group(tail=ep.tail, drop=ep.drop, build=build)


def _dense_group(analysis: _Analysis, binding: _Binding, rules: DispatchRules,
                 taken: set[relax.Var], stats: DispatchStats) -> _Group | None:
    call = binding.value
    data, weight = call.args
    w = constant_value(weight)
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
    ep = _epilogue(analysis, binding.var, n, rank, rank - 1, residual=False, taken=taken,
                   rules=rules)
    weight_folded = (w * ep.scale.reshape(1, -1)).astype(np.float32)
    bias = ep.shift.astype(np.float32)
    flags = ep.flags
    wid = weight_id(weight_folded)
    out_ty = ep.tail.ty
    name = rules.symbol("dense")
    stats.add(name)

    def build(visit, emit):
        args = [visit(data), relax.const(weight_folded), relax.const(bias),
                relax.prim_value(flags), relax.prim_value(wid)]
        return relax.call_dps_packed(name, args, out_ty)

    return _Group(tail=ep.tail, drop=ep.drop, build=build)


def _batch_matmul_group(binding: _Binding, rules: DispatchRules,
                        stats: DispatchStats) -> _Group | None:
    """``a @ b`` of two float32 activations [*batch, M, K] and [*batch, K, N] with the same
    batch dims, as one oneDNN batched matmul (no epilogue: what follows stays TVM's)."""
    call = binding.value
    a, b = call.args
    if (not _float32(a) or not _float32(b) or constant_value(b) is not None
            or call.attrs.out_dtype not in (None, "", "float32")):
        return None
    a_dims, b_dims = (getattr(x.ty.shape, "values", None) for x in (a, b))
    if a_dims is None or b_dims is None or len(a_dims) != len(b_dims) or len(a_dims) not in (3, 4):
        return None
    if not _equal_dims(a_dims[:-2], b_dims[:-2]):
        return None  # broadcast batch dims: TVM's kernel
    if not _equal_dims([a_dims[-1]], [b_dims[-2]]):
        return None
    shape = static_shape(a), static_shape(b)
    if None not in shape and int(np.prod(shape[0])) * shape[1][-1] < rules.dense_min_macs:
        return None
    name = rules.symbol("batch_matmul")
    stats.add(name)
    out_ty = binding.var.ty

    def build(visit, emit):
        return relax.call_dps_packed(name, [visit(a), visit(b)], out_ty)

    return _Group(tail=binding.var, drop={binding.var}, build=build)


def _tiny(data: relax.Expr, rules: DispatchRules) -> bool:
    """Whether ``data`` is static and under ``rules.norm_min_elements``, where TVM's kernel beats
    a library call (which costs about 2 us more; ``DispatchRules``)."""
    shape = static_shape(data)
    return shape is not None and int(np.prod(shape)) < rules.norm_min_elements


def _softmax_group(binding: _Binding, rules: DispatchRules,
                   stats: DispatchStats) -> _Group | None:
    """A float32 softmax along any axis of a tensor of any shape, as one oneDNN softmax."""
    call = binding.value
    (data,) = call.args
    if not _float32(data) or data.ty.ndim < 1 or _tiny(data, rules):
        return None
    name = rules.symbol("softmax")
    stats.add(name)
    axis = int(call.attrs.axis) % data.ty.ndim
    out_ty = binding.var.ty

    def build(visit, emit):
        return relax.call_dps_packed(name, [visit(data), relax.prim_value(axis)], out_ty)

    return _Group(tail=binding.var, drop={binding.var}, build=build)


def _layer_norm_group(binding: _Binding, rules: DispatchRules,
                      stats: DispatchStats) -> _Group | None:
    """A float32 layer norm over the last axis, scaled and shifted by [C] vectors, as one oneDNN
    layer normalization."""
    call = binding.value
    data, gamma, beta = call.args
    attrs = call.attrs
    if not (_float32(data) and _float32(gamma) and _float32(beta)) or data.ty.ndim < 1:
        return None
    rank = data.ty.ndim
    if ([int(a) % rank for a in attrs.axes] != [rank - 1] or not attrs.center or not attrs.scale
            or gamma.ty.ndim != 1 or beta.ty.ndim != 1 or _tiny(data, rules)):
        return None
    dims = [getattr(x.ty.shape, "values", None) for x in (data, gamma, beta)]
    if None in dims or not _equal_dims([dims[1][0], dims[2][0]], [dims[0][-1]] * 2):
        return None
    name = rules.symbol("layer_norm")
    stats.add(name)
    epsilon = float(attrs.epsilon)
    out_ty = binding.var.ty

    def build(visit, emit):
        args = [visit(data), visit(gamma), visit(beta), relax.prim_value(tvm.tirx.FloatImm(
            "float64", epsilon))]
        return relax.call_dps_packed(name, args, out_ty)

    return _Group(tail=binding.var, drop={binding.var}, build=build)


def _trailing_reduction(call: relax.Expr | None, op: tvm.ir.Op) -> tuple[relax.Expr, int] | None:
    """``op`` (mean or variance) over the last k axes of a float32 tensor with kept dims: its
    input and k, else None."""
    if not _is_call(call, op) or not call.attrs.keepdims or call.attrs.axis is None:
        return None
    data = call.args[0]
    if not _float32(data):
        return None
    rank = data.ty.ndim
    axes = sorted(int(a) % rank for a in call.attrs.axis)
    if not axes or axes != list(range(rank - len(axes), rank)):
        return None
    return data, len(axes)


def _standardize_group(analysis: _Analysis, binding: _Binding, rules: DispatchRules,
                       stats: DispatchStats) -> _Group | None:
    """``(x - mean(x)) / sqrt(var(x) + eps)`` over x's last axes as one oneDNN normalization.

    ONNX InstanceNormalization (GroupNorm as torch exports it) imports as mean and variance;
    LayerNormalization before opset 17 is exported as ``mean((x - mean(x)) ** 2)``. Both ran as
    serial TVM reductions (a fifth of wav2vec2's main-thread time). The affine after it stays elementwise.
    """
    centered, root = binding.value.args
    sqrt = analysis.value(root)
    if not _is_call(sqrt, _SQRT):
        return None
    shifted = analysis.value(sqrt.args[0])
    if not _is_call(shifted, _ADD):
        return None
    variance_var, eps_expr = shifted.args
    epsilon = scalar_constant(eps_expr)
    if epsilon is None:
        variance_var, eps_expr = eps_expr, variance_var
        epsilon = scalar_constant(eps_expr)
    subtract = analysis.value(centered)
    if epsilon is None or not _is_call(subtract, _SUBTRACT):
        return None
    data, mean_var = subtract.args
    mean = _trailing_reduction(analysis.value(mean_var), _MEAN)
    if mean is None or not mean[0].same_as(data):
        return None
    inner = {mean_var, centered, variance_var, sqrt.args[0], root}
    variance = _trailing_reduction(analysis.value(variance_var), _VARIANCE)
    if variance is None:  # the written-out form: mean of the centered values squared
        variance = _trailing_reduction(analysis.value(variance_var), _MEAN)
        square_var = variance[0] if variance is not None else None
        square = analysis.value(square_var)
        if _is_call(square, _POWER) and scalar_constant(square.args[1]) == 2.0:
            squared = square.args[0]
        elif _is_call(square, _MULTIPLY) and square.args[0].same_as(square.args[1]):
            squared = square.args[0]
        else:
            return None
        if not squared.same_as(centered):
            return None
        inner.add(square_var)
    elif not variance[0].same_as(data):
        return None
    if variance[1] != mean[1] or not _same_shape(data, binding.var) or _tiny(data, rules):
        return None
    for var in inner:  # every step used only by the next ones
        consumers = analysis.consumers.get(var, [])
        if (var in analysis.used_outside or analysis.uses.get(var, 0) != len(consumers)
                or not set(consumers) <= inner | {binding.var}):
            return None
    name = rules.symbol("standardize")
    stats.add(name)
    trailing = mean[1]
    out_ty = binding.var.ty

    def build(visit, emit):
        args = [visit(data), relax.prim_value(trailing),
                relax.prim_value(tvm.tirx.FloatImm("float64", epsilon))]
        return relax.call_dps_packed(name, args, out_ty)

    return _Group(tail=binding.var, drop=inner | {binding.var}, build=build)


def _library_groups(analysis: _Analysis, rules: DispatchRules,
                    stats: DispatchStats) -> list[_Group]:
    groups: list[_Group] = []
    taken: set[relax.Var] = set()
    for var, binding in analysis.bindings.items():
        if var in taken:
            continue
        group = None
        if rules.conv2d and any(_is_call(binding.value, op) for op in (_CONV2D, _CONV1D)):
            group = _conv_group(analysis, binding, rules, taken, stats)
        elif rules.dense and _is_call(binding.value, _MATMUL):
            group = _dense_group(analysis, binding, rules, taken, stats)
            if group is None and rules.batch_matmul:
                group = _batch_matmul_group(binding, rules, stats)
        elif rules.softmax and _is_call(binding.value, _SOFTMAX):
            group = _softmax_group(binding, rules, stats)
        elif rules.layer_norm and _is_call(binding.value, _LAYER_NORM):
            group = _layer_norm_group(binding, rules, stats)
        elif rules.layer_norm and _is_call(binding.value, _DIVIDE):
            group = _standardize_group(analysis, binding, rules, stats)
        if group is not None:
            groups.append(group)
            taken |= group.drop
    return groups
