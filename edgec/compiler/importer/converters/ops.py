"""Converters for ONNX ops TVM 0.27's importer lacks and ONNX defines without a function body."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax, topi
from tvm.relax.frontend.onnx import onnx_frontend

from edgec.compiler.ir import constant, static_shape
from edgec.core.model import attribute_text


def _constant_int(expr, what: str, node: str) -> int:
    if not isinstance(expr, tvm.ir.GenericConst):
        raise ValueError(f"{node}: {what} must be known at compile time (a constant or a fixed input)")
    return int(np.asarray(expr.value.numpy()).reshape(-1)[0])


class CumProd:
    """ONNX CumProd (opset 26): cumulative product along a constant axis, optionally exclusive
    (starting at 1) and/or reversed."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            data = inputs[0]
            name = attrs.get("tvm_custom", {}).get("name", "CumProd")
            axis = _constant_int(inputs[1], "the axis", name)
            reverse = attrs.get("reverse", 0) != 0
            if reverse:
                data = bb.emit_te(topi.flip, data, axis=axis)
            data = bb.normalize(relax.op.cumprod(data, axis, exclusive=attrs.get("exclusive", 0) != 0))
            if reverse:
                data = bb.emit_te(topi.flip, data, axis=axis)
            return data
        return convert


class LpNormalization:
    """ONNX LpNormalization: x / ||x||_p along ``axis`` (p = 1 or 2), as onnxruntime computes it
    (a zero norm gives zero)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            axis, p = attrs.get("axis", -1), attrs.get("p", 2)
            if p == 1:
                norm = relax.op.sum(relax.op.abs(x), axis=[axis], keepdims=True)
            elif p == 2:
                norm = relax.op.sqrt(relax.op.sum(relax.op.multiply(x, x), axis=[axis], keepdims=True))
            else:
                raise ValueError(f"LpNormalization: p must be 1 or 2, got {p}")
            norm = bb.normalize(norm)
            zero = relax.const(0, x.ty.dtype)
            safe = relax.op.where(relax.op.equal(norm, zero), relax.const(1, x.ty.dtype), norm)
            return relax.op.divide(x, safe)
        return convert


def shape_with_dims(bb: relax.BlockBuilder, shape: relax.Expr) -> relax.Expr:
    """A shape computed at run time (a 1-D int64 tensor of static length) as a ShapeExpr: of the
    input dims it was computed from where the computation can be followed (``Shape`` ->
    ``Gather`` -> ``Concat`` and the like), else of fresh symbolic dims. TVM's converters pass
    such a tensor through ``tensor_to_shape``, which leaves the result without dims that
    legalization could lower. Other values pass through."""
    ty = shape.ty
    if not (isinstance(ty, relax.TensorType) and ty.ndim == 1 and ty.shape is not None
            and isinstance(ty.shape.values[0], tvm.tirx.IntImm)):
        return shape
    known = _symbolic_values(bb, shape)
    if known is not None and len(known) == int(ty.shape.values[0]):
        return relax.ShapeExpr(known)
    dims = [tvm.tirx.Var(f"s{k}", "int64") for k in range(int(ty.shape.values[0]))]
    value = bb.emit(relax.op.tensor_to_shape(shape))
    bb.match_cast(value, relax.ShapeType(dims))
    return relax.ShapeExpr(dims)


def _symbolic_values(bb: relax.BlockBuilder, expr: relax.Expr, depth: int = 0) -> list | None:
    """The elements of a small int64 tensor (rank 0 or 1) as ints or symbolic dims, following
    the bindings that computed it; None where it depends on data."""
    if depth > 32:
        return None
    if isinstance(expr, relax.Var):
        bound = bb.lookup_binding(expr)
        return None if bound is None else _symbolic_values(bb, bound, depth + 1)
    if isinstance(expr, tvm.ir.GenericConst):
        array = np.asarray(expr.value.numpy())
        return [int(v) for v in array.reshape(-1)] if array.dtype.kind in "iu" and array.ndim <= 1 else None
    if isinstance(expr, relax.ShapeExpr):
        return [int(v) if isinstance(v, tvm.tirx.IntImm) else v for v in expr.values]
    if not isinstance(expr, relax.Call) or not isinstance(expr.op, tvm.ir.Op):
        return None
    name, args = expr.op.name, expr.args

    def values(k: int) -> list | None:
        return _symbolic_values(bb, args[k], depth + 1)

    def numbers(k: int) -> list[int] | None:
        found = values(k)
        return found if found is not None and all(isinstance(v, int) for v in found) else None

    if name in ("relax.shape_to_tensor", "relax.astype") or (
            name == "relax.reshape" and expr.ty.ndim <= 1):
        return values(0)
    if name == "relax.shape_of":
        ty = args[0].ty
        return None if ty.shape is None else _symbolic_values(bb, ty.shape, depth + 1)
    if name == "relax.concat" and isinstance(args[0], relax.Tuple):
        parts = [_symbolic_values(bb, f, depth + 1) for f in args[0].fields]
        return None if any(p is None for p in parts) else [v for p in parts for v in p]
    if name == "relax.take" and int(expr.attrs.axis or 0) == 0:
        data, index = values(0), numbers(1)
        if data is None or index is None:
            return None
        return [data[i % len(data)] for i in index] if all(-len(data) <= i < len(data) for i in index) else None
    if name in ("relax.add", "relax.less", "relax.where"):
        operands = [numbers(k) for k in range(len(args))]
        if any(o is None for o in operands):
            return None
        arrays = [np.asarray(o) for o in operands]
        result = (arrays[0] + arrays[1] if name == "relax.add" else arrays[0] < arrays[1]
                  if name == "relax.less" else np.where(arrays[0].astype(bool), arrays[1], arrays[2]))
        return [int(v) for v in np.asarray(result).reshape(-1)]
    return None


class ConstantOfShape:
    """ONNX ConstantOfShape with a shape computed at run time (``Shape`` -> ``Gather`` ->
    ``Concat``, as exported models build zero states): TVM's converter leaves it unlowerable."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.ConstantOfShape.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            return fallback(bb, [shape_with_dims(bb, inputs[0])], attrs, params)
        return convert


