"""Converters for ONNX ops TVM 0.27's importer lacks and ONNX defines without a function body."""

from __future__ import annotations

from typing import Callable

import numpy as np
import tvm
from tvm import relax, topi
from tvm.relax.frontend.onnx import onnx_frontend


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
    converter takes integers): both become integers, then TVM's converter runs."""

    @classmethod
    def get_converter(cls, opset: int) -> Callable:
        fallback = onnx_frontend.OneHot.get_converter(opset)

        def convert(bb, inputs, attrs, params):
            indices, depth = inputs[0], inputs[1]
            if "float" in str(indices.ty.dtype):  # ONNX allows float indices; they index as ints
                indices = bb.normalize(relax.op.astype(indices, "int64"))
            if isinstance(depth, tvm.ir.GenericConst):
                depth = relax.const(np.int64(np.asarray(depth.value.numpy()).reshape(-1)[0]))
            return fallback(bb, [indices, depth, *inputs[2:]], attrs, params)
        return convert
