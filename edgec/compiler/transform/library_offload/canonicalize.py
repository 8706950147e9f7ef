"""Canonical forms the library patterns rely on: numpy folding of simple computations on
constants, inference batch norm as a multiply and an add, ``sum(stack(...))`` as adds, and the
identities (``broadcast_to`` a tensor's own shape, inference dropout, a slice of everything)
removed, and a convolution's kernel taps that read only padding dropped."""

from __future__ import annotations

import numpy as np
import tvm
from tvm import relax

from edgec.compiler.ir import constant, static_shape
from edgec.compiler.transform.library_offload.analysis import (_Analysis, _BATCH_NORM,
                                                               _BROADCAST_TO, _CONV2D, _DROPOUT,
                                                               _float32,
                                                               _Group, _is_call, _same_shape,
                                                               _STACK, _STRIDED_SLICE, _SUM,
                                                               constant_value)


def _whole_slice(value: relax.Call, var: relax.Var) -> bool:
    """Whether a ``strided_slice`` takes every element in order: from 0 in steps of 1, to a
    result of its input's shape. GhostNet's modules slice their concat to the channels it
    already has (``out[:, :channels]``); as a copy it made the tensor leave the blocked layout."""
    data, _, begin = value.args[:3]
    strides = value.args[4] if len(value.args) > 4 else None  # absent: steps of 1
    if not (isinstance(begin, relax.Tuple) and isinstance(strides, (relax.Tuple, type(None)))):
        return False
    begins = [_static_int(v) for v in begin.fields]
    steps = [] if strides is None else [_static_int(v) for v in strides.fields]
    return all(b == 0 for b in begins) and all(s == 1 for s in steps) and _same_shape(data, var)


def _live_taps(size: int, out: int, kernel: int, stride: int, pad: int,
               dilation: int) -> tuple[int, int]:
    """The first and last kernel tap along one axis that some output position reads inside an
    input of ``size`` (the taps outside that range read only padding)."""
    live = [k for k in range(kernel)
            if any(0 <= o * stride - pad + k * dilation < size for o in range(out))]
    return (live[0], live[-1]) if live else (0, kernel - 1)


def _live_conv(value: relax.Call, var: relax.Var):
    """A builder of the same 2-D convolution without its kernel rows and columns that read only
    padding, or None when every tap reads the input somewhere. DeepLab's ASPP convolutions
    (dilation 24 and 36 on a 14x14 input) are then 1x1 convolutions: oneDNN ran them as 3x3
    through its GEMM kernel, 9 ms each, with the outer taps multiplying zeros."""
    data, weight = value.args
    attrs = value.attrs
    array = constant_value(weight)
    shape, out_shape = static_shape(data), static_shape(var)
    if (array is None or shape is None or out_shape is None or len(shape) != 4
            or attrs.data_layout != "NCHW" or attrs.kernel_layout != "OIHW"):
        return None
    strides = [int(s) for s in attrs.strides]
    dilation = [int(d) for d in attrs.dilation]
    pads = [int(p) for p in attrs.padding]  # top, left, bottom, right
    spans = [_live_taps(shape[2 + a], out_shape[2 + a], array.shape[2 + a], strides[a],
                        pads[a], dilation[a]) for a in range(2)]
    if all(first == 0 and last == array.shape[2 + a] - 1
           for a, (first, last) in enumerate(spans)):
        return None
    begin = [pads[a] - spans[a][0] * dilation[a] for a in range(2)]
    end = [pads[2 + a] - (array.shape[2 + a] - 1 - spans[a][1]) * dilation[a] for a in range(2)]
    if min(begin + end) < 0:  # the output would need cropping, not padding: keep the taps
        return None
    live = array[:, :, spans[0][0]:spans[0][1] + 1, spans[1][0]:spans[1][1] + 1]

    def build(visit, emit):
        return relax.op.nn.conv2d(
            visit(data), relax.const(np.ascontiguousarray(live)), strides, begin + end,
            dilation, int(attrs.groups), "NCHW", "OIHW", attrs.out_layout,
            attrs.out_dtype or None)

    return build


def _static_int(expr: relax.Expr) -> int | None:
    """A slice bound's value when it is an integer immediate, else None."""
    return int(expr.value) if isinstance(expr, tvm.tirx.IntImm) else None


def _canonical_groups(analysis: _Analysis) -> list[_Group]:
    groups = []
    folded: dict[relax.Var, np.ndarray] = {}

    def lookup(expr: relax.Expr) -> np.ndarray | None:
        return folded.get(expr) if isinstance(expr, relax.Var) else constant_value(expr)

    for var, binding in analysis.bindings.items():
        value = binding.value
        array = _fold(value, lookup, var)
        if array is not None:
            folded[var] = array
            groups.append(_Group(tail=var, drop=set(), alias=constant(array)))
            continue
        bn_group = _batch_norm_group(analysis, var, value, lookup)
        if bn_group is not None:
            groups.append(bn_group)
        elif _is_call(value, _CONV2D) and (live := _live_conv(value, var)) is not None:
            groups.append(_Group(tail=var, drop=set(), build=live))
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
        elif _is_call(value, _STRIDED_SLICE) and _whole_slice(value, var):
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