class Pow:
    """ONNX Pow with base and exponent of different types (TVM wants one) or integer ones (TVM
    computes floats only): the result has the base's type."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Pow.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x, y = inputs
            x_dtype, y_dtype = x.ty.dtype, y.ty.dtype
            if "float" not in str(x_dtype) and "float" not in str(y_dtype):
                # TVM's power is float-only; float64 is exact for every integer result below 2**53.
                wide = relax.op.power(relax.op.astype(x, "float64"), relax.op.astype(y, "float64"))
                return relax.op.astype(wide, x_dtype)
            if x_dtype == y_dtype:
                return fallback(bb, inputs, attrs, params)
            if "float" in str(x_dtype):
                return relax.op.power(x, relax.op.astype(y, x_dtype))
            if "float" in str(y_dtype):
                return relax.op.astype(relax.op.power(relax.op.astype(x, y_dtype), y), x_dtype)
            return relax.op.power(x, relax.op.astype(y, x_dtype))
        return convert


class OneHot:
    """ONNX OneHot with float indices or a float or one-element ``depth`` (ONNX allows them; TVM's
    converter takes integers): both become integers, and an axis below -1 counted from the
    front (TVM's one_hot takes only -1), then TVM's converter runs; its result is cast back to
    the values' dtype."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.OneHot.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            indices, depth = inputs[0], inputs[1]
            if "float" in str(indices.ty.dtype):  # ONNX allows float indices; they index as ints
                indices = bb.normalize(relax.op.astype(indices, "int64"))
            if isinstance(depth, tvm.ir.GenericConst):
                depth = constant(np.int64(np.asarray(depth.value.numpy()).reshape(-1)[0]))
            axis = attrs.get("axis", -1)
            if axis < -1:  # counted from the end of the output, one rank more than the indices
                attrs = {**attrs, "axis": axis + indices.ty.ndim + 1}
            result = bb.normalize(fallback(bb, [indices, depth, *inputs[2:]], attrs, params))
            dtype = str(inputs[2].ty.dtype)  # TVM's takes the values as Python numbers (float64)
            return result if str(result.ty.dtype) == dtype else relax.op.astype(result, dtype)
        return convert


class IsInf:
    """ONNX IsInf with ``detect_positive`` / ``detect_negative`` (TVM's converter ignores both)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            positive, negative = attrs.get("detect_positive", 1), attrs.get("detect_negative", 1)
            inf = relax.op.isinf(x)
            if positive and negative:
                return inf
            if not positive and not negative:
                return relax.op.logical_and(inf, relax.const(False, "bool"))
            zero = relax.const(0, x.ty.dtype)
            side = relax.op.greater(x, zero) if positive else relax.op.less(x, zero)
            return relax.op.logical_and(inf, side)
        return convert


def _over(base, prefix: str):
    """Decorator: ``convert(fallback, bb, inputs, attrs, params)`` as a converter class over
    ``base`` (TVM's, or one that wraps it), ``fallback`` being ``base``'s converter for the
    node's opset; named ``prefix`` + ``base``'s name."""

    def make(convert: Callable) -> type:
        class Converter:
            @classmethod
            def get_converter(cls, opset: int) -> Callable:
                fallback = base.get_converter(opset)
                return lambda bb, inputs, attrs, params: convert(fallback, bb, inputs, attrs, params)

        Converter.__name__ = Converter.__qualname__ = prefix + getattr(base, "__name__", "")
        return Converter
    return make


def _is_op(expr, *names: str) -> bool:
    return (isinstance(expr, relax.Call) and isinstance(expr.op, tvm.ir.Op)
            and expr.op.name in names)


def infinite_extremum(base) -> type:
    """A ReduceMax/ReduceMin converter over ``base`` (TVM's) whose float reduction starts from
    -inf/+inf, as ONNX's does: TOPI's starts from the lowest/highest finite value, so the max of
    a row of -inf came out -3.4e38 (Attention's fully masked rows test it against -inf). Over
    bool (opset 20) they are any/all: TOPI has no lowest bool and failed to compile."""

    @_over(base, "")
    def convert(fallback, bb, inputs, attrs, params):
        result = fallback(bb, inputs, attrs, params)
        if not _is_op(result, "relax.max", "relax.min"):
            return result
        data = result.args[0]
        ty = data.ty
        if not (isinstance(ty, relax.TensorType)
                and (_is_float_dtype(ty.dtype) or str(ty.dtype) == "bool")
                and isinstance(ty.shape, relax.ShapeExpr) and ty.ndim > 0):
            return result  # no dims to compute over: TOPI's (finite) start stays
        axis = result.attrs.axis
        axes = None if axis is None else [int(a) for a in axis]
        if axes == []:
            return result
        return bb.emit_te(_extremum, data, axes, bool(result.attrs.keepdims),
                          result.op.name == "relax.max")
    return convert


def _extremum(x, axes, keepdims: bool, largest: bool):
    """max (``largest``) or min of ``x`` over ``axes`` (None: all), from -inf or +inf (bool:
    any or all, from False or True)."""
    ndim = len(x.shape)
    reduced = topi.reduction._get_real_axis(ndim, axes)
    if str(x.dtype) == "bool":
        combine = tvm.tirx.Or if largest else tvm.tirx.And
        identity = not largest
    else:
        combine = tvm.tirx.Max if largest else tvm.tirx.Min
        identity = float("-inf") if largest else float("inf")
    reducer = tvm.te.comm_reducer(lambda a, b: combine(a, b),
                                  lambda dtype: tvm.tirx.const(identity, dtype),
                                  name="max" if largest else "min")
    k = {a: tvm.te.reduce_axis((0, x.shape[a]), name=f"k{a}") for a in reduced}
    if keepdims:
        shape = [1 if a in k else x.shape[a] for a in range(ndim)]
    else:
        shape = [x.shape[a] for a in range(ndim) if a not in k]

    def body(*index):
        index = list(index)
        full = []
        for a in range(ndim):
            if a in k:
                full.append(k[a])
                if keepdims:
                    index.pop(0)
            else:
                full.append(index.pop(0))
        return reducer(x[tuple(full)], axis=list(k.values()))

    return tvm.te.compute(shape, body, name="max" if largest else "min", tag="comm_reduce")


# Float types narrower than float32: onnxruntime accumulates their MatMul and Conv in float32 and
# rounds the result once (TVM's float16 accumulator rounded every addition: 377 of 512 results
# of a K=64 matmul differed).
_NARROW_FLOATS = ("float16", "bfloat16")
WIDE_FLOAT = "float32"


def _narrow(expr) -> str | None:
    ty = getattr(expr, "ty", None)
    if isinstance(ty, relax.TensorType) and str(ty.dtype) in _NARROW_FLOATS:
        return str(ty.dtype)
    return None


def wide_matmul(base) -> type:
    """A MatMul converter over ``base`` (TVM's) that accumulates float16/bfloat16 products in
    float32 (``out_dtype``, as ``ToMixedPrecision`` emits it) and rounds the result once."""

    @_over(base, "Wide")
    def convert(fallback, bb, inputs, attrs, params):
        result = fallback(bb, inputs, attrs, params)
        dtype = _narrow(inputs[0])
        if dtype is None or _narrow(inputs[1]) != dtype or not _is_op(result, "relax.matmul"):
            return result
        wide = bb.normalize(relax.op.matmul(result.args[0], result.args[1], out_dtype=WIDE_FLOAT))
        return relax.op.astype(wide, dtype)
    return convert


class NarrowSoftmax:
    """ONNX Softmax (opset 13+) over float16/bfloat16: ``x - max`` and the exponentials computed
    in float32, the exponentials rounded to the input's type (as ONNX's reference rounds them;
    Attention's float16 cases are checked against it at 1e-3, a float32 softmax missed one),
    summed in float32 and divided in the input's type. TVM's kernel summed in float16,
    rounding every addition: 8 to 20 ulps from onnxruntime over 200 terms, 2 here. Other types
    and opsets go to ``base``."""

    base = onnx_frontend.Softmax

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = cls.base.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x = inputs[0]
            dtype = _narrow(x)
            if dtype is None or opset < 13:
                return fallback(bb, inputs, attrs, params)
            axis = int(attrs.get("axis", -1))
            wide = bb.normalize(relax.op.astype(x, WIDE_FLOAT))
            peak = bb.normalize(relax.op.max(wide, [axis], keepdims=True))
            exp = bb.normalize(relax.op.astype(relax.op.exp(relax.op.subtract(wide, peak)), dtype))
            total = relax.op.sum(relax.op.astype(exp, WIDE_FLOAT), [axis], keepdims=True)
            return relax.op.divide(exp, relax.op.astype(total, dtype))
        return convert


_CONVOLUTIONS = ("relax.nn.conv1d", "relax.nn.conv2d", "relax.nn.conv3d")


def wide_conv(base) -> type:
    """A Conv converter over ``base`` (TVM's) that accumulates float16/bfloat16 products, and
    adds the bias, in float32 (``out_dtype``) and rounds the result once, as onnxruntime does
    (TVM's float16 accumulator was off by several ulps)."""

    @_over(base, "Wide")
    def convert(fallback, bb, inputs, attrs, params):
        result = fallback(bb, inputs, attrs, params)
        dtype = _narrow(inputs[0])
        bias = None
        conv = result
        if _is_op(result, "relax.add") and _is_op(result.args[0], *_CONVOLUTIONS):
            conv, bias = result.args
        if dtype is None or not _is_op(conv, *_CONVOLUTIONS) or conv.attrs.out_dtype:
            return result
        a = conv.attrs
        op = getattr(relax.op.nn, conv.op.name.rsplit(".", 1)[1])
        wide = bb.normalize(op(conv.args[0], conv.args[1], strides=a.strides, padding=a.padding,
                               dilation=a.dilation, groups=a.groups, data_layout=a.data_layout,
                               kernel_layout=a.kernel_layout, out_layout=a.out_layout,
                               out_dtype=WIDE_FLOAT))
        if bias is not None:
            wide = bb.normalize(relax.op.add(wide, relax.op.astype(bias, WIDE_FLOAT)))
        return relax.op.astype(wide, dtype)
    return convert


def without_empty_operands(base) -> type:
    """A Concat converter over ``base`` (TVM's) that leaves out the operands with no elements
    along the axis (CausalConvWithState's zero padding of a size-one kernel): TVM folds their
    zeros into a constant with no elements, which the VM cannot load from an artifact."""

    @_over(base, "NonEmpty")
    def convert(fallback, bb, inputs, attrs, params):
        axis = int(attrs.get("axis", 0))
        kept = [x for x in inputs if not _empty_along(x, axis)]
        if kept and len(kept) < len(inputs):
            return kept[0] if len(kept) == 1 else fallback(bb, kept, attrs, params)
        return fallback(bb, inputs, attrs, params)
    return convert


def _empty_along(expr, axis: int) -> bool:
    ty = getattr(expr, "ty", None)
    if not (isinstance(ty, relax.TensorType) and isinstance(ty.shape, relax.ShapeExpr)
            and ty.ndim > 0):
        return False
    extent = ty.shape.values[axis % ty.ndim]
    return isinstance(extent, tvm.tirx.IntImm) and int(extent) == 0


class SpaceToDepth:
    """ONNX SpaceToDepth with ``mode`` (opset 28 adds CRD; TVM's converter always does DCR)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.SpaceToDepth.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            mode = attribute_text(attrs.get("mode"), "DCR")
            if mode == "DCR":
                return fallback(bb, inputs, attrs, params)
            if mode != "CRD":
                raise ValueError(f"SpaceToDepth: unknown mode {mode!r} (DCR or CRD)")
            block = int(attrs["blocksize"])
            b, c, h, w = inputs[0].ty.shape
            x = relax.op.reshape(inputs[0], (b, c, h // block, block, w // block, block))
            x = relax.op.permute_dims(x, [0, 1, 3, 5, 2, 4])
            return relax.op.reshape(x, (b, c * block * block, h // block, w // block))
        return convert


def _is_float_dtype(dtype) -> bool:
    return "float" in str(dtype)


class Mod:
    """ONNX Mod with ``fmod=0`` on floats: ``x - floor(x / y) * y`` gives NaN for an infinite
    ``y`` and loses the sign of a zero result; ONNX wants C's fmod moved to the sign of ``y``
    (an infinite ``y`` returns ``x`` or ``y``, a zero result has ``y``'s sign)."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Mod.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x, y = inputs
            dtype = str(x.ty.dtype)
            if attrs.get("fmod", 0) != 0 or not _is_float_dtype(dtype):
                return fallback(bb, inputs, attrs, params)
            zero = relax.const(0, dtype)
            rem = bb.normalize(relax.op.mod(x, y))  # C fmod: the sign of x
            y_negative = bb.normalize(relax.op.less(y, zero))
            moved = relax.op.logical_and(relax.op.not_equal(rem, zero),
                                         relax.op.logical_xor(relax.op.less(rem, zero), y_negative))
            rem = bb.normalize(relax.op.where(moved, relax.op.add(rem, y), rem))
            signed_zero = relax.op.where(y_negative, relax.const(-0.0, dtype), zero)
            return relax.op.where(relax.op.equal(rem, zero), signed_zero, rem)
        return convert


class BitShift:
    """ONNX BitShift with a shift below 0 or at least the bit width: ONNX gives what the sign
    fill alone produces (0, or -1 shifting a negative value right); TVM's shift is undefined
    there."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.BitShift.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x, y = inputs
            dtype = str(x.ty.dtype)
            bits = tvm.DataType(dtype).bits
            direction = attribute_text(attrs.get("direction"), "LEFT")
            out_of_range = relax.op.greater_equal(y, relax.const(bits, y.ty.dtype))
            if dtype.startswith("int"):
                out_of_range = relax.op.logical_or(out_of_range,
                                                   relax.op.less(y, relax.const(0, y.ty.dtype)))
            out_of_range = bb.normalize(out_of_range)
            safe = bb.normalize(relax.op.where(out_of_range, relax.const(0, y.ty.dtype), y))
            shifted = bb.normalize(fallback(bb, [x, safe], attrs, params))
            zero = relax.const(0, dtype)
            fill = zero
            if direction == "RIGHT" and dtype.startswith("int"):
                fill = relax.op.where(relax.op.less(x, zero), relax.const(-1, dtype), zero)
            return relax.op.where(out_of_range, fill, shifted)
        return convert


class ConvTranspose:
    """ONNX ConvTranspose with ``output_shape`` (TVM's converter ignores it): the pads come from
    it as ONNX's spec computes them (``auto_pad`` SAME_UPPER puts the odd one at the end, others at
    the start); a negative pad (the output reaches past what the kernels cover) is zeros, at the
    end unless SAME_*, as onnxruntime and ONNX's reference have it; the bias is added
    everywhere."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.ConvTranspose.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            if "output_shape" not in attrs:
                return fallback(bb, inputs, attrs, params)
            x, w = inputs[0], inputs[1]
            bias = inputs[2] if len(inputs) > 2 else None
            name = attrs.get("tvm_custom", {}).get("name", "ConvTranspose")

            x_shape, w_shape = static_shape(x), static_shape(w)
            if x_shape is None or w_shape is None:
                raise ValueError(f"{name}: output_shape needs the input and weight shapes known "
                                 "at compile time")
            spatial = len(x_shape) - 2
            target = [int(d) for d in attrs["output_shape"]][-spatial:]
            strides = list(attrs.get("strides", [1] * spatial))
            dilations = list(attrs.get("dilations", [1] * spatial))
            output_padding = list(attrs.get("output_padding", [0] * spatial))
            kernel = list(attrs.get("kernel_shape", w_shape[2:]))
            auto_pad = attribute_text(attrs.get("auto_pad"), "NOTSET")
            begin, end = [], []
            for i in range(spatial):
                total = (strides[i] * (x_shape[i + 2] - 1) + output_padding[i]
                         + (kernel[i] - 1) * dilations[i] + 1 - target[i])
                if auto_pad == "SAME_UPPER":
                    begin.append(total // 2)
                    end.append(total - total // 2)
                elif auto_pad != "SAME_LOWER" and total < 0:
                    # Past what the kernels cover: onnxruntime and ONNX's reference both add the
                    # (zero) rows at the end.
                    begin.append(0)
                    end.append(total)
                else:
                    begin.append(total - total // 2)
                    end.append(total // 2)
            conv_attrs = {k: v for k, v in attrs.items() if k not in ("output_shape", "auto_pad")}
            conv_attrs["pads"] = [max(p, 0) for p in begin + end]
            out = fallback(bb, [x, w, None], conv_attrs, params)
            grow = [max(-p, 0) for p in begin + end]
            if any(grow):
                widths = [0, 0, 0, 0]
                for i in range(spatial):
                    widths += [grow[i], grow[spatial + i]]
                out = relax.op.nn.pad(bb.normalize(out), widths)
            if bias is not None:
                out = relax.op.add(out, relax.op.reshape(bias, [1, -1] + [1] * spatial))
            return out
        return convert


def _constant_array(expr) -> np.ndarray | None:
    if expr is None:
        return None
    if isinstance(expr, tvm.ir.GenericConst):
        return np.asarray(expr.value.numpy())
    if isinstance(expr, relax.ShapeExpr) and all(isinstance(v, tvm.tirx.IntImm)
                                                 for v in expr.values):
        return np.array([int(v) for v in expr.values], np.int64)
    return None


def _resize_source(out_len: int, in_len: int, scale: float, coord: str, roi: tuple[float, float]):
    """ONNX Resize's source coordinate of each output index along one axis, and for
    tf_crop_and_resize which ones fall outside the input (they take extrapolation_value)."""
    y = np.arange(out_len, dtype=np.float64)
    length = scale * in_len  # the output length before truncation, as ONNX uses it
    outside = None
    if coord == "align_corners":
        x = np.zeros(out_len) if length == 1 else y * (in_len - 1) / (length - 1)
    elif coord == "asymmetric":
        x = y / scale
    elif coord == "tf_crop_and_resize":
        start, stop = roi
        if length == 1:
            x = np.full(out_len, (stop - start) * (in_len - 1) / 2)
        else:
            x = y * (stop - start) * (in_len - 1) / (length - 1)
        x = x + start * (in_len - 1)
        outside = (x < 0) | (x > in_len - 1)
    elif coord == "pytorch_half_pixel":
        x = np.full(out_len, -0.5) if length == 1 else (y + 0.5) / scale - 0.5
    elif coord == "half_pixel":
        x = (y + 0.5) / scale - 0.5
    elif coord == "half_pixel_symmetric":
        offset = in_len / 2 * (1 - out_len / length)
        x = offset + (y + 0.5) / scale - 0.5
    else:
        raise ValueError(f"Resize: unknown coordinate_transformation_mode {coord!r}")
    return x, outside


def _resize_coefficients(ratio: np.ndarray, scale: float, mode: str, nearest: str, cubic_a: float,
                         antialias: bool) -> np.ndarray:
    """ONNX Resize's interpolation weights, [out, taps], for each output's position ``ratio`` in
    (0, 1] past the input index at or left of it."""
    r = ratio[:, None]
    if mode == "nearest":
        whole = ratio == 1
        take_right = {"round_prefer_floor": ratio > 0.5, "round_prefer_ceil": ratio >= 0.5,
                      "floor": np.zeros_like(whole), "ceil": np.ones_like(whole)}.get(nearest)
        if take_right is None:
            raise ValueError(f"Resize: unknown nearest_mode {nearest!r}")
        take_right = whole | take_right
        return np.stack([~take_right, take_right], axis=1).astype(np.float64)
    if mode == "linear" and not antialias:
        return np.concatenate([1 - r, r], axis=1)
    a = cubic_a
    if mode == "cubic" and not antialias:
        s, t = r + 1, 2 - r
        return np.concatenate([((a * s - 5 * a) * s + 8 * a) * s - 4 * a,
                               ((a + 2) * r - (a + 3)) * r * r + 1,
                               ((a + 2) * (1 - r) - (a + 3)) * (1 - r) * (1 - r) + 1,
                               ((a * t - 5 * a) * t + 8 * a) * t - 4 * a], axis=1)
    scale = min(scale, 1.0)  # antialiasing widens the kernel by 1 / scale when downsampling
    if mode == "linear":
        start = int(np.floor(-1 / scale) + 1)
        taps = np.arange(start, 2 - start)
        coeffs = np.clip(1 - np.abs((taps[None, :] - r) * scale), 0, 1)
    elif mode == "cubic":
        start = int(np.floor(-2 / scale) + 1)
        d = np.abs(scale * (np.arange(start, 2 - start)[None, :] - r))
        near = ((a + 2) * d - (a + 3)) * d * d + 1
        far = ((a * d - 5 * a) * d + 8 * a) * d - 4 * a
        coeffs = np.where(d <= 1, near, np.where(d < 2, far, 0.0))
    else:
        raise ValueError(f"Resize: unknown mode {mode!r}")
    return coeffs / coeffs.sum(axis=1, keepdims=True)


def resize_taps(in_len: int, out_len: int, scale: float, *, mode: str = "nearest",
                coord: str = "half_pixel", nearest: str = "round_prefer_floor",
                cubic_a: float = -0.75, exclude_outside: bool = False, antialias: bool = False,
                roi: tuple[float, float] = (0.0, 1.0)):
    """One axis of ONNX Resize as gathers: output ``i`` is ``sum_k weights[i, k] *
    input[indices[i, k]]`` (``indices`` clamped into the input, as ONNX's edge padding reads),
    or the extrapolation value where ``outside[i]`` (None when no output is)."""
    x, outside = _resize_source(out_len, in_len, scale, coord, roi)
    floor = np.floor(x)
    ratio = np.where(x == floor, 1.0, x - floor)
    weights = _resize_coefficients(ratio, scale, mode, nearest, cubic_a, antialias)
    taps = weights.shape[1]
    # The taps nearest x, ties to the smaller index (ONNX's window in edge-padded coordinates).
    pad = int(np.ceil(taps / 2))
    padded = x + pad
    p = np.floor(padded)
    frac = padded - p
    if taps % 2 == 0:
        offset = np.where(frac == 0, -(taps // 2), -(taps // 2) + 1)
    else:
        offset = np.where(frac <= 0.5, -((taps - 1) // 2), -((taps - 1) // 2) + 1)
    indices = (p + offset).astype(np.int64)[:, None] + np.arange(taps)[None, :] - pad
    if exclude_outside:
        weights = np.where((indices < 0) | (indices >= in_len), 0.0, weights)
        total = weights.sum(axis=1, keepdims=True)
        weights = weights / np.where(total == 0, 1.0, total)
    indices = np.clip(indices, 0, in_len - 1)
    if outside is not None and not outside.any():
        outside = None
    return indices, weights, outside


class Resize:
    """ONNX Resize (opset 11+) where TVM's converter computes something else: scales whose output
    length is not exactly ``scale * input`` (ONNX maps coordinates with the scale, TVM with the
    length ratio), antialiasing, ``half_pixel_symmetric``, ``keep_aspect_ratio_policy`` (with the
    ``axes`` that ``fold`` leaves it), a resized batch or channel axis and a one-element
    ``align_corners`` / ``tf_crop_and_resize`` axis. Those become per-axis gathers
    with constant indices and weights computed here; everything else stays TVM's."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.Resize.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            plan = cls._plan(inputs, attrs) if opset >= 11 else None
            if plan is None:
                return fallback(bb, inputs, attrs, params)
            return cls._emit(bb, inputs[0], plan, attrs)
        return convert

    @staticmethod
    def _plan(inputs, attrs):
        """Per resized axis (axis, out_len, scale, roi), or None where TVM's converter is right."""

        x = inputs[0]
        shape = static_shape(x) if isinstance(x, relax.Expr) else None
        pick = [inputs[i] if len(inputs) > i else None for i in (1, 2, 3)]
        roi, scales, sizes = (_constant_array(v) for v in pick)
        known = (roi, scales, sizes)
        if shape is None or any(p is not None and c is None for p, c in zip(pick, known)):
            return None  # not known at compile time: TVM's converter decides
        rank = len(shape)
        coord = attribute_text(attrs.get("coordinate_transformation_mode"), "half_pixel")
        policy = attribute_text(attrs.get("keep_aspect_ratio_policy"), "stretch")
        antialias = bool(attrs.get("antialias", 0))
        listed = [int(a) % rank for a in attrs.get("axes", range(rank))]
        factors, out = [1.0] * rank, list(shape)
        if scales is not None and scales.size:
            for axis, factor in zip(listed, scales.astype(np.float32)):
                factors[axis] = float(factor)
                out[axis] = int(float(factor) * shape[axis])
        elif sizes is not None and sizes.size:
            for axis, size in zip(listed, sizes):
                out[axis] = int(size)
                factors[axis] = int(size) / shape[axis]
            if policy != "stretch":
                pick_scale = {"not_larger": min, "not_smaller": max}.get(policy)
                if pick_scale is None:
                    raise ValueError(f"Resize: unknown keep_aspect_ratio_policy {policy!r}")
                common = pick_scale(factors[a] for a in listed)
                for axis in listed:
                    factors[axis] = common
                    out[axis] = int(common * shape[axis] + 0.5)
        else:
            return None
        spans = [(0.0, 1.0)] * rank
        if roi is not None and roi.size:
            if roi.size != 2 * len(listed):
                return None  # not ONNX's layout (spatial-only, say): TVM's converter reads it
            for i, axis in enumerate(listed):
                spans[axis] = (float(roi[i]), float(roi[len(listed) + i]))
        axes = []
        tvm_right = (policy == "stretch" and coord != "half_pixel_symmetric"
                     and "axes" not in attrs)
        for i in range(rank):
            if (np.isclose(factors[i], 1.0) and out[i] == shape[i]
                    and np.isclose(spans[i][0], 0.0) and np.isclose(spans[i][1], 1.0)):
                continue
            axes.append((i, out[i], factors[i], spans[i]))
            if antialias and factors[i] < 1:
                tvm_right = False
            if not np.isclose(factors[i], out[i] / shape[i], rtol=1e-6, atol=0):
                tvm_right = False
            if out[i] == 1 and coord in ("align_corners", "tf_crop_and_resize"):
                tvm_right = False
        if tvm_right and all(out[i] == shape[i] for i in range(2)):
            return None
        return axes

    @staticmethod
    def _emit(bb, x, axes, attrs):
        mode = attribute_text(attrs.get("mode"), "nearest")
        dtype = str(x.ty.dtype)
        work = dtype if _is_float_dtype(dtype) else "float32"
        options = dict(mode=mode,
                       coord=attribute_text(attrs.get("coordinate_transformation_mode"), "half_pixel"),
                       nearest=attribute_text(attrs.get("nearest_mode"), "round_prefer_floor"),
                       cubic_a=float(attrs.get("cubic_coeff_a", -0.75)),
                       exclude_outside=bool(attrs.get("exclude_outside", 0)),
                       antialias=bool(attrs.get("antialias", 0)))
        if mode == "nearest" and options["antialias"]:
            raise ValueError("Resize: antialias is not defined for mode 'nearest'")
        rank = len(x.ty.shape)
        if work != dtype:
            x = bb.normalize(relax.op.astype(x, work))
        for axis, out_len, scale, roi in axes:
            in_len = int(x.ty.shape[axis])
            indices, weights, outside = resize_taps(in_len, out_len, scale, roi=roi, **options)
            along = [1] * rank
            along[axis] = out_len
            if np.all((weights == 0) | (weights == 1)) and np.all(weights.sum(axis=1) == 1):
                chosen = indices[np.arange(out_len), weights.argmax(axis=1)]
                result = relax.op.take(x, constant(chosen.astype(np.int64)), axis=axis)
            else:
                result = None
                for k in range(weights.shape[1]):
                    index = constant(indices[:, k].astype(np.int64))
                    gathered = relax.op.take(x, index, axis=axis)
                    weight = relax.const(weights[:, k].reshape(along).astype(work), work)
                    term = bb.normalize(relax.op.multiply(gathered, weight))
                    result = term if result is None else bb.normalize(relax.op.add(result, term))
            if outside is not None:
                fill = relax.const(attrs.get("extrapolation_value", 0.0), work)
                result = relax.op.where(relax.const(outside.reshape(along)), fill, result)
            x = bb.normalize(result)
        if work != dtype:
            info = np.iinfo(dtype)
            x = relax.op.clip(relax.op.round(x), float(info.min), float(info.max))
            x = relax.op.astype(x, dtype)
        return x


class NonMaxSuppression:
    """ONNX NonMaxSuppression. Over a static box count, TVM's kernel: ONNX suppresses a box whose
    IoU is *above* iou_threshold (absent: 0), TVM's kernel one at or above it (absent: 0.5), so the
    threshold handed to TVM is the next float32 up, and a threshold known only at run time is an
    error (TVM's converter would use 0.5). Over a box count known only at run time (the boxes a
    detector keeps after its score filter; TVM sizes its output from a static count), edgec's
    CPU kernel ``edgec_nms`` (native/runtime_kernels.cc), ONNX's semantics exactly."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.NonMaxSuppression.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            inputs = list(inputs) + [None] * (5 - len(inputs))
            name = attrs.get("tvm_custom", {}).get("name", "NonMaxSuppression")
            boxes_ty = getattr(inputs[0], "ty", None)
            if not (isinstance(boxes_ty, relax.TensorType) and boxes_ty.shape is not None
                    and isinstance(boxes_ty.shape.values[1], tvm.tirx.IntImm)):
                return _native_nms(bb, inputs, int(attrs.get("center_point_box", 0)))
            threshold = inputs[3]
            if threshold is None:
                value = 0.0
            elif isinstance(threshold, tvm.ir.GenericConst):
                value = float(np.asarray(threshold.value.numpy()).reshape(-1)[0])
            elif isinstance(threshold, relax.Var) and threshold.name in params[1]:
                value = float(np.asarray(params[1][threshold.name][1].numpy()).reshape(-1)[0])
            else:
                raise ValueError(f"{name}: iou_threshold must be known at compile time "
                                 "(a constant or a fixed input)")
            above = np.nextafter(np.float32(value), np.float32(np.inf))
            inputs[3] = relax.const(np.array([above], np.float32))
            # Exporters write "no limit" as INT64_MAX (torchvision's batched NMS); TVM's kernel
            # sizes its output by the limit, as an int32: at most every box is kept.
            limit = inputs[2]
            if isinstance(limit, tvm.ir.GenericConst):
                boxes = int(boxes_ty.shape.values[1])
                if int(np.asarray(limit.value.numpy()).reshape(-1)[0]) > boxes:
                    inputs[2] = relax.const(np.array([boxes], np.int64), "int64")
            # TVM's kernel crashes the process on scores of unknown dims (known rank): give
            # them fresh symbolic dims.
            ty = getattr(inputs[1], "ty", None)
            if isinstance(ty, relax.TensorType) and ty.shape is None and ty.ndim >= 0:
                dims = [tvm.tirx.Var(f"nms1_{d}", "int64") for d in range(ty.ndim)]
                value = inputs[1] if isinstance(inputs[1], relax.Var) else bb.emit(inputs[1])
                inputs[1] = bb.match_cast(value, relax.TensorType(dims, ty.dtype))
            return fallback(bb, inputs, attrs, params)
        return convert


def _native_nms(bb: relax.BlockBuilder, inputs: list, center_point_box: int) -> relax.Expr:
    """``edgec_nms`` on ``inputs`` (absent ones as ONNX's defaults): [selected, 3] int64, the
    row count a fresh dim."""
    def tensor(value, default, dtype):
        return relax.const(np.array(default, dtype), dtype) if value is None else value

    args = [inputs[0], inputs[1], tensor(inputs[2], [0], "int64"), tensor(inputs[3], [0.0], "float32"),
            tensor(inputs[4], [0.0], "float32"), relax.prim_value(int(inputs[4] is not None)),
            relax.prim_value(center_point_box)]
    rows = bb.emit(relax.op.call_pure_packed("edgec_nms", *args,
                                             ty_args=[relax.TensorType(ndim=2, dtype="int64")]))
    return bb.match_cast(rows, relax.TensorType([tvm.tirx.Var("nms_selected", "int64"), 3], "int64"))


def _dequantized(bb, x, scale, zero_point, axis: int):
    """``x`` (integer) as float32, ``(x - zero_point) * scale``, per tensor or, for a 1-D
    ``scale``, per slice along ``axis``. Float32 whatever the scale's type: the integer
    operators these stand for accumulate exactly, float16 would not."""
    scale = bb.normalize(relax.op.astype(scale, "float32"))
    if zero_point is None:
        zero_point = relax.const(0, str(x.ty.dtype))
    return bb.normalize(relax.op.dequantize(x, scale, zero_point, axis=axis % x.ty.ndim,
                                            out_dtype="float32"))


def _quantized(bb, y, scale, zero_point, axis: int):
    """Float ``y`` rounded half to even onto ``zero_point``'s integer type (uint8 without one),
    saturating, per tensor or per slice along ``axis``."""
    scale = bb.normalize(relax.op.astype(scale, "float32"))
    dtype = "uint8" if zero_point is None else str(zero_point.ty.dtype)
    if zero_point is None:
        zero_point = relax.const(0, dtype)
    return relax.op.quantize(y, scale, zero_point, axis=axis % y.ty.ndim, out_dtype=dtype)


class QLinearMatMul:
    """ONNX QLinearMatMul (the "QOperator" format of quantized models): ``a`` per tensor or per
    row, ``b`` per tensor or per column, the result requantized per tensor or per row."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        def convert(bb, inputs, attrs, params):
            a, a_scale, a_zp, b, b_scale, b_zp, y_scale, y_zp = inputs
            product = bb.normalize(relax.op.matmul(_dequantized(bb, a, a_scale, a_zp, -2),
                                                   _dequantized(bb, b, b_scale, b_zp, -1)))
            return _quantized(bb, product, y_scale, y_zp, -2)
        return convert


class QLinearConv:
    """ONNX QLinearConv: the convolution of the dequantized input and (per output channel)
    weights plus the int32 bias at scale ``x_scale * w_scale``, requantized. The convolution
    itself is TVM's ONNX Conv converter, so every Conv attribute means the same."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        conv = onnx_frontend.Conv.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            x, x_scale, x_zp, w, w_scale, w_zp, y_scale, y_zp = inputs[:8]
            bias = inputs[8] if len(inputs) > 8 else None
            args = [_dequantized(bb, x, x_scale, x_zp, 1), _dequantized(bb, w, w_scale, w_zp, 0)]
            if bias is not None:
                scales = relax.op.multiply(relax.op.astype(x_scale, "float32"),
                                           relax.op.astype(w_scale, "float32"))
                args.append(bb.normalize(relax.op.multiply(relax.op.astype(bias, "float32"), scales)))
            else:
                args.append(None)  # TVM's Conv converter reads the bias slot
            out = bb.normalize(conv(bb, args, attrs, params))
            return _quantized(bb, out, y_scale, y_zp, 1)
        return convert


class ConvInteger:
    """ONNX ConvInteger: the int32 convolution of the inputs less their zero points (the
    weights' per output channel), through TVM's ONNX Conv converter."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        conv = onnx_frontend.Conv.get_converter(opset)

        def widened(bb, value, zero_point):
            """``value - zero_point`` in int32; a 1-D zero point is one per output channel."""
            value = bb.normalize(relax.op.astype(value, "int32"))
            if zero_point is None:
                return value
            zero_point = bb.normalize(relax.op.astype(zero_point, "int32"))
            if zero_point.ty.ndim == 1:
                zero_point = relax.op.reshape(zero_point, [-1] + [1] * (value.ty.ndim - 1))
            return bb.normalize(relax.op.subtract(value, zero_point))

        def convert(bb, inputs, attrs, params):
            x, w = inputs[0], inputs[1]
            x_zp = inputs[2] if len(inputs) > 2 else None
            w_zp = inputs[3] if len(inputs) > 3 else None
            if x_zp is not None:  # one value for the whole input, possibly as a 1-element tensor
                x_zp = relax.op.reshape(x_zp, [])
            # No bias; TVM's Conv converter reads the slot.
            return conv(bb, [widened(bb, x, x_zp), widened(bb, w, w_zp), None], attrs, params)
        return convert


def constant_bound_clip(base) -> type:
    """A Clip converter over ``base`` (TVM's) that, when every bound given is a constant, emits
    ``maximum``/``minimum`` Relax ops with scalar constants, as ONNX defines Clip. TVM's emits
    TE kernels, opaque to Relax passes: a relu6 then neither fused into the convolution before it
    nor kept the blocked layout between library calls (mobilenet_v2 spent a fifth of its time in
    those kernels and the layout transforms around them). A NaN bound is no bound, as in
    onnxruntime; bounds computed at run time keep TVM's converter."""

    @_over(base, "ConstantBound")
    def convert(fallback, bb, inputs, attrs, params):
        x = inputs[0]
        ty = x.ty
        if not isinstance(ty, relax.TensorType):
            return fallback(bb, inputs, attrs, params)
        dtype = str(ty.dtype)
        if len(inputs) > 1:  # opset 11+: bounds as optional inputs
            bounds = [None if i >= len(inputs) or inputs[i] is None else _constant_array(inputs[i])
                      for i in (1, 2)]
            if any(b is None and i < len(inputs) and inputs[i] is not None
                   for b, i in zip(bounds, (1, 2))) or any(b is not None and b.size != 1
                                                           for b in bounds):
                return fallback(bb, inputs, attrs, params)
            lo, hi = (None if b is None else b.reshape(()).item() for b in bounds)
        else:  # opset 6: bounds as attributes
            lo, hi = attrs.get("min"), attrs.get("max")
        out = x
        for bound, op in ((lo, relax.op.maximum), (hi, relax.op.minimum)):
            if bound is None or (isinstance(bound, float) and np.isnan(bound)):
                continue
            if isinstance(bound, float) and np.isinf(bound) and np.dtype(dtype).kind == "f":
                continue  # max(x, -inf) and min(x, inf) are x
            out = bb.emit(op(out, relax.const(np.array(bound, dtype=dtype), dtype)))
        return out
    return convert
