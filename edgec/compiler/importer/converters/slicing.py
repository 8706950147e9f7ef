"""ONNX Slice with constant bounds on symbolic axes, with extents TVM can reason about.

TVM's converter hands ONNX's bounds to ``strided_slice`` unchanged, so the extent of a symbolic
axis is ONNX's clamping written out: ``Slice(y, -1, INT_MAX)`` (tf2onnx's last step of a
sequence) on ``seq`` has the extent ``T.min(INT_MAX, seq) - T.min(T.max(seq - 1, 0), seq)``,
which a following ``Squeeze`` cannot prove to be 1 and an ``Add`` cannot match against
``seq - 1`` (``x[:, :-1]``).

Here the bounds of a symbolic axis are written in terms of its dim ``n`` and the slice is taken
with ``assume_inbound``, so the extent is a plain expression (``1`` for ``[-1:]``, ``n - 1`` for
``[:-1]``, ``n - 1`` for ``[1:]``):

    start < 0               -> n + start     (assumes n >= -start)
    start >= 0              -> start         (assumes n >= start)
    end >= INT32_MAX        -> n             (the "to the end" exporters write)
    end < 0                 -> n + end       (assumes n >= -end)
    0 <= end < INT32_MAX    -> min(end, n)   (ONNX's clamp kept: ``x[:, :512]`` on a shorter
                                              input is common, and reading past n is not safe)

The assumptions are that a symbolic dim is at least as long as the constant bounds count from
its ends: where it is shorter ONNX gives an empty or shorter slice, and this gives a negative or
wrong extent. Exporters write these bounds for "the last k" / "all but the last k", which the
models they export never apply to a shorter sequence.

Static axes with a positive step take ONNX's bounds exactly (Python's ``slice.indices``, which
clamps as ONNX does); axes with another step on a symbolic dim, or a negative step, go through
TVM's clamping ``strided_slice`` as before, with bounds past +-INT32_MAX brought to it (TVM's
clamping overflows int64 on PyTorch's INT64_MAX reversing a symbolic axis). A slice whose axes are all static, with bounds known
only at run time, or on a shape value is TVM's converter's.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax, tirx
from tvm.relax.frontend.onnx import onnx_frontend

# An end at or past this means "to the end of the axis" (tf2onnx writes INT32_MAX, PyTorch
# INT64_MAX).
TO_THE_END = 2**31 - 1


def _constant_list(expr, params) -> list[int] | None:
    """A 1-D constant int input as ints; None when it is not known at compile time."""
    if expr is None:
        return None
    expr = onnx_frontend.get_constant(expr, params)
    if not isinstance(expr, tvm.ir.GenericConst):
        return None
    array = np.asarray(expr.value.numpy())
    if array.dtype.kind not in "iu":
        return None
    return [int(v) for v in array.reshape(-1)]


def symbolic_bounds(n: tirx.PrimExpr, start: int, end: int) -> tuple[tirx.PrimExpr, tirx.PrimExpr]:
    """``[start:end]`` (step 1) on a symbolic dim ``n`` as in-bound begin and end (see the
    module's table for the assumptions)."""
    dtype = str(n.ty)
    begin = n + tirx.const(start, dtype) if start < 0 else tirx.const(start, dtype)
    if end >= TO_THE_END:
        stop = n
    elif end < 0:
        stop = n + tirx.const(end, dtype)
    else:
        stop = tirx.min(tirx.const(end, dtype), n)
    return begin, stop


class Slice:
    """ONNX Slice (opset 10+) with constant starts/ends/axes/steps on a tensor with a symbolic
    sliced axis: in-bound bounds in terms of the dim (module docstring)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Slice.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            planned = cls._plan(inputs, params) if opset >= 10 else None
            if planned is None:
                return fallback(bb, inputs, attrs, params)
            data, inbound, clamped = planned
            if inbound:
                axes, begins, ends = zip(*inbound)
                data = bb.normalize(relax.op.strided_slice(
                    data, list(axes), list(begins), list(ends), assume_inbound=True))
            if clamped:
                axes, begins, ends, steps = zip(*clamped)
                data = bb.normalize(relax.op.strided_slice(
                    data, list(axes), list(begins), list(ends), list(steps),
                    assume_inbound=False))
            return data
        return convert

    @staticmethod
    def _plan(inputs, params):
        """(data, in-bound (axis, begin, end) with step 1, clamped (axis, start, end, step) for
        TVM), or None where TVM's converter serves."""
        data = inputs[0]
        if not isinstance(data, relax.Expr) or isinstance(data, relax.ShapeExpr):
            return None
        ty = data.ty
        if not isinstance(ty, relax.TensorType) or ty.shape is None:
            return None
        dims = list(ty.shape.values)
        rank = len(dims)
        inputs = list(inputs) + [None] * (5 - len(inputs))
        starts, ends = _constant_list(inputs[1], params), _constant_list(inputs[2], params)
        if starts is None or ends is None or len(starts) != len(ends):
            return None
        axes = _constant_list(inputs[3], params) if inputs[3] is not None else list(range(len(starts)))
        steps = _constant_list(inputs[4], params) if inputs[4] is not None else [1] * len(starts)
        if axes is None or steps is None or not len(axes) == len(steps) == len(starts):
            return None
        if any(step == 0 for step in steps) or any(not -rank <= a < rank for a in axes):
            return None  # TVM's converter raises the error
        axes = [a % rank for a in axes]
        if len(set(axes)) != len(axes):
            return None
        if all(isinstance(dims[a], tirx.IntImm) for a in axes):
            return None  # all static: TVM's clamping is exact
        inbound, clamped = [], []
        for axis, start, end, step in zip(axes, starts, ends, steps):
            n = dims[axis]
            if isinstance(n, tirx.IntImm) and step > 0:
                first, stop, _ = slice(start, end, step).indices(int(n))
                stop = max(stop, first)
                if step == 1:
                    inbound.append((axis, first, stop))
                else:
                    clamped.append((axis, first, stop, step))
            elif step == 1:
                inbound.append((axis, *symbolic_bounds(n, start, end)))
            else:
                # TVM's clamping overflows int64 on INT64_MAX-like bounds: any bound past
                # +-INT32_MAX is past the end of any axis, and clamps the same.
                clamped.append((axis, *(min(max(v, -TO_THE_END), TO_THE_END) for v in (start, end)),
                                step))
        return data, inbound, clamped


def checked_squeeze(base) -> type:
    """A Squeeze converter over ``base`` (TVM's, or one that wraps it) that also squeezes a
    symbolic axis whose extent the importer cannot prove to be 1, such as ``Slice(x, 0, 1)``'s
    ``T.min(1, n)``: ONNX requires the extent to be 1, so the tensor is ``match_cast`` to a shape
    with 1 there, which the VM checks when it runs (a clear error where ONNX's Squeeze would
    fail), and ``base`` squeezes that. TVM's converter refuses every symbolic axis."""

    class Squeeze:
        @classmethod
        def get_converter(cls, opset: int) -> Callable:
            fallback = base.get_converter(opset)

            def convert(bb, inputs, attrs, params):
                data = inputs[0]
                if opset >= 13:
                    axes = _constant_list(inputs[1], params) if len(inputs) > 1 else None
                else:
                    axes = [int(a) for a in attrs["axes"]] if "axes" in attrs else None
                unit = _unit_shape(data, axes)
                if unit is not None:
                    data = bb.match_cast(data, relax.TensorType(unit, data.ty.dtype))
                    inputs = [data, *inputs[1:]]
                return fallback(bb, inputs, attrs, params)
            return convert

    Squeeze.__name__ = Squeeze.__qualname__ = f"Checked{getattr(base, '__name__', 'Squeeze')}"
    return Squeeze


def _unit_shape(data, axes: list[int] | None) -> list | None:
    """``data``'s shape with the listed symbolic axes set to 1, or None when none needs it (or
    ``data`` is not a tensor with known dims)."""
    if (axes is None or not isinstance(data, relax.Expr) or isinstance(data, relax.ShapeExpr)
            or isinstance(data, tvm.ir.GenericConst)):
        return None
    ty = data.ty
    if not isinstance(ty, relax.TensorType) or not isinstance(ty.shape, relax.ShapeExpr):
        return None
    dims = list(ty.shape.values)
    analyzer = tvm.sym.Analyzer()
    changed = False
    for axis in axes:
        if not -len(dims) <= axis < len(dims):
            return None  # base raises the error
        extent = dims[axis % len(dims)]
        if not isinstance(extent, tirx.IntImm) and not analyzer.can_prove_equal(extent, 1):
            dims[axis % len(dims)] = tirx.const(1, str(extent.ty))
            changed = True
    return dims if changed else None
